"""Tests for dlbricks_tf/estimating/calibration.py: per-kind factors from
timed bricks against their predictions, on exact arithmetic."""

import math

import pytest

from dlbricks_tf import stats
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


def test_kinds_that_agree_within_share_only_their_factors_error():
    ln2 = math.log(2)
    # Three kinds, each timed at one ratio: 1x, 2x, 0.5x.
    cal = calibration.fit(
        ["conv"] * 3 + ["batchnorm"] * 2 + ["activation"] * 3,
        [1.0] * 3 + [2.0] * 2 + [0.5] * 3,
        [1.0] * 8,
    )
    # No brick strays from its kind's ratio: no residual of its own.
    assert cal.spread("conv")[1] == 0 and cal.spread("pool")[1] == 0
    # The overall median log ratio is 0; the kinds lie (0, ln 2, -ln 2)
    # from it: tau^2 = 2 ln2^2 / (3 - 1).
    tau = ln2
    w = 3 / (3 + calibration.PRIOR)
    assert cal.spread("conv")[0] == pytest.approx((1 - w) * tau)
    # A kind not timed may lie anywhere the kinds do.
    assert cal.spread("pool")[0] == pytest.approx(tau)
    shared, own = cal.halves("pool", 10.0)
    assert shared == pytest.approx(10 * math.expm1(stats.Z95 * tau))
    assert own == 0


def test_a_kinds_own_spread_is_its_residuals_pooled_with_all_kinds():
    # conv: log ratios (-a, 0, a) around their median 0; batchnorm and
    # activation agree within; a wild dense brick is clipped.
    a = 0.2
    cal = calibration.fit(
        ["conv"] * 3 + ["batchnorm"] * 2 + ["activation"] * 2 + ["dense"] * 2,
        [math.exp(-a), 1.0, math.exp(a), 2.0, 2.0, 0.5, 0.5, 1.0, 10.0],
        [1.0] * 9,
    )
    clipped = min(math.log(10.0) / 2, calibration.CLIP)
    # Residuals: conv 2 a^2 over 2 dof; dense 2 clipped^2 over 1 dof.
    pooled = (2 * a * a + 2 * clipped**2) / (2 + 1 + 1 + 1)
    prior = calibration.PRIOR
    assert cal.spread("conv")[1] == pytest.approx(
        math.sqrt((2 * a * a + prior * pooled) / (2 + prior))
    )
    assert cal.spread("batchnorm")[1] == pytest.approx(
        math.sqrt(prior * pooled / (1 + prior))
    )
    assert cal.spread("pool")[1] == pytest.approx(math.sqrt(pooled))
    # More bricks of a kind, its factor known better.
    assert cal.spread("conv")[0] < cal.spread("pool")[0]


def test_too_few_kinds_say_nothing_of_the_others():
    cal = calibration.fit(["conv", "conv", "dense"], [1.0, 2.0, 1.0], [1.0] * 3)
    assert cal.spread("conv") is not None
    assert cal.spread("pool") is None and cal.halves("pool", 1.0) is None
    assert calibration.Calibration().halves("conv", 1.0) is None


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
