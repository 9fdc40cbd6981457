"""Tests for dlbricks_tf/measuring/rounds.py: rounds of real timers.

Bricks of tiny Keras models are timed by real TensorFlow timers, and an
ONNX file by real ONNX Runtime sessions; the tests count what was sampled,
committed and charged, and never assert a speed. That importing this
module (on the ONNX Runtime path) imports no TensorFlow is checked in
ort_timing_test.py.
"""

import dataclasses

import pytest

import dlbricks_tf
from dlbricks_tf.machine import settings as settings_lib
from dlbricks_tf.measuring import ort_timing, rounds, timing
from dlbricks_tf.stats import Timing
from tests import models

SETTINGS, _ = models.settings()
ORT = settings_lib.RunSettings(1, 1, 1, backend="onnxruntime")
FAST = timing.TimingOptions(
    min_samples=3,
    max_samples=5,
    max_seconds=0.2,
    target_sample_ms=0.5,
    samples_per_call=2,
    warmup_calls=1,
)
# Any interval is narrow enough: every timer settles at min_samples kept
# (samples this short can be left out as disturbed: room for more).
SETTLES = dataclasses.replace(FAST, absolute_precision_ms=1e9, max_samples=20)
# No interval is: every timer ends noisy at a cap.
NEVER_SETTLES = dataclasses.replace(
    FAST, precision=-1.0, absolute_precision_ms=-1.0
)


def _timer(model, options=FAST):
    return timing.Timer(model, SETTINGS, options, check_settings=False)


def _bricks(model, granularity=1):
    """{signature: brick} of a model, in its order."""
    d = dlbricks_tf.decompose(model, granularity=granularity)
    bricks = {}
    for brick in d.bricks:
        bricks.setdefault(brick.signature, brick)
    return bricks


class _Factory:
    """Makes the TF timer of a brick by its key, and keeps each made."""

    def __init__(self, bricks, options):
        self.bricks, self.options, self.made = bricks, options, {}

    def __call__(self, key):
        model = self.bricks[key].build(SETTINGS.batch_size)
        self.made[key] = _timer(model, self.options)
        return self.made[key]


@pytest.fixture(scope="module")
def chain_onnx(tmp_path_factory):
    folder = tmp_path_factory.mktemp("onnx")
    path, _ = ort_timing.convert_for_ort(models.chain()[0], folder)
    return path


def test_wall_clock_charges_each_kind_given_even_on_error():
    clock = rounds.WallClock()
    assert clock.run((rounds.CAMPAIGN, rounds.SETUP), sum, [1, 2]) == 3
    with pytest.raises(ZeroDivisionError):
        clock.run("conversion", lambda: 1 / 0)
    assert clock[rounds.CAMPAIGN] == clock[rounds.SETUP] >= 0
    assert clock[rounds.END_TO_END] == 0.0
    assert set(clock.seconds) == {
        "campaign",
        "setup",
        "end_to_end",
        "conversion",
    }
    clock.add(rounds.END_TO_END, 2.0)
    assert clock[rounds.END_TO_END] == 2.0 and clock["unknown"] == 0.0


def test_more_precise_prefers_a_settled_then_a_narrower_timing():
    def t(ci, noisy):
        return Timing(1.0, 1.0, 1.0, 1.0, 5, 1.0 - ci, 1.0 + ci, noisy)

    assert rounds.more_precise(t(0.5, True), t(0.9, False)) == t(0.9, False)
    assert rounds.more_precise(t(0.5, False), t(0.1, True)) == t(0.5, False)
    assert rounds.more_precise(t(0.5, True), t(0.2, True)) == t(0.2, True)
    assert rounds.more_precise(t(0.2, True), t(0.5, True)) == t(0.2, True)


def test_model_sampler_keeps_company_past_its_own_timing_uncharged():
    timer = _timer(models.chain()[0])
    clock = rounds.WallClock()
    done = []
    sampler = rounds.ModelSampler(timer, clock, lambda: done.append(1))
    while not sampler.done:
        sampler()
    own, counted = len(timer.samples), clock[rounds.END_TO_END]
    assert timer.done and done == [1] and counted > 0
    sampler.EXTRA_SHARE = 1e9  # Every round may sample.
    sampler()
    sampler()
    assert len(timer.samples) == own + 2
    assert clock[rounds.END_TO_END] == counted  # Charged to no clock.
    assert done == [1]
    assert sampler.finish() == timer.result()


def test_model_sampler_extra_samples_stop_at_their_share():
    timer = _timer(models.chain()[0])
    sampler = rounds.ModelSampler(timer, rounds.WallClock())
    sampler.finish()
    own = len(timer.samples)
    sampler.EXTRA_SHARE = 0.0
    for _ in range(3):
        sampler()
    # The first extra sample was free (none taken yet); it used the share.
    assert len(timer.samples) == own + 1


