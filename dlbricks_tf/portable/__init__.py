"""Portable suites: unique bricks exported to a folder and timed anywhere.

`export` writes a suite folder (each brick as a SavedModel and an ONNX
file), `suite_dir` reads one back and checks it, `suite_check` refuses
bricks whose files do more than compute before they run, `suite_bench`
times a folder's bricks with no source model, and `recipe` keeps a model
as its bricks' signatures, so that it can be estimated from the timings of
a shared suite.
"""
