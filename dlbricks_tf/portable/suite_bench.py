"""Timing the bricks of an exported suite folder, with no source model.

A suite folder (`dlbricks export`, read by `dlbricks_tf.portable.suite_dir`)
holds each unique brick as a SavedModel and an ONNX file, with its input specs
and id bounds. `builder(settings)` returns what the backend of `settings`
runs of one of its bricks, for the one timing path of every command
(`dlbricks_tf.measuring.brick_timing`):

- `tf`: the SavedModel, wrapped in a `keras.Model` (`TFSMLayer`), timed by
  the same in-graph protocol as bricks cut in memory
  (`dlbricks_tf.measuring.timing`);
- `onnxruntime`: the ONNX file in ONNX Runtime sessions with the settings'
  thread pools (`dlbricks_tf.measuring.ort_timing`).

`bench.time_suite(suite_dir, ..., build=builder(settings))` then times
what the store lacks, committing each result, keyed by signature,
settings (backend included) and machine fingerprint; `measurer` times
one brick alone.

Example:
    suite = suite_dir.load_suite("suite").shard(0, 3)
    with Store("shard0.sqlite") as store:
        bench.time_suite(suite, store, settings, fp, options,
                         build=builder(settings))
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from dlbricks_tf.machine import settings as settings_lib
from dlbricks_tf.measuring import brick_timing, memory, onnx_files, sampling
from dlbricks_tf.portable import suite_bricks, suite_check, suite_dir
from dlbricks_tf.stats import Timing


def measurer(
    settings: settings_lib.RunSettings,
    options: sampling.TimingOptions | None = None,
    *,
    check_settings: bool = True,
    suite_folder: str | None = None,
    unsafe: bool = False,
) -> Callable[[suite_dir.SuiteDirEntry], Timing]:
    """Returns a function timing one suite brick on `settings.backend`.

    The brick is loaded by `builder` (checked first unless `unsafe`) and
    timed alone by the timer of its backend
    (`dlbricks_tf.measuring.brick_timing.model_timer`), as `bench --suite`
    times it under the loop protocol.

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
    build = builder(settings, suite_folder=suite_folder, unsafe=unsafe)

    def measure(entry: suite_dir.SuiteDirEntry) -> Timing:
        timer = brick_timing.model_timer(
            build(entry),
            settings,
            options,
            check_settings=check_settings,
            id_bounds=entry.id_bounds,
        )
        return sampling.time_interleaved([timer])[0]

    return measure


def builder(
    settings: settings_lib.RunSettings,
    source: str = "saved_model",
    *,
    suite_folder: str | None = None,
    unsafe: bool = False,
) -> Callable[[suite_dir.SuiteDirEntry], Any]:
    """Returns entry -> what the backend of `settings` runs of it.

    Before a brick is loaded, its files are checked as data
    (`dlbricks_tf.portable.suite_check`): a brick whose SavedModel holds an
    op Keras bricks do not export to, whose ONNX file uses another operator
    domain or external data outside its folder, or whose files link out of
    the suite folder is refused and never runs.

    Args:
        settings: Run settings (their backend and batch size).
        source: On TF, "saved_model": the brick's SavedModel in a
            `keras.layers.TFSMLayer` (needs no code of the suite's author:
            a custom layer is in the graph); "keras": the brick rebuilt
            from its `.keras` file (fresh layers from their configs in
            Keras's safe mode; a custom layer needs its module imported,
            `--import`). ONNX Runtime always runs the ONNX file.
        suite_folder: The suite folder no brick file may link out of.
        unsafe: Skip the checks: only for a suite the user trusts.

    Returns:
        build(entry): a runnable `keras.Model` on TF, a
        `onnx_files.OnnxFile` on ONNX Runtime.

    Raises:
        ValueError: For an unknown `source`.
    """
    if source not in ("saved_model", "keras"):
        raise ValueError(
            "source must be 'saved_model' or 'keras'. "
            f"Received: source={source!r}"
        )

    def check(entry: suite_dir.SuiteDirEntry) -> None:
        if not unsafe:
            root = suite_folder or os.path.dirname(entry.saved_model)
            suite_check.require(entry, root, settings.backend)

    def build(entry: suite_dir.SuiteDirEntry) -> Any:
        check(entry)
        if settings.backend == "onnxruntime":
            return _onnx_file(entry, settings)
        if source == "keras":
            return suite_bricks.load_keras_brick(entry, settings.batch_size)
        return suite_bricks.load_saved_model(entry, settings.batch_size)

    return build


def _onnx_file(
    entry: suite_dir.SuiteDirEntry, settings: settings_lib.RunSettings
) -> onnx_files.OnnxFile:
    """The ONNX file of a suite brick, checked to fit in memory."""
    if entry.onnx is None:
        why = entry.onnx_error or "tf2onnx could not convert it"
        raise sampling.MeasurementError(
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
    return onnx_files.OnnxFile(
        entry.onnx,
        tuple(entry.id_bounds) if entry.id_bounds is not None else None,
        tuple((tuple(i.shape[1:]), i.dtype) for i in entry.inputs),
    )
