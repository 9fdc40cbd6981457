"""Rebuild a model's latency from the timings of its bricks.

`sequential` (the default) adds up every brick of the model, each
occurrence counted, since TensorFlow on CPU runs layers one after another.
`parallel` takes the longest path through the brick DAG, the latency if
independent branches ran at the same time. A brick without a timing is an
error that names every missing signature; nothing is dropped silently.

The uncertainty is carried by bounds: the estimate built from the bricks'
CI lows and from their CI highs (both sums and longest paths are monotone
in the brick times). Summing bounds is conservative: it assumes every brick
errs the same way at once.

Every estimate says where its milliseconds come from (`Estimate.sources`):
by default all from timed bricks ("timed"); a caller that labels bricks
(a cover by brick size, `dlbricks_tf.estimating.cover`; bricks a latency model
filled in, "predicted", `dlbricks_tf.estimating.predict`) gets each label's
share.

Example:
    est = estimate(decomposition, store.results(settings, fp))
    est.ms, est.low_ms, est.high_ms
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from dlbricks_tf import errors
from dlbricks_tf.stats import Timing

MODES = ("sequential", "parallel")
# Which statistic of each brick's timing an estimate adds up. The mean is
# the default (`Timing.center_ms`: the median for timings stored without a
# mean): the mean of a sum is the sum of the means, so the estimate and the
# whole model's mean agree whatever the machine's noise, while under noise
# a model's median exceeds the sum of its bricks' medians (each brick's
# median leaves out the stalls that every call of the whole model meets
# somewhere). The minimum resists a machine's slow phases (compare it with
# the whole model's minimum).
STATISTICS = {
    "mean": "center_ms",
    "median": "median_ms",
    "min": "min_ms",
    "trimmed_mean": "trimmed_mean_ms",
}


class MissingResultsError(errors.Error):
    """Some bricks of a model have no timing.

    Attributes:
        model: The model's name.
        signatures: Every brick without a timing, failed ones included.
        failed: {signature: reason} of those recorded as failed.
    """

    def __init__(
        self,
        model: str,
        signatures: Sequence[str],
        failed: Mapping[str, str] | None = None,
    ) -> None:
        self.model = model
        self.signatures = tuple(signatures)
        self.failed = {
            s: r for s, r in (failed or {}).items() if s in self.signatures
        }
        untimed = [s for s in self.signatures if s not in self.failed]
        parts = []
        if untimed:
            shown = ", ".join(untimed[:10])
            more = len(untimed) - 10
            parts.append(
                f"{len(untimed)} brick(s) have no timing: {shown}"
                f"{f' (+{more} more)' if more > 0 else ''}"
            )
        if self.failed:
            items = list(self.failed.items())
            shown = "; ".join(f"{s} ({r})" for s, r in items[:3])
            more = len(items) - 3
            parts.append(
                f"{len(items)} brick(s) failed when timed: {shown}"
                f"{f' (+{more} more)' if more > 0 else ''}"
            )
        super().__init__(
            f"Model {model!r}: {'; '.join(parts)}. Time them first (they "
            "are listed by Store.missing; `dlbricks bench` tries failed "
            "bricks again)."
        )


class ImpossibleTimingError(errors.Error):
    """A brick's timing would make an estimate infinite, NaN or negative.

    Attributes:
        model: The model's name.
        signature: The brick.
    """

    def __init__(self, model: str, signature: str, problem: str) -> None:
        self.model = model
        self.signature = signature
        super().__init__(
            f"Model {model!r}: brick {signature} has {problem}, so no "
            "estimate is given; `dlbricks bench` times it again (an "
            "impossible timing counts as missing), or restore the store "
            "from a copy."
        )


TIMED = "timed"
PREDICTED = "predicted"


@dataclasses.dataclass(frozen=True)
class Source:
    """Where part of an estimate comes from.

    Attributes:
        label: "timed", "predicted", or a cover's brick size ("G=2").
        share: Its part of the sum of the bricks' latencies (the sequential
            estimate; the shares of an estimate add up to 1).
        bricks: Its bricks, repeats included.
    """

    label: str
    share: float
    bricks: int


class _Decomposition(Protocol):
    name: str
    bricks: list[Any]
    dependencies: list[tuple[int, ...]]


@dataclasses.dataclass(frozen=True)
class Estimate:
    """A model latency rebuilt from its bricks.

    Attributes:
        model: Model name.
        mode: "sequential" or "parallel".
        ms: Estimate from the bricks' medians.
        low_ms: Estimate from the bricks' CI lows.
        high_ms: Estimate from the bricks' CI highs.
        bricks: Bricks of the model (repeats included).
        noisy: Whether any brick's timing is flagged noisy.
        noisy_signatures: The noisy bricks' signatures, unique, in order.
        sources: Where the estimate comes from, largest share first.
    """

    model: str
    mode: str
    ms: float
    low_ms: float
    high_ms: float
    bricks: int
    noisy: bool
    noisy_signatures: tuple[str, ...] = ()
    sources: tuple[Source, ...] = ()

    def share(self, label: str) -> float:
        """The share of the estimate that a source label holds (0 if none)."""
        return sum(s.share for s in self.sources if s.label == label)

    @property
    def relative_uncertainty(self) -> float:
        """Largest distance from `ms` to a bound, over `ms`."""
        if self.ms <= 0:
            return float("inf")
        return max(self.ms - self.low_ms, self.high_ms - self.ms) / self.ms


def estimate(
    decomposition: _Decomposition,
    results: Mapping[str, Timing],
    mode: str = "sequential",
    *,
    call_overhead_ms: float = 0.0,
    statistic: str = "mean",
    failures: Mapping[str, str] | None = None,
    sources: Mapping[str, str] | None = None,
) -> Estimate:
    """Estimates a model's latency from its bricks' timings.

    Args:
        decomposition: The model's decomposition (`name`, `bricks` with
            `signature`, and `dependencies`).
        results: {signature: timing}, e.g. `Store.results(settings, fp)`.
        mode: "sequential" (sum over all bricks) or "parallel" (longest
            path through the brick DAG).
        call_overhead_ms: Added once: what a whole model pays per call
            beyond its layers. Brick and model timings exclude the
            `tf.function` dispatch (see `dlbricks_tf.measuring.timing`); pass a
            measured dispatch (`Timing.dispatch_ms`) to estimate the latency
            of one `model(x)` call as a user sees it.
        statistic: "mean" (default; the median for a timing stored
            without a mean), "median", "min" or "trimmed_mean" of each
            brick's timing; the bounds are the mean's 95% interval for
            "mean", the median's otherwise.
        failures: {signature: reason} of bricks recorded as failed
            (`Store.failures`), named apart if they have no timing.
        sources: {signature: label} of bricks that did not come from the
            model's own timed bricks (e.g. "predicted"); the others are
            "timed". Gives `Estimate.sources`.

    Returns:
        The estimate with its bounds.

    Raises:
        ValueError: For an unknown mode or inconsistent dependencies.
        MissingResultsError: If any brick has no timing.
        ImpossibleTimingError: If a brick's figure is not a finite number
            (or its latency or interval high is below 0), which would make
            the estimate infinite, NaN or negative; a low bound below 0 is
            cut at 0.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}. Received: {mode!r}")
    if statistic not in STATISTICS:
        raise ValueError(
            f"statistic must be one of {STATISTICS}. Received: {statistic!r}"
        )
    signatures = [b.signature for b in decomposition.bricks]
    missing = [s for s in dict.fromkeys(signatures) if s not in results]
    if missing:
        raise MissingResultsError(decomposition.name, missing, failures)
    timings = [results[s] for s in signatures]
    if mode == "sequential":
        combine = _sequential
    else:
        deps = decomposition.dependencies
        if len(deps) != len(signatures):
            raise ValueError(
                f"Model {decomposition.name!r} has {len(signatures)} bricks "
                f"but {len(deps)} dependency entries."
            )

        def combine(values: Sequence[float]) -> float:
            return _longest_path(values, deps)

    noisy = tuple(
        dict.fromkeys(
            s for s, t in zip(signatures, timings, strict=True) if t.noisy
        )
    )
    labels = [(sources or {}).get(s, TIMED) for s in signatures]
    figures = {
        s: _figures(decomposition.name, s, label, t, statistic)
        for s, label, t in zip(signatures, labels, timings, strict=True)
    }
    values = [figures[s][0] for s in signatures]
    # A latency is never below 0: a mean's interval that reaches below it
    # (a chained brick of a few microseconds) is cut there.
    lows = [max(figures[s][1], 0.0) for s in signatures]
    highs = [figures[s][2] for s in signatures]
    return Estimate(
        model=decomposition.name,
        mode=mode,
        ms=combine(values) + call_overhead_ms,
        low_ms=combine(lows) + call_overhead_ms,
        high_ms=combine(highs) + call_overhead_ms,
        bricks=len(signatures),
        noisy=bool(noisy),
        noisy_signatures=noisy,
        sources=_sources(labels, values),
    )


