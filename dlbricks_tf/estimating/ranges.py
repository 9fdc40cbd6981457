"""An estimate's range: its bricks' precision and the machine's own variation.

The bricks' 95% intervals bound what sampling leaves uncertain in an
estimate. They say nothing of what the machine does between the minutes
its bricks were timed and the minute the model runs: on a shared VM whole
models move by 5-20% from one minute to the next, far beyond the
intervals. So a range built from the bricks alone misses the measured
latency for many models, and a user cannot tell a good estimate from a
lucky one.

The machine's part is measured in the same run, from the other models:
every model that `run` measures end to end says how far this machine's
estimates land from its measurements in this run (the log of its
normalized latency). A model's machine term is the root mean square of
those log ratios over the run's *other* models (leave one out, so that no
model's range is fitted to its own measurement) times Student's t at 95%
with as many degrees of freedom as there are others (the interval of one
new draw of a spread known from n draws around 0: 4.30 from two others,
2.18 from twelve), with at least `MIN_OTHERS` of them; with fewer the
range is the bricks' alone, and the row says so (`machine_half` None).
The two parts add in quadrature on each side of the estimate.

A model is flagged when its range is wider than +-10% (the accuracy the
tool promises) and the row says why: the bricks whose intervals weigh most
in it, or the machine's variation in this run, whichever is larger.

Example:
    widen(runs)           # runs: model rows of one G (`rows.model_row`)
    runs[0]["estimated_low_ms"], runs[0]["range_flag"]
"""

from __future__ import annotations

import math
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

from dlbricks_tf.stats import t975

# Other models the machine's term needs: `make run`'s three models give
# each two (one ratio says next to nothing of a spread).
MIN_OTHERS = 2
# The accuracy the tool promises: a wider range is flagged.
PROMISE = 0.10


def log_ratio(row: Mapping[str, Any]) -> float | None:
    """log(estimated / measured) of a model row, None without both."""
    est, measured = row.get("estimated_ms"), row.get("measured_ms")
    if est is None or measured is None:
        return None
    if not (est > 0 and measured > 0) or math.isinf(est / measured):
        return None
    return math.log(est / measured)


def rms(values: Sequence[float]) -> float:
    """Root mean square of `values` (nan for none)."""
    if not values:
        return math.nan
    return math.sqrt(sum(v * v for v in values) / len(values))


def machine_halves(rows: Sequence[Mapping[str, Any]]) -> list[float | None]:
    """Each row's machine term, relative: t975(n) x RMS over n others.

    Args:
        rows: Model rows of one G (each with `estimated_ms`, `measured_ms`).

    Returns:
        Per row, the relative half-width the machine's variation adds, or
        None when fewer than `MIN_OTHERS` other rows have a ratio.
    """
    ratios = [log_ratio(r) for r in rows]
    out: list[float | None] = []
    for i in range(len(rows)):
        others = [r for j, r in enumerate(ratios) if j != i and r is not None]
        n = len(others)
        out.append(t975(n) * rms(others) if n >= MIN_OTHERS else None)
    return out


def widen(rows: Sequence[MutableMapping[str, Any]]) -> None:
    """Sets each estimated row's range to its bricks' and machine's parts.

    Reads `estimated_ms`, `bricks_low_ms`, `bricks_high_ms` (the bounds
    from the bricks' intervals, `rows.model_row`), `estimate_precision` and
    `uncertain_bricks`; writes `estimated_low_ms`, `estimated_high_ms`,
    `machine_half` (None when the run has too few other models),
    `range_half` (the larger side over the estimate) and `range_flag`
    ("" within +-10%, else why). Idempotent: a second call over more rows
    recomputes every range from the bricks' bounds.

    Args:
        rows: Model rows of one G; rows without an estimate are left alone.
    """
    halves = machine_halves(rows)
    for row, machine in zip(rows, halves, strict=True):
        est = row.get("estimated_ms")
        if est is None or math.isnan(est) or "bricks_low_ms" not in row:
            continue
        extra = (machine or 0.0) * est
        low = est - math.hypot(est - row["bricks_low_ms"], extra)
        high = est + math.hypot(row["bricks_high_ms"] - est, extra)
        half = max(est - low, high - est) / est if est > 0 else math.inf
        row["estimated_low_ms"] = low
        row["estimated_high_ms"] = high
        row["machine_half"] = machine
        row["range_half"] = half
        row["range_flag"] = _why(row, half, machine)


def _why(row: Mapping[str, Any], half: float, machine: float | None) -> str:
    """ "" for a range within the promise, else what widens it most."""
    if half <= PROMISE:
        return ""
    bricks = (row["bricks_high_ms"] - row["bricks_low_ms"]) / 2
    bricks /= row["estimated_ms"]
    if machine is not None and machine >= bricks:
        return f"machine: +-{100 * machine:.0f}% from the other models' misses"
    named = ", ".join(row.get("uncertain_bricks") or ())
    return f"bricks: {named}" if named else "bricks"


def summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The corpus row's figures on ranges, over the estimated rows.

    `range_holds`: rows whose range holds their measured latency;
    `flagged`: rows whose range is wider than +-10%; `machine_variation`:
    RMS of the log ratios over all the rows (nan for none).
    """
    estimated = [r for r in rows if not math.isnan(r["estimated_ms"])]
    ratios = [x for x in (log_ratio(r) for r in estimated) if x is not None]
    return {
        "range_holds": sum(
            r["estimated_low_ms"] <= r["measured_ms"] <= r["estimated_high_ms"]
            for r in estimated
        ),
        "flagged": sum(bool(r.get("range_flag")) for r in estimated),
        "machine_variation": rms(ratios),
    }
