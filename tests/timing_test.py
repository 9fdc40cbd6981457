"""Tests for dlbricks_tf/measuring/timing.py.

No test asserts a speed: timings on a shared machine are noise. The tests
check the protocol (positive, consistent statistics, sample counts, batches
of S samples per call, the loop running the model exactly S x K times) on
tiny models.
"""

import dataclasses
import statistics

import keras
import pytest
from keras import layers

from dlbricks_tf.machine import settings as settings_lib
from dlbricks_tf.measuring import reference, timing
from tests import models

# Pools are fixed at TensorFlow's first op: configure them at collection,
# before any test runs one.
SETTINGS, CHECKED = models.settings()
FAST = timing.TimingOptions(
    min_samples=5,
    max_samples=12,
    max_seconds=0.5,
    target_sample_ms=0.2,
    samples_per_call=4,
    warmup_calls=1,
)


def _tiny():
    x = keras.Input((8,))
    return keras.Model(x, layers.Dense(4, activation="relu")(x))


def _busy():
    """A model whose call (~0.1 ms) dwarfs the loop overhead subtracted."""
    x = keras.Input((32, 32, 16))
    return keras.Model(x, layers.Conv2D(32, 3, padding="same")(x))


def _timer(model, options=FAST):
    return timing.Timer(model, SETTINGS, options, check_settings=CHECKED)


def test_time_model_statistics_are_consistent():
    # Not the tiny Dense: once the loop's per-call cost (~10-20 us) is
    # subtracted, its samples may clamp to 0 on a busy machine.
    if CHECKED:
        t = timing.time_model(_busy(), SETTINGS, FAST)
    else:  # time_model insists on the pools matching the settings.
        t = timing.time_interleaved([_timer(_busy())])[0]
    assert 0 <= t.min_ms <= t.median_ms <= t.max_ms
    assert t.median_ms > 0
    assert t.min_ms <= t.trimmed_mean_ms <= t.max_ms
    assert t.ci_low_ms <= t.median_ms <= t.ci_high_ms
    assert 1 <= t.samples <= FAST.max_samples
    assert t.samples >= FAST.min_samples or t.noisy
    assert t.calls_per_sample >= 1
    assert t.dispatch_ms > 0 and t.loop_overhead_ms >= 0


def test_a_sample_call_takes_a_batch_and_runs_s_times_k_calls():
    x = keras.Input((8,))
    counter = models.Counter()
    model = keras.Model(x, layers.Dense(4)(counter(x)))
    timer = _timer(model)
    timer.sample()  # Prepares: traces, warms up, calibrates.
    k, s = timer.calls_per_sample, timer.samples_per_call
    assert k >= 1 and 1 <= s <= FAST.samples_per_call
    before = int(counter.calls.numpy())
    batch = timer.sample()
    assert int(counter.calls.numpy()) - before == s * k
    assert len(batch) == s and all(b >= 0 for b in batch)
    assert timer.samples[-s:] == tuple(batch)
    assert timer.dispatches == 2
    assert timer.empty_sample_ms >= 0 and timer.dispatch_ms > 0


def test_a_timer_reads_the_reference_right_after_each_batch_call():
    x = keras.Input((8,))
    counter = models.Counter()
    model = keras.Model(x, layers.Dense(4)(counter(x)))
    workload = reference.Reference()

    def from_python():
        raise AssertionError("read before the batch, not after its call")

    scale = reference.ReferenceScale(from_python, 1.0, graph=workload)
    timer = _timer(model)
    timer.scale = scale
    timer.sample()
    before = int(counter.calls.numpy())
    timer.sample()
    # The batch's call runs the model S x K times; the reference follows.
    assert int(counter.calls.numpy()) - before == (
        timer.samples_per_call * timer.calls_per_sample
    )
    # One reading per batch, of real work, and each batch scaled by it.
    assert len(scale.readings) == timer.dispatches == 2
    assert all(r > 0.001 for r in scale.readings)
    assert (
        timer._factors
        == [1.0 / scale.readings[0]] * timer.samples_per_call
        + [1.0 / statistics.median(scale.readings)] * timer.samples_per_call
    )
    # A batch taken for a benchmark's own rule: raw, with its call's
    # reading, and neither kept nor handed to the scale.
    kept = timer.samples
    before = int(counter.calls.numpy())
    durations, reading = timer.batch_ms()
    assert int(counter.calls.numpy()) - before == (
        timer.samples_per_call * timer.calls_per_sample
    )
    assert len(durations) == timer.samples_per_call
    assert reading > 0.001
    assert timer.samples == kept and len(scale.readings) == 2