def _figures(
    model: str, signature: str, label: str, timing: Timing, statistic: str
) -> tuple[float, float, float]:
    """(latency, interval low, interval high) a brick adds to an estimate.

    Raises:
        ImpossibleTimingError: A figure is not a finite number, or the
            latency or the high is below 0 (a sum would be infinite, NaN
            or negative).
    """
    kind = "a predicted" if label == PREDICTED else "a stored"
    try:
        value = getattr(timing, STATISTICS[statistic])
        if statistic == "mean":
            low, high = timing.center_low_ms, timing.center_high_ms
        else:
            low, high = timing.ci_low_ms, timing.ci_high_ms
    except TypeError as e:  # A figure that is not a number.
        raise ImpossibleTimingError(
            model, signature, f"{kind} timing that is not numbers ({e})"
        ) from e
    for name, figure, least in (
        ("latency", value, 0.0),
        ("interval high", high, 0.0),
        ("interval low", low, -math.inf),
    ):
        if not (
            isinstance(figure, int | float)
            and math.isfinite(figure)
            and figure >= least
        ):
            raise ImpossibleTimingError(
                model, signature, f"{kind} timing whose {name} is {figure!r} ms"
            )
    return value, low, high


def _sources(labels: Sequence[str], values: Sequence[float]) -> tuple:
    """Each label's share of the sum of `values`, largest first."""
    total = sum(max(v, 0.0) for v in values)
    parts: dict[str, list] = {}
    for label, value in zip(labels, values, strict=True):
        part = parts.setdefault(label, [0.0, 0])
        part[0] += max(value, 0.0)
        part[1] += 1
    out = [
        Source(label, ms / total if total > 0 else 1 / len(parts), n)
        for label, (ms, n) in parts.items()
    ]
    return tuple(sorted(out, key=lambda s: (-s.share, s.label)))


