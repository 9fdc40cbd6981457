"""Tests for dlbricks_tf/measuring/precision.py (no TensorFlow)."""

import math

import pytest

from dlbricks_tf.measuring import precision
from dlbricks_tf.stats import Timing, summarize


def _spread(center: float, width: float, n: int = 21) -> list[float]:
    """n samples evenly spread over center +- width."""
    return [center - width + 2 * width * i / (n - 1) for i in range(n)]


def test_interval_is_the_mean_interval_the_stored_timing_carries():
    samples = _spread(10.0, 1.0)
    # Student's t on the spread: what `summarize` stores and estimates add.
    sd = math.sqrt(sum((v - 10.0) ** 2 for v in samples) / 20)
    expected = precision.stats.t975(20) * sd / math.sqrt(21)
    mean, half = precision.interval(samples)
    assert mean == pytest.approx(10.0)
    assert half == pytest.approx(expected)
    assert half == pytest.approx(summarize(samples, noisy=False).mean_half_ms)
    assert precision.interval([1.0]) == (1.0, math.inf)
    assert precision.interval([]) == (0.0, math.inf)


def test_a_burst_widens_the_interval_the_chain_stops_on():
    # One sample of 20 caught in a neighbour's burst: the median barely
    # moves, the mean's interval (what the estimate adds up) widens, and
    # the chain goes on sampling.
    quiet = _spread(10.0, 0.05)
    burst = [*quiet[:-1], 30.0]
    weights = {"m": {"a": 1}}
    assert precision.chain_verdict({"a": quiet}, weights, {}, 0.02)[0]
    assert not precision.chain_verdict({"a": burst}, weights, {}, 0.02)[0]


def test_a_tiny_imprecise_brick_does_not_hold_a_model_back():
    # A 10 ms brick known to +-0.5% and a 0.01 ms brick known to +-50%:
    # the model's estimate (10.01 ms) is known far better than 2%.
    samples = {"big": _spread(10.0, 0.05), "tiny": _spread(0.01, 0.005)}
    settled, holding = precision.chain_verdict(
        samples, {"m": {"big": 1, "tiny": 1}}, {}, 0.02
    )
    assert settled and not holding


def test_the_brick_that_keeps_a_model_from_its_target_is_named():
    samples = {"a": _spread(5.0, 2.0), "b": _spread(5.0, 0.01)}
    settled, holding = precision.chain_verdict(
        samples, {"m": {"a": 1, "b": 1}}, {}, 0.02
    )
    assert not settled
    assert holding == {"a"}


def test_counts_weigh_and_known_bricks_widen_the_budget():
    samples = {"a": _spread(1.0, 0.15)}  # a's mean known to +-4%.
    assert precision.interval(samples["a"])[1] == pytest.approx(0.04, abs=0.005)
    # Alone, a is 100% of the model: +-4% misses 2%.
    assert not precision.chain_verdict(samples, {"m": {"a": 1}}, {}, 0.02)[0]
    # Beside 99 ms already timed, a is 1% of the model: its share of the
    # budget is 0.02^2 * 100 * 1, more than its (4% of 1 ms)^2.
    weights = {"m": {"a": 1, "old": 1}}
    assert precision.chain_verdict(samples, weights, {"old": 99.0}, 0.02)[0]


def test_a_model_mostly_untimed_is_extrapolated_from_its_timed_calls():
    # a is one of the model's 50 brick calls: its estimate is taken as 50
    # times a's, so a needs to be known to 2% * sqrt(50), not 2%.
    samples = {"a": _spread(1.0, 0.15)}  # +-4%.
    others = {f"b{i}": 1 for i in range(49)}
    weights = {"m": {"a": 1, **others}}
    assert precision.chain_verdict(samples, weights, {}, 0.02)[0]
    # Once every call is timed, nothing is extrapolated.
    known = {k: 0.0 for k in others}
    assert not precision.chain_verdict(samples, weights, known, 0.02)[0]


def test_bricks_of_no_model_are_held_to_the_chain_sum():
    samples = {"a": _spread(1.0, 0.001), "b": _spread(1.0, 0.5)}
    settled, holding = precision.chain_verdict(samples, {}, {}, 0.02)
    assert not settled and holding == {"b"}
    settled, _ = precision.chain_verdict(samples, {}, {}, 0.5)
    assert settled


def test_estimate_precision_adds_half_widths_in_quadrature():
    a = summarize(_spread(3.0, 0.3), noisy=False)
    b = summarize(_spread(4.0, 0.4), noisy=False)
    ha, hb = precision.timing_half_width(a), precision.timing_half_width(b)
    got = precision.estimate_precision({"a": 2, "b": 1}, {"a": a, "b": b})
    want = math.sqrt((2 * ha) ** 2 + hb**2) / (2 * 3.0 + 4.0)
    assert math.isclose(got, want)


def test_shared_parts_add_end_to_end_within_a_group_only():
    def timing(ms, half):
        return Timing(ms, ms, ms, ms, 0, ms - half, ms + half, False)

    timings = {
        "t": timing(4.0, 0.4),  # Timed.
        "a": timing(2.0, 0.2),  # Predicted, conv.
        "b": timing(1.0, 0.1),  # Predicted, conv.
        "c": timing(3.0, 0.3),  # Predicted, dense.
    }
    shared = {"a": ("conv", 0.5), "b": ("conv", 0.25), "c": ("dense", 0.6)}
    counts = {"t": 1, "a": 2, "b": 1, "c": 1}
    got = precision.estimate_precision(counts, timings, {"a", "b", "c"}, shared)
    # Own parts in quadrature with the timed brick's; conv's shared parts
    # end to end (a counted twice); the two groups in quadrature.
    own = 0.4**2 + (2 * 0.2) ** 2 + 0.1**2 + 0.3**2
    groups = (2 * 0.5 + 0.25) ** 2 + 0.6**2
    assert got == pytest.approx(math.sqrt(own + groups) / (4 + 4 + 1 + 3))
    # Without shared parts, predicted bricks add end to end (as before).
    plain = precision.estimate_precision(counts, timings, {"a", "b", "c"})
    linear = 2 * 0.2 + 0.1 + 0.3
    assert plain == pytest.approx(math.sqrt(0.4**2 + linear**2) / 12)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
