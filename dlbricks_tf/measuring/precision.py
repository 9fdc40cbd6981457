"""How precisely the models' estimates are known from their bricks' samples.

A model's estimate is the sum of its bricks' means times their counts,
so what has to be known precisely is that sum, not every brick: a brick
that is 0.1% of every model it appears in needs little precision. With h_b
the half-width of brick b's mean interval (95%, Student's t: the interval
its stored timing carries and `estimate_precision` adds up) and c_b its
count in the model, the estimate's half-width is taken as
sqrt(sum_b (c_b h_b)^2) (independent errors). The rule reads the interval
of what is summed. On the median's (order statistics), a quarter wider
than the mean's for near-normal samples and blind to a few slow ones,
estimates came out at +-0.8-3.3% for a target of 2%; on the mean's,
+-1.1-2.2%, for a tenth to a fifth less sampled brick time. A burst in a
brick's samples widens its mean's interval, so a chain beside a noisy
neighbour samples longer, as it should.

Bricks are timed a chain at a time (`dlbricks_tf.measuring.campaign`), so the
rule is applied per chain: the bricks of a chain that model m uses may spend the
share of m's error budget that their part of m's estimate earns,

    sum_{b in chain} (c_b h_b)^2 <= p^2 * E_m * S_m,

where S_m is the chain's part of E_m (sum over the chain's bricks of c_b
times the mean) and E_m the model's estimate. Summed over the chains
that cover m (their S_m add up to E_m) this keeps m's half-width within
p E_m.

E_m is not known until every brick of m is timed: it is extrapolated from
the bricks timed so far (this chain's and earlier ones) by their share of
m's brick calls, E_m = (S_m + R_m) C_m / T_m, with R_m the known bricks'
part, C_m the calls of m's bricks and T_m those already timed. Without
that, a model of which a chain holds a few small bricks (a BatchNorm
shared with the model being timed) had its estimate taken as those bricks
alone, had to know them to p by themselves, and kept the chain sampling to
its cap (731 of the 1,072 bricks of the 13-model run). The per-model
precision reached is computed afresh from the stored timings
(`estimate_precision`) and reported.
Bricks that no model names (a suite timed without its models) count once
each in one pseudo-model per chain: the chain's sum is known to p.

A chain that cannot meet the rule within its caps flags as noisy only the
bricks that keep some model from its target: the largest terms, until the
rest fits. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence

from dlbricks_tf import stats
from dlbricks_tf.stats import Timing

# The pseudo-model of a chain's bricks that no model names.
CHAIN = "(chain)"


def interval(samples: Sequence[float]) -> tuple[float, float]:
    """(mean, half-width of its 95% interval) of a brick's samples.

    (0.0, inf) without samples; the half-width is inf under 2 samples.
    """
    return stats.mean_interval(samples) if samples else (0.0, math.inf)


def timing_half_width(timing: Timing) -> float:
    """Half-width of a stored timing's interval, in ms.

    That of the mean, which estimates add up (`Timing.center_half_ms`; the
    median's for a timing stored without a mean).
    """
    return timing.center_half_ms


def chain_verdict(
    samples: Mapping[str, Sequence[float]],
    weights: Mapping[str, Mapping[str, int]],
    known_ms: Mapping[str, float],
    precision: float,
    absolute_ms: float = 0.0,
) -> tuple[bool, frozenset[str]]:
    """Whether a chain's samples pin every model's estimate down enough.

    Args:
        samples: Per-call samples (ms) of each brick of the chain.
        weights: {model: {signature: count}} of the models whose estimates
            matter; bricks outside every model form one pseudo-model.
        known_ms: Centers (means) of bricks timed before this chain.
        precision: Wanted relative half-width of each estimate (p).
        absolute_ms: Also good enough once the chain's part of a model's
            half-width is at most this many ms.

    Returns:
        (settled, the bricks that keep some model from its target).
    """
    intervals = {k: interval(v) for k, v in samples.items()}
    means = {k: mean for k, (mean, _) in intervals.items()}
    widths = {k: half for k, (_, half) in intervals.items()}
    groups = {
        model: {k: c for k, c in counts.items() if k in samples and c > 0}
        for model, counts in weights.items()
    }
    named = {k for counts in groups.values() for k in counts}
    loose = {k: 1 for k in samples if k not in named}
    if loose:
        groups[CHAIN] = loose
    holding: set[str] = set()
    for model, counts in groups.items():
        if not counts:
            continue
        part = sum(c * means[k] for k, c in counts.items())
        rest = sum(
            c * known_ms.get(k, 0.0)
            for k, c in weights.get(model, {}).items()
            if k not in samples
        )
        budget = (
            precision**2
            * _extrapolated(
                part + rest, weights.get(model, counts), samples, known_ms
            )
            * part
        )
        terms = sorted(((c * widths[k]) ** 2, k) for k, c in counts.items())
        if sum(t for t, _ in terms) <= max(budget, absolute_ms**2):
            continue
        while terms and sum(t for t, _ in terms) > budget:
            holding.add(terms.pop()[1])  # The largest term first.
    return not holding, frozenset(holding)


def _extrapolated(
    timed_ms: float,
    counts: Mapping[str, int],
    samples: Mapping[str, Sequence[float]],
    known_ms: Mapping[str, float],
) -> float:
    """A model's estimate, from the part of its brick calls timed so far."""
    calls = sum(counts.values())
    timed = sum(c for k, c in counts.items() if k in samples or k in known_ms)
    return timed_ms * calls / timed if timed else timed_ms


def estimate_precision(
    counts: Mapping[str, int],
    timings: Mapping[str, Timing],
    predicted: Collection[str] = (),
    shared: Mapping[str, tuple[str, float]] | None = None,
) -> float:
    """Relative half-width of an estimate from stored brick timings.

    The timed bricks' half-widths add in quadrature (they are sampled
    independently). Predicted bricks (`dlbricks_tf.estimating.predict`)
    add theirs end to end: a predictor's errors within one model go the
    same way (a kind of layer it prices wrong is wrong in every brick that
    holds it), which is why its interval is that of a sum of bricks. The
    two parts add in quadrature.

    A predicted brick in `shared` (a prediction corrected by the bricks
    timed beside it, `dlbricks_tf.estimating.calibration`) splits its
    error instead: its timing's half-width is its own residual, which
    adds in quadrature as a timed brick's does, and `shared[s]` = (group,
    half-width in ms) is the part it shares with its group's other
    bricks (its kind's factor), which adds end to end within the group;
    the groups add in quadrature.

    Args:
        counts: {signature: count} of one model.
        timings: Timings of (at least) those signatures.
        predicted: The signatures whose timings were predicted, not timed.
        shared: {signature: (group, shared half-width ms)} of predicted
            bricks whose error is split so.

    Returns:
        The relative half-width (see above); inf if the estimate is 0.
    """
    shared = shared or {}
    total = sum(c * timings[k].center_ms for k, c in counts.items())
    timed = math.sqrt(
        sum(
            (c * timing_half_width(timings[k])) ** 2
            for k, c in counts.items()
            if k not in predicted or k in shared
        )
    )
    guessed = sum(
        c * timing_half_width(timings[k])
        for k, c in counts.items()
        if k in predicted and k not in shared
    )
    groups: dict[str, float] = {}
    for k, c in counts.items():
        if k in predicted and k in shared:
            group, half = shared[k]
            groups[group] = groups.get(group, 0.0) + c * half
    spread = math.sqrt(
        timed**2 + guessed**2 + sum(h * h for h in groups.values())
    )
    return spread / total if total > 0 else math.inf
