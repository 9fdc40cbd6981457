"""A fixed reference workload, timed beside every sample: the machine's state.

On a shared VM the same brick or model runs 1.1-3x slower for seconds or
minutes at a time (hypervisor steal, a neighbour's memory traffic), and
nothing inside one timer can tell that slowdown from the brick's own cost.
`Reference` is a workload that never changes, compute-bound (a chain of
square matmuls) and memory-bound (a reduction over a buffer several times
the L2 cache), run on TensorFlow's thread pools like the bricks. It is read
right before a batch of samples (a chain pass, a whole model's batch, an
ONNX Runtime batch), at most every `INTERVAL_S`: adjacent in time, not
concurrent, since two vCPUs have no core to spare.

`ReferenceScale` turns those readings into a factor: each batch of samples
is multiplied by `state_ms / r`, where r is the median of the last
`WINDOW` readings and `state_ms` the machine's reference state, the median
reading of the first calibration on this machine and these settings, kept
in the store (`Store.reference_state`). A slowdown that hits a sample and
its reference alike leaves the scaled sample where it was; a run with a
steady reference is scaled by about 1. Scaled timings are milliseconds
"at the reference state": on a quiet machine, what a user measures.

Example:
    scale = ReferenceScale.for_store(Reference(), store, settings, fp)
    timer.scale = scale
    ...
    scale.summary()  # {"reference_state_ms", "reference_median_ms", ...}
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from dlbricks_tf import stats

# Readings whose median scales a batch: adjacent in time, and steadier
# than one reading.
WINDOW = 3
# Readings of a first calibration.
CALIBRATION_READINGS = 15
# A batch that starts less than this after the last reading is scaled by
# that reading's factor: a reading costs 5-10 ms (the workload twice, see
# `Reference.read`), so the reference takes at most about 2% of the
# sampling time, however short the batches are, while still following
# changes of the machine that last a few seconds or more (a steal episode,
# another process's run).
INTERVAL_S = 0.5


class Reference:
    """The reference workload on TensorFlow: one reading is a few ms.

    Args:
        size: Side of the square matrices of the compute part.
        matmuls: Chained matmuls per reading.
        memory_mib: Size of the buffer the memory part reduces.
        seed: Seed of the fixed inputs.
    """

    def __init__(
        self,
        size: int = 192,
        matmuls: int = 4,
        memory_mib: int = 8,
        seed: int = 0,
    ) -> None:
        import tensorflow as tf

        self._a = tf.random.stateless_normal((size, size), (seed, 1)) / size
        floats = memory_mib * 2**20 // 4
        self._buffer = tf.random.stateless_normal((floats,), (seed, 2))

        @tf.function(
            input_signature=[
                tf.TensorSpec(self._a.shape, tf.float32),
                tf.TensorSpec(self._buffer.shape, tf.float32),
            ]
        )
        def read(a, buffer):
            # Each part depends on the stamp before it by data (a stamp is
            # never NaN, but no optimiser can prove it), each stamp on the
            # part before it by a control edge, and the parts' results are
            # returned: grappler turns work that only feeds control edges
            # into a NoOp.
            start = tf.timestamp()
            x = a + tf.cast(tf.math.is_nan(start), tf.float32)
            for _ in range(matmuls):
                x = tf.linalg.matmul(x, a)
            corner = x[0, 0]
            with tf.control_dependencies([corner]):
                middle = tf.timestamp()
            total = tf.reduce_sum(
                buffer + tf.cast(tf.math.is_nan(middle), tf.float32)
            )
            with tf.control_dependencies([total]):
                end = tf.timestamp()
            return (middle - start) * 1e3, (end - middle) * 1e3, corner + total

        self._read = read.get_concrete_function()
        self.seconds = 0.0  # Wall-clock spent reading.
        self.read()  # Traced and warmed up.
        self.seconds = 0.0

    def read(self) -> float:
        """One reading, ms: the compute part plus the memory part.

        The workload runs twice and the second run is the reading: the
        first brings its operands back into the caches. Read cold, its
        buffer (which fits in a server's L3) came from memory or from L3
        depending on how much the chain pass or model batch before it had
        evicted, so readings taken in a run were slower than the
        back-to-back readings of the calibration, and spread with what
        ran before them rather than with the machine.
        """
        start = time.perf_counter()
        self._read(self._a, self._buffer)
        compute, memory, _ = self._read(self._a, self._buffer)
        value = float(compute.numpy()) + float(memory.numpy())
        self.seconds += time.perf_counter() - start
        return value


class ReferenceScale:
    """Scales batches of samples to the machine's reference state.

    Args:
        read: Returns one reference reading, ms (`Reference.read`).
        state_ms: The reference state: the reading a sample is scaled to;
            or a function that returns it, called when it is first needed
            (`for_store`).
        window: Readings whose median scales a batch.
        interval_s: A batch that starts sooner than this after the last
            reading reuses its factor (0: a reading before every batch).
        clock: Seconds, monotonic (for `interval_s`).
    """

    def __init__(
        self,
        read: Callable[[], float],
        state_ms: float | Callable[[], float],
        window: int = WINDOW,
        interval_s: float = INTERVAL_S,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._state: float | None = None
        self._find_state = state_ms if callable(state_ms) else None
        if self._find_state is None:
            self._state = _checked(state_ms)
        self._read = read
        self._window = max(1, int(window))
        self._interval_s = max(0.0, float(interval_s))
        self._clock = clock
        self._last: tuple[float, float] | None = None  # (time, factor)
        self.readings: list[float] = []
        self.seconds = 0.0  # Wall-clock spent reading, calibration apart.

    @property
    def state_ms(self) -> float:
        """The reference state, ms (found now if it was not yet)."""
        if self._state is None:
            self._state = _checked(self._find_state())
        return self._state

    @classmethod
    def calibrate(
        cls, read: Callable[[], float], readings: int = CALIBRATION_READINGS
    ) -> float:
        """The median of `readings` readings: a first reference state."""
        return stats.median([read() for _ in range(max(1, readings))])

    @classmethod
    def for_store(
        cls,
        reference: Reference,
        store: Any,
        settings: Any,
        fingerprint: Any,
        readings: int = CALIBRATION_READINGS,
    ) -> ReferenceScale:
        """The scale of this machine and settings, calibrated once.

        The reference state is read from the store; a store without one
        for these settings and machine is given the median of `readings`
        readings. Both happen when the state is first needed (the first
        batch, or `state_ms`), so that a command stopped before it times
        anything (a model that does not load) leaves the store as it was.
        """

        def state() -> float:
            found = store.reference_state(settings, fingerprint)
            if found is None:
                found = store.put_reference_state(
                    settings,
                    fingerprint,
                    cls.calibrate(reference.read, readings),
                )
            return found

        return cls(reference.read, state)

    def factor(self) -> float:
        """State / recent readings; reads the reference unless it just did.

        The reference is read again once `interval_s` has passed since
        the last reading; until then, that reading's factor stands.
        """
        now = self._clock()
        if self._last is not None and now - self._last[0] < self._interval_s:
            return self._last[1]
        value = self._read()
        self.seconds += self._clock() - now
        self.readings.append(value)
        recent = self.readings[-self._window :]
        current = stats.median(recent)
        factor = self.state_ms / current if current > 0 else 1.0
        self._last = (self._clock(), factor)
        return factor

    def summary(self) -> dict[str, float | int | None]:
        """The state and the spread of this run's readings.

        Returns:
            reference_state_ms, reference_median_ms, reference_readings,
            reference_ratio: the median reading over the state (how much
            slower than at its calibration the machine ran, by which the
            samples were scaled down), and reference_spread: the
            half-distance between the 10th and 90th percentiles of the
            readings over their median (how far the machine moved during
            the run), and reference_seconds, the wall-clock spent
            reading. The median, ratio and spread are None without
            readings.
        """
        if not self.readings:
            return {
                "reference_state_ms": self._state,
                "reference_median_ms": None,
                "reference_readings": 0,
                "reference_ratio": None,
                "reference_spread": None,
                "reference_seconds": self.seconds,
            }
        ordered = sorted(self.readings)
        median = stats.median(ordered)

        def quantile(q: float) -> float:
            return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

        return {
            "reference_state_ms": self.state_ms,
            "reference_median_ms": median,
            "reference_readings": len(ordered),
            "reference_ratio": median / self.state_ms,
            "reference_spread": (quantile(0.9) - quantile(0.1)) / 2 / median,
            "reference_seconds": self.seconds,
        }


def _checked(state_ms: float) -> float:
    if not state_ms > 0:
        raise ValueError(
            f"state_ms must be positive. Received: state_ms={state_ms!r}"
        )
    return float(state_ms)
