"""TensorFlow's start-up: thread pools fixed first, its noise hidden.

TensorFlow fixes its thread pools at its first op, so the settings of the
flags are put in force before it runs one; what its C++ runtime writes to
stderr while starting (CUDA, oneDNN) is hidden unless `--verbosity` asks
for debug output.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile

from absl import logging

from dlbricks_tf.cli import shared_flags, timing_flags
from dlbricks_tf.machine import process as process_lib
from dlbricks_tf.machine import settings as settings_lib
from dlbricks_tf.measuring import ort_session


def quiet() -> bool:
    """Whether start-up noise is hidden (below absl's debug verbosity)."""
    return logging.get_verbosity() < logging.DEBUG


@contextlib.contextmanager
def native_logs_hidden(hidden: bool):
    """Hides what TensorFlow's C++ start-up writes to fd 2 (CUDA, oneDNN).

    TF_CPP_MIN_LOG_LEVEL does not silence messages logged before absl's
    C++ logging is initialised. They are replayed if start-up fails.
    """
    if not hidden:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            captured.seek(0)
            sys.stderr.write(captured.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def start_tensorflow():
    """Fixes the thread pools before TensorFlow's first op; returns settings.

    The settings (`RunSettings`) are those of the flags, on the TF backend.
    """
    hidden = quiet()
    with native_logs_hidden(hidden):
        import tensorflow as tf

        settings = settings_lib.RunSettings.default(
            shared_flags.BATCH.value,
            intra_op_threads=shared_flags.INTRA.value,
            inter_op_threads=shared_flags.INTER.value,
            protocol=timing_flags.PROTOCOL.value,
        )
        process_lib.configure_threads(
            settings.intra_op_threads, settings.inter_op_threads
        )
        tf.constant(0.0).numpy()  # Initialises the runtime (and its logs).
    if hidden:
        tf.get_logger().setLevel("ERROR")
    return settings


def start_backend():
    """`start_tensorflow`, then the settings of --backend.

    TensorFlow's pools are fixed either way (bricks are cut and converted
    with it); on ONNX Runtime the settings' threads size its sessions, and
    each brick is timed alone ("loop"). ONNX Runtime missing is one line.
    """
    import dataclasses

    settings = start_tensorflow()
    backend = shared_flags.BACKEND.value
    if backend == settings.backend:
        return settings

    ort_session.require_onnxruntime()
    return dataclasses.replace(
        settings, backend=backend, protocol=timing_flags.PROTOCOL.value
    )
