"""A fixed reference workload, timed beside every sample: the machine's state.

On a shared VM the same brick or model runs 1.1-3x slower for seconds or
minutes at a time (hypervisor steal, a neighbour's memory traffic), and
nothing inside one timer can tell that slowdown from the brick's own cost.
`Reference` is a workload that never changes, run on TensorFlow's thread
pools like the bricks: by default a small conv block shaped like them
(convolutions, a depthwise layer, element-wise ops); stores calibrated
before it keep a chain of square matmuls and a reduction over a buffer
several times the L2 cache (`WORKLOADS`).

TensorFlow's timers read it right after their own calls
(`Reference.after_call`): a chain after each sample's last pass, a
model's timer after each batch's call, on pools and caches as the
samples left them. ONNX Runtime's timers read it from Python right
before a batch (`Reference.read`), at most every `INTERVAL_S`. Adjacent
in time, never concurrent: two vCPUs have no core to spare.

`ReferenceScale` turns those readings into a factor: each batch of samples
is multiplied by `state_ms / r`, where r is the median of the last
`WINDOW` readings and `state_ms` the machine's reference state, kept in
the store per machine and settings (`Store.reference_state`): the median
of the first readings the store's first timing run took after its
timers' calls (read before batches: of a calibration of back-to-back
readings). A
slowdown that hits a sample and its reference alike leaves the scaled
sample where it was; a run with a steady reference is scaled by about 1.
Scaled timings are milliseconds "at the reference state": what the
machine ran like in the run that calibrated the store.

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

from dlbricks_tf import errors, stats

# Readings whose median scales a batch: the last WINDOW (about 4 s of a
# run at `INTERVAL_S`). On a 2-vCPU VM one reading moves +-30-35% from one
# to the next 0.1-0.3 s apart, faster than any batch it stands beside, so
# a short window put that noise into every batch's factor; what a common
# scale has to cancel is the slower drift (a steal episode, another
# process's run, a host that runs 1.5x slower for minutes), which a
# longer window still follows.
WINDOW = 9
# The first factor of a scale (a process's first batch) is the median of
# readings taken back to back for FIRST_S seconds (at least WINDOW): with
# one reading, a command that times little (`measure` of one model, a
# `run` whose bricks are stored) was put on the common scale by a single
# reading, 40% off at worst (a store's MobileNetV2 read 1.93 the second
# time it was run, its bricks scaled by 1.35 and the model by 0.71).
FIRST_S = 0.2
# A calibration first runs the workload for WARM_S, unread. It happens
# when a command has cut its models (Python alone for seconds, TF's pools
# idle), and a reading taken after an idle spell is slower for tens of ms
# (1.2-1.7 ms after 0.3 s idle against 0.6-1.0 back to back, 2026-12-03):
# calibrated cold, a store's state sat at 1.46 ms while its run read a
# median 0.87, and every stored millisecond was 1.68x what the machine ran.
WARM_S = 0.2
# Readings of a first calibration.
CALIBRATION_READINGS = 15
# A batch that starts less than this after the last reading is scaled by
# that reading's factor: a reading costs 5-10 ms (the workload twice, see
# `Reference.read`), so the reference takes at most about 2% of the
# sampling time, however short the batches are, while still following
# changes of the machine that last a few seconds or more (a steal episode,
# another process's run).
INTERVAL_S = 0.5
# TensorFlow's timers read the reference right after their own calls,
# the workload's runs back to back in one call (`ReferenceScale.graph`,
# `Reference.after_call`): on pools and caches in the state the samples
# left them, where a reading from Python before a batch found them in
# whatever state the gap left (1.2-1.7 ms after 0.3 s idle against
# 0.6-1.0 back to back): a process's median reading moved 0.55-1.44x of
# the state between the processes of one store, against 10% read in the
# calls, and later runs on a reused store read 12/16 within ±10% against
# 5/16 (7/16 without the reference; docs/history/2026-12-03.md). The
# readings were first taken inside the timers' calls, a `tf.while_loop`
# in each chain's and model's graph: 90-125 ms of every chain's setup.
# Read right after the call, they agree with those to 1-2% (medians of
# 300 alternated readings: 0.977-1.006 with oneDNN, 0.999 without).
# False: read from Python before each batch.
AFTER_CALLS = True
# The workload a new store's reference state is taken with (`WORKLOADS`).
# A brick-shaped conv block: read in the timers' calls, it left whole
# models measured minutes apart and in other processes an SD of 4.2, 7.6
# and 10.2% (of their scaled logs; quiet, beside a CPU spinner, beside a
# memory streamer), where the matmul chain and reduction had left 7.3,
# 9.4 and 13.6% (`benchmarks.scale_rules`), and the 13 models at G=1 read
# 12 and 13 of 13 within ±10% beside those neighbours against 12 and 11
# (docs/history/2026-12-03.md). A store whose state was taken with
# another workload keeps reading that one (`ReferenceScale.for_store`).
WORKLOAD = "conv-block"


class Reference:
    """The reference workload on TensorFlow: one reading is about a ms.

    A reading runs the workload `RUNS` times back to back and times the
    last run: in as many calls (`read`), or in one (`after_call`).

    Args:
        workload: Which fixed work a reading times (`WORKLOADS`): a store
            keeps the name beside its state, and a state is only ever
            compared with readings of its own workload.
        seed: Seed of the fixed inputs and weights.
        **shape: The workload's sizes (see `_conv_block`,
            `_matmul_reduce`), for a smaller one in tests.
    """

    # The first run brings the operands back into the caches.
    RUNS = 2

    def __init__(
        self, workload: str = WORKLOAD, seed: int = 0, **shape: int
    ) -> None:
        import tensorflow as tf

        if workload not in WORKLOADS:
            raise ValueError(
                f"Unknown reference workload {workload!r}: use one of "
                f"{', '.join(WORKLOADS)}."
            )
        self.workload = workload
        self._operands, self._ops = WORKLOADS[workload](seed, **shape)
        ops = self._ops

        @tf.function(
            input_signature=[
                tf.TensorSpec(o.shape, o.dtype) for o in self._operands
            ]
        )
        def read(*operands):
            parts, value = ops(operands, tf.timestamp())
            return (*parts, value)

        self._read = read.get_concrete_function()
        self._looped = None  # `after_call`'s loop, traced at its first.
        self.seconds = 0.0  # Wall-clock spent reading.
        self.read()  # Traced and warmed up.
        self.seconds = 0.0

    def after_call(self) -> float:
        """One reading, ms, taken right after a timer's call.

        The workload's `RUNS` runs go back to back in one call of a loop
        traced once per `Reference`, as they would inside the timer's own
        function, with none of its cost: a loop in each chain's graph made
        its trace and first call 90-125 ms longer.
        """
        start = time.perf_counter()
        ms, _ = self._loop()(self._zero, self._runs)
        reading = float(ms.numpy())
        self.seconds += time.perf_counter() - start
        return reading

    def _loop(self):
        """The concrete function of `after_call`'s loop, traced once:
        (zero, times) -> (ms of the last run, a float32 0.0 that depends
        on it by data); `zero` is a float32 0.0 the first run follows."""
        if self._looped is None:
            import tensorflow as tf

            from dlbricks_tf.measuring.timing_loop import zero_after

            operands, ops = self._operands, self._ops

            def body(i, ms, carried):
                with tf.control_dependencies([carried]):
                    start = tf.timestamp()
                parts, value = ops(operands, start)
                return i + 1, tf.add_n(list(parts)), zero_after(value)

            @tf.function(
                input_signature=[
                    tf.TensorSpec([], tf.float32),
                    tf.TensorSpec([], tf.int32),
                ],
                autograph=False,
            )
            def loop(zero, times):
                _, ms, carried = tf.while_loop(
                    lambda i, ms, carried: i < times,
                    body,
                    (tf.constant(0), tf.constant(0.0, tf.float64), zero),
                    parallel_iterations=1,
                )
                return ms, carried

            self._looped = loop.get_concrete_function()
            self._zero = tf.constant(0.0)
            self._runs = tf.constant(self.RUNS)
        return self._looped

    def read(self) -> float:
        """One reading, ms: the sum of the workload's parts.

        The workload runs twice and the second run is the reading: the
        first brings its operands back into the caches. Read cold, its
        operands came from memory or from L3 depending on how much the
        chain pass or model batch before it had evicted, so readings
        taken in a run were slower than the back-to-back readings of the
        calibration, and spread with what ran before them rather than
        with the machine.
        """
        return sum(self.parts())

    def parts(self) -> tuple[float, ...]:
        """One reading as `read` takes it, in the workload's parts, ms
        (the matmul-reduce workload: compute, memory; the conv block:
        one)."""
        start = time.perf_counter()
        for _ in range(self.RUNS - 1):
            self._read(*self._operands)
        *parts, _ = self._read(*self._operands)
        self.seconds += time.perf_counter() - start
        return tuple(float(p.numpy()) for p in parts)


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
        first: Readings the first factor is the median of, at least.
        first_s: The first factor reads for this long, at least (and
            `first` readings); `for_store` passes `FIRST_S`.
        graph: The `Reference` that TensorFlow's timers read right
            after their own calls (`Reference.after_call`) and hand to
            `factor_of`; None: every batch is scaled by `factor`, read
            before it.
        keep: With `graph`, when `state_ms()` returns None (no state
            yet): the state is the median of the first `calibration`
            readings handed to `factor_of`, passed to `keep`, which
            returns the state to use (`for_store` stores it); batches
            before it are not scaled.
        calibration: Readings such a state is the median of.
        workload: The name of the workload `read` times (`WORKLOADS`), for
            `summary`.
    """

    def __init__(
        self,
        read: Callable[[], float],
        state_ms: float | Callable[[], float],
        window: int = WINDOW,
        interval_s: float = INTERVAL_S,
        clock: Callable[[], float] = time.perf_counter,
        first: int = 1,
        first_s: float = 0.0,
        graph: Reference | None = None,
        keep: Callable[[float], float] | None = None,
        calibration: int = CALIBRATION_READINGS,
        workload: str | None = None,
    ) -> None:
        self.graph = graph
        self.workload = workload
        self._keep = keep
        self._calibration = max(1, int(calibration))
        self._state: float | None = None
        self._find_state = state_ms if callable(state_ms) else None
        if self._find_state is None:
            self._state = _checked(state_ms)
        self._read = read
        self._window = max(1, int(window))
        self._interval_s = max(0.0, float(interval_s))
        self._clock = clock
        self._first = max(1, int(first))
        self._first_s = max(0.0, float(first_s))
        self._last: tuple[float, float] | None = None  # (time, factor)
        self.readings: list[float] = []
        self.seconds = 0.0  # Wall-clock spent reading, calibration apart.

    @property
    def state_ms(self) -> float | None:
        """The reference state, ms (found now if it was not yet).

        None while a state taken from the timers' readings (`keep`)
        waits for its readings.
        """
        if self._state is None:
            found = self._find_state()
            if found is None and self._keep is None:
                raise ValueError("No reference state, and none to calibrate.")
            if found is not None:
                self._state = _checked(found)
        return self._state

    @classmethod
    def calibrate(
        cls,
        read: Callable[[], float],
        readings: int = CALIBRATION_READINGS,
        warm_s: float = 0.0,
        clock: Callable[[], float] = time.perf_counter,
    ) -> float:
        """The median of `readings` readings: a first reference state.

        Readings taken in the first `warm_s` seconds are left out (and
        `readings` taken after them), so that the state is that of a warm
        machine, as a run's readings are.
        """
        start = clock()
        while clock() - start < warm_s:
            read()
        return stats.median([read() for _ in range(max(1, readings))])

    @classmethod
    def for_store(
        cls,
        reference: Reference,
        store: Any,
        settings: Any,
        fingerprint: Any,
        readings: int = CALIBRATION_READINGS,
        warm_s: float = WARM_S,
    ) -> ReferenceScale:
        """The scale of this machine and settings, calibrated once.

        The reference state is read from the store; a store without one
        for these settings and machine is given the median of `readings`
        readings: on TensorFlow (with `AFTER_CALLS`), the first that its
        timers take after their calls, the batches before them
        unscaled; else a calibration of back-to-back readings after
        `warm_s` of warm-up, when the state is first needed (the first
        batch, or `state_ms`). Either way a command stopped before it
        times anything (a model that does not load) leaves the store as
        it was.

        A state is a reading of one workload: a store whose state was
        taken with another workload than `reference`'s (one calibrated
        before `WORKLOAD` changed) is read with that workload, so that
        every timing it holds stays on one scale.

        Raises:
            errors.Error: If the store's state is of a workload this
                dlbricks_tf does not know.
        """
        kept = store.reference_workload(settings, fingerprint)
        if kept is not None and kept != reference.workload:
            if kept not in WORKLOADS:
                raise errors.Error(
                    f"The store's reference state for these settings is a "
                    f"reading of the {kept!r} workload, which this "
                    "dlbricks_tf does not know: use the dlbricks_tf that "
                    "wrote it, or another --db."
                )
            reference = Reference(kept)
        workload = reference.workload

        def stored() -> float | None:
            return store.reference_state(settings, fingerprint)

        def keep(state: float) -> float:
            return store.put_reference_state(
                settings, fingerprint, state, workload
            )

        def state() -> float:
            found = stored()
            if found is None:
                found = keep(
                    cls.calibrate(reference.read, readings, warm_s=warm_s)
                )
            return found

        if AFTER_CALLS and settings.backend == "tf":
            return cls(
                reference.read,
                stored,
                first=WINDOW,
                first_s=FIRST_S,
                graph=reference,
                keep=keep,
                calibration=readings,
                workload=workload,
            )
        return cls(
            reference.read,
            state,
            first=WINDOW,
            first_s=FIRST_S,
            workload=workload,
        )

    def factor(self) -> float:
        """State / recent readings; reads the reference unless it just did.

        The reference is read again once `interval_s` has passed since
        the last reading; until then, that reading's factor stands. The
        first factor is the median of the readings taken back to back for
        `first_s` (at least `first`, at most 100 times as many).
        """
        now = self._clock()
        if self._last is not None and now - self._last[0] < self._interval_s:
            return self._last[1]
        if not self.readings:
            start = now
            first = []
            while len(first) < self._first or (
                self._clock() - start < self._first_s
                and len(first) < 100 * self._first
            ):
                first.append(self._read())
            self.seconds += self._clock() - now
            self.readings += first
            current = stats.median(first)
        else:
            self.readings.append(self._read())
            self.seconds += self._clock() - now
            current = stats.median(self.readings[-self._window :])
        return self._factor_for(current)

    def _factor_for(self, current: float) -> float:
        """State / `current`, kept as the last factor; 1 while the state
        waits for its readings, or if `current` is not positive."""
        state = self._state_from_readings()
        if state is None:
            return 1.0
        factor = state / current if current > 0 else 1.0
        self._last = (self._clock(), factor)
        return factor

    def _state_from_readings(self) -> float | None:
        """The state; a pending one is the first readings' median, kept."""
        state = self.state_ms
        if state is None:  # A first state, from this run's own readings.
            if len(self.readings) < self._calibration:
                return None
            first = stats.median(self.readings[: self._calibration])
            state = self._state = _checked(self._keep(first))
        return state

    def factor_of(
        self, reading_ms: float, seconds: float | None = None
    ) -> float:
        """State / recent readings, `reading_ms` the latest.

        For a batch whose timer read the reference right after its own
        call (`graph`): the reading joins the window and the batch is scaled by
        the window's median, as `factor` does with its own readings.
        `seconds` is what the reading cost, for `summary`; by default
        `Reference.RUNS` times its ms (the workload ran that many times).
        """
        if seconds is None:
            seconds = Reference.RUNS * max(reading_ms, 0.0) / 1e3
        self.seconds += seconds
        if not reading_ms > 0:
            return self._last[1] if self._last is not None else 1.0
        self.readings.append(float(reading_ms))
        return self._factor_for(stats.median(self.readings[-self._window :]))

    def summary(self) -> dict[str, float | int | str | None]:
        """The state and the spread of this run's readings.

        Returns:
            reference_state_ms, reference_median_ms, reference_readings,
            reference_ratio: the median reading over the state (how much
            slower than at its calibration the machine ran, by which the
            samples were scaled down), and reference_spread: the
            half-distance between the 10th and 90th percentiles of the
            readings over their median (how far the machine moved during
            the run), reference_seconds, the wall-clock spent reading,
            and reference_workload, what a reading times (`WORKLOADS`;
            None if not known). The median, ratio and spread are None without
            readings; the state and ratio are None while the state waits
            for its readings.
        """
        state = self.state_ms
        if not self.readings:
            return {
                "reference_state_ms": state,
                "reference_median_ms": None,
                "reference_readings": 0,
                "reference_ratio": None,
                "reference_spread": None,
                "reference_seconds": self.seconds,
                "reference_workload": self.workload,
            }
        ordered = sorted(self.readings)
        median = stats.median(ordered)

        def quantile(q: float) -> float:
            return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

        return {
            "reference_state_ms": state,
            "reference_median_ms": median,
            "reference_readings": len(ordered),
            "reference_ratio": None if state is None else median / state,
            "reference_spread": (quantile(0.9) - quantile(0.1)) / 2 / median,
            "reference_seconds": self.seconds,
            "reference_workload": self.workload,
        }


