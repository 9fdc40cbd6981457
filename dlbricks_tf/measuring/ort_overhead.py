"""What one ONNX Runtime `Run` costs, calibrated once per process.

Each call of a sample pays the Python loop and ORT's own cost of a `Run`
(binding checks, execution frame, thread pool hand-off), several
microseconds, as much as a small brick. `run_overhead_ms` measures it on a
trivial ONNX graph (`_empty_model`) with the same inputs, bound to the same
OrtValues, and as many outputs, each the `Size` of an input: the median
per call of samples of many calls in the same loop. `OrtTimer` subtracts
it (see `dlbricks_tf.measuring.ort_timing`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dlbricks_tf import stats
from dlbricks_tf.machine import settings as settings_lib
from dlbricks_tf.measuring.ort_session import bind, session_for, timed_ns

# Calls per calibration sample of the trivial graph (a few ms).
_CALIBRATION_CALLS = 400
_CALIBRATION_SAMPLES = 9
_CALIBRATION_ROUNDS = 3


def _empty_model(
    file_specs: Sequence[tuple[str, tuple[Any, ...], str]], outputs: int
) -> bytes:
    """A serialised ONNX graph with these inputs and `outputs` tiny outputs.

    Output j is the `Size` of input j mod n: no work, and not foldable at
    load time (the batch dimension stays symbolic).
    """
    import onnx  # Lazy: comes with tf2onnx; needed for calibration only.
    from onnx import helper

    inputs = [
        helper.make_tensor_value_info(
            name,
            helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),
            ["batch", *shape[1:]],
        )
        for name, shape, dtype in file_specs
    ]
    nodes = [
        helper.make_node("Size", [inputs[j % len(inputs)].name], [f"out_{j}"])
        for j in range(outputs)
    ]
    results = [
        helper.make_tensor_value_info(f"out_{j}", onnx.TensorProto.INT64, [])
        for j in range(outputs)
    ]
    graph = helper.make_graph(nodes, "empty", inputs, results)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 13)]
    )
    model.ir_version = 8  # Opset 13; loadable by any ORT >= 1.10.
    return model.SerializeToString()


_RUN_OVERHEAD_MS: dict[tuple[Any, ...], float] = {}


def run_overhead_ms(
    settings: settings_lib.RunSettings,
    file_specs: Sequence[tuple[str, tuple[Any, ...], str]],
    values: Sequence[Sequence[Any]],
    outputs: int,
) -> float:
    """Per-call cost of the timing loop and of an ORT `Run`, in ms.

    Measured once per process, thread counts, input specs, output count
    and number of input copies, on `_empty_model` with the same inputs
    bound to the same OrtValues: the median, over rounds, of the median
    per-call duration of samples of many back-to-back calls. Cached.

    Args:
        settings: Run settings (thread counts) of the timed session.
        file_specs: (name, shape, dtype) of the inputs.
        values: Input copies, each one OrtValue per input.
        outputs: Outputs of the timed model.

    Returns:
        Milliseconds per call.
    """
    key = (
        settings.intra_op_threads,
        settings.inter_op_threads,
        tuple(
            (dtype, tuple(v.shape()))
            for (_, _, dtype), v in zip(file_specs, values[0], strict=True)
        ),
        outputs,
        len(values),
    )
    if key not in _RUN_OVERHEAD_MS:
        session = session_for(_empty_model(file_specs, outputs), settings)
        bindings = [bind(session, copy) for copy in values]
        run = session.run_with_iobinding
        rounds = max(1, _CALIBRATION_CALLS // len(bindings))
        calls = [(run, b) for b in bindings] * rounds
        timed_ns(calls, 2)  # Warms up.
        per_call = [
            stats.median(timed_ns(calls, _CALIBRATION_SAMPLES))
            / len(calls)
            / 1e6
            for _ in range(_CALIBRATION_ROUNDS)
        ]
        _RUN_OVERHEAD_MS[key] = max(stats.median(per_call), 0.0)
    return _RUN_OVERHEAD_MS[key]
