"""Timing the bricks of an exported suite folder, with no source model.

A suite folder (`dlbricks export`, read by `dlbricks_tf.suite_dir`) holds
each unique brick as a SavedModel and an ONNX file, with its input specs
and id bounds. `measurer(settings, options)` returns the function that
times one of its bricks on the backend of `settings`:

- `tf`: the SavedModel, wrapped in a `keras.Model` (`TFSMLayer`), timed by
  the same in-graph protocol as bricks cut in memory
  (`dlbricks_tf.timing`);
- `onnxruntime`: the ONNX file in ONNX Runtime sessions with the settings'
  thread pools (`dlbricks_tf.ort_timing`).

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

from collections.abc import Callable

from dlbricks_tf import settings as settings_lib
from dlbricks_tf import suite_dir, timing
from dlbricks_tf.stats import Timing


def measurer(
    settings: settings_lib.RunSettings,
    options: timing.TimingOptions | None = None,
    *,
    check_settings: bool = True,
) -> Callable[[suite_dir.SuiteDirEntry], Timing]:
    """Returns a function timing one suite brick on `settings.backend`.

    Args:
        settings: Run settings in force in this process; `backend` picks
            the SavedModel (tf) or the ONNX file (onnxruntime).
        options: Sampling options, as for bricks cut in memory.
        check_settings: Verify TensorFlow's thread pools first (tf only).

    Returns:
        measure(entry) -> Timing.

    Raises:
        MeasurementError: When called, if the brick cannot be timed (e.g.
            no ONNX file for it, or ONNX Runtime missing).
    """
    if settings.backend == "onnxruntime":

        def measure(entry: suite_dir.SuiteDirEntry) -> Timing:
            from dlbricks_tf import ort_timing

            if entry.onnx is None:
                why = entry.onnx_error or "tf2onnx could not convert it"
                raise timing.MeasurementError(
                    f"Brick {entry.signature} has no ONNX file in its suite "
                    f"({why}); time it with --backend=tf."
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
        model = suite_dir.load_saved_model(entry, settings.batch_size)
        return timing.time_model(
            model,
            settings,
            options,
            check_settings=check_settings,
            id_bounds=entry.id_bounds,
        )

    return measure_tf
