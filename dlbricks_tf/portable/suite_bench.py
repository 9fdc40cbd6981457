"""Timing the bricks of an exported suite folder, with no source model.

A suite folder (`dlbricks export`, read by `dlbricks_tf.portable.suite_dir`)
holds each unique brick as a SavedModel and an ONNX file, with its input specs
and id bounds. `measurer(settings, options)` returns the function that
times one of its bricks on the backend of `settings`:

- `tf`: the SavedModel, wrapped in a `keras.Model` (`TFSMLayer`), timed by
  the same in-graph protocol as bricks cut in memory
  (`dlbricks_tf.measuring.timing`);
- `onnxruntime`: the ONNX file in ONNX Runtime sessions with the settings'
  thread pools (`dlbricks_tf.measuring.ort_timing`).

`bench.time_suite(suite_dir, ..., measure=measurer(settings, options))`
then times what the store lacks, committing each result, keyed by
signature, settings (backend included) and machine fingerprint.

Example:
    suite = suite_dir.load_suite("suite").shard(0, 3)
    with Store("shard0.sqlite") as store:
        bench.time_suite(suite, store, settings, fp,
                         measure=measurer(settings, options))
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from dlbricks_tf import settings as settings_lib
from dlbricks_tf.measuring import memory, timing
from dlbricks_tf.portable import suite_check, suite_dir
from dlbricks_tf.stats import Timing


def measurer(
    settings: settings_lib.RunSettings,
    options: timing.TimingOptions | None = None,
    *,
    check_settings: bool = True,
    suite_folder: str | None = None,
    unsafe: bool = False,
) -> Callable[[suite_dir.SuiteDirEntry], Timing]:
    """Returns a function timing one suite brick on `settings.backend`.

    Before a brick is loaded, its files are checked as data
    (`dlbricks_tf.portable.suite_check`): a brick whose SavedModel holds an op
    Keras bricks do not export to, whose ONNX file uses another operator
    domain or external data outside its folder, or whose files link out
    of the suite folder is refused and never runs.

    Args:
        settings: Run settings in force in this process; `backend` picks
            the SavedModel (tf) or the ONNX file (onnxruntime).
        options: Sampling options, as for bricks cut in memory.
        check_settings: Verify TensorFlow's thread pools first (tf only).
        suite_folder: The suite folder no brick file may link out of
            (default: each brick's own folder).
        unsafe: Skip the checks: only for a suite the user trusts.

    Returns:
        measure(entry) -> Timing.

    Raises:
        MeasurementError: When called, if the brick cannot be timed (e.g.
            no ONNX file for it, or ONNX Runtime missing).
        RefusedBrickError: When called, if the brick fails a check.
    """

    def check(entry: suite_dir.SuiteDirEntry) -> None:
        if not unsafe:
            root = suite_folder or os.path.dirname(entry.saved_model)
            suite_check.require(entry, root, settings.backend)

    if settings.backend == "onnxruntime":

        def measure(entry: suite_dir.SuiteDirEntry) -> Timing:
            from dlbricks_tf.measuring import ort_timing

            check(entry)
            if entry.onnx is None:
                why = entry.onnx_error or "tf2onnx could not convert it"
                raise timing.MeasurementError(
                    f"Brick {entry.signature} has no ONNX file in its suite "
                    f"({why}); time it with --backend=tf."
                )
            # Refused in one line before a session allocates anything.
            memory.check_specs(
                f"Brick {entry.signature}",
                settings.batch_size,
                os.path.getsize(entry.onnx),
                [(i.shape, i.dtype) for i in entry.inputs],
                [(o.shape, o.dtype) for o in entry.outputs],
            )
            return ort_timing.time_onnx(
                entry.onnx,
                settings,
                options,
                input_specs=[(i.shape[1:], i.dtype) for i in entry.inputs],
                id_bounds=entry.id_bounds,
            )

        return measure

    def measure_tf(entry: suite_dir.SuiteDirEntry) -> Timing:
        check(entry)
        model = suite_dir.load_saved_model(entry, settings.batch_size)
        return timing.time_model(
            model,
            settings,
            options,
            check_settings=check_settings,
            id_bounds=entry.id_bounds,
        )

    return measure_tf


def builder(
    settings: settings_lib.RunSettings,
    source: str = "saved_model",
    *,
    suite_folder: str | None = None,
    unsafe: bool = False,
) -> Callable[[suite_dir.SuiteDirEntry], Any]:
    """Returns entry -> runnable `keras.Model`, for chains on TF.

    Every brick is checked first, as by `measurer`, unless `unsafe`.

    Args:
        settings: Run settings (their batch size).
        source: "saved_model": the brick's SavedModel in a
            `keras.layers.TFSMLayer`, as `measurer` times it (needs no
            code of the suite's author: a custom layer is in the graph);
            "keras": the brick rebuilt from its `.keras` file (fresh layers
            from their configs in Keras's safe mode; a custom layer needs
            its module imported, `--import`).
        suite_folder: The suite folder no brick file may link out of.
        unsafe: Skip the checks: only for a suite the user trusts.

    Raises:
        ValueError: For an unknown `source`.
    """
    if source not in ("saved_model", "keras"):
        raise ValueError(
            "source must be 'saved_model' or 'keras'. "
            f"Received: source={source!r}"
        )

    def build(entry: suite_dir.SuiteDirEntry) -> Any:
        if not unsafe:
            root = suite_folder or os.path.dirname(entry.saved_model)
            suite_check.require(entry, root, settings.backend)
        if source == "keras":
            return suite_dir.load_keras_brick(entry, settings.batch_size)
        return suite_dir.load_saved_model(entry, settings.batch_size)

    return build
