"""ONNX Runtime timing of ONNX files: the TF harness's protocol on ORT.

A brick or a whole model converted to ONNX
(`dlbricks_tf.measuring.onnx_convert`) is timed in an
`onnxruntime.InferenceSession` on the CPU execution provider, with the thread
counts of `RunSettings` (intra-op threads, inter-op threads; sequential
execution, full graph optimisation), under the sampling protocol of
`dlbricks_tf.measuring.sampling` and into the same `TimingOptions` and
`stats.Timing`, so results go into the same store under settings with
`backend="onnxruntime"`.

Protocol. The synthetic inputs (`synthetic.arrays_for_specs`: ids below
their bounds, 0/1 masks, normal floats) are bound once, as OrtValues, to an
`IOBinding`, and so are the outputs after a first run: a call copies and
allocates nothing in Python. A sample is K back-to-back
`run_with_iobinding` calls between two `time.perf_counter_ns()` reads (the
Python garbage collector paused), K chosen so that a sample lasts about
`target_sample_ms`. `sample()` takes S such samples (at most
`samples_per_call`, fewer if they would last over `max_call_ms`), so that
interleaved timers take turns; sampling stops when the median's 95%
interval is within `precision` (or `absolute_precision_ms`) or at a cap
(then the result is noisy).

What is subtracted. Each call of a sample also pays the Python loop and
ORT's own cost of a `Run` (binding checks, execution frame, thread pool
hand-off), several microseconds, as much as a small brick. It is
calibrated once per process, input specs, output count, thread counts and
copies, on a trivial ONNX graph with the same inputs (bound to the same
OrtValues) and as many outputs, each the `Size` of an input: the median per
call of samples of many calls in the same loop. With
`subtract_loop_overhead` (the default) it is subtracted from every call,
of bricks and whole models alike, so that a whole model (one `Run`) is not
charged one `Run` overhead per brick by the estimate. A result's
`loop_overhead_ms` is what was subtracted per call and its `dispatch_ms`
the calibrated cost of one `Run`, which
`estimate(..., call_overhead_ms=timing.dispatch_ms)` adds back once to
estimate a call as a user sees it (for TF, that is the `tf.function`
dispatch, which no sample contains).

With `weight_copies` > 1 the file is loaded into that many sessions (each
with its own weights) and calls rotate through them, as through the
`input_copies` input sets. Each session has its own intra-op thread pool,
whose threads spin briefly after a run (ORT's default, kept: a user's
session does too).

Example:
    settings = RunSettings.default(batch_size=1, backend="onnxruntime")
    timing = time_onnx("brick.onnx", settings)
    timing.median_ms
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dlbricks_tf import stats
from dlbricks_tf.machine import settings as settings_lib
from dlbricks_tf.measuring import sampling
from dlbricks_tf.measuring.ort_overhead import run_overhead_ms
from dlbricks_tf.measuring.ort_session import (
    bind,
    import_onnxruntime,
    onnx_input_specs,
    resolve_specs,
    session_for,
    timed_ns,
)

# The TF harness's error and options (`dlbricks_tf.measuring.timing` re-exports
# them too), so callers handle both backends alike. Nothing here imports
# TensorFlow; the synthetic inputs (`dlbricks_tf.cutting.synthetic`) come
# with Keras and are imported when a timer is made.
MeasurementError = sampling.MeasurementError
TimingOptions = sampling.TimingOptions


def _copy_prefix(prefix: str | None, index: int, copies: int) -> str | None:
    """The profile prefix of weight copy `index`: ORT names a profile
    `<prefix>_<date and time to the millisecond>.json`, so two sessions of
    one prefix that began profiling in the same millisecond wrote one
    file, which read back as two JSON documents. Each copy gets its own;
    one copy keeps `prefix`."""
    if prefix is None or copies == 1:
        return prefix
    return f"{prefix}{index}"


class OrtTimer(sampling.AdaptiveSampling):
    """Times one ONNX file under fixed settings, one batch at a time.

    The interface of `dlbricks_tf.measuring.timing.Timer` (both are
    `sampling.AdaptiveSampling`): call `sample()` until `done`, then
    `result()`, and `restart()` for fresh samples of the same sessions;
    `sampling.time_interleaved` samples several (of either kind) in
    interleaved rounds. The first `sample()` warms up, calibrates the
    per-call overhead and chooses K and S.

    Args:
        path: The `.onnx` file (a dynamic batch dimension takes
            `settings.batch_size`).
        settings: Run settings with `backend="onnxruntime"`.
        options: Sampling options
            (`dlbricks_tf.measuring.sampling.TimingOptions`).
        input_specs: (shape without the batch dimension, dtype) per input,
            in the file's input order; None reads them from the file. Needed
            where the file leaves a non-batch dimension open.
        id_bounds: Exclusive upper bound of each integer input's ids (None
            for an input without one, as `synthetic.id_bounds` gives them
            for the Keras model); None: no bounds (small ints).
        profile_prefix: Profile every run with ORT's profiler (see
            `session_for`); slows the runs, for tests.
        session_config: Session configuration entries of every session
            (see `session_for`), e.g. to stop idle threads spinning.
        model: The model itself, serialised: the sessions open it, and
            `path` only names it (a chain's merged graph, never written
            to a file).

    Raises:
        OnnxRuntimeMissingError: If onnxruntime cannot be imported.
        MeasurementError: For settings of another backend, a file ORT
            cannot load, or inputs that do not fit the file.
    """

    # Every sample kept, as ORT's chains keep theirs (`AdaptiveSampling`).
    leaves_out_disturbed = False

    def __init__(
        self,
        path: str | os.PathLike,
        settings: settings_lib.RunSettings,
        options: TimingOptions | None = None,
        *,
        input_specs: Sequence[tuple[Sequence[int], str]] | None = None,
        id_bounds: Sequence[int | None] | None = None,
        profile_prefix: str | None = None,
        session_config: Mapping[str, str] | None = None,
        model: bytes | None = None,
    ) -> None:
        self.path = str(path)
        self.name = Path(path).stem
        self.settings = settings
        self.options = options or TimingOptions()
        if settings.backend != "onnxruntime":
            raise MeasurementError(
                f"Backend {settings.backend!r} is not timed by OrtTimer; use "
                "settings with backend='onnxruntime' (or timing.Timer)."
            )
        if settings.jit_compile:
            raise MeasurementError(
                "jit_compile (XLA) applies to backend 'tf' only; use "
                "settings with jit_compile=False for ONNX Runtime."
            )
        from dlbricks_tf.cutting import synthetic  # Imports Keras.

        ort = import_onnxruntime()
        weight_copies = max(1, self.options.weight_copies)
        input_copies = max(1, self.options.input_copies)
        self.sessions = [
            session_for(
                path if model is None else model,
                settings,
                profile_prefix=_copy_prefix(profile_prefix, i, weight_copies),
                config=session_config,
                name=self.path,
            )
            for i in range(weight_copies)
        ]
        where = f"ONNX model {self.path!r}"
        self._file_specs = onnx_input_specs(self.sessions[0])
        specs = resolve_specs(
            self._file_specs, input_specs, settings.batch_size, where
        )
        try:
            sets = [
                synthetic.arrays_for_specs(
                    specs, id_bounds, settings.batch_size, self.options.seed + c
                )
                for c in range(input_copies)
            ]
        except ValueError as e:
            raise MeasurementError(f"{where}: {e}") from e
        self.inputs = sets  # The synthetic arrays, one list per copy.
        # OrtValues share the arrays' memory: keep both alive.
        self._values = [
            [ort.OrtValue.ortvalue_from_numpy(a) for a in arrays]
            for arrays in sets
        ]
        self._outputs = len(self.sessions[0].get_outputs())
        self._copies = max(input_copies, weight_copies)  # Per iteration.
        self._bindings: list[tuple[Any, Any]] = []
        self._calls: list[tuple[Any, Any]] = []
        self._runs = 0
        self._samples: list[float] = []
        self._factors: list[float] = []
        self._crowded: list[bool] = []
        self._sampling_s = 0.0
        self._prepare_s = 0.0
        self._n = 0  # Iterations per sample; K = n * copies.
        self._s = 0
        self._overhead_ms = 0.0
        self._subtracted_ms = 0.0

    def _iteration(self) -> list[tuple[Any, Any]]:
        """One iteration: call c on session c % W with input copy c % I."""
        if not self._bindings:
            for c in range(self._copies):
                session = self.sessions[c % len(self.sessions)]
                values = self._values[c % len(self._values)]
                try:
                    binding = bind(session, values)
                except Exception as e:  # ORT's own types.
                    raise MeasurementError(
                        f"ONNX Runtime cannot run {self.path!r} on "
                        f"synthetic inputs: {type(e).__name__}: {e}"
                    ) from e
                self._runs += 1
                self._bindings.append((session.run_with_iobinding, binding))
        return self._bindings

    def durations_ms(self, iterations: int, samples: int) -> list[float]:
        """Takes `samples` samples of `iterations` iterations; raw ms each.

        An iteration makes `calls_per_iteration` calls; nothing is
        subtracted and nothing is recorded as a sample.
        """
        calls = self._iteration() * iterations
        durations = timed_ns(calls, samples)
        self._runs += len(calls) * samples
        return [d / 1e6 for d in durations]

    def _prepare(self) -> None:
        opts = self.options
        self._iteration()  # Binds, and runs every binding once.
        warm = self.durations_ms(1, max(1, opts.warmup_calls))
        self._overhead_ms = run_overhead_ms(
            self.settings, self._file_specs, self._values, self._outputs
        )
        if opts.subtract_loop_overhead:
            self._subtracted_ms = self._overhead_ms
        self._choose_sizes(warm, self.durations_ms)
        self._calls = self._iteration() * self._n

    @property
    def runs(self) -> int:
        """`run_with_iobinding` calls made so far (warm-up included)."""
        return self._runs

    @property
    def dispatch_ms(self) -> float:
        """Calibrated cost of one ORT `Run` call (0 before sampling)."""
        return self._overhead_ms

    @property
    def overhead_per_call_ms(self) -> float:
        """What is subtracted from each call (0 if not subtracting)."""
        return self._subtracted_ms

    @property
    def _what(self) -> str:
        return f"ONNX model {self.path!r}"

    def _take(self, count: int) -> list[float]:
        durations = timed_ns(self._calls, count)
        self._runs += len(self._calls) * count
        calls = len(self._calls)
        return [
            max(d / 1e6 / calls - self._subtracted_ms, 0.0) for d in durations
        ]


def time_onnx(
    path: str | os.PathLike,
    settings: settings_lib.RunSettings,
    options: TimingOptions | None = None,
    *,
    input_specs: Sequence[tuple[Sequence[int], str]] | None = None,
    id_bounds: Sequence[int | None] | None = None,
) -> stats.Timing:
    """Times an ONNX file (a brick or a whole model) with ONNX Runtime.

    Args:
        path: The `.onnx` file.
        settings: Run settings with `backend="onnxruntime"`.
        options: Sampling options; defaults to `TimingOptions()`.
        input_specs: (shape without batch, dtype) per input; None reads
            them from the file.
        id_bounds: Exclusive id bound per input (None: no bound).

    Returns:
        Milliseconds per call: min, median, trimmed mean, max, CI.

    Raises:
        MeasurementError: If the file cannot be timed under `settings`.

    Example:
        >>> settings = RunSettings.default(1, backend="onnxruntime")
        >>> time_onnx("brick.onnx", settings).median_ms
        0.042
    """
    timer = OrtTimer(
        path, settings, options, input_specs=input_specs, id_bounds=id_bounds
    )
    return sampling.time_interleaved([timer])[0]


def convert_for_ort(
    model: Any,
    workdir: str | os.PathLike,
    name: str | None = None,
    *,
    batch_size: int | None = None,
    boundary: str = "keras",
) -> tuple[Path, list[int | None]]:
    """Converts a Keras model to `workdir/<name>.onnx`, dynamic batch.

    Then writes `<name>.json` beside it with the model's id bounds
    (`synthetic.id_bounds`), so that a cached file can be timed without
    the Keras model, and the file's boundary layout (`boundary`, and the
    indices of its channels-first inputs and outputs); the `.json` is
    written last, so its presence means the `.onnx` is complete. Both are
    rewritten.

    Args:
        model: A built Keras model.
        workdir: Folder of the files (created if absent).
        name: File stem; the model's name by default.
        batch_size: Fixed batch dimension, or None for a dynamic one.
        boundary: The boundary layout, one of `onnx_convert.BOUNDARIES`
            ("keras": as the model has them).

    Returns:
        (path of the `.onnx` file, id bound per input).

    Raises:
        dlbricks_tf.measuring.onnx_convert.ConversionError: If tf2onnx fails.
    """
    from dlbricks_tf.cutting import synthetic
    from dlbricks_tf.measuring import onnx_convert

    folder = Path(workdir)
    folder.mkdir(parents=True, exist_ok=True)
    stem = name or model.name
    path = folder / f"{stem}.onnx"
    bounds = synthetic.id_bounds(model)
    info = onnx_convert.to_onnx(
        model, path, batch_size=batch_size, boundary=boundary
    )
    sidecar = {
        "format": FILE_FORMAT,
        "id_bounds": bounds,
        "boundary": boundary,
        "nchw_inputs": list(info.nchw_inputs),
        "nchw_outputs": list(info.nchw_outputs),
    }
    path.with_suffix(".json").write_text(json.dumps(sidecar))
    return path, bounds


# What `convert_for_ort` writes, recorded in the `.json` beside each file:
# 2, with zero terms dropped (`onnx_convert.drop_zero_terms`). A file of
# another format is converted again rather than reused.
FILE_FORMAT = 2


def is_current(path: str | os.PathLike) -> bool:
    """Whether the file beside this `.json` is of `FILE_FORMAT`."""
    sidecar = Path(path).with_suffix(".json")
    if not sidecar.is_file():
        return False
    return json.loads(sidecar.read_text()).get("format") == FILE_FORMAT


def load_id_bounds(path: str | os.PathLike) -> list[int | None] | None:
    """The id bounds `convert_for_ort` wrote beside an `.onnx` file.

    Returns:
        One bound (or None) per input, or None if there is no such file.
    """
    sidecar = Path(path).with_suffix(".json")
    if not sidecar.is_file():
        return None
    return list(json.loads(sidecar.read_text())["id_bounds"])


def time_keras_model_on_ort(
    model: Any,
    settings: settings_lib.RunSettings,
    options: TimingOptions | None,
    workdir: str | os.PathLike,
) -> stats.Timing:
    """Converts a Keras model (brick or whole) to ONNX and times it on ORT.

    Args:
        model: A built Keras model with fixed input shapes but the batch
            dimension.
        settings: Run settings with `backend="onnxruntime"`.
        options: Sampling options (None: `TimingOptions()`).
        workdir: Folder for `<model.name>.onnx` (kept).

    Returns:
        The timing, as `time_onnx`.

    Raises:
        ConversionError: If the model cannot be converted.
        MeasurementError: If it cannot be timed.

    Example:
        >>> brick = decompose(model, 1).bricks[0].build(None)
        >>> time_keras_model_on_ort(brick, settings, None, "onnx/")
    """
    path, bounds = convert_for_ort(model, workdir)
    return time_onnx(path, settings, options, id_bounds=bounds)