def test_model_sampler_keeps_the_model_error_for_finish():
    clock = rounds.WallClock()
    sampler = rounds.ModelSampler(_timer(models.failing()), clock)
    sampler()
    sampler()  # Nothing raised while bricks may be in flight.
    assert isinstance(sampler.error, ValueError) and not sampler.done
    assert clock[rounds.END_TO_END] > 0  # The failed call is charged.
    with pytest.raises(ValueError, match="fails when run"):
        sampler.finish()


def test_rounds_commit_each_brick_once_and_call_between_each_round():
    bricks = _bricks(models.chain()[0], granularity=2)
    make = _Factory(bricks, SETTLES)
    clock, between, results = rounds.WallClock(), [], {}
    keys = [*bricks, *bricks]  # A repeated key is timed once.
    summary = rounds.time_in_rounds(
        keys,
        make,
        clock,
        between=lambda: between.append(len(results)),
        on_result=results.__setitem__,
    )
    assert sorted(summary.timed) == sorted(results) == sorted(bricks)
    assert summary.remeasured == summary.failed == ()
    assert summary.rounds == len(between)
    assert summary.rounds == max(t.dispatches for t in make.made.values())
    for key, result in results.items():
        assert result == make.made[key].result() and not result.noisy
    prepared = sum(t.prepare_seconds for t in make.made.values())
    assert 0 < prepared < clock[rounds.SETUP] <= clock[rounds.CAMPAIGN]
    assert clock[rounds.END_TO_END] == 0.0


def test_a_noisy_brick_is_measured_again_by_the_same_timer():
    bricks = _bricks(models.chain()[0], granularity=3)
    make = _Factory(bricks, NEVER_SETTLES)
    results = {}
    summary = rounds.time_in_rounds(bricks, make, on_result=results.__setitem__)
    assert sorted(summary.remeasured) == sorted(summary.timed)
    assert sorted(summary.timed) == sorted(bricks) == sorted(make.made)
    for key, result in results.items():
        # One measurement's samples, of the two its timer took.
        assert result.noisy and result.samples <= NEVER_SETTLES.max_samples
        assert make.made[key].dispatches >= 2


def test_a_brick_that_cannot_be_made_or_sampled_is_handed_on():
    loose = _bricks(models.loose())
    (relu,) = [k for k, b in loose.items() if b.class_names == ("ReLU",)]
    failing = _bricks(models.failing())
    (bad,) = [k for k, b in failing.items() if b.class_names == ("Failing",)]
    chain = _bricks(models.chain()[0])
    good = next(iter(chain))
    bricks = {**chain, relu: loose[relu], bad: failing[bad]}
    failures, results = {}, {}
    summary = rounds.time_in_rounds(
        [relu, bad, good],
        _Factory(bricks, SETTLES),
        on_result=results.__setitem__,
        on_failure=lambda key, e: failures.setdefault(key, e),
    )
    assert summary.failed == (relu, bad) == tuple(failures)
    assert isinstance(failures[relu], timing.MeasurementError)
    assert "unknown dimension" in str(failures[relu])
    assert isinstance(failures[bad], ValueError)
    assert summary.timed == (good,) == tuple(results)
    with pytest.raises(ValueError, match="fails when run"):
        rounds.time_in_rounds([bad], _Factory(bricks, SETTLES))


def test_rounds_of_onnx_runtime_timers_with_their_model(chain_onnx):
    clock = rounds.WallClock()
    model = rounds.ModelSampler(
        clock.run(
            rounds.END_TO_END, ort_timing.OrtTimer, chain_onnx, ORT, FAST
        ),
        clock,
    )
    made = {}

    def make(key):
        options = NEVER_SETTLES if key == "noisy" else SETTLES
        made[key] = ort_timing.OrtTimer(chain_onnx, ORT, options)
        return made[key]

    results = {}
    summary = rounds.time_in_rounds(
        ["noisy", "settles"],
        make,
        clock,
        between=model,
        on_result=results.__setitem__,
    )
    measured = model.finish()
    assert sorted(summary.timed) == ["noisy", "settles"]
    assert summary.remeasured == ("noisy",)
    assert results["noisy"].noisy and not results["settles"].noisy
    assert results["settles"] == made["settles"].result()
    assert model.done and measured == model.timer.result()
    prepared = sum(t.prepare_seconds for t in made.values())
    assert 0 < prepared < clock[rounds.SETUP] <= clock[rounds.CAMPAIGN]
    assert clock[rounds.END_TO_END] > 0


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
