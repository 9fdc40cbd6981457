r"""Accuracy and speed-up of DLBricks on a corpus of keras.applications models.

For each granularity G and each model: decompose the model, then time the
whole model and its bricks not yet timed at this G in interleaved rounds
(one sample of each per round), so that the ratio estimate / measured
compares measurements taken close together in time. Writes `report.json`
and prints a Markdown table.

Figures, per G: geometric mean, min and max of the normalized latency
(sequential estimate / measured end to end), the paper's speed-up (sum of
end-to-end latencies / sum of unique-brick latencies), and the wall-clock
time of the brick campaign (decomposing, building and timing the unique
bricks) against that of timing every model end to end (building the timer
and sampling), both with the same protocol in the same run; and the median
relative difference of --recheck bricks timed a second time.

Every G times its unique bricks afresh; results are written to the store
(for export), not read from it.

Usage:
    python -m benchmarks.accuracy --models=ResNet50,MobileNetV2 \
        --granularities=1 --out=dlbricks_out/accuracy
"""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import os
import time
from pathlib import Path

from absl import app, flags, logging

_DEFAULT_MODELS = [
    "VGG16",
    "ResNet50",
    "ResNet50V2",
    "InceptionV3",
    "Xception",
    "MobileNet",
    "MobileNetV2",
    "MobileNetV3Small",
    "DenseNet121",
    "EfficientNetB0",
    "EfficientNetV2B0",
    "ConvNeXtTiny",
    "NASNetMobile",
]

_MODELS = flags.DEFINE_list(
    "models", _DEFAULT_MODELS, "keras.applications model names."
)
_ALL = flags.DEFINE_bool(
    "all", False, "Use all keras.applications models (overrides --models)."
)
_GRANULARITIES = flags.DEFINE_list(
    "granularities", ["1", "2", "3", "4", "5", "6"], "Values of G."
)
_BATCH = flags.DEFINE_integer("batch_size", 1, "Batch size.", lower_bound=1)
_INTRA = flags.DEFINE_integer(
    "intra_op_threads", None, "Intra-op threads (default: physical cores).",
    lower_bound=1,
)  # fmt: skip
_INTER = flags.DEFINE_integer(
    "inter_op_threads", 1, "Inter-op threads.", lower_bound=1
)
_PRECISION = flags.DEFINE_float(
    "precision", 0.02, "Relative CI half-width to stop at.", lower_bound=0
)
_MAX_SECONDS = flags.DEFINE_float(
    "max_seconds", 5.0, "Sampling cap per brick or model, seconds."
)
_MAX_SAMPLES = flags.DEFINE_integer(
    "max_samples", 100, "Sampling cap per brick or model.", lower_bound=1
)
_TARGET_MS = flags.DEFINE_float(
    "target_sample_ms", 5.0, "Duration of one sample (K calls), ms."
)
_COPIES = flags.DEFINE_integer(
    "input_copies", 1, "Input copies the loop rotates through.", lower_bound=1
)
_WEIGHT_COPIES = flags.DEFINE_integer(
    "weight_copies",
    1,
    "Fresh copies of each brick the loop rotates through (cold weights).",
    lower_bound=1,
)
_ABSOLUTE_MS = flags.DEFINE_float(
    "absolute_precision_ms",
    0.001,
    "Also stop once the median's CI half-width is below this, ms.",
    lower_bound=0,
)
_RECHECK = flags.DEFINE_integer(
    "recheck",
    10,
    "Bricks per G timed a second time to check repeatability.",
    lower_bound=0,
)
_OUT = flags.DEFINE_string(
    "out", "dlbricks_out/accuracy", "Output folder (report, store)."
)


def _model_names() -> list[str]:
    import keras

    if _ALL.value:
        return sorted(n for n in dir(keras.applications) if n[0].isupper())
    return list(_MODELS.value)


