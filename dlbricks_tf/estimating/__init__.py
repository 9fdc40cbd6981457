"""Estimating: a model's latency rebuilt from its bricks' timings.

`estimate` rebuilds it from the bricks of one cut, and `rows` sets it
against the model's measurement as the rows of report.json and of the
`estimate` command. `cover` covers a model by stored bricks of any G,
`features` and `predict` fit a per-machine latency model for the bricks
the store lacks, and `beyond` turns covered and predicted estimates into
rows that say where each came from.
"""
