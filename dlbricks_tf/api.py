"""The whole job from Python, in a few calls: time, measure, estimate.

`run` does what `dlbricks run` does: cut the models, time the unique bricks
the store lacks and every whole model in interleaved rounds, and estimate
each model from its bricks. `measure` times whole models alone; `estimate`
rebuilds models from the bricks a store already holds (no timing). Each
returns typed values (`ModelResult`, `stats.Timing`), and each fixes
TensorFlow's thread pools for the caller first (`configure`; a clear
`ThreadPoolError` when TensorFlow already runs with other sizes).

Models are `keras.applications` names, model files (`.keras`, `.h5`,
config `.json`) or `ModelSource`s; results go to the SQLite store at `db`
(created if absent), keyed by settings and machine, so a second call
reuses every brick already timed.

Example:
    import dlbricks_tf

    results = dlbricks_tf.run(["MobileNetV2", "ResNet50"], db="s.sqlite")
    for r in results:
        print(r.model, r.measured_ms, r.estimated_ms, r.normalized)
    rows = dlbricks_tf.estimate(["MobileNetV2"], db="s.sqlite")
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from typing import Any

from dlbricks_tf.machine import process as process_lib
from dlbricks_tf.machine import settings as settings_lib
from dlbricks_tf.machine.fingerprint import system_fingerprint
from dlbricks_tf.measuring import sampling
from dlbricks_tf.models import sources as sources_lib
from dlbricks_tf.running import job, steps
from dlbricks_tf.stats import Timing
from dlbricks_tf.storing.store import Store

# A model as the calls take it: a name, a file path or a `ModelSource`.
Model = str | os.PathLike | sources_lib.ModelSource


@dataclasses.dataclass(frozen=True)
class ModelResult:
    """One model at one G: measured against estimated.

    Attributes:
        model: The model's name.
        granularity: G.
        measured_ms: Its end-to-end latency (the mean of its samples), or
            None when `estimate` found no end-to-end timing in the store.
        estimated_ms: The sum of its bricks' latencies (nan if a brick
            failed).
        low_ms: Lower bound of the estimate's range: from `run`, the
            bricks' 95% precision and the machine's variation seen in the
            run's other models, in quadrature
            (`dlbricks_tf.estimating.ranges`); from `estimate`, every
            brick at the low end of its 95% interval at once.
        high_ms: Upper bound.
        normalized: estimated / measured (None without a measurement).
        failed_bricks: {signature: reason} of its bricks that could not
            be built or timed.
        range_flag: Why the range is wider than +-10% ("" if it is not,
            or if only the bricks' bounds are known).
        predicted_share: The share of the estimate that predicted bricks
            make (under a `budget_s`; 0 when every brick was timed).
    """

    model: str
    granularity: int
    measured_ms: float | None
    estimated_ms: float
    low_ms: float
    high_ms: float
    normalized: float | None
    failed_bricks: dict[str, str] = dataclasses.field(default_factory=dict)
    range_flag: str = ""
    predicted_share: float = 0.0

    @property
    def within(self) -> bool:
        """Whether the estimate is within 10% of the measurement."""
        n = self.normalized
        return n is not None and not math.isnan(n) and 0.9 <= n <= 1.1


def configure(
    *,
    batch_size: int = 1,
    intra_op_threads: int | None = None,
    inter_op_threads: int = 1,
    backend: str = "tf",
) -> settings_lib.RunSettings:
    """Run settings for this machine, with TensorFlow's pools fixed to them.

    Args:
        batch_size: Batch dimension of the synthetic inputs.
        intra_op_threads: Threads one op may use (None: physical cores).
        inter_op_threads: Ops that may run at once.
        backend: "tf" or "onnxruntime" (whose sessions take the threads,
            each on pools of its own, see
            `dlbricks_tf.measuring.ort_session.session_options`).

    Raises:
        ThreadPoolError: TensorFlow already runs with other pool sizes
            (start a new process, or ask for the sizes in force).
    """
    chosen = settings_lib.RunSettings.default(
        batch_size,
        intra_op_threads=intra_op_threads,
        inter_op_threads=inter_op_threads,
    )
    process_lib.configure_threads(
        chosen.intra_op_threads, chosen.inter_op_threads
    )
    if backend == chosen.backend:
        return chosen
    return dataclasses.replace(chosen, backend=backend, protocol=None)


def run(
    models: Sequence[Model],
    *,
    db: str | os.PathLike,
    granularity: int | Sequence[int] = 1,
    settings: settings_lib.RunSettings | None = None,
    fuse: bool = False,
    onnx_folder: str | os.PathLike | None = None,
    reference: bool = True,
    budget_s: float | None = None,
    probe_count: int | None = None,
) -> list[ModelResult]:
    """Times the models' unique bricks and the models; estimates each.

    Args:
        models: Names, model files or `ModelSource`s.
        db: The store file.
        granularity: One G or several (one result per model and G).
        settings: From `configure()` (default: this machine's).
        fuse: Keep fusion units whole (see `dlbricks_tf.decompose`).
        onnx_folder: Where ONNX files are kept on ONNX Runtime (default:
            an `onnx` folder beside `db`).
        reference: Scale every batch of samples to the machine's
            reference state, as `dlbricks run` does by default
            (`dlbricks_tf.measuring.reference`); False: raw times.
        budget_s: Time the bricks within this many seconds, the probes
            first and the others predicted, as `dlbricks run --budget`
            (`dlbricks_tf.running.budget`; TF only); None: every brick.
        probe_count: Under a budget, the probes timed first if the store
            lacks them (default: all of them, about 4 min; `--probe_count`).

    Returns:
        One `ModelResult` per model and G, in order.

    Raises:
        ModelSourceError: A name or file that is not a model.
        StoreError: The store cannot be used.
        MeasurementError: A whole model cannot be timed.
    """

    chosen = settings or configure()
    gs = [granularity] if isinstance(granularity, int) else list(granularity)
    options, brick_options = _options(chosen)
    folder = onnx_folder or _onnx_folder(db)
    with Store(db) as store:
        report, _ = job.run_job(
            _sources(models),
            gs,
            chosen,
            store,
            options,
            brick_options,
            fuse=fuse,
            onnx_folder=folder,
            reference=reference,
            budget_s=budget_s,
            probe_count=probe_count,
        )
    return [_result(row) for row in report["runs"]]


def measure(
    models: Sequence[Model],
    *,
    db: str | os.PathLike,
    settings: settings_lib.RunSettings | None = None,
    onnx_folder: str | os.PathLike | None = None,
    reference: bool = True,
) -> dict[str, Timing]:
    """Times whole models into the store; returns {model: timing}.

    `reference` as in `run`: on by default, as for `dlbricks measure`.
    """

    chosen = settings or configure()
    options, _ = _options(chosen)
    folder = onnx_folder or _onnx_folder(db)
    fingerprint = system_fingerprint()
    with Store(db) as store:
        scale = None
        if reference:
            from dlbricks_tf.measuring import reference as reference_lib

            scale = reference_lib.ReferenceScale.for_store(
                reference_lib.Reference(), store, chosen, fingerprint
            )
        return steps.measure_models(
            _sources(models),
            chosen,
            fingerprint,
            store,
            options,
            onnx_folder=folder,
            scale=scale,
        )


def estimate(
    models: Sequence[Model],
    *,
    db: str | os.PathLike,
    granularity: int = 1,
    mode: str = "sequential",
    settings: settings_lib.RunSettings | None = None,
    fuse: bool = False,
) -> list[ModelResult]:
    """Estimates models from the bricks a store holds, timing nothing.

    On ONNX Runtime (`settings.backend`), each model is converted to the
    `onnx` folder beside `db` to read the NCHWc reorders its graph runs,
    added as `run` adds them.

    Raises:
        MissingResultsError: A model has bricks the store lacks.
    """

    chosen = settings or settings_lib.RunSettings.default()
    with Store(db) as store:
        rows = steps.estimate_models(
            _sources(models),
            granularity,
            chosen,
            system_fingerprint(),
            store,
            mode,
            fuse=fuse,
            onnx_folder=_onnx_folder(db),
        )
    return [_result(r, "low_ms", "high_ms") for r in rows]


def _sources(models: Sequence[Model]) -> list[sources_lib.ModelSource]:
    """`ModelSource`s of names, paths and sources, in order."""
    if isinstance(models, str | os.PathLike):
        models = [models]
    out = []
    for m in models:
        if isinstance(m, sources_lib.ModelSource):
            out.append(m)
        else:
            out += sources_lib.resolve_models([os.fspath(m)])
    return out


def _onnx_folder(db: str | os.PathLike) -> str:
    """The `onnx` folder beside a store file."""
    return os.path.join(os.path.dirname(db) or ".", "onnx")


def _options(chosen: settings_lib.RunSettings) -> tuple[Any, Any]:

    return sampling.model_and_brick_options(
        chosen.protocol, brick_min_samples=sampling.BRICK_MIN_SAMPLES
    )


def _result(
    row: dict[str, Any],
    low: str = "estimated_low_ms",
    high: str = "estimated_high_ms",
) -> ModelResult:
    """A report row (`rows.model_row`, or with `low`/`high` named as in
    `rows.estimate_row`) as a `ModelResult`."""
    return ModelResult(
        model=row["model"],
        granularity=row["granularity"],
        measured_ms=row["measured_ms"],
        estimated_ms=row["estimated_ms"],
        low_ms=row[low],
        high_ms=row[high],
        normalized=row["normalized"],
        failed_bricks=dict(row.get("failed_bricks") or {}),
        range_flag=row.get("range_flag") or "",
        predicted_share=row.get("predicted_share") or 0.0,
    )
