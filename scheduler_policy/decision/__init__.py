"""The decision core, pure: triage, budgets, allocation, stabilization and the messages
for people.
"""
