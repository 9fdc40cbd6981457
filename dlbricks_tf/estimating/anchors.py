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
their sum now to their stored sum (each weighted by its count), carries
every stored brick of the model to the phase of its own measurement:

    estimate = sum_new c_b t_b + drift * sum_stored c_b t_b,
    drift = sum_anchors c_a t_a(now) / sum_anchors c_a t_a(stored).

A slowdown that hits the model and its anchors alike then leaves the
ratio where it was; on a steady machine the drift is about 1 and the
estimate unchanged. The store keeps its timings; `estimate` (which
measures nothing) reads them as they are.

It is an option of `run` (`--anchors`), off by default: in a run of the
40 with it, the 16 models that took anchors read drifts of 0.81-1.07
(median 0.95), so a few heavy bricks timed again in another chain moved
as much as the machine had; it pulled EfficientNetV2M in (1.129 to
0.919) and pushed InceptionV3 out (1.051 to 0.880). Measured in
docs/measuring.md.

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
