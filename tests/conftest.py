"""Pytest set-up shared by the tests: quiet TensorFlow, import the repo."""

import os
import sys

import threadpoolctl

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# One OpenMP (and OpenBLAS) thread, here and in the commands the tests run:
# scikit-learn's trees fit a few hundred bricks, too few to gain from
# threads, and on a 2-core host with one core busy elsewhere their OpenMP
# barriers made one predictor's fit take 27 s against 6 s on one thread.
# TensorFlow's thread pools do not read this variable. libgomp reads it
# once, when loaded; Bazel runs a test file as the main module, whose
# imports load it before pytest reads this file: those already loaded are
# limited here.
if os.environ.setdefault("OMP_NUM_THREADS", "1") == "1":
    threadpoolctl.threadpool_limits(1)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def pytest_collection_finish(session):
    """Fixes TensorFlow's pools at one thread each, before any test runs.

    TensorFlow fixes them at its first op; a test that ran one first would
    fix TensorFlow's defaults, and the commands the tests run in this
    process (`tests/cli.py`) and the timers that check their settings need
    these. Only if a test file imported TensorFlow: the others stay free
    of it.
    """
    del session  # Unused.
    if "tensorflow" not in sys.modules:
        return
    from dlbricks_tf.machine import process

    try:
        process.configure_threads(1, 1)
    except process.ThreadPoolError:
        # A file run as the main module (Bazel) ran an op on import:
        # timers then do not check the pools (`tests.models.settings`).
        pass
