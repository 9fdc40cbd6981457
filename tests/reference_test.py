"""Tests for dlbricks_tf/measuring/reference.py.

The scale's arithmetic is checked exactly on made-up readings and samples
(`FakeTimer` below stands for a timer whose samples follow a made-up
machine); the TF workload is checked to time real work.
"""

import pytest

from dlbricks_tf import errors, stats
from dlbricks_tf.machine import process as process_lib
from dlbricks_tf.machine import settings as settings_lib
from dlbricks_tf.machine.fingerprint import system_fingerprint
from dlbricks_tf.measuring import reference, sampling
from dlbricks_tf.storing.store import Store


class FakeTimer(sampling.AdaptiveSampling):
    """Samples of a brick of `cost` ms on a machine slowed by `slowdown()`."""

    def __init__(self, cost, slowdown, count=5, precision=0.0):
        self.options = sampling.TimingOptions(
            min_samples=count, max_samples=1000, precision=precision
        )
        self._cost, self._slowdown = cost, slowdown
        self._samples, self._sampling_s, self._prepare_s = [], 0.0, 0.0
        self._factors = []
        self._crowded = []
        self._copies, self._n, self._s = 1, 0, count

    def _prepare(self):
        self._n = 1

    def _take(self, count):
        return [self._cost * self._slowdown()] * count

    @property
    def dispatch_ms(self):
        return 0.0

    @property
    def overhead_per_call_ms(self):
        return 0.0

    @property
    def _what(self):
        return "fake"


class Machine:
    """A machine whose speed changes between batches: 1x, 2x, 3x, ..."""

    def __init__(self, factors, reference_ms=2.0):
        self.factors = list(factors)
        self.reference_ms = reference_ms
        self.now = 0

    def read(self):
        """A reference reading at the current speed; the next batch too."""
        self.now += 1
        return self.reference_ms * self.factors[self.now - 1]

    def slowdown(self):
        return self.factors[self.now - 1]


def test_a_slowdown_of_sample_and_reference_alike_cancels():
    machine = Machine([1.0, 2.0, 3.0, 1.5, 1.0, 2.5])
    scale = reference.ReferenceScale(
        machine.read, state_ms=2.0, window=1, interval_s=0
    )
    timer = FakeTimer(4.0, machine.slowdown)
    timer.scale = scale
    for _ in range(6):
        timer.sample()
    # Every batch ran 1-3x slower, and every one reads 4 ms at the state.
    assert timer.samples == pytest.approx([4.0] * 30)
    assert timer.result().median_ms == pytest.approx(4.0)
    assert timer.result().mean_ms == pytest.approx(4.0)
    assert scale.readings == [2.0, 4.0, 6.0, 3.0, 2.0, 5.0]
    # The machine ran at a median 1.75x its state: the run's samples were
    # scaled down by that much.
    assert scale.summary()["reference_ratio"] == pytest.approx(1.75)


def test_the_stopping_rule_reads_the_samples_spread_not_the_references():
    # Steady samples beside a reference that jitters 1x, 2x, 1x, ...:
    # each batch scaled by its own factor spreads 2:1, but the samples
    # themselves are known at once; the rule reads them on the common
    # scale (their median factor), and the stored timing stays per batch.
    machine = Machine([1.0, 2.0] * 10)
    scale = reference.ReferenceScale(
        machine.read, state_ms=2.0, window=1, interval_s=0
    )
    timer = FakeTimer(4.0, lambda: 1.0, count=5, precision=0.02)
    timer.scale = scale
    timer.sample()
    timer.sample()
    assert sorted(set(timer.samples)) == [2.0, 4.0]
    assert timer.settled
    assert timer.result().mean_ms == pytest.approx(3.0)


def test_a_steady_reference_leaves_samples_unchanged():
    machine = Machine([1.0] * 4)
    scale = reference.ReferenceScale(machine.read, state_ms=2.0, interval_s=0)
    timer = FakeTimer(3.25, lambda: 1.0)
    timer.scale = scale
    for _ in range(4):
        timer.sample()
    assert list(timer.samples) == [3.25] * 20
    summary = scale.summary()
    assert summary["reference_median_ms"] == 2.0
    assert summary["reference_spread"] == 0.0
    assert summary["reference_readings"] == 4
    assert summary["reference_ratio"] == 1.0


