"""CPU timing harness for Keras models: bricks and whole models alike.

Samples are timed inside the graph: one `tf.function` call (the loop of
`dlbricks_tf.measuring.timing_loop.sampled_function`) takes S samples, each
running the model K times between two `tf.timestamp()` reads. The `tf.function`
dispatch (1-2 ms on a busy machine, more than many single layers) is paid
once per S samples and enters none of them. What the timing machinery
still costs is measured and subtracted: the per-call cost of the loop and
its timestamps (about 9 us here, measured once per process on an empty
model) and, under XLA only, the duration of an empty sample (a compiled
loop of no iteration between two timestamps; without XLA it is 0 by
construction). K is chosen so a sample lasts about `target_sample_ms`
(1 ms: timestamps have microsecond resolution, and there is no dispatch to
amortise). S is at most `samples_per_call`, fewer for long samples (a
whole model) so that interleaved timers take turns. Inputs and weights may
rotate through several copies so that consecutive calls do not find them
hot in cache.

Sampling is adaptive: batches of samples are taken until the median's 95%
interval is within `precision` of the median, or a cap is hit (the result
is then flagged noisy). `Timer` exposes batches (`sample()`) so that bricks
and whole models can be measured in interleaved rounds, close together in
time; `time_interleaved` takes any `Sampler` (also
`dlbricks_tf.measuring.ort_timing.OrtTimer`).

Integer inputs get ids below the bounds found in the model's graph
(`dlbricks_tf.cutting.synthetic.id_bounds`), or below explicit `id_bounds` for a
model whose graph hides them (a SavedModel in `keras.layers.TFSMLayer`).

Example:
    timing = time_model(model, RunSettings.default(batch_size=1))
    timing.median_ms
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import keras
import numpy as np
import tensorflow as tf

from dlbricks_tf import stats
from dlbricks_tf.cutting import synthetic
from dlbricks_tf.machine import process as process_lib
from dlbricks_tf.machine import settings as settings_lib
from dlbricks_tf.measuring import memory, timing_loop

# The sampling protocol, shared with ONNX Runtime timing (no TensorFlow
# there); re-exported: callers use `timing.TimingOptions` and the rest.
from dlbricks_tf.measuring.sampling import AdaptiveSampling as AdaptiveSampling
from dlbricks_tf.measuring.sampling import MeasurementError as MeasurementError
from dlbricks_tf.measuring.sampling import Sampler as Sampler
from dlbricks_tf.measuring.sampling import TimingOptions as TimingOptions
from dlbricks_tf.measuring.sampling import time_interleaved as time_interleaved


def _fresh_copy(model: keras.Model) -> keras.Model:
    """A copy of a functional model with the same graph and new weights."""
    try:
        return keras.models.clone_model(model)
    except Exception as e:  # Keras raises many types for unclonable models.
        raise MeasurementError(
            f"Cannot copy model {model.name!r} for weight_copies > 1: {e}"
        ) from e


def _arrays_with_bounds(
    model: keras.Model,
    specs: Sequence[tuple[tuple[int, ...], str]],
    id_bounds: Sequence[int | None],
    input_copies: int,
    seed: int,
) -> list[list[np.ndarray]]:
    """Input sets of a model whose id bounds are given, one per copy."""
    bounds = list(id_bounds)
    if len(bounds) != len(specs):
        raise MeasurementError(
            f"Model {model.name!r} has {len(specs)} inputs but "
            f"{len(bounds)} id_bounds were given; pass one bound (or None) "
            f"per input. Received: id_bounds={bounds}"
        )
    unbatched = [(shape[1:], dtype) for shape, dtype in specs]
    batch = specs[0][0][0] if specs else 1
    try:
        return [
            synthetic.arrays_for_specs(unbatched, bounds, batch, seed + c)
            for c in range(input_copies)
        ]
    except ValueError as e:
        raise MeasurementError(f"Model {model.name!r}: {e}") from e


class Timer(AdaptiveSampling):
    """Times one model under fixed settings, one batch of samples at a time.

    Construct one per brick or model; call `sample()` until `done`, then
    `result()`. Several timers may be sampled in interleaved rounds (see
    `time_interleaved`). The first `sample()` traces, warms up, measures the
    overheads and chooses K and S.

    Args:
        model: A built Keras model; its inputs need fixed shapes except the
            batch dimension, or open ones that `input_shapes` gives.
        settings: Run settings; thread pools and the oneDNN flag must
            already be in force in this process.
        options: Sampling options.
        check_settings: Verify `settings` against the process first.
        id_bounds: Exclusive upper bound of the ids of each flat input (None
            for an input without one), instead of the bounds found in the
            model's graph; for a model whose graph hides its Embeddings
            (a SavedModel wrapped in `keras.layers.TFSMLayer`).
        input_shapes: Sizes of the inputs' open dimensions, {input name:
            shape without the batch}, "*" for every input not named (a
            transformer's sequence length; see `synthetic.input_specs`).

    Raises:
        MeasurementError: If the settings cannot be honoured here, or
            `id_bounds` does not have one entry per input.
        ThreadPoolError: If the thread pools differ from `settings`.
        OneDnnError: If TensorFlow's oneDNN decision is not the predicted one.
    """

    def __init__(
        self,
        model: keras.Model,
        settings: settings_lib.RunSettings,
        options: TimingOptions | None = None,
        *,
        check_settings: bool = True,
        id_bounds: Sequence[int | None] | None = None,
        input_shapes: Mapping[str, Sequence[int | None]] | None = None,
    ) -> None:
        self.model = model
        self.settings = settings
        self.options = options or TimingOptions()
        if settings.backend != "tf":
            raise MeasurementError(
                f"Backend {settings.backend!r} is not timed by this harness; "
                "use backend='tf'."
            )
        if check_settings:
            settings_lib.check_threads(settings)
            if settings.onednn != process_lib.onednn_in_effect():
                raise MeasurementError(
                    f"settings.onednn={settings.onednn} but this process runs "
                    f"with oneDNN {'on' if not settings.onednn else 'off'}; "
                    "set TF_ENABLE_ONEDNN_OPTS before starting Python."
                )
        try:
            specs = synthetic.input_specs(
                model, settings.batch_size, input_shapes
            )
        except ValueError as e:
            raise MeasurementError(str(e)) from e
        input_copies = max(1, self.options.input_copies)
        # Refused in one line before anything batch-sized is allocated.
        memory.check(
            model,
            settings.batch_size,
            input_copies=input_copies,
            weight_copies=self.options.weight_copies,
            input_specs=specs if input_shapes else None,
        )
        try:
            models = [model] + [
                _fresh_copy(model)
                for _ in range(self.options.weight_copies - 1)
            ]
            self._copies = max(input_copies, len(models))  # Per iteration.
            if id_bounds is None:
                sets = [
                    synthetic.synthetic_inputs(
                        model,
                        settings.batch_size,
                        seed=self.options.seed + c,
                        input_shapes=input_shapes,
                    )
                    for c in range(input_copies)
                ]
            else:
                sets = _arrays_with_bounds(
                    model, specs, id_bounds, input_copies, self.options.seed
                )
            self._input_sets = sets
            self._inputs = [
                tf.constant(np.stack([s[n] for s in sets]))
                for n in range(len(specs))
            ]
        except (MemoryError, tf.errors.ResourceExhaustedError) as e:
            raise memory.MemoryLimitError(
                f"Model {model.name!r} does not fit in memory at batch size "
                f"{settings.batch_size:,}: {type(e).__name__}: "
                f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}"
                "; use a smaller --batch_size."
            ) from e
        # Traced at the first call.
        self._loop_args = (models, specs, input_copies, settings.jit_compile)
        self._run = None
        self._samples: list[float] = []
        self._factors: list[float] = []
        self._crowded: list[bool] = []
        self._sampling_s = 0.0
        self._dispatches = 0
        self._prepare_s = 0.0
        self._n = 0  # Loop iterations per sample; K = n * copies.
        self._s = 0  # Samples per call.
        self._dispatch_ms = 0.0
        self._empty_ms = 0.0
        self._loop_ms = 0.0

    @property
    def _graph(self):
        """The reference this timer reads after its calls, or None."""
        return getattr(self.scale, "graph", None)

    def durations_ms(
        self, iterations: int, samples: int, read: bool = False
    ) -> list[float]:
        """Runs one call of `samples` samples; returns their raw durations.

        Each sample runs `iterations` loop iterations of
        `calls_per_iteration` model calls; nothing is subtracted. With
        `read` (and a scale that reads after the timers' calls), the
        reference is read right after the call, into `_reading`.
        """
        graph = self._graph
        if self._run is None:
            self._run = timing_loop.sampled_function(*self._loop_args)
        durations, _ = self._run(
            self._inputs, tf.constant(iterations), tf.constant(samples)
        )
        if read and graph is not None:
            self._reading = graph.after_call()
        return (durations.numpy() * 1e3).tolist()

    def batch_ms(self) -> tuple[list[float], float]:
        """One batch as `sample` takes it, neither scaled nor kept.

        For benchmarks that scale batches by rules of their own
        (`benchmarks/scale_rules.py`). Prepares the timer first if it was
        not. Returns each sample's raw ms (its `calls_per_sample` model
        calls, nothing subtracted) and the ms of the reference reading
        taken right after the call (0.0 without a scale that reads after
        the timers' calls).
        """
        if not self._n:
            self.sample()
        durations = self.durations_ms(self._n, self._s, read=True)
        return durations, self._reading if self._graph is not None else 0.0

    def run_ms(self, iterations: int) -> float:
        """Returns the wall-clock ms of one call of one sample.

        The dispatch is included. For calibration checks: `sample()` is
        the measurement.
        """
        start = time.perf_counter()
        self.durations_ms(iterations, 1)
        return (time.perf_counter() - start) * 1e3

    def _prepare(self) -> None:
        opts = self.options
        with process_lib.collector_paused():  # As a chain's trace.
            self.run_ms(1)  # Traces and instantiates the function.
        warm = self.durations_ms(1, max(1, opts.warmup_calls))
        self._dispatch_ms = stats.median([self.run_ms(0) for _ in range(2)])
        if self.settings.jit_compile:  # Else an empty sample lasts 0.
            self._empty_ms = stats.median(self.durations_ms(0, 5))
        if opts.subtract_loop_overhead:
            self._loop_ms = timing_loop.loop_overhead_ms(
                self.settings, self._copies
            )
        self._choose_sizes(warm, self.durations_ms, self._empty_ms)

    @property
    def inputs(self) -> list[list[np.ndarray]]:
        """The synthetic input arrays: per input copy, one per flat input."""
        return self._input_sets

    @property
    def dispatch_ms(self) -> float:
        """Wall-clock ms of a call taking one empty sample (0 before)."""
        return self._dispatch_ms

    @property
    def empty_sample_ms(self) -> float:
        """Measured duration of a sample of no call (0 before sampling)."""
        return self._empty_ms

    @property
    def dispatches(self) -> int:
        """Calls of the timed function made by `sample()` so far."""
        return self._dispatches

    @property
    def overhead_per_call_ms(self) -> float:
        """Machinery cost subtracted from each sample, per model call."""
        calls = self.calls_per_sample
        return self._empty_ms / calls + self._loop_ms if calls else 0.0

    @property
    def _what(self) -> str:
        return f"model {self.model.name!r}"

    def _take(self, count: int) -> list[float]:
        durations = self.durations_ms(self._n, count, read=True)
        self._dispatches += 1
        calls = self.calls_per_sample
        return [
            max((d - self._empty_ms) / calls - self._loop_ms, 0.0)
            for d in durations
        ]


def time_model(
    model: keras.Model,
    settings: settings_lib.RunSettings,
    options: TimingOptions | None = None,
    *,
    check_settings: bool = True,
    id_bounds: Sequence[int | None] | None = None,
    input_shapes: Mapping[str, Sequence[int | None]] | None = None,
) -> stats.Timing:
    """Times a Keras model (a brick or a whole model) on synthetic inputs.

    Args:
        model: A built Keras model with fixed input shapes (but the batch
            dimension, taken from `settings.batch_size`), or open ones
            that `input_shapes` gives.
        settings: Run settings already in force in this process (see
            `dlbricks_tf.machine.settings.configure_threads`).
        options: Sampling options; defaults to `TimingOptions()`.
        check_settings: Verify `settings` against the process first.
        id_bounds: Exclusive id bound per flat input, overriding those
            found in the model's graph (see `Timer`).
        input_shapes: Sizes of the inputs' open dimensions (see `Timer`).

    Returns:
        Milliseconds per call: min, median, trimmed mean, max, CI.

    Raises:
        MeasurementError: If the model cannot be timed under `settings`.
    """
    timer = Timer(
        model,
        settings,
        options,
        check_settings=check_settings,
        id_bounds=id_bounds,
        input_shapes=input_shapes,
    )
    return time_interleaved([timer])[0]
