"""Run settings: everything besides the machine that changes a timing.

`RunSettings` is recorded with every result and keys it in the store.
`configure_threads` fixes TensorFlow's thread pools; it must run before
TensorFlow executes its first op (building a Keras model counts), so a
command-line tool calls it first thing in `main`.

Example:
    settings = RunSettings.default(batch_size=1)
    configure_threads(settings.intra_op_threads, settings.inter_op_threads)
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import sys
from collections.abc import Mapping
from typing import Any

from dlbricks_tf import errors

BACKENDS = ("tf", "onnxruntime")
# How bricks are timed: "chain" runs many bricks in one traced function,
# timed link by link (`dlbricks_tf.measuring.chain`); "loop" gives every brick
# its own traced loop (`dlbricks_tf.measuring.timing`, and ONNX Runtime's
# sessions). Results of one protocol never stand in for the other's: the key
# differs.
PROTOCOLS = ("loop", "chain")


class ThreadPoolError(errors.Error):
    """TensorFlow's thread pools are already fixed to other sizes."""


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """How a timing was taken.

    Attributes:
        batch_size: Batch dimension of the synthetic inputs.
        intra_op_threads: Threads one op may use.
        inter_op_threads: Ops that may run at the same time.
        backend: "tf" or "onnxruntime".
        onednn: Whether oneDNN's optimised kernels were on.
        jit_compile: Whether the `tf.function` was compiled with XLA.
        protocol: How bricks were timed, "chain" or "loop" (see
            `PROTOCOLS`); None picks "chain" for the TF backend without
            XLA (XLA has no timestamp op) and "loop" otherwise. Settings
            stored before chains existed read back as "loop".
    """

    batch_size: int
    intra_op_threads: int
    inter_op_threads: int
    backend: str = "tf"
    onednn: bool = True
    jit_compile: bool = False
    protocol: str | None = None

    def __post_init__(self) -> None:
        for name in ("batch_size", "intra_op_threads", "inter_op_threads"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"{name} must be a positive int. Received: {name}={value!r}"
                )
        if self.backend not in BACKENDS:
            raise ValueError(
                f"backend must be one of {BACKENDS}. "
                f"Received: backend={self.backend!r}"
            )
        chains = self.backend == "tf" and not self.jit_compile
        if self.protocol is None:
            object.__setattr__(self, "protocol", "chain" if chains else "loop")
        if self.protocol not in PROTOCOLS:
            raise ValueError(
                f"protocol must be one of {PROTOCOLS}. "
                f"Received: protocol={self.protocol!r}"
            )
        if self.protocol == "chain" and not chains:
            raise ValueError(
                "protocol='chain' needs backend='tf' without jit_compile "
                "(XLA has no timestamp op; ONNX Runtime times each brick "
                "in its own session); use protocol='loop'. Received: "
                f"backend={self.backend!r}, jit_compile={self.jit_compile}"
            )

    def key(self) -> str:
        """Returns a stable, readable key, e.g. 'tf-b1-t2x1-onednn1-jit0'.

        Chain-timed settings end in '-chain'; loop-timed ones keep the key
        they had before chains existed, so old stores still read.
        """
        return (
            f"{self.backend}-b{self.batch_size}"
            f"-t{self.intra_op_threads}x{self.inter_op_threads}"
            f"-onednn{int(self.onednn)}-jit{int(self.jit_compile)}"
            + ("-chain" if self.protocol == "chain" else "")
        )

    def to_dict(self) -> dict[str, Any]:
        """Returns the fields as a JSON-serialisable dict."""
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        """Returns canonical JSON (sorted keys) of the fields."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunSettings:
        """Builds settings from `to_dict` output.

        Settings written before the protocol was recorded were timed with
        one loop per brick: they read back as "loop".
        """
        values = dict(data)
        values.setdefault("protocol", "loop")
        return cls(**values)

    @classmethod
    def default(
        cls,
        batch_size: int = 1,
        *,
        intra_op_threads: int | None = None,
        inter_op_threads: int = 1,
        backend: str = "tf",
        jit_compile: bool = False,
        protocol: str | None = None,
    ) -> RunSettings:
        """Returns this machine's defaults: intra = physical cores, inter = 1.

        The oneDNN flag is the one in force (`onednn_in_effect`).
        """
        return cls(
            batch_size=batch_size,
            intra_op_threads=intra_op_threads or physical_cores(),
            inter_op_threads=inter_op_threads,
            backend=backend,
            onednn=onednn_in_effect(),
            jit_compile=jit_compile,
            protocol=protocol,
        )


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


def check_threads(settings: RunSettings) -> None:
    """Raises unless TensorFlow's thread pools match `settings`.

    Args:
        settings: The settings a timing is about to be recorded under.

    Raises:
        ThreadPoolError: If the configured pool sizes differ (including when
            they were never configured).
    """
    import tensorflow as tf

    threading = tf.config.threading
    current = (
        threading.get_intra_op_parallelism_threads(),
        threading.get_inter_op_parallelism_threads(),
    )
    wanted = (settings.intra_op_threads, settings.inter_op_threads)
    if current != wanted:
        raise ThreadPoolError(
            f"TensorFlow runs with intra={current[0]}, inter={current[1]} "
            f"threads (0 means unset) but the settings say intra={wanted[0]},"
            f" inter={wanted[1]}. Call configure_threads({wanted[0]}, "
            f"{wanted[1]}) before TensorFlow runs its first op."
        )