def test_the_state_is_where_samples_are_put_and_the_window_smooths():
    readings = iter([2.0, 4.0, 3.0])
    scale = reference.ReferenceScale(
        lambda: next(readings), 1.0, window=3, interval_s=0
    )
    # Medians of the last readings: 2, then (2+4)/2 = 3, then median 3.
    assert [scale.factor() for _ in range(3)] == [0.5, 1 / 3, 1 / 3]


def test_the_first_factor_is_the_median_of_a_burst_of_readings():
    now = [0.0]
    readings = iter([5.0, 1.0, 2.0, 2.0, 9.0, 2.0, 4.0])

    def read():  # A reading takes 0.1 s of the clock.
        now[0] += 0.1
        return next(readings)

    scale = reference.ReferenceScale(
        read, 2.0, window=2, interval_s=0, clock=lambda: now[0],
        first=3, first_s=0.45,
    )  # fmt: skip
    # Three readings at least, for 0.45 s at least: five (0.5 s), median 2.
    assert scale.factor() == 1.0
    assert scale.readings == [5.0, 1.0, 2.0, 2.0, 9.0]
    assert scale.summary()["reference_seconds"] == pytest.approx(0.5)
    # Then one reading a batch, the median of the last two: (9 + 2) / 2.
    assert scale.factor() == pytest.approx(2.0 / 5.5)
    assert scale.factor() == pytest.approx(2.0 / 3.0)


def test_a_batch_soon_after_a_reading_reuses_its_factor():
    now = [0.0]
    readings = iter([2.0, 4.0])

    def read():  # A reading takes 0.01 s of the clock.
        now[0] += 0.01
        return next(readings)

    scale = reference.ReferenceScale(
        read,
        2.0,
        window=1,
        interval_s=0.25,
        clock=lambda: now[0],
    )
    factors = []
    for t in (0.0, 0.1, 0.2, 0.3, 0.4):
        now[0] = t
        factors.append(scale.factor())
    # Read at 0 s and at 0.3 s only: the batches between reuse 2/2.
    assert factors == [1.0, 1.0, 1.0, 0.5, 0.5]
    assert scale.readings == [2.0, 4.0]
    assert scale.summary()["reference_seconds"] == pytest.approx(0.02)


def test_calibration_is_kept_in_the_store_and_reused(tmp_path):
    # ONNX Runtime's timers read from Python: a calibration of readings.
    settings = settings_lib.RunSettings(
        1, 1, 1, backend="onnxruntime", onednn=process_lib.onednn_enabled()
    )
    fp = system_fingerprint()
    readings = iter([3.0, 1.0, 2.0] + [9.0] * 20)

    class Fixed:
        workload = "fixed"

        def read(self):
            return next(readings)

    with Store(tmp_path / "s.sqlite") as store:
        first = reference.ReferenceScale.for_store(
            Fixed(), store, settings, fp, readings=3, warm_s=0
        )
        # Nothing is read or stored until the state is needed: a command
        # stopped before its first sample leaves the store as it was.
        assert store.reference_state(settings, fp) is None
        assert first.state_ms == 2.0  # The median of the calibration.
        assert store.reference_state(settings, fp) == 2.0
        again = reference.ReferenceScale.for_store(
            Fixed(), store, settings, fp, readings=3, warm_s=0
        )
        assert again.state_ms == 2.0  # Not calibrated again.


def test_a_calibration_leaves_out_its_warm_up():
    now = [0.0]
    readings = iter([9.0, 8.0, 7.0, 3.0, 1.0, 2.0])

    def read():  # A reading takes 0.1 s of the clock; the first are cold.
        now[0] += 0.1
        return next(readings)

    state = reference.ReferenceScale.calibrate(
        read, readings=3, warm_s=0.25, clock=lambda: now[0]
    )
    assert state == 2.0  # The median of the three read after 0.3 s.


