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

Example:
    cal = calibration.fit(kinds, timed_ms, predicted_ms)
    ms = predicted * cal.factor(kind)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from dlbricks_tf import stats

# Pseudo-bricks at the overall ratio added to every kind.
PRIOR = 2.0
# A ratio is clamped to [1 / LIMIT, LIMIT]: a brick timed at 0 (a no-op
# that grappler removed) must not price a kind at 0.
LIMIT = 10.0


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Factors that multiply predicted latencies, by kind of brick.

    Attributes:
        factors: {kind: factor} of the kinds with timed bricks.
        overall: The factor of the other kinds (1.0 with none timed).
        counts: {kind: timed bricks} the factors come from.
    """

    factors: Mapping[str, float] = dataclasses.field(default_factory=dict)
    overall: float = 1.0
    counts: Mapping[str, int] = dataclasses.field(default_factory=dict)

    def factor(self, kind: str) -> float:
        """What a predicted brick of `kind` is multiplied by."""
        return self.factors.get(kind, self.overall)


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
    overall = stats.median([v for values in logs.values() for v in values])
    factors = {}
    for kind, values in logs.items():
        w = len(values) / (len(values) + prior)
        factors[kind] = math.exp(w * stats.median(values) + (1 - w) * overall)
    return Calibration(
        factors=factors,
        overall=math.exp(overall),
        counts={k: len(v) for k, v in logs.items()},
    )
