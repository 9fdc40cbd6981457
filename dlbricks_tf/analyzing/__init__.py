"""Corpus analysis: the figures that motivate DLBricks, for any corpus.

`analysis` computes them (repeatability, layer types, similarity, reuse,
the accuracy/speed-up trade-off) with no I/O, `analysis_files` writes them
as CSV, JSON, PNG and TensorBoard logs, and `analyze` runs both over a
corpus of models.
"""
