"""Tests of dlbricks_tf.onnx_convert against real ONNX Runtime sessions."""

import keras
import numpy as np
import onnxruntime as ort
import pytest

import dlbricks_tf
from dlbricks_tf import onnx_convert
from tests import models


def _session(path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("name", ["chain", "multi_io", "transfer"])
def test_onnx_matches_keras(tmp_path, name):
    model, inputs = models.ALL[name]()
    path = tmp_path / "m.onnx"
    info = onnx_convert.to_onnx(model, path)
    session = _session(path)
    assert [i.name for i in session.get_inputs()] == list(info.input_names)
    expected = keras.tree.flatten(model(inputs, training=False))
    xs = [np.asarray(x) for x in keras.tree.flatten(inputs)]
    got = session.run(None, dict(zip(info.input_names, xs, strict=True)))
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, np.asarray(e), rtol=1e-4, atol=1e-5)


def test_brick_converts_with_anonymous_inputs(tmp_path):
    d = dlbricks_tf.decompose(models.residual()[0], granularity=2)
    brick = d.bricks[-1].build(batch_size=None)
    info = onnx_convert.to_onnx(brick, tmp_path / "b.onnx", batch_size=3)
    assert info.input_names == onnx_convert.input_names(brick)
    shapes = [i.shape for i in _session(tmp_path / "b.onnx").get_inputs()]
    assert all(s[0] == 3 for s in shapes)


def test_captured_constants_are_folded_not_inputs(tmp_path):
    # Normalization's mean and variance are eager tensors the traced call
    # captures; tf2onnx alone makes them graph inputs.
    inp = keras.Input((4, 4, 3))
    norm = keras.layers.Normalization(mean=[1.0, 2.0, 3.0], variance=[4.0] * 3)
    model = keras.Model(inp, keras.layers.ReLU()(norm(inp)))
    info = onnx_convert.to_onnx(model, tmp_path / "n.onnx")
    session = _session(tmp_path / "n.onnx")
    assert [i.name for i in session.get_inputs()] == ["input_0"]
    x = np.random.default_rng(0).standard_normal((2, 4, 4, 3), "float32")
    (got,) = session.run(None, {info.input_names[0]: x})
    np.testing.assert_allclose(got, np.asarray(model(x)), rtol=1e-5, atol=1e-6)


def test_opset_above_max_is_refused(tmp_path):
    with pytest.raises(ValueError, match="opset"):
        onnx_convert.to_onnx(models.chain()[0], tmp_path / "m.onnx", opset=19)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
