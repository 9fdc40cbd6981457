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
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
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


def layout_ms(
    sources: Sequence[ModelSource],
    settings,
    fingerprint,
    store,
    onnx_folder: str | os.PathLike,
    *,
    safe_mode: bool = True,
    log: Callable[[str], None] | None = None,
) -> dict[str, float]:
    """ONNX Runtime: {model: ms} of the NCHWc reorders its graph runs,
    priced at the store's (`dlbricks_tf.measuring.ort_layout`), as `run`
    adds them to its estimates. Each model is converted to `onnx_folder`
    to read them; one that cannot be converted or read gets none, in a
    line to `log` (None: a warning).
    """
    import keras

    from dlbricks_tf.measuring import brick_timing, ort_layout

    known = ort_layout.known_ms(
        store.results(settings, fingerprint, layout=True)
    )
    out = {}
    for source in sources:
        keras.backend.clear_session()
        try:
            model_file = brick_timing.model_onnx_file(
                source.build(safe_mode),
                onnx_folder,
                source.name,
                settings.batch_size,
            )
            counts = ort_layout.model_reorders(
                model_file.path, settings, model_file.id_bounds
            )
        except Exception as e:  # tf2onnx and ORT raise many types.
            line = f"{source.name}: its reorders not read, none added: {e}"
            if log is not None:
                log(line)
            else:
                warnings.warn(line, stacklevel=2)
            continue
        out[source.name] = ort_layout.price(counts, known).ms
    return out


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
    onnx_folder: str | os.PathLike | None = None,
) -> list[dict[str, Any]]:
    """Estimates every model from the store's brick timings.

    `fuse` cuts the models as `run_granularity` did with it; each model
    is cut at its own `input_shapes`. On ONNX Runtime with an
    `onnx_folder`, each model's NCHWc reorders are added as `run` adds
    them (`layout_ms`, the model converted there).

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
    extra = None
    if settings.backend == "onnxruntime" and onnx_folder is not None:
        extra = layout_ms(
            sources,
            settings,
            fingerprint,
            store,
            onnx_folder,
            safe_mode=safe_mode,
        )
    return estimate_plans(plans, settings, fingerprint, store, mode, extra)


def estimate_plans(
    plans: Iterable[tuple[str, Any]],
    settings,
    fingerprint,
    store,
    mode: str = "sequential",
    extra_ms: Mapping[str, float] | None = None,
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
        extra_ms: {model: ms} added once to its estimate (on ONNX Runtime
            its reorders, `layout_ms`).

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
        est = estimate_lib.estimate(
            plan,
            results,
            mode,
            failures=failures,
            call_overhead_ms=(extra_ms or {}).get(name, 0.0),
        )
        measured = store.get_model(name, settings, fingerprint)
        rows.append(estimate_row(name, plan.granularity, est, measured))
    return rows
