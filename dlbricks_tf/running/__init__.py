"""The whole job: models in, measured and estimated latency out.

`job` runs it for one granularity after another, `bench` times the bricks
of a suite that the store lacks, and `sharding` says which part of a suite
this worker times.
"""
