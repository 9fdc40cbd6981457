"""This process and the CPU it runs on: cores, oneDNN, thread pools.

`physical_cores` counts the cores this process may run on (the default
intra-op pool); `onednn_in_effect` says whether TensorFlow's oneDNN
optimisations are on in this process, predicted from the CPU's features
before TensorFlow is imported and read from TensorFlow after.
`configure_threads` fixes TensorFlow's thread pools; it must run before
TensorFlow executes its first op (building a Keras model counts), so a
command-line tool calls it first thing in `main`. `collector_paused`
holds Python's garbage collector while a function is traced or timed.
Importing this module imports no TensorFlow.

Example:
    settings = RunSettings.default(batch_size=1)
    configure_threads(settings.intra_op_threads, settings.inter_op_threads)
"""

from __future__ import annotations

import contextlib
import gc
import os
import platform
import sys
from collections.abc import Iterator, Mapping

from dlbricks_tf import errors


def physical_cores() -> int:
    """Returns the physical cores this process may run on (at least 1).

    Counts distinct (physical id, core id) pairs in /proc/cpuinfo, capped by
    the CPUs the process is allowed to use; falls back to `os.cpu_count()`.
    """
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count() or 1
    cores = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            physical = core = None
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "physical id":
                    physical = value.strip()
                elif key == "core id":
                    core = value.strip()
                elif not line.strip():
                    if core is not None:
                        cores.add((physical, core))
                    physical = core = None
            if core is not None:
                cores.add((physical, core))
    except OSError:
        pass
    return max(1, min(len(cores) or usable, usable))


# CPU features for which TensorFlow turns oneDNN on by default on Linux
# (`DefaultOneDnnPolicy` in tensorflow/core/util/port.cc), spelled as
# /proc/cpuinfo's "flags" line spells them.
ONEDNN_CPU_FLAGS = (
    "avx512_vnni",
    "avx512_bf16",
    "avx_vnni",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
)
# The one Arm core of the same policy, Neoverse V1 (e.g. AWS Graviton3):
# /proc/cpuinfo's "CPU implementer" and "CPU part" (the MIDR_EL1 fields
# TensorFlow reads).
_NEOVERSE_V1 = (0x41, 0xD40)
_X86 = ("x86_64", "amd64", "i386", "i686", "x86")
_ARM64 = ("aarch64", "arm64")


class OneDnnError(errors.Error):
    """TensorFlow's oneDNN decision differs from the one predicted."""


