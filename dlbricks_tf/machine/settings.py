"""Run settings: everything besides the machine that changes a timing.

`RunSettings` is recorded with every result and keys it in the store.
`check_threads` refuses to record a timing under settings that
TensorFlow's thread pools do not match. The pools are fixed, and the
machine facts the defaults read (physical cores, oneDNN) are found, by
`dlbricks_tf.machine.process`.

Example:
    settings = RunSettings.default(batch_size=1)
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from dlbricks_tf.machine.process import (
    ThreadPoolError,
    onednn_in_effect,
    physical_cores,
)

BACKENDS = ("tf", "onnxruntime")
# How bricks are timed: "chain" runs many bricks in one traced function,
# timed link by link (`dlbricks_tf.measuring.chain`), or on ONNX Runtime in
# one merged graph split by its profiler (`dlbricks_tf.measuring.ort_chain`);
# "loop" gives every brick its own traced loop (`dlbricks_tf.measuring.timing`)
# or ONNX Runtime session. Results of one protocol never stand in for the
# other's: the key differs.
PROTOCOLS = ("loop", "chain")


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
            `PROTOCOLS`); None picks "chain" without XLA (XLA has no
            timestamp op) and "loop" with it. Settings stored before
            chains existed (on ONNX Runtime: before ORT chains) read back
            as "loop".
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
        chains = not self.jit_compile
        if self.protocol is None:
            object.__setattr__(self, "protocol", "chain" if chains else "loop")
        if self.protocol not in PROTOCOLS:
            raise ValueError(
                f"protocol must be one of {PROTOCOLS}. "
                f"Received: protocol={self.protocol!r}"
            )
        if self.protocol == "chain" and not chains:
            raise ValueError(
                "protocol='chain' needs jit_compile off (XLA has no "
                "timestamp op); use protocol='loop'. Received: "
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
