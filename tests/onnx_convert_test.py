"""Tests of dlbricks_tf.measuring.onnx_convert against ONNX Runtime."""

import keras
import numpy as np
import onnxruntime as ort
import pytest

import dlbricks_tf
from dlbricks_tf.measuring import onnx_convert
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


def _gelu_model(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    inp = keras.Input((16,))
    out = keras.layers.Dense(32, activation="gelu")(inp)  # Exact GELU.
    return keras.Model(inp, out)


def test_exact_gelu_converts_to_erf_with_keras_numerics(tmp_path):
    import onnx

    model = _gelu_model()
    path = tmp_path / "gelu.onnx"
    info = onnx_convert.to_onnx(model, path)
    ops = [n.op_type for n in onnx.load(str(path)).graph.node]
    assert "Erfc" not in ops and "Erf" in ops
    onnx.checker.check_model(str(path))
    # Far into both tails, where erfc(x) and 1 - erf(x) part most.
    x = np.linspace(-12, 12, 8 * 16, dtype="float32").reshape(8, 16)
    (got,) = _session(path).run(None, {info.input_names[0]: x})
    np.testing.assert_allclose(got, np.asarray(model(x)), rtol=1e-5, atol=1e-5)


def test_unconvertible_op_is_refused_and_no_file_is_left(tmp_path):
    inp = keras.Input((8,))
    model = keras.Model(inp, keras.ops.erfinv(keras.ops.tanh(inp)))
    path = tmp_path / "erfinv.onnx"
    with pytest.raises(onnx_convert.ConversionError, match="Erfinv"):
        onnx_convert.to_onnx(model, path)
    assert not path.exists()


def test_outputs_that_differ_from_keras_are_refused(tmp_path):
    path = tmp_path / "a.onnx"
    info = onnx_convert.to_onnx(_gelu_model(seed=0), path)
    onnx_convert.check_outputs(_gelu_model(seed=0), path, info)
    # Same shapes, other weights: the file does not compute this model.
    with pytest.raises(onnx_convert.ConversionError, match="differs"):
        onnx_convert.check_outputs(_gelu_model(seed=1), path, info)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
