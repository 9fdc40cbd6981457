"""Tests for dlbricks_tf.estimating.ranges, on exact arithmetic."""

import math

import pytest

from dlbricks_tf import stats
from dlbricks_tf.estimating import ranges
from dlbricks_tf.stats import t975


def _row(model, estimated, measured, precision=0.0, bricks=("a",)):
    return {
        "model": model,
        "estimated_ms": estimated,
        "measured_ms": measured,
        "estimate_precision": precision,
        "estimated_low_ms": estimated * (1 - precision),
        "estimated_high_ms": estimated * (1 + precision),
        "uncertain_bricks": list(bricks),
    }


def test_each_model_is_widened_by_the_others_ratios_alone():
    ratios = [1.0, 1.1, 0.9, 1.0, 2.0]
    rows = [_row(f"m{i}", 10.0 * r, 10.0) for i, r in enumerate(ratios)]
    ranges.widen(rows)
    logs = [math.log(r) for r in ratios]
    for i, row in enumerate(rows):
        others = [x for j, x in enumerate(logs) if j != i]
        machine = t975(4) * math.sqrt(sum(x * x for x in others) / 4)
        assert row["machine_half"] == pytest.approx(machine)
        est = row["estimated_ms"]
        assert row["estimated_low_ms"] == pytest.approx(est * (1 - machine))
        assert row["estimated_high_ms"] == pytest.approx(est * (1 + machine))
        assert row["range_half"] == pytest.approx(machine)
    # The outlier's own miss does not widen its own range.
    assert rows[4]["machine_half"] < rows[0]["machine_half"]


def test_bricks_and_machine_add_in_quadrature():
    rows = [_row("x", 100.0, 100.0, precision=0.03)]
    rows += [_row(f"m{i}", 10.0, 10.0) for i in range(3)]
    rows[1]["estimated_ms"] = 10.0 * math.exp(0.03)  # others: RMS 0.03/sqrt3
    ranges.widen(rows)
    machine = t975(3) * 0.03 / math.sqrt(3)
    half = math.hypot(0.03, machine)
    assert rows[0]["range_half"] == pytest.approx(half)
    assert rows[0]["estimated_low_ms"] == pytest.approx(100 * (1 - half))
    assert rows[0]["estimated_high_ms"] == pytest.approx(100 * (1 + half))


def test_too_few_other_models_leave_the_bricks_range_and_say_so():
    rows = [_row(f"m{i}", 10.0, 10.0, precision=0.04) for i in range(2)]
    ranges.widen(rows)
    for row in rows:
        assert row["machine_half"] is None
        assert row["estimated_low_ms"] == pytest.approx(9.6)
        assert row["estimated_high_ms"] == pytest.approx(10.4)
        assert row["range_half"] == pytest.approx(0.04)
        assert row["range_flag"] == ""


def test_a_wide_range_is_flagged_with_its_larger_cause():
    # Bricks +-15% in x; the others agree exactly: the bricks are named.
    rows = [_row("x", 10.0, 10.0, 0.15, bricks=("conv_1", "bn_2"))]
    rows += [_row(f"m{i}", 10.0, 10.0) for i in range(3)]
    ranges.widen(rows)
    assert rows[0]["range_flag"] == "bricks: conv_1, bn_2"
    assert [r["range_flag"] for r in rows[1:]] == ["", "", ""]
    # The others miss by 20% either way: the machine is named, with its
    # RMS and its 95% half-width.
    rows = [_row("x", 10.0, 10.0, 0.01)]
    rows += [_row(f"m{i}", 10.0 * r, 10.0) for i, r in enumerate((1.2, 1.2))]
    rows += [_row("m3", 10.0 / 1.2, 10.0)]
    ranges.widen(rows)
    spread = math.log(1.2)
    assert rows[0]["range_flag"] == (
        f"machine: the other models missed by {100 * spread:.1f}% RMS "
        f"beyond their bricks' precision, +-{100 * t975(3) * spread:.1f}% "
        "at 95%"
    )


def test_a_range_the_anchors_widen_names_their_drift():
    # Stored bricks read 1.21x timed again: +-9.5% of the carry's, in
    # quadrature with +-6% of the other bricks'; the others agree.
    anchor = math.log(1.1)
    rows = [_row("x", 10.0, 10.0, math.hypot(0.06, anchor), ("conv_1",))]
    rows[0].update(anchor_drift=1.21, anchor_half=anchor)
    rows += [_row(f"m{i}", 10.0, 10.0) for i in range(3)]
    ranges.widen(rows)
    assert rows[0]["range_flag"] == (
        "anchors: its stored bricks read x1.210 timed again beside it, "
        "carried half-way; bricks: conv_1"
    )
    # The other bricks weigh more: they are named, as before.
    rows[0].update(estimate_precision=math.hypot(0.15, anchor))
    ranges.widen(rows)
    assert rows[0]["range_flag"] == "bricks: conv_1"


def test_a_miss_its_own_bricks_explain_is_not_the_machines():
    # m1 misses by 20% with bricks of +-40% (mostly predicted): its miss
    # is its bricks'; m2 misses by 20% with bricks of +-4%: 0.2^2 less
    # (0.04 / z)^2 of it is the machine's.
    rows = [
        _row("x", 10.0, 10.0, 0.01),
        _row("m1", 12.0, 10.0, 0.4),
        _row("m2", 12.0, 10.0, 0.04),
    ]
    ranges.widen(rows)
    log = math.log(1.2)
    assert ranges.excess(log, 0.4) == 0
    m2 = math.sqrt(log**2 - (0.04 / stats.Z95) ** 2)
    assert ranges.excess(log, 0.04) == pytest.approx(m2)
    assert rows[0]["machine_half"] == pytest.approx(
        t975(2) * math.sqrt(m2**2 / 2)
    )
    # Without a precision, the whole miss counts (rows written before it).
    assert ranges.excess(log, None) == log


def test_widening_twice_gives_the_same_ranges():
    rows = [
        _row(f"m{i}", 10.0 * r, 10.0, 0.02)
        for i, r in enumerate((1, 1.05, 0.97, 1.02))
    ]
    ranges.widen(rows)
    first = [dict(r) for r in rows]
    ranges.widen(rows)
    assert rows == first


def test_rows_without_an_estimate_or_a_precision_are_left_alone():
    rows = [_row(f"m{i}", 10.0, 10.0) for i in range(4)]
    rows.append(_row("failed", math.nan, 10.0))
    old = _row("old", 10.0, 10.0)
    del old["estimate_precision"]  # a row written before it was kept
    rows.append(old)
    ranges.widen(rows)
    assert "range_half" not in rows[-2] and "range_half" not in rows[-1]
    assert rows[0]["machine_half"] == 0.0  # the others agree exactly
    summary = ranges.summary(rows)
    assert summary == {"range_holds": 5, "flagged": 0, "machine_variation": 0.0}


def test_summary_counts_holds_and_flags():
    rows = [_row("x", 10.0, 12.0, 0.1), _row("y", 10.0, 10.5, 0.1)]
    rows[0]["range_flag"] = "bricks: a"
    summary = ranges.summary(rows)
    assert (summary["range_holds"], summary["flagged"]) == (1, 1)
    assert summary["machine_variation"] == pytest.approx(
        math.sqrt((math.log(10 / 12) ** 2 + math.log(10 / 10.5) ** 2) / 2)
    )


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
