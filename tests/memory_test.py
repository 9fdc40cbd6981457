"""Tests of dlbricks_tf/measuring/memory.py: refusing what cannot fit, up front.

The estimate of a small model is checked byte for byte (weights, inputs,
largest activation); a timing that would exceed the memory given is
refused in one line naming the model and the figures. Through the command
line, a batch of 10**12 ends in one line and a non-zero exit, and the
process never grows past what importing TensorFlow costs.

Example:
    python -m pytest tests/memory_test.py -p no:cacheprovider
"""

import os
import subprocess
import sys

import keras
import pytest

from dlbricks_tf.machine import settings as settings_lib
from dlbricks_tf.measuring import memory, timing
from tests import cli


def _model() -> keras.Model:
    inp = keras.Input((6,))
    x = keras.layers.Dense(50)(inp)
    return keras.Model(inp, keras.layers.Dense(2)(x), name="tiny")


def test_estimate_counts_weights_inputs_and_largest_activation():
    need = memory.estimate(_model(), batch_size=10, input_copies=2)
    assert need.weights == 4 * (6 * 50 + 50 + 50 * 2 + 2)
    assert need.inputs == 4 * 10 * 6 * 2 * 3  # Two copies, held thrice.
    assert need.activations == 4 * 10 * 50 * 3  # Dense(50) output.
    assert need.total == need.weights + need.inputs + need.activations


def test_weight_copies_multiply_the_weights():
    one = memory.estimate(_model(), 1)
    three = memory.estimate(_model(), 1, weight_copies=3)
    assert three.weights == 3 * one.weights


def test_open_dimensions_count_at_the_size_given():
    tokens = keras.Input((None, 8))
    scores = keras.ops.matmul(tokens, keras.ops.transpose(tokens, (0, 2, 1)))
    model = keras.Model(tokens, scores)  # (batch, length, length)
    need = memory.estimate(model, 1, input_specs=[((1, 100, 8), "float32")])
    assert need.inputs == 4 * 100 * 8 * 3
    assert need.activations == 4 * 100 * 100 * 3  # Length by length.


def test_check_refuses_in_one_line():
    model = _model()
    need = memory.estimate(model, 1000).total
    memory.check(model, 1000, available=int(need / memory.MARGIN) + 1)
    with pytest.raises(memory.MemoryLimitError) as info:
        memory.check(model, 1000, available=need)
    message = str(info.value)
    assert "\n" not in message
    assert "Model 'tiny'" in message and "batch size 1,000" in message
    assert "--batch_size" in message


def test_an_onnx_brick_is_checked_from_its_specs():
    inputs = [((None, 224, 224, 3), "float32")]
    outputs = [((None, 112, 112, 32), "float32")]
    need = memory.check_specs(
        "Brick ab12", 2, 4096, inputs, outputs, available=1 << 40
    )
    # Inputs held three times, the largest tensor three times.
    assert need.weights == 4096
    assert need.inputs == 3 * 2 * 224 * 224 * 3 * 4
    assert need.activations == 3 * 2 * 112 * 112 * 32 * 4  # The output.
    with pytest.raises(memory.MemoryLimitError, match="Brick ab12 needs"):
        memory.check_specs(
            "Brick ab12", 10**9, 4096, inputs, outputs, available=1 << 30
        )


def test_timer_refuses_before_allocating_inputs():
    settings = settings_lib.RunSettings.default(10**12, intra_op_threads=1)
    with pytest.raises(memory.MemoryLimitError, match="batch size"):
        timing.Timer(_model(), settings, check_settings=False)


def test_available_bytes_reads_this_machine():
    available = memory.available_bytes()
    assert available is not None and available > 0


def test_huge_batch_on_the_command_line(tmp_path):
    path = tmp_path / "tiny.keras"
    _model().save(path)
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        child = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tools.dlbricks",
                "bench",
                f"--models={path}",
                "--batch_size=1000000000000",
                f"--db={tmp_path / 'store.sqlite'}",
                *cli.FAST,
            ],
            cwd=cli.ROOT,
            env=cli.clean_environment(),
            stdout=stdout,
            stderr=stderr,
        )
        # wait4, not wait: the child's own peak memory comes with it.
        _, status, usage = os.wait4(child.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 1, err.read_text()
    lines = err.read_text().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dlbricks: error: "), lines
    assert "batch size 1,000,000,000,000" in out.read_text()
    # ru_maxrss is in KiB: the process stayed at what importing TensorFlow
    # costs; 10**12 inputs of 6 floats would be 24 TB.
    assert usage.ru_maxrss < 4 << 20


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
