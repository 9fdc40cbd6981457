"""ONNX Runtime sessions for timing: created, fed, run in a tight loop.

`session_for` opens an `onnxruntime.InferenceSession` on the CPU execution
provider with the thread counts of `RunSettings` (sequential execution,
full graph optimisation); `onnx_input_specs` and `resolve_specs` read and
check a file's inputs; `bind` binds inputs and outputs once to an
`IOBinding`, so that a call copies and allocates nothing in Python; and
`timed_ns` times samples of back-to-back calls with the garbage collector
paused. onnxruntime is imported on first use (`import_onnxruntime`), with a
one-line error when it is missing. No TensorFlow.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dlbricks_tf.machine import process as process_lib
from dlbricks_tf.machine import settings as settings_lib
from dlbricks_tf.measuring.sampling import MeasurementError

# ORT's type strings of the input dtypes synthetic data can be made for.
_ORT_DTYPES = {
    "tensor(float)": "float32",
    "tensor(double)": "float64",
    "tensor(float16)": "float16",
    "tensor(bool)": "bool",
    "tensor(int8)": "int8",
    "tensor(int16)": "int16",
    "tensor(int32)": "int32",
    "tensor(int64)": "int64",
    "tensor(uint8)": "uint8",
    "tensor(uint16)": "uint16",
    "tensor(uint32)": "uint32",
    "tensor(uint64)": "uint64",
}

Spec = tuple[tuple[int, ...], str]


class OnnxRuntimeMissingError(MeasurementError):
    """ONNX Runtime cannot be imported, so nothing can be timed on it."""


def import_onnxruntime() -> Any:
    """Imports onnxruntime, or raises a one-line error saying what to do."""
    try:
        import onnxruntime  # Lazy: only this backend needs it.
    except (ImportError, OSError) as e:
        raise OnnxRuntimeMissingError(
            f"ONNX Runtime cannot be imported ({type(e).__name__}: "
            f"{str(e).strip().splitlines()[0] if str(e).strip() else e!r})"
            ": pip install onnxruntime, or time with --backend=tf."
        ) from e
    return onnxruntime


def require_onnxruntime() -> None:
    """Raises `OnnxRuntimeMissingError` unless onnxruntime imports."""
    import_onnxruntime()


# (intra, inter) of the process's shared thread pools, once `share_threads`
# made them; None: every session has its own.
_SHARED: tuple[int, int] | None = None


def share_threads(settings: settings_lib.RunSettings) -> bool:
    """Makes every later session of this process run on one pair of pools.

    Not what the package's timings use (see `session_options`); kept to
    compare (`python -m benchmarks.ort_chains --shared_threads`). Each
    ORT session owns its thread pools, whose threads spin for a while
    after each `Run` unless told to stop. A process that times many
    sessions in turn (chains, whole models, their calibrations) then has
    the idle threads of one spinning while the next one runs, on the
    same cores: on 2 vCPUs at 2 intra-op threads, ResNet50 read 72.6 ms
    whole (36 ms on shared pools) and its bricks' sum 1.48x that. One
    pool of `settings`' sizes for every session avoids that, but its
    threads take no denormal flag from Python.

    At one intra-op thread a session has no pool thread to share, and
    nothing is done. Once made, the pools stay for the life of the
    process, and ORT then refuses any session that asks for threads of
    its own: every session of this package is opened through
    `session_options`, which asks for the shared ones.

    Returns:
        Whether the process's sessions share pools.

    Raises:
        MeasurementError: If the pools were made with other sizes.
    """
    global _SHARED
    sizes = (settings.intra_op_threads, settings.inter_op_threads)
    if _SHARED == sizes:
        return True
    if _SHARED is None and settings.intra_op_threads == 1:
        return False
    if _SHARED is not None:
        raise MeasurementError(
            f"This process's ONNX Runtime sessions share pools of "
            f"{_SHARED[0]}x{_SHARED[1]} threads; time {sizes[0]}x{sizes[1]} "
            "in another process."
        )
    ort = import_onnxruntime()
    ort.capi._pybind_state.set_global_thread_pool_sizes(*sizes)
    _SHARED = sizes
    return True


# ONNX Runtime's key for flush-to-zero and denormals-are-zero.
DENORMAL_AS_ZERO = "session.set_denormal_as_zero"
# Its key for a session's pool threads to stop spinning when a Run ends.
SPINNING_STOP = "session.force_spinning_stop"


def session_options(ort: Any, intra: int, inter: int) -> Any:
    """`SessionOptions` with these thread counts, on the shared pools if
    `share_threads` made them (whose sizes then stand), denormals as zero.

    Models built with `weights=None` carry random weights, and their
    activations shrink layer after layer (EfficientNetB0's peak 0.7
    after its stem, 7e-5 at its top); its bricks at G=3, chained, ended
    at 1e-19 to 1e-38, in float32's denormals (under 1.2e-38), which x86
    computes tens of times slower: the chain ran 333 ms against 13 ms
    with them flushed, and the model 13 ms. TensorFlow runs its
    kernels with denormals flushed to zero; ONNX Runtime flushes them
    only when asked (`DENORMAL_AS_ZERO`), on the threads of a session's
    own pools and, from the first session a process opens, on the thread
    that calls `Run` (numpy's arithmetic on that thread then flushes
    too). So every session asks, and both runtimes time the same
    arithmetic.

    Pools. Each session has its own, and from two intra-op threads on
    its threads stop spinning when a `Run` ends (`SPINNING_STOP`): a
    process that times many sessions in turn would otherwise have the
    idle threads of one spin while the next runs, on the same cores. The
    shared pools of `share_threads` avoid that too, but take no
    denormal flag from Python: their worker computed denormals as they
    came (EfficientNetB0's bricks at G=3 read 3.0x the model at two
    threads on them, 0.86x on pools of their own that stop spinning,
    whose whole models ran as fast as on the shared pools: 8.3 against
    8.4 ms, `python -m benchmarks.ort_chains --models=EfficientNetB0,
    MobileNetV2 --granularity=3 --fuse --intra_op_threads=2`).
    """
    options = ort.SessionOptions()
    options.add_session_config_entry(DENORMAL_AS_ZERO, "1")
    if _SHARED is not None:
        # The pools' sizes stand (ORT warns of counts set here).
        options.use_per_session_threads = False
        return options
    options.intra_op_num_threads = intra
    options.inter_op_num_threads = inter
    if intra > 1:
        options.add_session_config_entry(SPINNING_STOP, "1")
    return options


def session_for(
    path: str | os.PathLike | bytes,
    settings: settings_lib.RunSettings,
    *,
    profile_prefix: str | None = None,
    config: Mapping[str, str] | None = None,
    name: str | None = None,
) -> Any:
    """Returns an ONNX Runtime CPU session under `settings`' threads.

    The session runs on the CPU execution provider with
    `intra_op_num_threads` and `inter_op_num_threads` from `settings`,
    sequential execution (`inter_op_num_threads` is recorded but only used
    by ORT's parallel mode) and every graph optimisation.

    Args:
        path: The `.onnx` file, or a serialised model.
        settings: Run settings (their backend is not checked here).
        profile_prefix: If set, ORT profiles every run into a JSON file
            whose name starts with this (see `end_profiling()`); for tests
            and debugging, it slows every run.
        config: Session configuration entries
            (`SessionOptions.add_session_config_entry`), e.g.
            {"session.intra_op.allow_spinning": "0"}: threads that sleep
            when idle instead of spinning.
        name: What an error calls a serialised model (else `<bytes>`).

    Returns:
        An `onnxruntime.InferenceSession`.

    Raises:
        OnnxRuntimeMissingError: If onnxruntime cannot be imported.
        MeasurementError: If ORT cannot load the model.

    Example:
        >>> session = session_for("brick.onnx", settings)
        >>> session.get_session_options().intra_op_num_threads
        2
    """
    ort = import_onnxruntime()
    options = session_options(
        ort, settings.intra_op_threads, settings.inter_op_threads
    )
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3  # Errors only.
    if profile_prefix is not None:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    for key, value in (config or {}).items():
        options.add_session_config_entry(key, value)
    source = path if isinstance(path, bytes) else str(path)
    try:
        return ort.InferenceSession(
            source, sess_options=options, providers=["CPUExecutionProvider"]
        )
    except Exception as e:  # ORT raises its own types, and RuntimeError.
        if isinstance(path, bytes):
            where = repr(name) if name else "<bytes>"
        else:
            where = repr(str(path))
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise MeasurementError(
            f"ONNX Runtime cannot load model {where}: "
            f"{type(e).__name__}: {first}"
        ) from e


def onnx_input_specs(session: Any) -> list[tuple[str, tuple[Any, ...], str]]:
    """Returns (name, shape, dtype) of each input of an ORT session.

    A dimension ORT knows only by a symbol (the dynamic batch dimension of
    `onnx_convert.to_onnx`'s files) is None; dtypes are NumPy names.

    Raises:
        MeasurementError: For an input dtype synthetic data cannot be made
            for (strings, complex numbers, ...).
    """
    specs = []
    for node in session.get_inputs():
        if node.type not in _ORT_DTYPES:
            raise MeasurementError(
                f"ONNX input {node.name!r} has type {node.type}; synthetic "
                f"inputs exist for {', '.join(sorted(_ORT_DTYPES))}."
            )
        shape = tuple(d if isinstance(d, int) else None for d in node.shape)
        specs.append((node.name, shape, _ORT_DTYPES[node.type]))
    return specs


def resolve_specs(
    file_specs: Sequence[tuple[str, tuple[Any, ...], str]],
    given: Sequence[tuple[Sequence[int], str]] | None,
    batch_size: int,
    where: str,
) -> list[Spec]:
    """(shape without batch, dtype) per input, checked against the file."""
    if given is not None and len(given) != len(file_specs):
        raise MeasurementError(
            f"{where} has {len(file_specs)} inputs but {len(given)} "
            f"input_specs were given. Received: input_specs={list(given)}"
        )
    specs = []
    for i, (name, shape, dtype) in enumerate(file_specs):
        if not shape:
            raise MeasurementError(
                f"Input {name!r} of {where} is a scalar; a batch dimension "
                "is needed."
            )
        if shape[0] is not None and shape[0] != batch_size:
            raise MeasurementError(
                f"Input {name!r} of {where} has a fixed batch dimension "
                f"{shape[0]}, but batch_size={batch_size}. Convert it with "
                "a dynamic batch (to_onnx's default) or this batch size."
            )
        rest = shape[1:]
        if given is not None:
            want_shape = tuple(int(d) for d in given[i][0])
            want_dtype = np.dtype(given[i][1]).name
            fits = len(want_shape) == len(rest) and all(
                d is None or d == w
                for d, w in zip(rest, want_shape, strict=False)
            )
            if not fits or want_dtype != dtype:
                raise MeasurementError(
                    f"Input {name!r} of {where} is {dtype}{list(shape)}, "
                    f"but input_specs[{i}] says {want_dtype}"
                    f"{[None, *want_shape]}."
                )
            rest = want_shape
        if any(d is None for d in rest):
            raise MeasurementError(
                f"Input {name!r} of {where} has shape {list(shape)} with an "
                "unknown dimension; pass input_specs with every dimension "
                "but the batch one."
            )
        specs.append((tuple(rest), dtype))
    return specs


def timed_ns(calls: Sequence[tuple[Any, Any]], samples: int) -> list[int]:
    """Runs `samples` samples of all `calls`; returns each one's duration.

    Each call is (bound `run_with_iobinding`, its IOBinding). The garbage
    collector is paused so that a collection lands in no sample.
    """
    clock = time.perf_counter_ns
    durations = []
    with process_lib.collector_paused():
        for _ in range(samples):
            start = clock()
            for run, binding in calls:
                run(binding)
            durations.append(clock() - start)
    return durations


def bind(session: Any, values: Sequence[Any]) -> Any:
    """An IOBinding of `values` to the session's inputs, outputs fixed.

    The outputs are first bound to the CPU, then, after one run, to the
    OrtValues that run produced, so that later runs allocate none.
    """
    binding = session.io_binding()
    for node, value in zip(session.get_inputs(), values, strict=True):
        binding.bind_ortvalue_input(node.name, value)
    names = [node.name for node in session.get_outputs()]
    for name in names:
        binding.bind_output(name, "cpu")
    session.run_with_iobinding(binding)
    for name, value in zip(names, binding.get_outputs(), strict=True):
        binding.bind_ortvalue_output(name, value)
    return binding
