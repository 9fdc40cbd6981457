"""Tests of dlbricks_tf/measuring/onnx_files.py: files kept per layout.

Real tf2onnx conversions and ONNX Runtime sessions; nothing is timed.
"""

import dataclasses
import json

import keras
import numpy as np
import pytest

from dlbricks_tf.measuring import brick_timing, onnx_files, ort_timing
from tests import models

SETTINGS, _ = models.settings()
ORT = dataclasses.replace(SETTINGS, backend="onnxruntime", protocol="loop")


def _conv(batch):
    """A channels-last convolution: its edges convert channels-first."""
    keras.utils.set_random_seed(0)
    inp = keras.Input((10, 10, 3), batch_size=batch)
    return keras.Model(inp, keras.layers.Conv2D(4, 3)(inp))


def test_brick_files_are_channels_first_and_named_by_layout(tmp_path):
    brick = brick_timing.brick_onnx_file(_conv, tmp_path, "abc", 1)
    assert brick.path == str(tmp_path / "brick-abc-conv_nchw.onnx")
    sidecar = json.loads((tmp_path / "brick-abc-conv_nchw.json").read_text())
    assert sidecar["boundary"] == onnx_files.BRICK_BOUNDARY
    assert (sidecar["nchw_inputs"], sidecar["nchw_outputs"]) == ([0], [0])
    # What ONNX Runtime's timer feeds it: synthetic inputs of its shape.
    timer = ort_timing.OrtTimer(brick.path, ORT)
    assert [x.shape for x in timer.inputs[0]] == [(1, 3, 10, 10)]
    # A whole model keeps the layout its users feed.
    model = brick_timing.model_onnx_file(_conv(None), tmp_path, "m", 1)
    timer = ort_timing.OrtTimer(model.path, ORT)
    assert [x.shape for x in timer.inputs[0]] == [(1, 10, 10, 3)]


def test_a_file_of_another_layout_is_not_reused(tmp_path):
    nhwc = onnx_files.onnx_file(_conv, tmp_path, "brick-abc", 1)
    assert nhwc.path == str(tmp_path / "brick-abc.onnx")
    nchw = onnx_files.onnx_file(
        _conv, tmp_path, "brick-abc", 1, boundary=onnx_files.BRICK_BOUNDARY
    )
    assert nchw.path != nhwc.path
    shapes = {
        path: [x.shape for x in ort_timing.OrtTimer(path, ORT).inputs[0]]
        for path in (nhwc.path, nchw.path)
    }
    assert shapes == {
        nhwc.path: [(1, 10, 10, 3)],
        nchw.path: [(1, 3, 10, 10)],
    }
    # Each is reused by its own layout only.
    again = onnx_files.onnx_file(
        lambda batch: pytest.fail("converted again"),
        tmp_path,
        "brick-abc",
        1,
        boundary=onnx_files.BRICK_BOUNDARY,
    )
    assert again.path == nchw.path


def test_brick_file_computes_the_keras_brick(tmp_path):
    brick = brick_timing.brick_onnx_file(_conv, tmp_path, "abc", 1)
    x = np.random.default_rng(0).standard_normal((1, 10, 10, 3), "float32")
    want = np.asarray(_conv(None)(x, training=False))
    timer = ort_timing.OrtTimer(brick.path, ORT)
    session = timer.sessions[0]
    (got,) = session.run(None, {"input_0": x.transpose(0, 3, 1, 2)})
    np.testing.assert_allclose(
        got.transpose(0, 2, 3, 1), want, rtol=1e-4, atol=1e-5
    )


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
