"""Tests for dlbricks_tf/estimating/estimate.py."""

from types import SimpleNamespace

import pytest

from dlbricks_tf.estimating import estimate as estimate_lib
from dlbricks_tf.stats import Timing


def _timing(ms, noisy=False):
    return Timing(
        min_ms=ms * 0.8,
        median_ms=ms,
        trimmed_mean_ms=ms,
        max_ms=ms * 1.5,
        samples=20,
        ci_low_ms=ms * 0.9,
        ci_high_ms=ms * 1.1,
        noisy=noisy,
    )


def _decomposition(signatures, dependencies, name="m"):
    bricks = [SimpleNamespace(signature=s) for s in signatures]
    return SimpleNamespace(name=name, bricks=bricks, dependencies=dependencies)


# A diamond with a repeated brick:  0:a -> {1:b, 2:c -> 3:c} -> 4:a
_DIAMOND = _decomposition(
    ["a", "b", "c", "c", "a"], [(), (0,), (0,), (2,), (1, 3)]
)
_RESULTS = {"a": _timing(1.0), "b": _timing(5.0), "c": _timing(2.0)}


def test_sequential_is_sum_with_repeats_counted():
    est = estimate_lib.estimate(_DIAMOND, _RESULTS)
    assert est.mode == "sequential"
    assert est.ms == pytest.approx(1 + 5 + 2 + 2 + 1)
    assert est.low_ms == pytest.approx(0.9 * 11)
    assert est.high_ms == pytest.approx(1.1 * 11)
    assert est.bricks == 5 and not est.noisy
    assert est.relative_uncertainty == pytest.approx(0.1)


def test_statistic_picks_what_is_summed():
    est = estimate_lib.estimate(_DIAMOND, _RESULTS, statistic="min")
    assert est.ms == pytest.approx(0.8 * 11)
    with pytest.raises(ValueError, match="statistic"):
        estimate_lib.estimate(_DIAMOND, _RESULTS, statistic="mode")


def test_mean_is_summed_with_its_interval_and_median_without_one():
    # Timings with a mean add their means and their means' intervals;
    # one stored without a mean (an older store) adds its median and
    # median interval, as estimates did when it was written.
    results = {
        "a": Timing(
            1, 1, 1, 9, 20, 0.9, 1.1, False, mean_ms=1.5, mean_half_ms=0.2
        ),
        "b": _timing(5.0),
        "c": Timing(
            2, 2, 2, 9, 20, 1.8, 2.2, False, mean_ms=3.0, mean_half_ms=0.5
        ),
    }
    est = estimate_lib.estimate(_DIAMOND, results)
    assert est.ms == pytest.approx(1.5 + 5 + 3 + 3 + 1.5)
    assert est.low_ms == pytest.approx(1.3 + 4.5 + 2.5 + 2.5 + 1.3)
    assert est.high_ms == pytest.approx(1.7 + 5.5 + 3.5 + 3.5 + 1.7)
    median = estimate_lib.estimate(_DIAMOND, results, statistic="median")
    assert median.ms == pytest.approx(1 + 5 + 2 + 2 + 1)
    assert median.low_ms == pytest.approx(0.9 + 4.5 + 1.8 + 1.8 + 0.9)
    # A store without means: the default estimate is the median's.
    old = estimate_lib.estimate(_DIAMOND, _RESULTS)
    assert (
        old.ms
        == estimate_lib.estimate(
            _DIAMOND, _RESULTS, "sequential", statistic="median"
        ).ms
    )


def test_parallel_is_critical_path():
    est = estimate_lib.estimate(_DIAMOND, _RESULTS, mode="parallel")
    # Paths: a-b-a = 7, a-c-c-a = 6.
    assert est.ms == pytest.approx(7.0)
    slow_c = dict(_RESULTS, c=_timing(3.0))
    assert estimate_lib.estimate(_DIAMOND, slow_c, "parallel").ms == 8.0