def _checked(state_ms: float) -> float:
    if not state_ms > 0:
        raise ValueError(
            f"state_ms must be positive. Received: state_ms={state_ms!r}"
        )
    return float(state_ms)


def _matmul_reduce(
    seed: int, size: int = 192, matmuls: int = 4, memory_mib: int = 8
):
    """A chain of `matmuls` square matmuls of side `size` (compute), then a
    reduction over a buffer of `memory_mib` MiB, several times the L2
    cache (memory): (operands, ops) for `Reference`.

    The ops return ((compute ms, memory ms), a float32 value of the work).
    Each part depends on the stamp before it by data (a stamp is never
    NaN, but no optimiser can prove it), each stamp on the part before it
    by a control edge, and the parts' results are returned: grappler
    turns work that only feeds control edges into a NoOp.
    """
    import tensorflow as tf

    a = tf.random.stateless_normal((size, size), (seed, 1)) / size
    floats = memory_mib * 2**20 // 4
    buffer = tf.random.stateless_normal((floats,), (seed, 2))

    def ops(operands, start):
        a, buffer = operands
        x = a + _zero(start)
        for _ in range(matmuls):
            x = tf.linalg.matmul(x, a)
        corner = x[0, 0]
        with tf.control_dependencies([corner]):
            middle = tf.timestamp()
        total = tf.reduce_sum(buffer + _zero(middle))
        with tf.control_dependencies([total]):
            end = tf.timestamp()
        return ((middle - start) * 1e3, (end - middle) * 1e3), corner + total

    return (a, buffer), ops