def _cpuinfo_field(cpuinfo: str, name: str) -> str | None:
    """The value of the first `name : value` line, None if there is none."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == name:
            return value.strip()
    return None


def _read_cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return f.read()
    except OSError:
        return ""


def onednn_default(
    cpuinfo: str | None = None,
    *,
    system: str | None = None,
    machine: str | None = None,
) -> bool:
    """Whether TensorFlow turns oneDNN on when `TF_ENABLE_ONEDNN_OPTS` is unset.

    TensorFlow's rule: on Linux, on for x86 CPUs with one of
    `ONEDNN_CPU_FLAGS` and for Arm Neoverse V1 cores, off for every other
    CPU; on for x86 Windows; off elsewhere. The flags are read from
    /proc/cpuinfo, where the kernel lists only the features it enabled
    (TensorFlow asks the CPU itself: a kernel too old to name AVX_VNNI or
    AMX hides them here).

    Args:
        cpuinfo: Text of /proc/cpuinfo; this machine's by default.
        system: `platform.system()`, e.g. "Linux"; this machine's by default.
        machine: `platform.machine()`, e.g. "x86_64"; this machine's by
            default.

    Returns:
        The default.
    """
    system = platform.system() if system is None else system
    machine = (platform.machine() if machine is None else machine).lower()
    if system == "Windows":
        return machine in _X86
    if system != "Linux":
        return False
    cpuinfo = _read_cpuinfo() if cpuinfo is None else cpuinfo
    if machine in _X86:
        flags = set((_cpuinfo_field(cpuinfo, "flags") or "").split())
        return not flags.isdisjoint(ONEDNN_CPU_FLAGS)
    if machine in _ARM64:
        try:
            core = (
                int(_cpuinfo_field(cpuinfo, "CPU implementer") or "", 16),
                int(_cpuinfo_field(cpuinfo, "CPU part") or "", 16),
            )
        except ValueError:
            return False
        return core == _NEOVERSE_V1
    return False


def onednn_enabled(
    environ: Mapping[str, str] | None = None, *, default: bool | None = None
) -> bool:
    """Whether TensorFlow's oneDNN optimisations are on, without importing it.

    TensorFlow reads `TF_ENABLE_ONEDNN_OPTS` once, when it is imported:
    "1" or "true" turns oneDNN on and "0" or "false" off (any case); unset,
    or any other value (TensorFlow logs a warning), leaves its default
    (`onednn_default`). Once TensorFlow is imported, `onednn_in_effect`
    reads its own answer.

    Args:
        environ: Environment to read; `os.environ` by default.
        default: The CPU's default; `onednn_default()` when None.

    Returns:
        The flag.
    """
    env = os.environ if environ is None else environ
    value = env.get("TF_ENABLE_ONEDNN_OPTS")
    if value is not None and value.lower() in ("0", "false"):
        return False
    if value is not None and value.lower() in ("1", "true"):
        return True
    return onednn_default() if default is None else default


def tensorflow_onednn() -> bool | None:
    """TensorFlow's own oneDNN decision, None while it is not imported.

    Never imports TensorFlow: the answer is read only when a module has
    already done so (it is fixed at that import).
    """
    if "tensorflow" not in sys.modules:
        return None
    from tensorflow.python.util import _pywrap_util_port

    return bool(_pywrap_util_port.IsMklEnabled())


def onednn_in_effect() -> bool:
    """This process's oneDNN flag: TensorFlow's answer, checked against ours.

    Before TensorFlow is imported, the prediction of `onednn_enabled`;
    after, TensorFlow's own decision (`tensorflow_onednn`), which must
    match the prediction.

    Raises:
        OneDnnError: If TensorFlow decided otherwise than predicted (a CPU
            or platform the rule does not know, or `TF_ENABLE_ONEDNN_OPTS`
            changed after TensorFlow was imported).
    """
    predicted = onednn_enabled()
    actual = tensorflow_onednn()
    if actual is not None and actual != predicted:
        value = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
        raise OneDnnError(
            f"TensorFlow runs with oneDNN {'on' if actual else 'off'} but "
            f"dlbricks_tf predicted {'on' if predicted else 'off'} "
            f"(TF_ENABLE_ONEDNN_OPTS={value!r}); start Python with "
            f"TF_ENABLE_ONEDNN_OPTS={int(actual)} so that results are "
            "labelled with what TensorFlow does."
        )
    return predicted


class ThreadPoolError(errors.Error):
    """TensorFlow's thread pools are already fixed to other sizes."""


def configure_threads(intra: int, inter: int = 1) -> None:
    """Fixes TensorFlow's intra- and inter-op thread pools.

    Must be called before TensorFlow runs its first op: TensorFlow ignores
    `OMP_NUM_THREADS` and refuses new pool sizes once initialised. Calling
    it again with the sizes already in force is a no-op.

    Args:
        intra: Threads one op may use, at least 1.
        inter: Ops that may run at the same time, at least 1.

    Raises:
        ValueError: If a size is not a positive int.
        ThreadPoolError: If TensorFlow already runs with other pool sizes.
    """
    for name, value in (("intra", intra), ("inter", inter)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(
                f"{name} must be a positive int. Received: {name}={value!r}"
            )
    import tensorflow as tf  # Lazy: importing this module must stay cheap.

    threading = tf.config.threading
    current = (
        threading.get_intra_op_parallelism_threads(),
        threading.get_inter_op_parallelism_threads(),
    )
    if current == (intra, inter):
        return
    try:
        threading.set_intra_op_parallelism_threads(intra)
        threading.set_inter_op_parallelism_threads(inter)
    except RuntimeError as e:
        raise ThreadPoolError(
            f"TensorFlow is already initialised with intra={current[0]}, "
            f"inter={current[1]} threads (0 means TensorFlow's default); "
            f"cannot switch to intra={intra}, inter={inter}. Call "
            "configure_threads() before building any model or running any "
            "op, or run in a fresh process."
        ) from e


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Holds Python's cyclic garbage collector for the block.

    Tracing a `tf.function` allocates tens of Python objects per op, and
    the collections they trigger scan every object the process holds (the
    models, their layers, the graphs already traced): paused, the trace of
    a chain of bricks took a fifth less time
    (`python -m benchmarks.setup_cost`). Around a sample, a collection
    lands in no duration. Nested uses keep it paused to the outermost end;
    the objects made meanwhile are collected as usual afterwards.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
