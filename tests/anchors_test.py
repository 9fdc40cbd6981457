"""Tests for dlbricks_tf/estimating/anchors.py: which stored bricks a model
times again beside it, and how their drift carries its estimate (exact
arithmetic); and a real `run` whose second model's bricks are all stored
(real timers, a real store; no timing threshold)."""

import dataclasses
import math

import pytest

from dlbricks_tf.estimating import anchors
from dlbricks_tf.machine.fingerprint import system_fingerprint
from dlbricks_tf.measuring import sampling
from dlbricks_tf.running import job
from dlbricks_tf.stats import Timing
from dlbricks_tf.storing.store import Store
from tests import models


def _t(ms: float, half: float = 0.0) -> Timing:
    return Timing(
        min_ms=ms * 0.9,
        median_ms=ms,
        trimmed_mean_ms=ms,
        max_ms=ms * 1.2,
        samples=10,
        ci_low_ms=ms - half,
        ci_high_ms=ms + half,
        noisy=False,
        loop_overhead_ms=0.002,
        mean_ms=ms,
        mean_half_ms=half,
    )


COUNTS = {"a": 1, "b": 2, "c": 1, "d": 4}
STORED = {"a": _t(5.0), "b": _t(2.0), "c": _t(1.0), "d": _t(0.1)}


def test_the_heaviest_stored_bricks_until_half_of_the_stored_part():
    # Weights: a 5, b 4, c 1, d 0.4 (of 10.4): a alone holds 48%, a and b
    # 87%.
    assert anchors.choose(COUNTS, STORED, new=()) == ["a", "b"]
    assert anchors.choose(COUNTS, STORED, new=(), share=0.4) == ["a"]
    assert anchors.choose(COUNTS, STORED, new=(), most=1) == ["a"]
    # A brick timed beside the model is no anchor.
    assert anchors.choose(COUNTS, STORED, new={"a"}) == ["b"]


def test_anchors_only_where_enough_calls_are_stored():
    # Stored: c and d, 5 of the 8 calls; b and a new (3 calls).
    stored = {"c": STORED["c"], "d": STORED["d"]}
    assert anchors.choose(COUNTS, stored, new={"a", "b"}) == ["c"]
    assert anchors.choose(COUNTS, stored, new={"a", "b"}, from_share=0.7) == []
    assert anchors.choose(COUNTS, {}, new=()) == []


def test_a_slowdown_of_the_anchors_carries_every_stored_brick():
    retimed = {"a": _t(6.0), "b": _t(2.4)}  # 20% slower now.
    drift = anchors.drift(COUNTS, STORED, retimed)
    assert drift == pytest.approx((6.0 + 2 * 2.4) / (5.0 + 2 * 2.0))
    assert drift == pytest.approx(1.2)
    carried = anchors.carried(STORED, {"a", "b", "c"}, drift)
    assert carried["c"].mean_ms == pytest.approx(1.2)
    assert carried["c"].median_ms == pytest.approx(1.2)
    assert carried["c"].min_ms == pytest.approx(0.9 * 1.2)
    assert carried["c"].samples == 10
    # The loop's overhead is no latency: it is kept as it was.
    assert carried["c"].loop_overhead_ms == 0.002
    assert carried["d"] is STORED["d"]  # Not carried: timed beside it.
    assert STORED["c"].mean_ms == 1.0  # The stored timings stand.


def test_a_steady_machine_leaves_the_estimate_unchanged():
    retimed = {"a": _t(5.0), "b": _t(2.0)}
    assert anchors.drift(COUNTS, STORED, retimed) == 1.0
    assert anchors.carried(STORED, {"a", "b"}, 1.0) == STORED
    assert anchors.drift(COUNTS, STORED, {}) == 1.0


