"""The job's two halves run apart: whole models timed, then estimated.

`measure_models` times every model end to end into the store, one after
another (the `measure` command); `estimate_models` cuts every model at one
G and estimates it from the brick timings the store holds, and
`estimate_plans` does so for models given as decompositions or recipes
(the `estimate` command, with or without models). Estimates that cover a
model by bricks of several G, or predict the bricks never timed, are
`dlbricks_tf.estimating.beyond.cover_and_predict`'s.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

from dlbricks_tf.estimating import estimate as estimate_lib
from dlbricks_tf.estimating.rows import estimate_row
from dlbricks_tf.measuring import sampling
from dlbricks_tf.models.sources import ModelSource
from dlbricks_tf.running.job import Progress
from dlbricks_tf.stats import Timing


def measure_models(
    sources: Sequence[ModelSource],
    settings,
    fingerprint,
    store,
    options=None,
    *,
    safe_mode: bool = True,
    check_settings: bool = True,
    progress: Progress | None = None,
    onnx_folder: str | os.PathLike | None = None,
    scale: Any = None,
) -> dict[str, Timing]:
    """Times every model end to end, one after another, into the store.

    A model with `input_shapes` is timed at them, and stored under its
    name, which names them ("bert@128"). On ONNX Runtime each model is
    converted to `onnx_folder` first, and timed by the timer `run` uses
    (`brick_timing.model_timer`). With a `scale`
    (`dlbricks_tf.measuring.reference.ReferenceScale`), every batch of
    samples is scaled to the machine's reference state, as `run` and
    `bench` scale theirs.

    Returns:
        {model: timing}, in order.
    """
    import keras

    from dlbricks_tf.measuring import brick_timing

    if settings.backend == "onnxruntime" and onnx_folder is None:
        raise ValueError(
            "ONNX Runtime times ONNX files: pass onnx_folder, where the "
            "models' files are kept."
        )
    measured = {}
    for i, source in enumerate(sources):
        keras.backend.clear_session()
        model = source.build(safe_mode)
        runnable = model
        if settings.backend == "onnxruntime":
            runnable = brick_timing.model_onnx_file(
                model, onnx_folder, source.name, settings.batch_size
            )
        timer = brick_timing.model_timer(
            runnable,
            settings,
            options,
            check_settings=check_settings,
            input_shapes=source.shapes,
            scale=scale,
        )
        measured[source.name] = sampling.time_interleaved([timer])[0]
        store.put_model(
            source.name, settings, fingerprint, measured[source.name]
        )
        if progress is not None:
            progress(source.name, i + 1, len(sources))
        del model, runnable, timer
    return measured


def estimate_models(
    sources: Sequence[ModelSource],
    granularity: int,
    settings,
    fingerprint,
    store,
    mode: str = "sequential",
    *,
    safe_mode: bool = True,
    fuse: bool = False,
) -> list[dict[str, Any]]:
    """Estimates every model from the store's brick timings.

    `fuse` cuts the models as `run_granularity` did with it; each model
    is cut at its own `input_shapes`.

    Returns:
        The rows of `estimate_plans`, one per model.

    Raises:
        MissingResultsError: A model has bricks without a timing (those
            recorded as failed are named with their reasons).
    """
    plans = (
        (source.name, source.decompose(granularity, safe_mode, fuse))
        for source in sources
    )
    return estimate_plans(plans, settings, fingerprint, store, mode)


def estimate_plans(
    plans: Iterable[tuple[str, Any]],
    settings,
    fingerprint,
    store,
    mode: str = "sequential",
) -> list[dict[str, Any]]:
    """Estimates models from the store's brick timings, one row each.

    Args:
        plans: (model name, plan) pairs, read one at a time; a plan is a
            `Decomposition` or a `dlbricks_tf.portable.recipe.Recipe` (no model
            needed).
        settings: The `RunSettings` whose timings are read.
        fingerprint: The machine whose timings are read.
        store: The `Store`.
        mode: "sequential" or "parallel" (see
            `dlbricks_tf.estimating.estimate`).

    Returns:
        One row per model: model, granularity, mode, estimated_ms, low_ms,
        high_ms, bricks, noisy_bricks, and measured_ms, measured_noisy and
        normalized when the store holds an end-to-end timing (else None).

    Raises:
        MissingResultsError: A model has bricks without a timing (those
            recorded as failed are named with their reasons).
    """
    results = store.results(settings, fingerprint)
    failures = store.failures(settings, fingerprint)
    rows = []
    for name, plan in plans:
        est = estimate_lib.estimate(plan, results, mode, failures=failures)
        measured = store.get_model(name, settings, fingerprint)
        rows.append(estimate_row(name, plan.granularity, est, measured))
    return rows
