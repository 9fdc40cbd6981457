"""Tests for dlbricks_tf/stats.py."""

import math

import pytest

from dlbricks_tf import stats


def test_median_ci_ranks_small_n_is_whole_range():
    assert stats.median_ci_ranks(1) == (0, 0)
    assert stats.median_ci_ranks(5) == (0, 4)


def test_median_ci_ranks_n10_matches_binomial_table():
    # P(B <= 1) = 11/1024 <= 0.025 < P(B <= 2): interval [x_(2), x_(9)].
    assert stats.median_ci_ranks(10) == (1, 8)


def test_median_ci_ranks_are_symmetric_and_narrow_with_n():
    lo, hi = stats.median_ci_ranks(100)
    assert lo + hi == 99
    assert (hi - lo) / 100 < 0.25
    lo2, hi2 = stats.median_ci_ranks(1000)
    assert (hi2 - lo2) / 1000 < (hi - lo) / 100


def test_summarize_statistics():
    samples = [5.0, 1.0, 2.0, 3.0, 4.0, 100.0, 2.5, 3.5, 1.5, 4.5]
    t = stats.summarize(samples, noisy=False, calls_per_sample=7)
    assert t.min_ms == 1.0
    assert t.max_ms == 100.0
    assert t.median_ms == pytest.approx(3.25)
    # 20% trimmed: drop 1.0, 1.5 and 5.0, 100.0.
    assert t.trimmed_mean_ms == pytest.approx((2 + 2.5 + 3 + 3.5 + 4 + 4.5) / 6)
    assert (t.ci_low_ms, t.ci_high_ms) == (1.5, 5.0)
    assert t.samples == 10 and t.calls_per_sample == 7 and not t.noisy


def test_summarize_rejects_empty():
    with pytest.raises(ValueError):
        stats.summarize([], noisy=False)


def test_is_settled():
    assert not stats.is_settled([1.0] * 4, 0.02)  # Too few samples.
    assert stats.is_settled([1.0] * 10, 0.02)
    assert not stats.is_settled([1.0, 2.0] * 10, 0.02)
    assert stats.is_settled([1.0, 1.001] * 10, 0.02)


def test_absolute_precision_settles_tiny_timings():
    tiny = [0.010, 0.013] * 10  # +-15%, but within 2 microseconds.
    assert not stats.is_settled(tiny, 0.02)
    assert stats.is_settled(tiny, 0.02, absolute_ms=0.002)


def test_relative_half_width():
    assert stats.relative_half_width(10.0, 9.0, 10.5) == pytest.approx(0.1)
    assert math.isinf(stats.relative_half_width(0.0, 0.0, 0.0))


def test_a_scaled_timing_scales_its_samples_not_its_overheads():
    t = stats.summarize(
        [1.0, 2.0, 3.0, 4.0, 5.0], noisy=False, loop_overhead_ms=0.5
    )
    doubled = t.scaled(2.0)
    for name in stats.SAMPLE_MS:
        assert getattr(doubled, name) == pytest.approx(2 * getattr(t, name))
    assert doubled.loop_overhead_ms == 0.5 and doubled.samples == 5
    assert doubled.noisy == t.noisy
    assert doubled.center_ms == pytest.approx(6.0)


def test_timing_dict_round_trip():
    t = stats.summarize([1.0, 2.0, 3.0], noisy=True, dispatch_ms=0.3)
    assert stats.Timing.from_dict(t.to_dict()) == t
    assert t.relative_precision == pytest.approx(0.5)


def test_geomean():
    assert stats.geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert stats.geomean(v for v in (1.0, 1000.0)) == pytest.approx(31.6227766)
    assert math.isnan(stats.geomean([]))


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
