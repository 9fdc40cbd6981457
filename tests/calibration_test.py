"""Tests for dlbricks_tf/estimating/calibration.py: per-kind factors from
timed bricks against their predictions, on exact arithmetic."""

import math

import pytest

from dlbricks_tf.estimating import calibration


def test_a_kind_timed_at_twice_its_prediction_is_doubled():
    cal = calibration.fit(["conv"] * 3, [2.0, 4.0, 6.0], [1.0, 2.0, 3.0])
    assert cal.factor("conv") == pytest.approx(2.0)
    # The only kind timed sets the overall ratio too.
    assert cal.factor("dense") == pytest.approx(2.0)
    assert cal.counts == {"conv": 3}


def test_a_kind_of_few_timed_bricks_is_pulled_toward_all_kinds():
    # One batchnorm brick at 4x; three conv bricks right.
    cal = calibration.fit(
        ["batchnorm", "conv", "conv", "conv"],
        [4.0, 1.0, 2.0, 3.0],
        [1.0, 1.0, 2.0, 3.0],
    )
    # The overall median log ratio of (ln 4, 0, 0, 0) is 0.
    assert cal.overall == pytest.approx(1.0)
    # One brick against PRIOR = 2 pseudo-bricks at the overall ratio.
    w = 1 / (1 + calibration.PRIOR)
    assert cal.factor("batchnorm") == pytest.approx(math.exp(w * math.log(4)))
    assert cal.factor("conv") == pytest.approx(1.0)
    assert cal.factor("pool") == pytest.approx(1.0)  # None timed.


def test_the_median_ignores_one_wild_brick():
    cal = calibration.fit(
        ["activation"] * 5, [0.5, 0.5, 0.5, 0.5, 50.0], [1.0] * 5
    )
    assert cal.factor("activation") == pytest.approx(0.5)


def test_a_brick_timed_at_zero_is_clamped_not_a_zero_factor():
    cal = calibration.fit(["identity"], [0.0], [0.01], prior=0.0)
    assert cal.factor("identity") == pytest.approx(1 / calibration.LIMIT)


def test_nothing_timed_changes_nothing_and_lengths_must_match():
    cal = calibration.fit([], [], [])
    assert cal.factor("conv") == 1.0 and cal.counts == {}
    with pytest.raises(ValueError, match="One kind, timing and prediction"):
        calibration.fit(["conv"], [1.0, 2.0], [1.0])


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
