"""The models the engine fits: a scaling model per job, a demand forecast per queue, and their
cache.
"""
