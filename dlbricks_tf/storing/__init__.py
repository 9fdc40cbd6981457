"""The store: SQLite timings keyed by brick, run settings and machine.

`store` is the results API (timings, failures, predictors, reference
states); `database` opens, creates and migrates the file; `merging`
exports a store to JSON or CSV and merges stores written elsewhere. None
of them imports TensorFlow.
"""
