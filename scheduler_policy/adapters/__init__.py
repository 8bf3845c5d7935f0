"""The engine's adapters to the world: observation files now; the Volcano client and leader
election next.
"""