def _sequential(values: Sequence[float]) -> float:
    return float(sum(values))


def _longest_path(
    values: Sequence[float], dependencies: Sequence[Sequence[int]]
) -> float:
    """Longest (heaviest) path through a DAG given in topological order."""
    finish: list[float] = []
    for i, (value, deps) in enumerate(zip(values, dependencies, strict=True)):
        for d in deps:
            if not 0 <= d < i:
                raise ValueError(
                    f"Brick {i} depends on brick {d}; dependencies must "
                    "point to earlier bricks (topological order)."
                )
        start = max((finish[d] for d in deps), default=0.0)
        finish.append(start + value)
    return max(finish, default=0.0)


def speedup(
    end_to_end_ms: Mapping[str, float],
    unique_brick_ms: Mapping[str, float],
) -> float:
    """The paper's speed-up: sum of model latencies / sum of unique bricks.

    Args:
        end_to_end_ms: {model: measured latency}.
        unique_brick_ms: {signature: latency} of the suite's unique bricks.

    Returns:
        How many times less time one pass over the unique bricks takes than
        one pass over the whole models.
    """
    bricks = sum(unique_brick_ms.values())
    if bricks <= 0:
        raise ValueError("Unique brick latencies must sum to more than 0.")
    return sum(end_to_end_ms.values()) / bricks