def test_more_samples_per_call_need_fewer_calls():
    one = dataclasses.replace(FAST, samples_per_call=1, precision=0.0)
    many = dataclasses.replace(FAST, samples_per_call=6, precision=0.0)
    a, b = _timer(_tiny(), one), _timer(_tiny(), many)
    timing.time_interleaved([a, b])
    # precision 0 never settles (unless the absolute bound is met): both
    # run to max_samples or max_seconds.
    assert len(b.samples) % 6 == 0 or len(b.samples) == FAST.max_samples
    assert a.dispatches == len(a.samples)
    assert b.dispatches <= -(-len(b.samples) // 6) + 1
    if len(a.samples) == len(b.samples) == FAST.max_samples:
        assert b.dispatches < a.dispatches


def test_batches_stop_at_max_samples():
    options = dataclasses.replace(
        FAST, samples_per_call=5, max_samples=7, precision=0.0,
        absolute_precision_ms=0.0, max_seconds=60.0,
    )  # fmt: skip
    # Not the tiny Dense: samples that all clamp to 0 once the loop's cost
    # is subtracted have an interval of width 0, which settles at once.
    timer = _timer(_busy(), options)
    while not timer.done:
        timer.sample()
    assert len(timer.samples) == 7 and timer.dispatches == 2
    assert timer.result().noisy


def test_restart_takes_fresh_samples_without_tracing_again():
    options = dataclasses.replace(
        FAST, samples_per_call=5, max_samples=5, precision=0.0,
        absolute_precision_ms=0.0, max_seconds=60.0,
    )  # fmt: skip
    x = keras.Input((8,))
    counter = models.Counter()
    timer = _timer(keras.Model(x, layers.Dense(4)(counter(x))), options)
    timing.time_interleaved([timer])
    taken = len(timer.samples)
    k = timer.calls_per_sample
    traces = timer._run.experimental_get_tracing_count()
    before = int(counter.calls.numpy())
    prepared = timer.prepare_seconds
    assert prepared > 0
    assert timer.restart() is timer and timer.samples == () and not timer.done
    second = timing.time_interleaved([timer])[0]
    assert taken == len(timer.samples) == 5
    assert second.samples == len(timer.kept_samples)  # Bursts left out.
    assert int(counter.calls.numpy()) - before == 5 * k  # Only sampling.
    assert timer._run.experimental_get_tracing_count() == traces == 1
    assert timer.calls_per_sample == k
    assert timer.prepare_seconds == prepared  # Not prepared again.


def test_calls_per_sample_is_a_multiple_of_the_copies():
    options = dataclasses.replace(FAST, input_copies=3)
    timer = _timer(_tiny(), options)
    timer.sample()
    assert timer.calls_per_iteration == 3
    assert timer.calls_per_sample % 3 == 0
    assert timer.dispatch_ms > 0


def test_weight_copies_rotate_fresh_models():
    options = dataclasses.replace(FAST, weight_copies=3, input_copies=2)
    timer = _timer(_tiny(), options)
    assert all(s >= 0 for s in timer.sample())
    assert timer.calls_per_sample % 3 == 0
    assert timer.result().calls_per_sample == timer.calls_per_sample


def test_interleaved_rounds_sample_every_timer():
    timers = [_timer(_tiny()), _timer(_tiny())]
    results = timing.time_interleaved(timers)
    assert len(results) == 2
    for timer, result in zip(timers, results, strict=True):
        assert timer.done
        assert result.samples == len(timer.kept_samples)
        assert result.noisy == (not timer.settled)


def test_multi_input_multi_output_and_int_inputs():
    ids = keras.Input((5,), dtype="int32")
    feats = keras.Input((3,))
    e = layers.Flatten()(layers.Embedding(4, 2)(ids))
    model = keras.Model([ids, feats], [e, layers.Dense(2)(feats)])
    timer = _timer(model)
    batch = timer.sample()
    assert all(s >= 0 for s in batch)
    assert len(timer.samples) == len(batch) == timer.samples_per_call


def test_jit_compile_is_timed():
    settings = dataclasses.replace(SETTINGS, jit_compile=True, protocol=None)
    timer = timing.Timer(_tiny(), settings, FAST, check_settings=CHECKED)
    assert all(s >= 0 for s in timer.sample())


def test_result_before_sampling_raises():
    with pytest.raises(timing.MeasurementError):
        _timer(_tiny()).result()


def test_settings_with_the_other_onednn_flag_are_refused():
    if not CHECKED:
        pytest.skip("An earlier test fixed the thread pools to other sizes.")
    other = dataclasses.replace(SETTINGS, onednn=not SETTINGS.onednn)
    with pytest.raises(timing.MeasurementError, match="settings.onednn="):
        timing.Timer(_tiny(), other, FAST)


def test_unsupported_backend_and_unknown_shapes_raise():
    onnx = settings_lib.RunSettings(1, 1, 1, backend="onnxruntime")
    with pytest.raises(timing.MeasurementError, match="Backend"):
        timing.Timer(_tiny(), onnx, check_settings=False)
    x = keras.Input((None, 3))
    model = keras.Model(x, layers.Dense(2)(x))
    with pytest.raises(timing.MeasurementError, match="unknown dimension"):
        _timer(model)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
