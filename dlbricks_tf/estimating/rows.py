"""Report rows: models' estimates set against their measurements.

`model_row` is a model's row of report.json (measured against estimated,
sequential and parallel), `corpus_row` the row of the corpus at one G (the
figures over its models), and `estimate_row` a row of the `estimate`
command, which `dlbricks_tf.estimating.beyond` extends with where a
covered or predicted estimate came from. `dlbricks_tf.running.job` builds
them as it runs; scripts that time models their own way build the same rows.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

from dlbricks_tf.cutting.split import split_name
from dlbricks_tf.estimating import estimate as estimate_lib
from dlbricks_tf.estimating import ranges
from dlbricks_tf.measuring import precision
from dlbricks_tf.stats import Timing, geomean

# Bricks a row names as weighing most in its range.
UNCERTAIN_BRICKS = 3


def model_row(
    name: str,
    granularity: int,
    settings,
    measured: Timing,
    results,
    d,
    failed: Mapping[str, str] | None = None,
    predicted: Mapping[str, Timing] | None = None,
    shared: Mapping[str, tuple[str, float]] | None = None,
    layout: Any = None,
) -> dict[str, Any]:
    """One model's row of report.json: measured against estimated.

    Without a timing of every brick there is no estimate (nan).
    With `predicted`, the bricks `results` lacks are taken from it: the
    row then says how many and what share of the estimate were predicted
    (`predicted_bricks`, `predicted_share`, `method` "predicted"), and its
    range holds the predictor's error (`precision.estimate_precision`).

    Args:
        name: The model.
        granularity: G.
        settings: The `RunSettings` it was timed under.
        measured: Its end-to-end timing.
        results: {signature: timing} of the bricks timed.
        d: Its decomposition at G.
        failed: {signature: reason} of the bricks that failed; the row's
            `failed_bricks` holds the model's.
        predicted: {signature: predicted timing} (`Predictor.timing`) of
            bricks never timed (a campaign within a budget,
            `dlbricks_tf.running.budget`); None: every brick is timed.
        shared: {signature: (kind, half-width ms)}: the part of a
            corrected prediction's error its kind shares
            (`BudgetSummary.shared`); the other predicted bricks carry
            the predictor's cross-validated interval.
        layout: On ONNX Runtime, the model's NCHWc reorders priced
            (`dlbricks_tf.measuring.ort_layout.LayoutPrice`): added once to
            every estimate, as a model's cost beyond its layers; the row
            says how many and what they add. None: nothing added.
    """
    failed = failed or {}
    # A predicted brick's minimum is its predicted latency (its interval's
    # low is no sample), so that `normalized_min` is not read low.
    guessed = {
        s: dataclasses.replace(t, min_ms=t.median_ms)
        for s, t in (predicted or {}).items()
        if s not in results
    }
    if guessed:
        results = {**results, **guessed}
    m = measured
    signatures = dict.fromkeys(b.signature for b in d.bricks)
    row = {
        "model": name,
        "granularity": granularity,
        "split": split_name(d.fuse),
        "batch_size": settings.batch_size,
        # The mean (the median for a timing stored without one): what the
        # estimate, a sum of the bricks' means, is compared with.
        "measured_ms": m.center_ms,
        "measured_median_ms": m.median_ms,
        # The 95% interval of the measured mean, for the charts' range.
        "measured_ci_low_ms": m.center_low_ms,
        "measured_ci_high_ms": m.center_high_ms,
        "measured_noisy": m.noisy,
        "dispatch_ms": m.dispatch_ms,
        "bricks": len(d.bricks),
        "failed_bricks": {s: failed[s] for s in signatures if s in failed},
    }
    if any(s not in results for s in signatures):
        nan = math.nan
        return {
            **row,
            "estimated_ms": nan,
            "estimated_parallel_ms": nan,
            "normalized": nan,
            "normalized_median": nan,
            "normalized_min": nan,
            "estimated_low_ms": nan,
            "estimated_high_ms": nan,
            "noisy_bricks": 0,
            "estimate_precision": nan,
        }
    counts = collections.Counter(b.signature for b in d.bricks)
    labels = {s: estimate_lib.PREDICTED for s in signatures if s in guessed}
    extra = layout.ms if layout is not None else 0.0
    estimate = functools.partial(
        estimate_lib.estimate, d, results, call_overhead_ms=extra
    )
    seq = estimate("sequential", sources=labels)
    width = precision.estimate_precision(counts, results, labels, shared)
    par = estimate("parallel")
    row = {
        **row,
        "estimated_ms": seq.ms,
        "estimated_parallel_ms": par.ms,
        "normalized": seq.ms / m.center_ms if m.center_ms > 0 else math.inf,
        # The same ratio from medians: on a noisy machine below the mean's,
        # since a model's median exceeds the sum of its bricks' medians.
        "normalized_median": (
            estimate(statistic="median").ms / m.median_ms
            if m.median_ms > 0
            else math.inf
        ),
        # The same ratio from minima: robust to a machine's slow phases.
        "normalized_min": (
            estimate(statistic="min").ms / m.min_ms
            if m.min_ms > 0
            else math.inf
        ),
        "noisy_bricks": len(seq.noisy_signatures),
        # The relative half-width the bricks' intervals leave the estimate
        # (in quadrature: the bricks are sampled independently).
        "estimate_precision": width,
        # The bricks whose intervals weigh most in it (count x half-width).
        "uncertain_bricks": [
            s
            for s, _ in sorted(
                counts.items(),
                key=lambda kv: (
                    -kv[1] * precision.timing_half_width(results[kv[0]])
                ),
            )[:UNCERTAIN_BRICKS]
        ],
        # How the estimate was obtained (see dlbricks_tf.estimating.beyond).
        "method": "predicted" if labels else "timed",
        "sources": {s.label: s.share for s in seq.sources},
    }
    if layout is not None:
        row["layout_ms"] = layout.ms
        row["layout_reorders"] = layout.reorders
        row["layout_reorders_exact"] = layout.exact
        row["layout_reorders_unpriced"] = layout.unpriced
    if predicted is not None:
        row["predicted_bricks"] = len(labels)
        row["predicted_share"] = seq.share(estimate_lib.PREDICTED)
    # The range: the bricks' precision, until `ranges.widen` over the
    # run's models adds the machine's variation seen in the others.
    ranges.widen([row])
    return row


def corpus_row(
    granularity: int,
    fuse: bool,
    runs: Sequence[Mapping[str, Any]],
    measured: Mapping[str, Timing],
    results: Mapping[str, Timing],
    suite,
    failed_bricks: int = 0,
    **wall_clock: Any,
) -> dict[str, Any]:
    """The corpus row of report.json at one G: the figures over the models.

    The figures are those of the models that have an estimate; the
    speed-up is theirs over their bricks.

    Args:
        granularity: G.
        fuse: Whether the models were cut into fusion units.
        runs: The models' rows (`model_row`), at least one.
        measured: {model: end-to-end timing} of those models.
        results: {signature: timing} of the bricks timed.
        suite: Their unique bricks (`dlbricks_tf.cutting.suite.Suite`).
        failed_bricks: How many bricks failed.
        **wall_clock: What the run cost, e.g. campaign_wall_s=12.5; kept
            in the row in the order given.
    """
    estimable = [r for r in runs if not math.isnan(r["estimated_ms"])]
    names = {r["model"] for r in estimable}
    normalized = [r["normalized"] for r in estimable]
    used = {
        e.signature
        for e in suite.entries
        if any(name in names for name, _ in e.counts)
    }
    return {
        "granularity": granularity,
        "geomean_normalized": geomean(normalized),
        "min_normalized": min(normalized, default=math.nan),
        "max_normalized": max(normalized, default=math.nan),
        # Models within the +-10% the tool promises; those whose range
        # holds their measured latency, those whose range is wider than
        # +-10%, and the machine's variation (`ranges.summary`).
        "within_10pct": sum(0.9 <= n <= 1.1 for n in normalized),
        **ranges.summary(estimable),
        "models": len(estimable),
        # The same from medians (see `model_row`'s normalized_median).
        "geomean_normalized_median": geomean(
            r["normalized_median"]
            for r in estimable
            if "normalized_median" in r
        ),
        "speedup": (
            estimate_lib.speedup(
                {n: measured[n].center_ms for n in names},
                {s: results[s].center_ms for s in used},
            )
            if estimable
            else math.nan
        ),
        "split": split_name(fuse),
        **wall_clock,
        "unique_bricks": len(suite),
        "total_bricks": suite.total_bricks,
        "failed_bricks": failed_bricks,
    }


def estimate_row(
    name: str, granularity: int, est, measured: Timing | None
) -> dict[str, Any]:
    """One row of the `estimate` command (`report.format_estimates`).

    measured_ms, measured_noisy and normalized are None without an
    end-to-end timing.
    """
    m = measured.center_ms if measured else None
    return {
        "model": name,
        "granularity": granularity,
        "mode": est.mode,
        "estimated_ms": est.ms,
        "low_ms": est.low_ms,
        "high_ms": est.high_ms,
        "bricks": est.bricks,
        "noisy_bricks": len(est.noisy_signatures),
        "measured_ms": m,
        "measured_noisy": measured.noisy if measured else None,
        "normalized": est.ms / m if m else None,
    }
