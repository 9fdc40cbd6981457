"""Predicted bricks corrected, per kind, by the bricks timed beside them.

A predictor learnt mostly from the probes (`dlbricks_tf.models.probes`)
prices a model's bricks with a bias that one kind of brick shares: on
the 13 models at G=1 (2026-12-03, AMD EPYC), a predictor of the probes
alone priced them 1.24x their timed sum (geomean over the models), small
bricks most (bricks under 10 us at 1.7-2.1x, 1 ms or more at 0.66-0.93x),
and errors of one kind go the same way in every model. A few dozen of
the models' bricks among hundreds of probes hardly move a refitted
predictor (a budgeted campaign that refitted as it went read 1.15-1.36x).
What does move it: the ratio timed / predicted of the bricks timed so
far, per kind (`regressors.brick_kinds`), applied to the bricks of that
kind still predicted.

`fit` takes the median log ratio of each kind's timed bricks, pulled
toward the median over all kinds by `PRIOR` pseudo-bricks (a kind of one
timed brick moves a third of the way to its own ratio), and a kind with
no timed brick gets the overall ratio. The ratios must come from bricks
the predictor did not learn from, or they read 1.

How far off a corrected prediction still is (`Calibration.spread`) comes
from the same held-out ratios, in two parts that add differently over a
model's bricks:

* the kind's own factor, shared by every brick of the kind in every
  model (errors of one kind go the same way): the error of a median of
  n_k log ratios, (pi/2) s_k^2 / n_k, weighted as the factor is (w^2),
  plus (1 - w)^2 tau^2 for the pull toward all kinds, tau^2 being how far
  the kinds' medians lie from the overall one; a kind with no timed
  brick has tau^2 (plus the overall median's error), once `MIN_KINDS`
  kinds are timed (before, it keeps the predictor's interval);
* each brick's residual around its kind's factor, s_k, independent from
  brick to brick: it averages out over a model's many bricks.

s_k^2 is the kind's residual variance (around its median, each residual
clipped to +-`CLIP` in log so that one wild brick does not price a whole
kind as unknown) pooled with all kinds' by `PRIOR` pseudo-degrees of
freedom. `dlbricks_tf.measuring.precision.estimate_precision` adds the
shared parts end to end within a kind, the kinds and the residuals in
quadrature. Before, a predicted brick carried the predictor's
cross-validated interval, added end to end over every predicted brick of
a model: built for a predictor that had learnt nothing of these models,
it put the 13's budgeted estimates at +-51-276% (2026-12-05), even those
within 3%.

Example:
    cal = calibration.fit(kinds, timed_ms, predicted_ms)
    ms = predicted * cal.factor(kind)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence

from dlbricks_tf import stats

# Pseudo-bricks at the overall ratio added to every kind.
PRIOR = 2.0
# A ratio is clamped to [1 / LIMIT, LIMIT]: a brick timed at 0 (a no-op
# that grappler removed) must not price a kind at 0.
LIMIT = 10.0
# A residual counts at most this far (in log) in a kind's spread.
CLIP = 1.0
# Kinds timed, at least, for their spread to price the kinds not timed.
MIN_KINDS = 3


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Factors that multiply predicted latencies, by kind of brick.

    Attributes:
        factors: {kind: factor} of the kinds with timed bricks.
        overall: The factor of the other kinds (1.0 with none timed).
        counts: {kind: timed bricks} the factors come from.
        spreads: {kind: (sd of its log factor, sd of a brick's log
            residual)} of the kinds with timed bricks.
        other_spread: The same for the other kinds; None with fewer than
            `MIN_KINDS` kinds timed (then nothing says how far off their
            predictions are).
    """

    factors: Mapping[str, float] = dataclasses.field(default_factory=dict)
    overall: float = 1.0
    counts: Mapping[str, int] = dataclasses.field(default_factory=dict)
    spreads: Mapping[str, tuple[float, float]] = dataclasses.field(
        default_factory=dict
    )
    other_spread: tuple[float, float] | None = None

    def factor(self, kind: str) -> float:
        """What a predicted brick of `kind` is multiplied by."""
        return self.factors.get(kind, self.overall)

    def spread(self, kind: str) -> tuple[float, float] | None:
        """(sd of the kind's log factor, sd of a brick's log residual);
        None when nothing says (see `other_spread`)."""
        return self.spreads.get(kind, self.other_spread)

    def halves(self, kind: str, ms: float) -> tuple[float, float] | None:
        """95% half-widths (ms) of a corrected prediction of `ms`: (the
        part its kind shares, its own), or None when nothing says."""
        spread = self.spread(kind)
        if spread is None:
            return None
        return tuple(ms * math.expm1(stats.Z95 * sd) for sd in spread)


