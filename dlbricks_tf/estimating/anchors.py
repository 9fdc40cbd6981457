"""Anchors: stored bricks timed again beside a model, for its estimate.

`run` measures each whole model in the same rounds as the bricks it times
beside it, so a slow phase of the machine touches both sides of the
ratio estimate / measured. A brick already in the store (timed beside
another model, minutes or days before) was timed in another phase, and
the reference scale (`dlbricks_tf.measuring.reference`) only partly
carries it over: on a 2-vCPU AMD EPYC host (2026-12-04), 40 models at
G=1 read ResNet50 1.234, ResNet152 1.163 and ResNet50V2 0.871, three
models of which no brick was new (every one timed beside ResNet101 or
ResNet101V2), while the models timed beside their own bricks read within
10%.

So a model whose bricks are mostly stored gets anchors: its stored
bricks that weigh most in its estimate (count x latency), timed again in
chains beside it, never written to the store. Their drift, the ratio of
their sum now to their stored sum (each weighted by its count), says how
far the machine has moved for those bricks since they were stored:

    drift = sum_anchors c_a t_a(now) / sum_anchors c_a t_a(stored).

The stored part of the estimate is then known twice: as stored (on the
reference scale, which carries part of the machine's drift), and carried
by the anchors (a few bricks, timed in a chain of their own, which reads
them a few percent off where they were stored). Neither is the better:
in four runs of the 40 at G=1 on AMD EPYC hosts (2026-12-04 to 08,
quiet, oneDNN off and beside a CPU spinner; 16 models take anchors) the
log misses of those models had an RMS of 0.055-0.137 as stored,
0.049-0.109 carried by the whole drift, and 0.030-0.116 carried
half-way, the lowest in three of the four. So the stored bricks are
carried by the square root of the drift (`DAMPING`), the geometric mean
of the two estimates:

    estimate = sum_new c_b t_b + drift**DAMPING * sum_stored c_b t_b.

The two estimates' disagreement is part of the range: either may be the
right one, so the carried part is known to within half of |log drift|,
beside the anchors' own precision (`carry_precision`). A slowdown that
hits the model and its anchors alike moves the estimate half-way with
it; on a steady machine the drift is about 1 and the estimate unchanged.
The store keeps its timings; `estimate` (which measures nothing) reads
them as they are.

It is an option of `run` (`--anchors`), off by default: runs without
anchors, alternated with them, did as well or better on the same
models (docs/measuring.md).

Nothing here imports TensorFlow.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping

from dlbricks_tf.stats import Timing

# A model gets anchors when at least this share of its brick calls is
# stored already (timed before it): below it, most of its estimate is
# timed beside it anyway.
FROM_SHARE = 0.25
# The anchors hold at least this share of the stored part of its
# estimate (count x latency), heaviest first...
SHARE = 0.5
# ...and are at most this many distinct bricks: a chain's trace costs
# about 10-25 ms a brick, and the heaviest few hold most of a model (a
# ResNet50's five heaviest stored bricks hold 45% of its estimate).
MOST = 24
# The share of log(drift) the stored bricks are carried by: the two
# estimates of the stored part (as stored, and carried by the whole
# drift) missed alike, and their geometric mean missed least in three
# runs of four (above).
DAMPING = 0.5


def choose(
    counts: Mapping[str, int],
    stored: Mapping[str, Timing],
    new: Collection[str],
    *,
    from_share: float = FROM_SHARE,
    share: float = SHARE,
    most: int = MOST,
) -> list[str]:
    """The stored bricks of a model to time again beside it.

    Args:
        counts: {signature: count} of the model's bricks.
        stored: Timings of bricks timed before the model (at least the
            model's stored ones; others are ignored).
        new: Signatures timed beside the model in this run.
        from_share: Anchors only if the stored bricks hold at least this
            share of the model's brick calls.
        share: The anchors' least share of the stored part (count x
            latency), heaviest first.
        most: The most anchors.

    Returns:
        Signatures, heaviest first; empty if the model needs none.
    """
    old = {s: c for s, c in counts.items() if s in stored and s not in new}
    calls = sum(counts.values())
    if not old or sum(old.values()) < from_share * calls:
        return []
    weight = {s: c * stored[s].center_ms for s, c in old.items()}
    total = sum(weight.values())
    chosen: list[str] = []
    held = 0.0
    for s in sorted(weight, key=lambda s: (-weight[s], s)):
        if len(chosen) >= most or (chosen and held >= share * total):
            break
        if weight[s] <= 0:
            break
        chosen.append(s)
        held += weight[s]
    return chosen


def drift(
    counts: Mapping[str, int],
    stored: Mapping[str, Timing],
    retimed: Mapping[str, Timing],
) -> float:
    """Sum of the anchors now over their stored sum, count-weighted.

    The anchors are the keys of `retimed`; 1.0 without any, or if their
    stored sum is not positive.
    """
    now = sum(counts.get(s, 1) * t.center_ms for s, t in retimed.items())
    before = sum(counts.get(s, 1) * stored[s].center_ms for s in retimed)
    if not retimed or not before > 0 or not math.isfinite(now):
        return 1.0
    return now / before


def drift_precision(
    counts: Mapping[str, int], retimed: Mapping[str, Timing]
) -> float:
    """Relative half-width of the anchors' sum now (in quadrature: they
    are sampled independently), the uncertainty a drift adds."""
    total = sum(counts.get(s, 1) * t.center_ms for s, t in retimed.items())
    spread = math.sqrt(
        sum(
            (counts.get(s, 1) * t.center_half_ms) ** 2
            for s, t in retimed.items()
        )
    )
    return spread / total if total > 0 else math.inf


def carry(drift: float, damping: float = DAMPING) -> float:
    """The factor the stored bricks are carried by: drift**damping."""
    return drift**damping


def carry_precision(
    counts: Mapping[str, int],
    retimed: Mapping[str, Timing],
    drift: float,
    damping: float = DAMPING,
) -> float:
    """Relative half-width of `carry(drift)`: the anchors' precision
    (`drift_precision`, times `damping`) and how far the factor may sit
    from either estimate it stands between (the stored one, 1, and the
    whole drift), in quadrature."""
    if not retimed or not drift > 0:
        return 0.0
    between = max(damping, 1 - damping) * abs(math.log(drift))
    return math.hypot(damping * drift_precision(counts, retimed), between)


def carried(
    stored: Mapping[str, Timing], keys: Collection[str], factor: float
) -> dict[str, Timing]:
    """`stored` with the timings of `keys` multiplied by `factor`: at the
    phase of the model's measurement (every ms field, the sample count
    and flags kept)."""
    out = dict(stored)
    if factor == 1.0:
        return out
    for key in keys:
        out[key] = stored[key].scaled(factor)
    return out
