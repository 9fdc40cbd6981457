"""The models to time: default corpora, the user's models, the probes.

`corpus` names the default corpora, `sources` resolves what a job is
given (names, files, builders) into models, and `probes` is the seeded
corpus of layer configurations that calibrates predicted bricks.
"""