def _conv_block(seed: int, side: int = 28, width: int = 32):
    """A brick-shaped workload: (operands, ops) for `Reference`.

    A MobileNetV2-like block at batch 1 on a `side` x `side` x `width`
    input (1x1 expand to 6x the width, scale and shift as a folded
    BatchNormalization, ReLU6, 3x3 depthwise, scale and shift, ReLU6, 1x1
    project, the residual add), then a 3x3 convolution with a bias: the
    convolutions, depthwise layers and element-wise ops the bricks are
    made of, on the kernels and thread pools they run on. Timed against
    whole models in four processes, one after another, with the matmul
    and reduction read beside it, it followed them best beside a noisy
    neighbour (docs/history/2026-12-03.md, "Scale rules side by side").

    The ops return ((ms,), a float32 value of the work), the work
    depending on the stamp `start` by data as in `_matmul_reduce`.
    """
    import tensorflow as tf

    wide = 6 * width

    def normal(shape, stream, scale=1.0):
        return tf.random.stateless_normal(shape, (seed, stream)) * scale

    operands = (
        normal((1, side, side, width), 3),
        normal((1, 1, width, wide), 4, width**-0.5),
        1.0 + normal((wide,), 5, 0.1),
        normal((wide,), 6, 0.1),
        normal((3, 3, wide, 1), 7, 1 / 3),
        1.0 + normal((wide,), 8, 0.1),
        normal((wide,), 9, 0.1),
        normal((1, 1, wide, width), 10, wide**-0.5),
        normal((3, 3, width, width), 11, (9 * width) ** -0.5),
        normal((width,), 12, 0.1),
    )

    def ops(operands, start):
        x, expand, s1, b1, depthwise, s2, b2, project, conv, bias = operands
        x = x + _zero(start)
        y = tf.nn.conv2d(x, expand, 1, "SAME")
        y = tf.nn.relu6(y * s1 + b1)
        y = tf.nn.depthwise_conv2d(y, depthwise, [1, 1, 1, 1], "SAME")
        y = tf.nn.relu6(y * s2 + b2)
        y = tf.nn.conv2d(y, project, 1, "SAME") + x
        y = tf.nn.bias_add(tf.nn.conv2d(y, conv, 1, "SAME"), bias)
        corner = y[0, 0, 0, 0]
        with tf.control_dependencies([corner]):
            end = tf.timestamp()
        return ((end - start) * 1e3,), corner

    return operands, ops


def _zero(stamp):
    """0.0 (float32) that depends on `stamp` by data."""
    import tensorflow as tf

    return tf.cast(tf.math.is_nan(stamp), tf.float32)


# The reference workloads by name; `WORKLOAD` is what a new store's state
# is taken with.
WORKLOADS = {"conv-block": _conv_block, "matmul-reduce": _matmul_reduce}
