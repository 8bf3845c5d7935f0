"""The engine's vocabulary: queues, jobs, observations, decisions, the protocols of its boundary
and its errors.
"""
