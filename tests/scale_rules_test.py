"""Tests for benchmarks/scale_rules.py: the rules and spreads, on exact
arithmetic (no timing)."""

import math

import pytest

from benchmarks import scale_rules


def _process(slowdowns, base=None, rounds=2, batches=4, reading_ms=2.0):
    """Rows of one process: each round's batches of each model run
    `slowdowns[round]` slower, and so do their readings."""
    base = base or {"a": 10.0, "b": 3.0}
    rows = []
    for r in range(rounds):
        for model, ms in base.items():
            for _ in range(batches):
                s = slowdowns[r]
                rows.append(
                    {
                        "model": model,
                        "round": r,
                        "raw": ms * s,
                        "reading": reading_ms * s,
                        "compute": 0.5 * reading_ms * s,
                        "memory": 0.5 * reading_ms * s,
                        "block": reading_ms * s,
                    }
                )
    return rows


def test_a_slowdown_the_readings_share_leaves_the_window_rules_unchanged():
    processes = [_process([1.0, 1.0]), _process([2.0, 2.0])]
    for rule in (
        "own reading",
        "window 5",
        "window 27",
        "compute part, window 9",
        "conv block, own",
    ):
        logs = scale_rules.measurements(processes, rule)
        for model in ("a", "b"):
            first, second = logs[model][0], logs[model][1]
            assert second == pytest.approx(first)  # The same, 2x slower.
            assert first[1] == pytest.approx(first[0])
            assert scale_rules.spreads(logs[model]) == pytest.approx((0, 0, 0))
        # The state is a constant: the reading itself at 2 ms per reading.
        assert logs["a"][0][0] == pytest.approx(
            math.log(10.0 / (1.0 if "compute" in rule else 2.0))
        )


def test_raw_keeps_the_slowdown_and_damped_halves_it():
    processes = [_process([1.0, 1.0]), _process([4.0, 4.0])]
    raw = scale_rules.measurements(processes, "raw")
    assert raw["a"] == {
        0: [math.log(10.0)] * 2,
        1: [math.log(40.0)] * 2,
    }
    damped = scale_rules.measurements(processes, "window 9 ^0.5")
    # 40 / (4 * 2) ** 0.5 = 10 * 4 ** 0.5 / 2 ** 0.5.
    assert damped["a"][1] == pytest.approx([math.log(40.0 / 8**0.5)] * 2)


def test_spreads_within_between_and_all():
    logs = {0: [0.0, 0.2], 1: [1.0, 1.2]}
    within, between, every = scale_rules.spreads(logs)
    assert within == pytest.approx(math.sqrt(0.02))  # Each pair's variance.
    assert between == pytest.approx(math.sqrt(0.5))  # Means 0.1 and 1.1.
    assert every == pytest.approx(
        math.sqrt(sum((x - 0.6) ** 2 for x in (0.0, 0.2, 1.0, 1.2)) / 3)
    )


def test_a_window_follows_the_batches_in_the_order_they_were_taken():
    rows = _process([1.0, 3.0], batches=1)
    # Readings 2, 2, 6, 6: a window of 5 at the third batch holds 2, 2, 6.
    factors = scale_rules.RULES["window 5"](rows)
    assert factors == pytest.approx([1 / 2, 1 / 2, 1 / 2, 1 / 4])


def test_the_table_has_a_row_per_rule():
    lines = scale_rules.table([_process([1.0, 1.1]), _process([1.2, 1.0])])
    rows = lines.splitlines()[2:]
    assert [r.split(" | ")[0].lstrip("| ") for r in rows] == list(
        scale_rules.RULES
    )
    assert rows[1].endswith("| 0.0 |")  # own reading: every slowdown shared.


def test_coupling_is_the_slope_and_correlation_of_the_logs():
    # Each batch runs the square root of its reading's slowdown slower.
    rows = [
        {"model": "a", "round": 0, "raw": 10.0 * s**0.5, "reading": 2.0 * s}
        for s in (1.0, 1.5, 2.0, 4.0)
    ]
    table = scale_rules.coupling([rows, rows[::-1]])
    assert "| a | 8 | 1.00 | 0.50 |" in table.splitlines()


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