def _log_ratio(timed_ms: float, predicted_ms: float) -> float:
    ratio = max(timed_ms, 0.0) / max(predicted_ms, 1e-9)
    return math.log(min(max(ratio, 1.0 / LIMIT), LIMIT))


def fit(
    kinds: Sequence[str],
    timed_ms: Sequence[float],
    predicted_ms: Sequence[float],
    prior: float = PRIOR,
) -> Calibration:
    """The calibration of bricks timed at `timed_ms`, predicted at
    `predicted_ms` (by a predictor that did not learn from them).

    Raises:
        ValueError: If the three sequences differ in length.
    """
    if not len(kinds) == len(timed_ms) == len(predicted_ms):
        raise ValueError(
            "One kind, timing and prediction per brick. Received: "
            f"{len(kinds)}, {len(timed_ms)}, {len(predicted_ms)}"
        )
    if not kinds:
        return Calibration()
    logs: dict[str, list[float]] = {}
    for kind, t, p in zip(kinds, timed_ms, predicted_ms, strict=True):
        logs.setdefault(kind, []).append(_log_ratio(t, p))
    every = [v for values in logs.values() for v in values]
    overall = stats.median(every)
    medians = {kind: stats.median(values) for kind, values in logs.items()}
    own, pooled = _residual_variances(logs, medians, prior)
    between, general = _between_variance(medians, overall, every)
    factors, spreads = {}, {}
    for kind, values in logs.items():
        n = len(values)
        w = n / (n + prior)
        factors[kind] = math.exp(w * medians[kind] + (1 - w) * overall)
        factor_var = w**2 * math.pi / 2 * own[kind] / n + (1 - w) ** 2 * between
        spreads[kind] = (math.sqrt(factor_var), math.sqrt(own[kind]))
    other = between + math.pi / 2 * pooled / len(every)
    other_spread = (math.sqrt(other), math.sqrt(pooled)) if general else None
    return Calibration(
        factors=factors,
        overall=math.exp(overall),
        counts={k: len(v) for k, v in logs.items()},
        spreads=spreads,
        other_spread=other_spread,
    )


def _residual_variances(
    logs: Mapping[str, Sequence[float]],
    medians: Mapping[str, float],
    prior: float,
) -> tuple[dict[str, float], float]:
    """({kind: residual variance, pooled with all kinds'}, the pooled one).

    Residuals are taken around each kind's median and clipped to +-CLIP;
    a kind of one brick has no residual of its own and takes the pool's.
    The pool of no kind of two or more bricks is the spread of all the log
    ratios around their median.
    """
    sums = {
        kind: _clipped_squares(values, medians[kind])
        for kind, values in logs.items()
    }
    dof = {kind: len(values) - 1 for kind, values in logs.items()}
    if sum(dof.values()) > 0:
        pooled = sum(sums.values()) / sum(dof.values())
    else:
        every = [v for values in logs.values() for v in values]
        pooled = _clipped_squares(every, stats.median(every)) / max(
            len(every) - 1, 1
        )
    own = {
        kind: (sums[kind] + prior * pooled) / (dof[kind] + prior)
        if dof[kind] + prior > 0
        else pooled
        for kind in logs
    }
    return own, pooled


def _between_variance(
    medians: Mapping[str, float], overall: float, every: Sequence[float]
) -> tuple[float, bool]:
    """How far a kind's true log factor lies from the overall one (tau^2),
    and whether the kinds timed say so.

    The kinds' medians around the overall median, with one degree of
    freedom taken by the overall, from `MIN_KINDS` kinds on. With fewer,
    the spread of all the bricks' log ratios stands in for the timed
    kinds' pull toward the overall ratio, and nothing is said of the
    kinds not timed (False): two kinds that happen to agree say nothing
    of a third.
    """
    if len(medians) >= MIN_KINDS:
        return _clipped_squares(medians.values(), overall) / (
            len(medians) - 1
        ), True
    return _clipped_squares(every, overall) / max(len(every) - 1, 1), False


def _clipped_squares(values: Iterable[float], center: float) -> float:
    """Sum of the squared distances of `values` from `center`, each
    distance clipped to `CLIP`."""
    return sum(min(abs(v - center), CLIP) ** 2 for v in values)
