"""The whole DLBricks job: models in, measured vs estimated latency out.

For each granularity G: decompose every model, collect the unique bricks,
then per model time the whole model and its bricks not yet timed in
interleaved rounds (one sample of each per round, so that the ratio
estimate / measured compares measurements taken close together in time on
a noisy machine), store every result as it finishes, and rebuild each
model's latency from its bricks (sequential and parallel). The command
line's `run` and `benchmarks/accuracy.py` both call `run_granularity`.

Models are named by `resolve_models`: `keras.applications` names or model
files (`.keras`, `.h5`, config `.json`). Resolving does not import
TensorFlow, so a caller can check names before fixing the thread pools.

Example:
    configure_threads(settings.intra_op_threads, settings.inter_op_threads)
    sources = resolve_models(["MobileNetV2", "my_model.keras"])
    with Store("store.sqlite") as store:
        report = run_job(sources, [1], settings, store)
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dlbricks_tf import corpus, errors
from dlbricks_tf.split import split_name
from dlbricks_tf.stats import Timing

# The default corpus of `run`: three families (inverted residuals, residual
# bottlenecks, squeeze-and-excitation) that share many bricks at G=1 and
# finish in 2-4 minutes on a 2-core machine.
DEFAULT_MODELS = ("MobileNetV2", "ResNet50", "EfficientNetB0")
MODEL_FILE_SUFFIXES = (".keras", ".h5", ".hdf5", ".json")

# progress(model, done, total): timers finished so far at this G.
Progress = Callable[[str, int, int], None]


class ModelSourceError(errors.Error):
    """A model given by name or path cannot be found or loaded."""


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """A model named on the command line: an application or a file.

    Attributes:
        name: The name in reports and in the store (the application's name,
            or the file's stem).
        path: The model file, or None for a `keras.applications` name.
    """

    name: str
    path: str | None = None

    def build(self, safe_mode: bool = True):
        """Returns the runnable `keras.Model` (weights are not needed).

        Raises:
            ModelSourceError: If the file cannot be loaded.
            LoadError: If the file is unreadable or over a limit of
                `dlbricks_tf.limits`.
        """
        if self.path is None:
            return corpus.application(self.name)
        import keras

        from dlbricks_tf import loading

        # The file's sizes, nesting and layer count are checked first (see
        # dlbricks_tf.limits): Keras reads whatever the file holds.
        try:
            config = loading.read_config(self.path)
        except errors.Error as e:
            raise ModelSourceError(str(e)) from e
        try:
            if self.path.endswith(".json"):
                return keras.saving.deserialize_keras_object(
                    config, safe_mode=safe_mode
                )
            return keras.saving.load_model(
                self.path, compile=False, safe_mode=safe_mode
            )
        except Exception as e:  # Keras raises many types for bad files.
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            hint = ""
            if "Could not locate" in first:  # An unregistered custom class.
                hint = (
                    " Import the module that registers it first "
                    "(--import=your.module on the command line)."
                )
            raise ModelSourceError(
                f"Cannot load model file {self.path!r}: "
                f"{type(e).__name__}: {first}{hint}"
            ) from e

    def decompose(
        self,
        granularity: int,
        safe_mode: bool = True,
        fuse: bool = False,
        *,
        input_shapes=None,
    ):
        """Decomposes the model; a file is read for its config only.

        `fuse` keeps fusion units whole and `input_shapes` fixes open input
        dimensions (see `dlbricks_tf.decompose`).
        """
        from dlbricks_tf.decompose import decompose

        target = self.path if self.path is not None else self.build()
        return decompose(
            target,
            granularity,
            safe_mode=safe_mode,
            fuse=fuse,
            input_shapes=input_shapes,
        )


def resolve_models(specs: Sequence[str]) -> list[ModelSource]:
    """Turns names and paths into model sources, without importing Keras.

    Args:
        specs: `keras.applications` names (e.g. "ResNet50") or paths of
            `.keras`, `.h5` or config `.json` files.

    Returns:
        One source per spec, in order; files named by their stem, made
        unique with a suffix ("model", "model-2") when stems repeat.

    Raises:
        ModelSourceError: If there is no spec, a file does not exist, or a
            name is not an application.
    """
    if not specs:
        raise ModelSourceError(
            "No models given: pass --models with keras.applications names "
            "or model file paths."
        )
    sources: list[ModelSource] = []
    taken: set[str] = set()
    for spec in specs:
        spec = spec.strip()
        if spec in corpus.APPLICATIONS:
            name, path = spec, None
        elif spec.lower().endswith(MODEL_FILE_SUFFIXES) or os.sep in spec:
            if not os.path.isfile(spec):
                raise ModelSourceError(
                    f"Model file {spec!r} does not exist: check the path "
                    "given to --models."
                )
            name, path = Path(spec).stem, spec
        else:
            raise ModelSourceError(
                f"Unknown model {spec!r}: use a keras.applications name "
                f"such as ResNet50 (see --helpfull) or the path of a "
                f"{'/'.join(MODEL_FILE_SUFFIXES)} file."
            )
        unique, n = name, 1
        while unique in taken:
            n += 1
            unique = f"{name}-{n}"
        taken.add(unique)
        sources.append(ModelSource(unique, path))
    return sources


def geomean(values: Sequence[float]) -> float:
    """Geometric mean of positive values (nan if there is none)."""
    if not values:
        return float("nan")
    return math.exp(sum(math.log(v) for v in values) / len(values))


@dataclasses.dataclass
class GranularityResult:
    """What `run_granularity` measured at one G.

    Attributes:
        runs: One report row per model (see `run_granularity`).
        corpus: The report's corpus row for this G.
        decompositions: {model: decomposition}.
        suite: The unique bricks, with counts.
        results: {signature: timing} of every brick of the suite.
        measured: {model: end-to-end timing}.
        remeasured: Bricks timed twice because the first timing did not
            settle (the more precise one is stored; noisy if neither
            settled).
    """

    runs: list[dict[str, Any]]
    corpus: dict[str, Any]
    decompositions: dict[str, Any]
    suite: Any
    results: dict[str, Timing]
    measured: dict[str, Timing]
    remeasured: tuple[str, ...] = ()


def run_granularity(
    sources: Sequence[ModelSource],
    granularity: int,
    settings,
    fingerprint,
    store,
    options=None,
    brick_options=None,
    *,
    reuse_stored: bool = True,
    safe_mode: bool = True,
    check_settings: bool = True,
    progress: Progress | None = None,
    log: Callable[[str], None] | None = None,
    fuse: bool = False,
) -> GranularityResult:
    """Measures every model and its bricks at one G, and estimates.

    Every model is decomposed first (so the work is known), then built
    again, one at a time, to be timed: memory stays flat over a corpus.

    Args:
        sources: The models.
        granularity: G.
        settings: `RunSettings` in force in this process.
        fingerprint: This machine's `SystemFingerprint`.
        store: The `Store`; every result is written as it finishes.
        options: `TimingOptions` of whole models.
        brick_options: `TimingOptions` of bricks (default: `options`).
        reuse_stored: Skip bricks the store already holds (settled) for
            these settings and machine; False times every brick afresh.
        safe_mode: Refuse Lambda layers from model files.
        check_settings: Verify `settings` against the process first.
        progress: Called with (model, timers done, timers total of this G)
            as each brick or model finishes.
        log: Called with one line per model.
        fuse: Keep fusion units whole (see `dlbricks_tf.decompose`).

    Returns:
        The rows of report.json (`runs`, `corpus`) and what they came from.

    Raises:
        dlbricks_tf.Error: A model cannot be loaded, decomposed or timed.
    """
    import keras

    from dlbricks_tf import bench, campaign, timing
    from dlbricks_tf import estimate as estimate_lib
    from dlbricks_tf import suite as suite_lib

    brick_options = brick_options or options
    log = log or (lambda line: None)
    # "setup" is the campaign's part that no sampling cap shortens:
    # decomposing, building, and each brick timer's trace and warm-up.
    clock = {"campaign": 0.0, "end_to_end": 0.0, "setup": 0.0}
    setup = ("campaign", "setup")

    def timed(keys, fn, *args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            for key in (keys,) if isinstance(keys, str) else keys:
                clock[key] += time.perf_counter() - start

    from dlbricks_tf.decompose import decompose

    decompositions = {}
    for source in sources:
        # Building an application is not part of the campaign: a file's
        # config is read by decompose itself.
        target = source.path or source.build(safe_mode)
        decompositions[source.name] = timed(
            setup,
            decompose,
            target,
            granularity,
            safe_mode=safe_mode,
            fuse=fuse,
        )
        del target
        keras.backend.clear_session()
    suite = suite_lib.build_suite(decompositions)
    results: dict[str, Timing] = {}
    if reuse_stored:
        stored = store.results(settings, fingerprint, accept_noisy=False)
        results = {s: stored[s] for s in suite.signatures if s in stored}
    total = len(sources) + len(suite) - len(results)
    done = [0]
    if progress is not None and sources:
        progress(sources[0].name, 0, total)
    measured: dict[str, Timing] = {}
    first_noisy: dict[str, Timing] = {}  # First timings of re-measured ones.
    # {model: {signature: count}}: the estimates a chain's precision serves.
    weights: dict[str, dict[str, int]] = {}
    for entry in suite.entries:
        for name, count in entry.counts:
            weights.setdefault(name, {})[entry.signature] = count

    def finished(name: str) -> None:
        done[0] += 1
        if progress is not None:
            progress(name, done[0], total)

    def commit(name: str, key: str, result: Timing) -> None:
        results[key] = result  # Commit each brick as it finishes.
        store.put(key, settings, fingerprint, result)
        finished(name)

    class ModelRounds:
        """Samples the whole model once per round of its bricks.

        The whole model keeps sampling for as long as any of its bricks
        does, so its median covers the same stretch of time as theirs (the
        machine drifts); samples past its own stopping point serve only
        that comparison, and are charged to neither wall clock.
        """

        def __init__(self, name: str, timer: timing.Timer) -> None:
            self.name, self.timer, self.counted = name, timer, False

        def __call__(self) -> None:
            if self.counted:
                self.timer.sample()
                return
            timed("end_to_end", self.timer.sample)
            if self.timer.done:
                self.counted = True
                finished(self.name)

        def finish(self) -> None:
            while not self.counted:
                self()

    def time_looped(name, d, rounds: ModelRounds) -> int:
        brick_timers = {}
        for brick in d.bricks:
            if brick.signature in results or brick.signature in brick_timers:
                continue
            built = timed(setup, brick.build, settings.batch_size)
            brick_timers[brick.signature] = timed(
                setup,
                timing.Timer,
                built,
                settings,
                brick_options,
                check_settings=check_settings,
            )
        pending = list(brick_timers.items())
        # Interleaved rounds: one batch of samples of each timer per round.
        # A brick that stops unsettled is measured once more (fresh
        # samples), in the same rounds, before the more precise timing is
        # committed.
        while pending:
            rounds()
            for _, timer in pending:
                timed("campaign", timer.sample)
            left = []
            for key, timer in pending:
                if not timer.done:
                    left.append((key, timer))
                    continue
                result = timer.result()
                if result.noisy and key not in first_noisy:
                    first_noisy[key] = result
                    # Fresh samples, same traced loop (see `restart`).
                    left.append((key, timer.restart()))
                    continue
                if key in first_noisy:
                    result = bench.more_precise(first_noisy[key], result)
                commit(name, key, result)
            pending = left
        clock["setup"] += sum(t.prepare_seconds for t in brick_timers.values())
        return len(brick_timers)

    def time_chained(name, d, rounds: ModelRounds) -> int:
        fresh: dict[str, campaign.ChainedBrick] = {}
        for brick in d.bricks:
            if brick.signature not in results:
                fresh.setdefault(
                    brick.signature,
                    campaign.ChainedBrick(
                        brick.signature,
                        functools.partial(brick.build, settings.batch_size),
                    ),
                )
        order = campaign.ordered(
            list(fresh.values()), brick_options.chain_order, brick_options.seed
        )
        summary = campaign.time_chains(
            order,
            settings,
            brick_options,
            weights=weights,
            known=results,
            between=rounds,
            on_result=functools.partial(commit, name),
            check_settings=check_settings,
        )
        clock["setup"] += summary.setup_s
        clock["campaign"] += summary.setup_s + summary.sampling_s
        return len(fresh)

    runs = []
    for source in sources:
        keras.backend.clear_session()
        d = decompositions[source.name]
        model = source.build(safe_mode)
        model_timer = timed(
            "end_to_end",
            timing.Timer,
            model,
            settings,
            options,
            check_settings=check_settings,
        )
        rounds = ModelRounds(source.name, model_timer)
        if settings.protocol == "chain":
            new_bricks = time_chained(source.name, d, rounds)
        else:
            new_bricks = time_looped(source.name, d, rounds)
        rounds.finish()
        measured[source.name] = model_timer.result()
        store.put_model(
            source.name, settings, fingerprint, measured[source.name]
        )
        runs.append(
            _row(source.name, granularity, settings, measured, results, d)
        )
        runs[-1]["new_unique_bricks"] = new_bricks
        row = runs[-1]
        log(
            f"G={granularity} {source.name}: measured "
            f"{row['measured_ms']:.3f} ms, estimated "
            f"{row['estimated_ms']:.3f} ms (x{row['normalized']:.3f}, "
            f"+-{100 * row['estimate_precision']:.1f}%), "
            f"{row['bricks']} bricks, {new_bricks} timed"
        )
        del model, model_timer, rounds
    normalized = [r["normalized"] for r in runs]
    corpus_row = {
        "granularity": granularity,
        "geomean_normalized": geomean(normalized),
        "min_normalized": min(normalized),
        "max_normalized": max(normalized),
        "speedup": estimate_lib.speedup(
            {n: t.median_ms for n, t in measured.items()},
            {s: results[s].median_ms for s in suite.signatures},
        ),
        "split": split_name(fuse),
        "campaign_wall_s": clock["campaign"],
        "campaign_setup_s": clock["setup"],
        "bricks_timed": total - len(sources),
        "end_to_end_wall_s": clock["end_to_end"],
        "unique_bricks": len(suite),
        "total_bricks": suite.total_bricks,
    }
    return GranularityResult(
        runs,
        corpus_row,
        decompositions,
        suite,
        results,
        measured,
        tuple(first_noisy),
    )


def _row(name, g, settings, measured, results, d) -> dict[str, Any]:
    from dlbricks_tf import estimate as estimate_lib
    from dlbricks_tf import precision

    seq = estimate_lib.estimate(d, results, "sequential")
    par = estimate_lib.estimate(d, results, "parallel")
    m = measured[name]
    return {
        "model": name,
        "granularity": g,
        "split": split_name(d.fuse),
        "batch_size": settings.batch_size,
        "measured_ms": m.median_ms,
        "estimated_ms": seq.ms,
        "estimated_parallel_ms": par.ms,
        "normalized": seq.ms / m.median_ms if m.median_ms > 0 else math.inf,
        # The same ratio from minima: robust to a machine's slow phases.
        "normalized_min": (
            estimate_lib.estimate(d, results, statistic="min").ms / m.min_ms
            if m.min_ms > 0
            else math.inf
        ),
        "estimated_low_ms": seq.low_ms,
        "estimated_high_ms": seq.high_ms,
        "measured_noisy": m.noisy,
        "dispatch_ms": m.dispatch_ms,
        "noisy_bricks": len(seq.noisy_signatures),
        "bricks": seq.bricks,
        # The relative half-width the bricks' intervals leave the estimate.
        "estimate_precision": precision.estimate_precision(
            collections.Counter(b.signature for b in d.bricks), results
        ),
        # How the estimate was obtained (see dlbricks_tf.beyond).
        "method": "timed",
        "sources": {s.label: s.share for s in seq.sources},
    }


def new_report(fingerprint, settings, brick_options=None) -> dict[str, Any]:
    """An empty report.json: system, settings, options, no rows yet."""
    return {
        "system": {**fingerprint.to_dict(), "id": fingerprint.id},
        "settings": settings.to_dict(),
        "options": (
            dataclasses.asdict(brick_options) if brick_options else None
        ),
        "runs": [],
        "corpus": [],
    }


def run_job(
    sources: Sequence[ModelSource],
    granularities: Sequence[int],
    settings,
    store,
    options=None,
    brick_options=None,
    *,
    fingerprint=None,
    report_path: str | os.PathLike | None = None,
    reuse_stored: bool = True,
    safe_mode: bool = True,
    check_settings: bool = True,
    progress: Progress | None = None,
    log: Callable[[str], None] | None = None,
    fuse: bool = False,
) -> tuple[dict[str, Any], dict[int, GranularityResult]]:
    """Runs `run_granularity` for every G; returns the report and details.

    Args:
        sources: The models.
        granularities: The values of G, in order.
        settings: `RunSettings` in force in this process.
        store: The `Store`.
        options: `TimingOptions` of whole models.
        brick_options: `TimingOptions` of bricks (default: `options`).
        fingerprint: This machine's fingerprint (taken if None).
        report_path: Where to write report.json, rewritten after every G
            so a stopped run keeps what it did; None writes nothing.
        reuse_stored, safe_mode, check_settings, progress, log, fuse: As
            in `run_granularity`.

    Returns:
        (report, {G: GranularityResult}); the report as in report.json.
    """
    from dlbricks_tf.fingerprint import system_fingerprint

    fingerprint = fingerprint or system_fingerprint()
    report = new_report(fingerprint, settings, brick_options or options)
    details = {}
    for g in granularities:
        result = run_granularity(
            sources,
            g,
            settings,
            fingerprint,
            store,
            options,
            brick_options,
            reuse_stored=reuse_stored,
            safe_mode=safe_mode,
            check_settings=check_settings,
            fuse=fuse,
            progress=progress,
            log=log,
        )
        details[g] = result
        report["runs"] += result.runs
        report["corpus"].append(result.corpus)
        if report_path is not None:
            write_report(report, report_path)
    return report, details


def write_report(report: Mapping[str, Any], path: str | os.PathLike) -> None:
    """Writes report.json (non-finite numbers as null)."""
    Path(path).write_text(json.dumps(_finite(report), indent=1))


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


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
) -> dict[str, Timing]:
    """Times every model end to end, one after another, into the store.

    Returns:
        {model: timing}, in order.
    """
    import keras

    from dlbricks_tf import timing

    measured = {}
    for i, source in enumerate(sources):
        keras.backend.clear_session()
        model = source.build(safe_mode)
        measured[source.name] = timing.time_model(
            model, settings, options, check_settings=check_settings
        )
        store.put_model(
            source.name, settings, fingerprint, measured[source.name]
        )
        if progress is not None:
            progress(source.name, i + 1, len(sources))
        del model
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

    `fuse` cuts the models as `run_granularity` did with it.

    Returns:
        One row per model: model, granularity, mode, estimated_ms, low_ms,
        high_ms, bricks, noisy_bricks, and measured_ms, measured_noisy and
        normalized when the store holds an end-to-end timing (else None).

    Raises:
        MissingResultsError: A model has bricks without a timing (those
            recorded as failed are named with their reasons).
    """
    from dlbricks_tf import estimate as estimate_lib

    results = store.results(settings, fingerprint)
    failures = store.failures(settings, fingerprint)
    rows = []
    for source in sources:
        d = source.decompose(granularity, safe_mode, fuse)
        est = estimate_lib.estimate(d, results, mode, failures=failures)
        measured = store.get_model(source.name, settings, fingerprint)
        m = measured.median_ms if measured else None
        rows.append(
            {
                "model": source.name,
                "granularity": granularity,
                "mode": mode,
                "estimated_ms": est.ms,
                "low_ms": est.low_ms,
                "high_ms": est.high_ms,
                "bricks": est.bricks,
                "noisy_bricks": len(est.noisy_signatures),
                "measured_ms": m,
                "measured_noisy": measured.noisy if measured else None,
                "normalized": est.ms / m if m else None,
            }
        )
    return rows
