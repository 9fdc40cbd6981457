"""Robust summary statistics of latency samples.

A timing is summarised by statistics that resist the outliers of a shared,
noisy machine: the median with a distribution-free confidence interval
(order statistics of the binomial distribution, no normality assumed), the
20%-trimmed mean, and the extremes. Repeats stop once the interval is
narrow enough relative to the median (`is_settled`); a result that never
gets there is flagged `noisy`.

This module is pure Python so the store and the estimate can use `Timing`
without importing TensorFlow.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

# Two-sided confidence level of the median's interval.
CONFIDENCE = 0.95
# z of a two-sided 95% interval (the normal's 97.5% quantile).
Z95 = 1.959964
# Fewer samples than this give an interval too wide to mean anything.
MIN_SAMPLES = 5
TRIM = 0.2


@dataclasses.dataclass(frozen=True)
class Timing:
    """Summary of the latency samples of one model or brick.

    All times are milliseconds per call (per model invocation), after the
    per-sample dispatch overhead has been removed (see
    `dlbricks_tf.measuring.timing`).

    Attributes:
        min_ms: Fastest sample.
        median_ms: Median sample: the figure estimates are built from.
        trimmed_mean_ms: Mean of the samples without the lowest and highest
            20%.
        max_ms: Slowest sample.
        samples: Number of samples.
        ci_low_ms: Lower bound of the median's 95% confidence interval.
        ci_high_ms: Upper bound of the median's 95% confidence interval.
        noisy: True if the interval never got below the requested relative
            precision before the sampling cap.
        calls_per_sample: Model calls timed together in one sample (K).
        dispatch_ms: Per-sample overhead (one `tf.function` call) measured
            and subtracted before dividing by `calls_per_sample`.
        loop_overhead_ms: Per-call cost of the timing loop's machinery,
            measured on an empty model and subtracted.
        mean_ms: Mean of the samples (None for timings stored before it
            was kept). Estimates add means up: the mean of a sum is the
            sum of the means whatever the noise, while on a noisy machine
            a model's median exceeds the sum of its bricks' medians.
        mean_half_ms: Half-width of the mean's 95% interval (Student's t
            on the samples' spread), or None.
    """

    min_ms: float
    median_ms: float
    trimmed_mean_ms: float
    max_ms: float
    samples: int
    ci_low_ms: float
    ci_high_ms: float
    noisy: bool
    calls_per_sample: int = 1
    dispatch_ms: float = 0.0
    loop_overhead_ms: float = 0.0
    mean_ms: float | None = None
    mean_half_ms: float | None = None

    @property
    def center_ms(self) -> float:
        """The mean, or the median for a timing stored without one."""
        return self.median_ms if self.mean_ms is None else self.mean_ms

    @property
    def center_half_ms(self) -> float:
        """Half-width of `center_ms`'s 95% interval (the larger side)."""
        return max(
            self.center_ms - self.center_low_ms,
            self.center_high_ms - self.center_ms,
        )

    @property
    def center_low_ms(self) -> float:
        """Lower bound of `center_ms`'s 95% interval."""
        if self.mean_ms is None or self.mean_half_ms is None:
            return self.ci_low_ms
        return self.mean_ms - self.mean_half_ms

    @property
    def center_high_ms(self) -> float:
        """Upper bound of `center_ms`'s 95% interval."""
        if self.mean_ms is None or self.mean_half_ms is None:
            return self.ci_high_ms
        return self.mean_ms + self.mean_half_ms

    @property
    def relative_precision(self) -> float:
        """Largest distance from the median to a CI bound, over the median."""
        return relative_half_width(
            self.median_ms, self.ci_low_ms, self.ci_high_ms
        )

    def scaled(self, factor: float) -> Timing:
        """The same timing with every millisecond of its samples (`SAMPLE_MS`)
        multiplied by `factor`; the overheads, counts and flags kept."""
        return dataclasses.replace(
            self,
            **{
                name: getattr(self, name) * factor
                for name in SAMPLE_MS
                if getattr(self, name) is not None
            },
        )

    def to_dict(self) -> dict[str, Any]:
        """Returns the fields as a JSON-serialisable dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Timing:
        """Builds a `Timing` from `to_dict` output (extra keys ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        values["noisy"] = bool(values["noisy"])
        values["samples"] = int(values["samples"])
        values["calls_per_sample"] = int(values.get("calls_per_sample", 1))
        return cls(**values)


# The figures of a timing that are latencies: finite, 0 ms or more. Not
# more than 0: the chain and ONNX Runtime timers clamp a sample to 0 when
# the overhead subtracted from it exceeds it (a brick faster than a stamp's
# jitter), so a real timing may hold zeros.
LATENCIES = ("min_ms", "median_ms", "trimmed_mean_ms", "max_ms", "ci_low_ms",
             "ci_high_ms")  # fmt: skip
# The fields that are milliseconds of the samples: what a reference state
# or a drift scales (the overheads subtracted from them are not).
SAMPLE_MS = (*LATENCIES, "mean_ms", "mean_half_ms")
# Figures that may be absent (NULL in a store written before the means).
_OPTIONAL = ("mean_ms", "mean_half_ms")
# Overheads that were subtracted or are added back: finite, 0 ms or more.
_OVERHEADS = ("dispatch_ms", "loop_overhead_ms")
# The slack of the orderings a mean takes part in: a sum over n samples
# divided by n may round one unit past the samples' extremes.
_ROUNDING = 1e-9


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def timing_problem(
    values: Mapping[str, Any],
    *,
    ordered: bool = True,
    mean_in_range: bool = True,
) -> str | None:
    """What makes a timing's figures impossible, or None if nothing does.

    Checked: every latency (`LATENCIES`, the mean and its half-width if
    present, the overheads) is a finite number of 0 ms or more; at least
    one sample, and at least one call per sample; if `ordered`, min <= CI
    low <= median <= CI high <= max, and the trimmed mean within [min,
    max].

    Args:
        values: The figures by `Timing` field name (`Timing.to_dict`, or a
            store's row as read).
        ordered: Check the orderings too (a file to merge); without them,
            what is left is what a sum of latencies needs.
        mean_in_range: With `ordered`, also check min <= mean <= max.
            True for a timing whose mean is that of its samples (a whole
            model's, a brick timed in its own loop or ONNX Runtime
            session); a chained brick's mean is taken before the samples
            are clamped at 0 and after the links' mean excess is
            subtracted (`dlbricks_tf.measuring.chain`), so it may fall
            below its minimum.

    Returns:
        One phrase naming the figure(s) and their values, e.g.
        "median_ms=-1.0 is not a finite latency of 0 ms or more".
    """
    for name in (*LATENCIES, *_OVERHEADS, *_OPTIONAL):
        value = values.get(name)
        if value is None and name in _OPTIONAL:
            continue
        if not _is_number(value) or not (math.isfinite(value) and value >= 0):
            return f"{name}={value!r} is not a finite latency of 0 ms or more"
    for name in ("samples", "calls_per_sample"):
        value = values.get(name)
        if not _is_number(value) or not value >= 1:
            return f"{name}={value!r} is not a count of 1 or more"
    if not ordered:
        return None
    for low, high in (
        ("min_ms", "median_ms"),
        ("median_ms", "max_ms"),
        ("min_ms", "ci_low_ms"),
        ("ci_low_ms", "median_ms"),
        ("median_ms", "ci_high_ms"),
        ("ci_high_ms", "max_ms"),
    ):
        if values[low] > values[high]:
            return (
                f"{low}={values[low]!r} > {high}={values[high]!r} (a timing "
                "has min <= CI low <= median <= CI high <= max)"
            )
    low, high = values["min_ms"], values["max_ms"]
    slack = _ROUNDING * high
    means = ["trimmed_mean_ms"]
    if mean_in_range and values.get("mean_ms") is not None:
        means.append("mean_ms")
    for name in means:
        if not low - slack <= values[name] <= high + slack:
            return (
                f"{name}={values[name]!r} is outside [min_ms, max_ms] = "
                f"[{low!r}, {high!r}]"
            )
    return None


def geomean(values: Iterable[float]) -> float:
    """Geometric mean of positive values (nan if there is none)."""
    logs = [math.log(v) for v in values]
    return math.exp(sum(logs) / len(logs)) if logs else math.nan


def relative_half_width(median: float, low: float, high: float) -> float:
    """Returns max(median - low, high - median) / median (inf if median 0)."""
    if median <= 0:
        return math.inf
    return max(median - low, high - median) / median


def median_ci_ranks(n: int, confidence: float = CONFIDENCE) -> tuple[int, int]:
    """Returns 0-based ranks (lo, hi) bracketing the median of n samples.

    The interval [x_(lo), x_(hi)] of the sorted samples covers the true
    median with probability at least `confidence`, whatever the
    distribution (the number of samples below the median is
    Binomial(n, 1/2)). For very small n the whole range is returned.

    Args:
        n: Number of samples, at least 1.
        confidence: Two-sided coverage, in (0, 1).

    Returns:
        A pair of indices into the sorted samples.
    """
    if n < 1:
        raise ValueError(f"Need at least one sample. Received: n={n}")
    alpha = (1.0 - confidence) / 2.0
    # Largest j with P(B <= j - 1) <= alpha; the interval is
    # [x_(j), x_(n + 1 - j)] in 1-based ranks.
    log_half_n = n * math.log(0.5)
    cdf = 0.0
    j = 0
    for k in range(n):
        pmf = math.exp(
            math.lgamma(n + 1)
            - math.lgamma(k + 1)
            - math.lgamma(n - k + 1)
            + log_half_n
        )
        if cdf + pmf > alpha:
            break
        cdf += pmf
        j = k + 1
    if j == 0:
        return 0, n - 1
    return j - 1, n - j


def trimmed_mean(values: Sequence[float], trim: float = TRIM) -> float:
    """Returns the mean without the lowest and highest `trim` fraction."""
    ordered = sorted(values)
    cut = int(len(ordered) * trim)
    kept = ordered[cut : len(ordered) - cut] or ordered
    return sum(kept) / len(kept)


# Two-sided 97.5% quantiles of Student's t by degrees of freedom (1-30);
# beyond, the normal's 1.96 plus a small correction.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t975(dof: int) -> float:
    """The 97.5% quantile of Student's t with `dof` degrees of freedom."""
    if dof < 1:
        return math.inf
    if dof <= len(_T975):
        return _T975[dof - 1]
    return Z95 + 2.4 / dof


def mean_interval(values: Sequence[float]) -> tuple[float, float]:
    """(mean, half-width of its 95% interval); inf half-width for one value.

    Args:
        values: At least one value.
    """
    n = len(values)
    mean = math.fsum(values) / n
    if n < 2:
        return mean, math.inf
    variance = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, t975(n - 1) * math.sqrt(variance / n)


def median(values: Sequence[float]) -> float:
    """Returns the median of a non-empty sequence."""
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    if n % 2:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2.0


def is_settled(
    samples_ms: Sequence[float],
    precision: float,
    min_samples: int = MIN_SAMPLES,
    absolute_ms: float = 0.0,
) -> bool:
    """True if the median's CI half-width is within `precision` of it.

    Args:
        samples_ms: Samples so far.
        precision: Relative precision wanted, e.g. 0.02 for 2%.
        min_samples: Never settled with fewer samples than this.
        absolute_ms: Also settled once the half-width is at most this many
            ms, whatever the median: a brick of a few microseconds need not
            be known to 2% for a model estimate in milliseconds.

    Returns:
        Whether sampling may stop.
    """
    if len(samples_ms) < max(min_samples, 1):
        return False
    ordered = sorted(samples_ms)
    lo, hi = median_ci_ranks(len(ordered))
    mid = median(ordered)
    if max(mid - ordered[lo], ordered[hi] - mid) <= absolute_ms:
        return True
    return relative_half_width(mid, ordered[lo], ordered[hi]) <= precision


def summarize(
    samples_ms: Sequence[float],
    *,
    noisy: bool,
    calls_per_sample: int = 1,
    dispatch_ms: float = 0.0,
    loop_overhead_ms: float = 0.0,
) -> Timing:
    """Summarises per-call latency samples into a `Timing`.

    Args:
        samples_ms: Milliseconds per call, one value per sample.
        noisy: Whether sampling stopped at a cap before settling.
        calls_per_sample: Calls timed together in one sample.
        dispatch_ms: Per-sample overhead that was subtracted.
        loop_overhead_ms: Per-call loop overhead that was subtracted.

    Returns:
        The summary.

    Raises:
        ValueError: If `samples_ms` is empty.
    """
    if not samples_ms:
        raise ValueError("Cannot summarise zero samples.")
    ordered = sorted(float(s) for s in samples_ms)
    lo, hi = median_ci_ranks(len(ordered))
    mean, half = mean_interval(ordered)
    return Timing(
        min_ms=ordered[0],
        median_ms=median(ordered),
        trimmed_mean_ms=trimmed_mean(ordered),
        max_ms=ordered[-1],
        samples=len(ordered),
        ci_low_ms=ordered[lo],
        ci_high_ms=ordered[hi],
        noisy=noisy,
        calls_per_sample=calls_per_sample,
        dispatch_ms=dispatch_ms,
        loop_overhead_ms=loop_overhead_ms,
        mean_ms=mean,
        mean_half_ms=half if math.isfinite(half) else None,
    )
