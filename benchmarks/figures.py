"""Figures of normalized latencies that the evaluation scripts print.

A normalized latency is an estimate over the measured latency (1.0: the
estimate is exact). Means and medians are `dlbricks_tf.stats`'s: the
geometric mean, and the median of an even count the mean of the middle two.

Example:
    >>> summary_row("G=1", [0.8, 1.0, 1.25])
    '| G=1 | 1/3 | 1.000 | 0.800-1.250 |'
"""

from collections.abc import Sequence

from dlbricks_tf import stats

# The band counted as accurate: within 10% of the measured latency.
LOW, HIGH = 0.9, 1.1


def within(normalized: Sequence[float]) -> int:
    """How many normalized latencies lie within 0.90-1.10."""
    return sum(LOW <= v <= HIGH for v in normalized)


def summary_row(name: str, normalized: Sequence[float]) -> str:
    """A Markdown row: name | within 0.90-1.10 | geomean | min-max."""
    return (
        f"| {name} | {within(normalized)}/{len(normalized)} "
        f"| {stats.geomean(normalized):.3f} "
        f"| {min(normalized):.3f}-{max(normalized):.3f} |"
    )


def seconds_summary(seconds: Sequence[float]) -> str:
    """Durations given in seconds, as "median M ms, max X ms"."""
    return (
        f"median {1e3 * stats.median(seconds):.0f} ms, "
        f"max {1e3 * max(seconds):.0f} ms"
    )
