"""The ElasticPolicy an admin writes: what it is, its file format, per-job annotations and
validation.
"""