def test_parallel_of_a_chain_equals_sequential():
    chain = _decomposition(["a", "b", "c"], [(), (0,), (1,)])
    seq = estimate_lib.estimate(chain, _RESULTS, "sequential")
    par = estimate_lib.estimate(chain, _RESULTS, "parallel")
    assert seq.ms == pytest.approx(par.ms)


def test_missing_bricks_raise_listing_signatures():
    with pytest.raises(estimate_lib.MissingResultsError) as info:
        estimate_lib.estimate(_DIAMOND, {"a": _timing(1.0)})
    assert info.value.signatures == ("b", "c")
    assert "'b'" not in str(info.value) and "b, c" in str(info.value)
    assert info.value.model == "m"


def test_noisy_bricks_are_flagged():
    results = dict(_RESULTS, c=_timing(2.0, noisy=True))
    est = estimate_lib.estimate(_DIAMOND, results)
    assert est.noisy and est.noisy_signatures == ("c",)


def test_bad_mode_and_bad_dependencies_raise():
    with pytest.raises(ValueError, match="mode"):
        estimate_lib.estimate(_DIAMOND, _RESULTS, mode="fastest")
    forward = _decomposition(["a", "b"], [(1,), ()])
    with pytest.raises(ValueError, match="earlier"):
        estimate_lib.estimate(forward, _RESULTS, mode="parallel")


def test_call_overhead_is_added_once():
    plain = estimate_lib.estimate(_DIAMOND, _RESULTS)
    paid = estimate_lib.estimate(_DIAMOND, _RESULTS, call_overhead_ms=0.5)
    assert paid.ms == pytest.approx(plain.ms + 0.5)
    assert paid.low_ms == pytest.approx(plain.low_ms + 0.5)
    par = estimate_lib.estimate(
        _DIAMOND, _RESULTS, "parallel", call_overhead_ms=0.5
    )
    assert par.ms == pytest.approx(7.5)


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("median_ms", -1.0, "whose latency is -1.0 ms"),
        ("median_ms", float("inf"), "whose latency is inf ms"),
        ("median_ms", float("nan"), "whose latency is nan ms"),
        ("ci_high_ms", float("inf"), "whose interval high is inf ms"),
        ("ci_low_ms", "low", "whose interval low is 'low' ms"),
        ("mean_half_ms", "wide", "that is not numbers"),
    ],
)
def test_a_timing_that_would_make_an_impossible_sum_is_named(
    field, value, words
):
    import dataclasses

    mean = field == "mean_half_ms"
    bad = dataclasses.replace(
        _timing(5.0), **{field: value}, **({"mean_ms": 5.0} if mean else {})
    )
    statistic = "mean" if mean else "median"
    with pytest.raises(estimate_lib.ImpossibleTimingError) as info:
        estimate_lib.estimate(
            _DIAMOND, {**_RESULTS, "b": bad}, statistic=statistic
        )
    message = str(info.value)
    assert len(message.splitlines()) == 1
    assert message.startswith("Model 'm': brick b has a stored timing ")
    assert words in message and "`dlbricks bench` times it again" in message
    assert info.value.signature == "b"


def test_a_low_bound_below_zero_is_cut_at_zero():
    # A chained brick of a few microseconds: its mean's interval reaches
    # below 0, which no latency does.
    tiny = Timing(
        0.001, 0.002, 0.002, 0.003, 5, 0.001, 0.003, False,
        mean_ms=0.001, mean_half_ms=0.004,
    )  # fmt: skip
    one = _decomposition(["t"], [()])
    est = estimate_lib.estimate(one, {"t": tiny})
    assert est.ms == pytest.approx(0.001) and est.low_ms == 0.0
    assert est.high_ms == pytest.approx(0.005)


def test_speedup():
    assert estimate_lib.speedup({"x": 10.0, "y": 30.0}, {"a": 4, "b": 4}) == 5


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