def test_bad_state_is_refused():
    with pytest.raises(ValueError, match="state_ms must be positive"):
        reference.ReferenceScale(lambda: 1.0, 0.0)


class InGraphTimer(FakeTimer):
    """A `FakeTimer` that reads the reference inside its own batches."""

    _graph = "in-graph"

    def __init__(self, cost, machine, count=5):
        super().__init__(cost, machine.slowdown, count)
        self._machine = machine

    def _take(self, count):
        self._reading = self._machine.read()  # Beside this batch's samples.
        return super()._take(count)


def _never_read():
    raise AssertionError("read from Python though the timer reads in-graph")


def test_a_reading_inside_the_batch_scales_that_batch():
    machine = Machine([1.0, 2.0, 3.0, 1.5])
    scale = reference.ReferenceScale(
        _never_read, state_ms=2.0, window=1, interval_s=0
    )
    timer = InGraphTimer(4.0, machine)
    timer.scale = scale
    for _ in range(4):
        timer.sample()
    # Each batch ran 1-3x slower, its own reading alike: 4 ms each.
    assert timer.samples == pytest.approx([4.0] * 20)
    assert scale.readings == [2.0, 4.0, 6.0, 3.0]
    # A reading's cost is counted as the timer gives it: a batch's, twice
    # its ms (the workload runs twice), 2 x 15 ms here.
    assert scale.summary()["reference_seconds"] == pytest.approx(0.03)
    assert scale.factor_of(2.0, seconds=0.5) == 1.0
    assert scale.summary()["reference_seconds"] == pytest.approx(0.53)


def test_a_batch_without_a_reading_keeps_the_last_factor():
    scale = reference.ReferenceScale(_never_read, 2.0, window=3)
    assert scale.factor_of(0.0) == 1.0  # No factor yet: unscaled.
    assert scale.factor_of(4.0) == 0.5
    assert scale.factor_of(0.0) == 0.5
    # The window's median: of 4 and 1, then of 4, 1 and 2.
    assert scale.factor_of(1.0) == pytest.approx(2.0 / 2.5)
    assert scale.factor_of(2.0) == 1.0
    assert scale.readings == [4.0, 1.0, 2.0]


def test_a_state_from_the_timers_readings_is_their_first_median_kept():
    kept = []

    def keep(state):
        kept.append(state)
        return state

    scale = reference.ReferenceScale(
        _never_read,
        lambda: None,  # Nothing stored yet.
        window=1,
        graph="after calls",
        keep=keep,
        calibration=3,
    )
    assert scale.state_ms is None
    assert scale.summary()["reference_ratio"] is None
    # Unscaled until three readings; then their median is the state.
    assert [scale.factor_of(r) for r in (2.0, 4.0, 3.0, 6.0)] == [
        1.0,
        1.0,
        1.0,
        0.5,
    ]
    assert kept == [3.0] and scale.state_ms == 3.0


@pytest.mark.parametrize("backend", ["tf", "onnxruntime"])
def test_a_store_is_calibrated_by_its_first_runs_own_readings(
    tmp_path, backend
):
    settings = settings_lib.RunSettings(
        1, 1, 1, backend=backend, onednn=process_lib.onednn_enabled()
    )
    fp = system_fingerprint()
    ref = reference.Reference("matmul-reduce", size=64, matmuls=2, memory_mib=1)
    after_calls = reference.AFTER_CALLS and backend == "tf"
    with Store(tmp_path / "s.sqlite") as store:
        scale = reference.ReferenceScale.for_store(
            ref, store, settings, fp, readings=3, warm_s=0
        )
        assert scale.graph is (ref if after_calls else None)
        if not after_calls:  # Calibrated from back-to-back readings.
            assert scale.state_ms == store.reference_state(settings, fp)
            return
        # TensorFlow's timers read after their calls: the state waits for
        # the first three of their readings, and the store keeps it.
        assert scale.state_ms is None
        for reading in (2.0, 5.0, 4.0):
            assert scale.factor_of(reading) == 1.0
        assert store.reference_state(settings, fp) == 4.0
        assert scale.factor_of(8.0) == pytest.approx(4.0 / 4.5)
        again = reference.ReferenceScale.for_store(
            ref, store, settings, fp, readings=3, warm_s=0
        )
        assert again.state_ms == 4.0