def _build(name: str):
    import keras

    try:
        constructor = getattr(keras.applications, name)
    except AttributeError:
        raise app.UsageError(
            f"Unknown keras.applications model: {name}"
        ) from None
    return constructor(weights=None)


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _timed(clock: dict[str, float], key: str, fn, *args, **kwargs):
    start = time.perf_counter()
    try:
        return fn(*args, **kwargs)
    finally:
        clock[key] += time.perf_counter() - start


def _run_granularity(g, names, settings, fp, options, brick_options, store):
    """Measures every model at one G; returns (runs, corpus row)."""
    import keras

    import dlbricks_tf
    from dlbricks_tf import estimate as estimate_lib
    from dlbricks_tf import suite as suite_lib
    from dlbricks_tf import timing

    clock = {"campaign": 0.0, "end_to_end": 0.0}
    results, measured, decompositions, runs = {}, {}, {}, []
    for name in names:
        keras.backend.clear_session()
        gc.collect()
        model = _build(name)
        d = _timed(clock, "campaign", dlbricks_tf.decompose, model, g)
        decompositions[name] = d
        model_timer = _timed(
            clock, "end_to_end", timing.Timer, model, settings, options
        )
        brick_timers = {}
        for brick in d.bricks:
            if brick.signature in results or brick.signature in brick_timers:
                continue
            built = _timed(clock, "campaign", brick.build, settings.batch_size)
            brick_timers[brick.signature] = _timed(
                clock, "campaign", timing.Timer, built, settings, brick_options
            )
        timers = [("end_to_end", model_timer)]
        timers += [("campaign", t) for t in brick_timers.values()]
        pending = timers
        while pending:  # Interleaved rounds: one sample of each per round.
            for kind, timer in pending:
                _timed(clock, kind, timer.sample)
            pending = [(k, t) for k, t in pending if not t.done]
        for signature, timer in brick_timers.items():
            results[signature] = timer.result()
            store.put(signature, settings, fp, results[signature])
        measured[name] = model_timer.result()
        store.put_model(name, settings, fp, measured[name])
        seq = estimate_lib.estimate(d, results, "sequential")
        par = estimate_lib.estimate(d, results, "parallel")
        row = {
            "model": name,
            "granularity": g,
            "batch_size": settings.batch_size,
            "measured_ms": measured[name].median_ms,
            "estimated_ms": seq.ms,
            "estimated_parallel_ms": par.ms,
            "normalized": seq.ms / measured[name].median_ms,
            "estimated_low_ms": seq.low_ms,
            "estimated_high_ms": seq.high_ms,
            "measured_noisy": measured[name].noisy,
            "dispatch_ms": measured[name].dispatch_ms,
            "noisy_bricks": len(seq.noisy_signatures),
            "bricks": seq.bricks,
            "new_unique_bricks": len(brick_timers),
        }
        runs.append(row)
        logging.info(
            "G=%d %s: measured %.3f ms, estimated %.3f ms (x%.3f), "
            "%d bricks, %d new",
            g, name, row["measured_ms"], row["estimated_ms"],
            row["normalized"], row["bricks"], row["new_unique_bricks"],
        )  # fmt: skip
        del model, model_timer, brick_timers, timers, pending
    suite = suite_lib.build_suite(decompositions)
    repeat = _recheck(suite, results, settings, brick_options)
    normalized = [r["normalized"] for r in runs]
    corpus = {
        "granularity": g,
        "geomean_normalized": _geomean(normalized),
        "min_normalized": min(normalized),
        "max_normalized": max(normalized),
        "speedup": estimate_lib.speedup(
            {n: t.median_ms for n, t in measured.items()},
            {s: results[s].median_ms for s in suite.signatures},
        ),
        "campaign_wall_s": clock["campaign"],
        "end_to_end_wall_s": clock["end_to_end"],
        "unique_bricks": len(suite),
        "total_bricks": suite.total_bricks,
        **repeat,
    }
    return runs, corpus


