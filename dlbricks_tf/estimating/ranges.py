"""An estimate's range: its bricks' precision and the machine's own variation.

The bricks' 95% intervals bound what sampling leaves uncertain in an
estimate: their half-widths add in quadrature (`estimate_precision`; the
bricks are sampled independently), not end to end, which would assume
every brick errs the same way at once. What does move every brick the
same way is the machine, and the intervals say nothing of what it does
between the minutes the bricks were timed and the minute the model runs:
on a shared VM whole models move by 5-20% from one minute to the next,
far beyond the intervals. So a range built from the bricks alone misses
the measured latency for many models, and a user cannot tell a good
estimate from a lucky one.

The machine's part is measured in the same run, from the other models:
every model that `run` measures end to end says how far this machine's
estimates land from its measurements in this run (the log of its
normalized latency), less what each one's own bricks' precision explains
(`excess`: a predicted estimate's miss is mostly its predictions', and
is in its bricks' part already). A model's machine term is the root mean
square of those over the run's *other* models (leave one out, so that no
model's range is fitted to its own measurement) times Student's t at 95%
with as many degrees of freedom as there are others (the interval of one
new draw of a spread known from n draws around 0: 4.30 from two others,
2.18 from twelve), with at least `MIN_OTHERS` of them; with fewer the
range is the bricks' alone, and the row says so (`machine_half` None).
The two parts add in quadrature, the same on each side of the estimate.

A model is flagged when its range is wider than +-10% (the accuracy the
tool promises) and the row says why: the bricks whose intervals weigh most
in it, or the machine's variation in this run, whichever is larger. A
model carried by its anchors (`dlbricks_tf.estimating.anchors`) holds the
two estimates' disagreement in its bricks' part (`anchor_half`), and its
flag names the anchors' drift where that is the larger share of it. A
row with predicted bricks (a campaign within a budget,
`dlbricks_tf.running.budget`) holds their error in its bricks' part
(`precision.estimate_precision`): once the campaign has timed bricks of
enough kinds, what those read against their predictions
(`dlbricks_tf.estimating.calibration`: each kind's factor, shared by its
bricks, and each brick's own residual); before, the predictor's
cross-validated interval. A flag of a mostly predicted estimate says
what share of it was predicted.

Example:
    widen(runs)           # runs: model rows of one G (`rows.model_row`)
    runs[0]["estimated_low_ms"], runs[0]["range_flag"]
"""

from __future__ import annotations

import math
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

from dlbricks_tf.stats import Z95, t975

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


def _machine(
    rows: Sequence[Mapping[str, Any]],
) -> list[tuple[float, float] | None]:
    """Per row, its machine term: (t975(n) x spread, spread) of the log
    ratios of its n other rows, or None with fewer than `MIN_OTHERS`.

    The spread is the RMS of the others' log ratios less what their own
    bricks' precision explains (`excess`), so that a miss already inside
    a model's bricks' part is not counted again as the machine's."""
    ratios = [log_ratio(r) for r in rows]
    excesses = [
        None if r is None else excess(r, row.get("estimate_precision"))
        for r, row in zip(ratios, rows, strict=True)
    ]
    out: list[tuple[float, float] | None] = []
    for i in range(len(rows)):
        others = [e for j, e in enumerate(excesses) if j != i and e is not None]
        n = len(others)
        spread = rms(others)
        out.append((t975(n) * spread, spread) if n >= MIN_OTHERS else None)
    return out


def excess(ratio: float, precision: float | None) -> float:
    """What of a log ratio its bricks' precision does not explain.

    A model's log ratio is its bricks' error plus the machine's; their
    variances add, so the machine's is what is left of ratio^2 once the
    bricks' (their 95% half-width over z) is taken off, at least 0. Timed
    bricks leave a percent or two; predicted ones (a campaign within a
    budget) 5-20%, which counted again as the machine's doubled every
    budgeted model's range.
    """
    if precision is None or not math.isfinite(precision):
        return ratio
    return math.sqrt(max(ratio * ratio - (precision / Z95) ** 2, 0.0))


def widen(rows: Sequence[MutableMapping[str, Any]]) -> None:
    """Sets each estimated row's range to its bricks' and machine's parts.

    Reads `estimated_ms`, `measured_ms`, `estimate_precision` (the bricks'
    relative half-width, in quadrature) and `uncertain_bricks`; writes
    `estimated_low_ms`, `estimated_high_ms`, `machine_half` (None when the
    run has too few other models), `range_half` (over the estimate) and
    `range_flag` ("" within +-10%, else why). Idempotent: a second call
    over more rows recomputes every range.

    Args:
        rows: Model rows of one G; rows without an estimate or without
            `estimate_precision` (written before it) are left alone.
    """
    for row, machine in zip(rows, _machine(rows), strict=True):
        est = row.get("estimated_ms")
        bricks = row.get("estimate_precision")
        if est is None or bricks is None or math.isnan(est) or est <= 0:
            continue
        half = math.hypot(bricks, machine[0] if machine else 0.0)
        # A latency is never below 0: a range wider than +-100% (a mostly
        # predicted estimate) is cut there.
        row["estimated_low_ms"] = est * max(1 - half, 0.0)
        row["estimated_high_ms"] = est * (1 + half)
        row["machine_half"] = machine[0] if machine else None
        row["range_half"] = half
        row["range_flag"] = _why(row, half, bricks, machine)


def _why(
    row: Mapping[str, Any],
    half: float,
    bricks: float,
    machine: tuple[float, float] | None,
) -> str:
    """Why a range is wider than the promise (empty if it is not): the
    larger of the machine's term and the bricks' precision."""
    if half <= PROMISE:
        return ""
    if machine is not None and machine[0] >= bricks:
        return (
            f"machine: the other models missed by {100 * machine[1]:.1f}% "
            f"RMS beyond their bricks' precision, +-{100 * machine[0]:.1f}% "
            "at 95%"
        )
    named = ", ".join(row.get("uncertain_bricks") or ())
    anchor = row.get("anchor_half") or 0.0
    if anchor >= bricks / math.sqrt(2):  # The larger part of the bricks'.
        return (
            f"anchors: its stored bricks read x{row['anchor_drift']:.3f} "
            "timed again beside it, carried half-way"
            + (f"; bricks: {named}" if named else "")
        )
    share = row.get("predicted_share") or 0.0
    if share > 0:  # Predicted bricks carry the predictor's error.
        return (
            f"predicted: {100 * share:.0f}% of the estimate is predicted"
            f" ({row.get('predicted_bricks', 0)} bricks never timed)"
            + (f"; bricks: {named}" if named else "")
        )
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