def test_the_drift_is_known_to_its_anchors_precision():
    retimed = {"a": _t(5.0, half=0.3), "b": _t(2.0, half=0.2)}
    # sqrt(0.3^2 + (2 * 0.2)^2) = 0.5, over 5 + 2 * 2 = 9.
    assert anchors.drift_precision(COUNTS, retimed) == pytest.approx(0.5 / 9)


def test_the_stored_bricks_are_carried_half_way_in_logs():
    assert anchors.DAMPING == 0.5
    assert anchors.carry(1.21) == pytest.approx(1.1)
    assert anchors.carry(0.81) == pytest.approx(0.9)
    assert anchors.carry(1.0) == 1.0
    assert anchors.carry(1.21, damping=1.0) == pytest.approx(1.21)
    assert anchors.carry(1.21, damping=0.0) == 1.0


def test_the_carry_is_known_to_its_anchors_and_to_its_two_estimates():
    retimed = {"a": _t(5.0, half=0.3), "b": _t(2.0, half=0.2)}
    # Steady: only the anchors' own precision, halved with the log.
    assert anchors.carry_precision(COUNTS, retimed, 1.0) == pytest.approx(
        0.5 * 0.5 / 9
    )
    # A drift of 1.21: the carry, 1.1, sits log(1.1) from either end.
    assert anchors.carry_precision(COUNTS, retimed, 1.21) == pytest.approx(
        math.hypot(0.5 * 0.5 / 9, math.log(1.1))
    )
    # Carried all the way, the stored estimate is the far end.
    assert anchors.carry_precision(
        COUNTS, retimed, 1.21, damping=1.0
    ) == pytest.approx(math.hypot(0.5 / 9, math.log(1.21)))
    assert anchors.carry_precision(COUNTS, {}, 1.21) == 0.0


def test_mean_half_of_none_stays_none():
    t = dataclasses.replace(STORED["a"], mean_half_ms=None)
    assert anchors.carried({"a": t}, {"a"}, 2.0)["a"].mean_half_ms is None


SETTINGS, CHECKED = models.settings()
# Settled at 3 samples (a precision of +-100%): no stored brick is noisy,
# so a later run keeps every one (a noisy one would be timed again).
FAST = sampling.TimingOptions(
    precision=1.0,
    min_samples=3,
    max_samples=6,
    max_seconds=0.5,
    target_sample_ms=0.5,
)


@pytest.mark.parametrize("use", [True, False], ids=["anchors", "noanchors"])
def test_a_model_of_stored_bricks_times_anchors_and_stores_none(tmp_path, use):
    fp = system_fingerprint()
    first = job.ModelSource("first", builder=lambda: models.chain()[0])
    again = job.ModelSource("again", builder=lambda: models.chain()[0])
    with Store(tmp_path / "s.sqlite") as store:
        before = job.run_granularity(
            [first], 1, SETTINGS, fp, store, FAST, check_settings=CHECKED
        )
        stored = store.results(SETTINGS, fp)
        after = job.run_granularity(
            [again],
            1,
            SETTINGS,
            fp,
            store,
            FAST,
            check_settings=CHECKED,
            anchors=use,
        )
        assert store.results(SETTINGS, fp) == stored  # Nothing rewritten.
    (row,) = after.runs
    (first_row,) = before.runs
    assert first_row["anchor_bricks"] == 0  # Every brick timed beside it.
    assert first_row["anchor_drift"] == 1.0
    assert row["new_unique_bricks"] == 0
    if use:
        assert 1 <= row["anchor_bricks"] <= anchors.MOST
        assert row["anchor_drift"] > 0
    else:
        assert row["anchor_bricks"] == 0 and row["anchor_drift"] == 1.0
    assert row["anchor_carry"] == pytest.approx(math.sqrt(row["anchor_drift"]))
    # The same bricks, each carried half-way (in logs) by the drift.
    assert row["estimated_ms"] == pytest.approx(
        row["anchor_carry"] * first_row["estimated_ms"]
    )
    assert row["estimate_precision"] >= first_row["estimate_precision"]


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