def _recheck(suite, results, settings, options) -> dict:
    """Times a spread of the suite's bricks again; compares the medians."""
    from dlbricks_tf import timing

    count = min(_RECHECK.value, len(suite))
    if not count:
        return {}
    ordered = sorted(suite.entries, key=lambda e: e.signature)
    step = len(ordered) / count
    diffs = []
    for i in range(count):
        entry = ordered[int(i * step)]
        built = entry.brick.build(settings.batch_size)
        again = timing.time_model(built, settings, options)
        first = results[entry.signature].median_ms
        diffs.append(abs(again.median_ms - first) / first if first else 0.0)
    diffs.sort()
    return {
        "repeat_bricks": count,
        "repeat_median_rel_diff": diffs[len(diffs) // 2],
        "repeat_within_2pct": sum(d <= 0.02 for d in diffs) / count,
    }


def _table(report: dict) -> str:
    lines = [
        "| model | G | measured ms | sequential ms | parallel ms "
        "| normalized |",
        "|---|---|---|---|---|---|",
    ]
    for r in report["runs"]:
        lines.append(
            f"| {r['model']} | {r['granularity']} | {r['measured_ms']:.3f} "
            f"| {r['estimated_ms']:.3f} | {r['estimated_parallel_ms']:.3f} "
            f"| {r['normalized']:.3f} |"
        )
    lines += [
        "",
        "| G | geomean | min | max | speed-up | campaign s | end-to-end s "
        "| repeat diff |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in report["corpus"]:
        lines.append(
            f"| {c['granularity']} | {c['geomean_normalized']:.3f} "
            f"| {c['min_normalized']:.3f} | {c['max_normalized']:.3f} "
            f"| {c['speedup']:.2f} | {c['campaign_wall_s']:.1f} "
            f"| {c['end_to_end_wall_s']:.1f} "
            f"| {c.get('repeat_median_rel_diff', float('nan')):.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    try:
        granularities = [int(g) for g in _GRANULARITIES.value]
    except ValueError:
        raise app.UsageError("--granularities must be integers.") from None
    if any(g < 1 for g in granularities):
        raise app.UsageError("--granularities must be 1 or more.")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # Thread pools first: TensorFlow fixes them at its first op.
    from dlbricks_tf import settings as settings_lib

    settings = settings_lib.RunSettings.default(
        _BATCH.value,
        intra_op_threads=_INTRA.value,
        inter_op_threads=_INTER.value,
    )
    settings_lib.configure_threads(
        settings.intra_op_threads, settings.inter_op_threads
    )
    from dlbricks_tf import timing
    from dlbricks_tf.fingerprint import system_fingerprint
    from dlbricks_tf.store import Store

    options = timing.TimingOptions(
        precision=_PRECISION.value,
        max_samples=_MAX_SAMPLES.value,
        max_seconds=_MAX_SECONDS.value,
        target_sample_ms=_TARGET_MS.value,
        input_copies=_COPIES.value,
        absolute_precision_ms=_ABSOLUTE_MS.value,
    )
    # Weight copies emulate a whole model's cold weights: bricks only.
    brick_options = dataclasses.replace(
        options, weight_copies=_WEIGHT_COPIES.value
    )
    out = Path(_OUT.value)
    out.mkdir(parents=True, exist_ok=True)
    fp = system_fingerprint()
    names = _model_names()
    report = {
        "system": {**fp.to_dict(), "id": fp.id},
        "settings": settings.to_dict(),
        "options": dataclasses.asdict(brick_options),
        "runs": [],
        "corpus": [],
    }
    with Store(out / "store.sqlite") as store:
        for g in granularities:
            runs, corpus = _run_granularity(
                g, names, settings, fp, options, brick_options, store
            )
            report["runs"] += runs
            report["corpus"].append(corpus)
            # Rewrite after every G so a stopped run keeps what it did.
            (out / "report.json").write_text(json.dumps(report, indent=1))
    print(_table(report))
    print(f"\nReport: {out / 'report.json'}")


if __name__ == "__main__":
    app.run(main)