@pytest.mark.parametrize("backend", ["tf", "onnxruntime"])
def test_a_store_keeps_the_workload_its_state_was_read_with(tmp_path, backend):
    settings = settings_lib.RunSettings(
        1, 1, 1, backend=backend, onednn=process_lib.onednn_enabled()
    )
    fp = system_fingerprint()
    ref = reference.Reference()
    assert ref.workload == reference.WORKLOAD == "conv-block"
    with Store(tmp_path / "s.sqlite") as store:
        # A store calibrated with the matmuls and the reduction.
        store.put_reference_state(settings, fp, 2.0, "matmul-reduce")
        scale = reference.ReferenceScale.for_store(ref, store, settings, fp)
        # Its new readings are of that workload, on its state's scale.
        assert scale.state_ms == 2.0
        if scale.graph is not None:
            assert scale.graph.workload == "matmul-reduce"
        assert len(reference.Reference("matmul-reduce").parts()) == 2
        scale.factor()
        assert len(scale.readings) >= reference.WINDOW
    with Store(tmp_path / "new.sqlite") as store:
        fresh = reference.ReferenceScale.for_store(
            ref, store, settings, fp, readings=3, warm_s=0
        )
        if fresh.graph is not None:
            assert fresh.graph is ref
            for reading in (1.0, 2.0, 3.0):
                fresh.factor_of(reading)
        else:
            fresh.factor()
        assert store.reference_workload(settings, fp) == "conv-block"


def test_a_state_of_an_unknown_workload_is_refused_in_one_line(tmp_path):
    settings = settings_lib.RunSettings(
        1, 1, 1, onednn=process_lib.onednn_enabled()
    )
    fp = system_fingerprint()
    with Store(tmp_path / "s.sqlite") as store:
        store.put_reference_state(settings, fp, 2.0, "later-block")
        with pytest.raises(errors.Error) as info:
            reference.ReferenceScale.for_store(
                reference.Reference(), store, settings, fp
            )
    message = str(info.value)
    assert len(message.splitlines()) == 1
    assert "'later-block' workload" in message and "--db" in message
    with pytest.raises(ValueError, match="Unknown reference workload"):
        reference.Reference("later-block")


# Small sizes of each workload: a test reads real work, quickly.
_SMALL = {
    "conv-block": {"side": 14, "width": 16},
    "matmul-reduce": {"size": 64, "matmuls": 2, "memory_mib": 1},
}


@pytest.mark.parametrize("workload", sorted(reference.WORKLOADS))
def test_the_workload_times_real_work(workload):
    ref = reference.Reference(workload, **_SMALL[workload])
    values = [ref.read() for _ in range(5)]
    # Its parts run between their stamps: a reading is not a stamp's
    # resolution (a microsecond) but the work's.
    assert all(v > 0.001 for v in values)
    assert ref.seconds > 0
    assert stats.median(values) > 0
    # In its parts: each runs between its own stamps, and is counted.
    before = ref.seconds
    parts = ref.parts()
    assert len(parts) == {"conv-block": 1, "matmul-reduce": 2}[workload]
    assert all(p > 0.0005 for p in parts)
    assert ref.seconds > before


def test_a_reading_after_a_call_runs_the_loop_traced_once():
    ref = reference.Reference("matmul-reduce", **_SMALL["matmul-reduce"])
    loop = ref._loop()
    readings = [ref.after_call() for _ in range(3)]
    # The workload's runs, timed: real work, not a stamp's resolution.
    assert all(r > 0.001 for r in readings)
    assert ref.seconds > 0
    # No trace per reading (nor per timer): the one loop, called.
    assert ref._loop() is loop


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
