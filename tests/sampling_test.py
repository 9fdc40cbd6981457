"""Tests for dlbricks_tf/measuring/sampling.py: stop rule, rounds, options.

Timers here are fakes that return given samples: no model runs. That
importing the ORT timer (and so this module) imports no TensorFlow is
checked in ort_timing_test.py.
"""

import pytest

from dlbricks_tf import stats
from dlbricks_tf.measuring import sampling, timing


class FakeTimer(sampling.AdaptiveSampling):
    """Returns `per_batch` samples of `value` ms per `sample()`."""

    def __init__(self, value, options, per_batch=4):
        self.options = options
        self._samples, self._sampling_s, self._s = [], 0.0, per_batch
        self._factors = []
        self._crowded = []
        self.value, self.batches = value, 0

    def sample(self):
        batch = [self.value] * self._batch_count()
        self._samples += batch
        self.batches += 1
        return batch

    def result(self):
        return stats.summarize(self._samples, noisy=not self.settled)


def test_a_steady_timer_settles_after_min_samples():
    timer = FakeTimer(1.0, sampling.TimingOptions(min_samples=8))
    [result] = sampling.time_interleaved([timer])
    assert timer.settled and not result.noisy
    assert result.samples == 8 and timer.batches == 2


def test_rounds_stop_each_timer_when_it_is_done():
    quick = FakeTimer(1.0, sampling.TimingOptions(min_samples=4))
    slow = FakeTimer(2.0, sampling.TimingOptions(min_samples=12))
    results = sampling.time_interleaved([quick, slow])
    assert (quick.batches, slow.batches) == (1, 3)
    assert [r.median_ms for r in results] == [1.0, 2.0]


def test_a_batch_never_passes_max_samples():
    options = sampling.TimingOptions(min_samples=50, max_samples=6)
    timer = FakeTimer(1.0, options, per_batch=4)
    [result] = sampling.time_interleaved([timer])
    assert timer.capped and result.samples == 6 and result.noisy


def test_timing_re_exports_the_sampling_names():
    for name in (
        "AdaptiveSampling",
        "MeasurementError",
        "Sampler",
        "TimingOptions",
        "time_interleaved",
    ):
        assert getattr(timing, name) is getattr(sampling, name)


def test_copies_are_for_bricks_only():
    models, bricks = sampling.model_and_brick_options(
        "chain",
        input_copies=3,
        weight_copies=2,
        chain_links=16,
        chain_order="shuffled",
        precision=0.05,
        max_samples=40,
    )
    assert (models.input_copies, models.weight_copies) == (1, 1)
    assert (bricks.input_copies, bricks.weight_copies) == (3, 2)
    assert (bricks.chain_links, bricks.chain_order) == (16, "shuffled")
    assert models.precision == bricks.precision == 0.05


def test_brick_caps_apply_to_loops_only_and_never_exceed_the_models():
    caps = dict(brick_max_samples=60, brick_max_seconds=1.0)
    models, chained = sampling.model_and_brick_options(
        "chain", max_samples=100, max_seconds=5.0, **caps
    )
    assert (chained.max_samples, chained.max_seconds) == (100, 5.0)
    _, looped = sampling.model_and_brick_options(
        "loop", max_samples=100, max_seconds=5.0, **caps
    )
    assert (looped.max_samples, looped.max_seconds) == (60, 1.0)
    _, capped = sampling.model_and_brick_options(
        "loop", max_samples=30, max_seconds=0.5, **caps
    )
    assert (capped.max_samples, capped.max_seconds) == (30, 0.5)
    _, uncapped = sampling.model_and_brick_options("loop", max_samples=30)
    assert uncapped.max_samples == 30
    assert models == sampling.TimingOptions(max_samples=100, max_seconds=5.0)


def test_bricks_take_their_own_floor_within_their_cap():
    models, chained = sampling.model_and_brick_options(
        "chain", min_samples=10, brick_min_samples=5
    )
    assert (models.min_samples, chained.min_samples) == (10, 5)
    _, looped = sampling.model_and_brick_options(
        "loop", max_samples=40, brick_max_samples=3, brick_min_samples=5
    )
    assert (looped.min_samples, looped.max_samples) == (3, 3)
    _, same = sampling.model_and_brick_options("chain", min_samples=7)
    assert same.min_samples == 7


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
