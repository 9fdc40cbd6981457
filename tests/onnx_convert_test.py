"""Tests of dlbricks_tf.measuring.onnx_convert against ONNX Runtime."""

import keras
import numpy as np
import onnxruntime as ort
import pytest
import tensorflow as tf

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


@pytest.mark.parametrize("last", [False, True])
def test_a_zero_shift_is_dropped_from_the_file(tmp_path, last):
    # A BatchNormalization with fresh weights shifts by beta - mean x
    # scale = 0: the file keeps its scale, not an Add of zeros, whether
    # the sum is read by a ReLU or is the file's output.
    import onnx

    inp = keras.Input((4, 4, 3))
    x = keras.layers.BatchNormalization()(inp)
    model = keras.Model(inp, x if last else keras.layers.ReLU()(x))
    info = onnx_convert.to_onnx(model, tmp_path / "bn.onnx")
    proto = onnx.load(str(tmp_path / "bn.onnx"))
    assert onnx_convert.count_ops(proto, "Add") == 0
    assert onnx_convert.count_ops(proto, "Mul") == 1
    assert [o.name for o in proto.graph.output] == list(info.output_names)
    x = np.random.default_rng(1).standard_normal((2, 4, 4, 3), "float32")
    (got,) = _session(tmp_path / "bn.onnx").run(None, {info.input_names[0]: x})
    np.testing.assert_allclose(got, np.asarray(model(x)), rtol=1e-5, atol=1e-6)
    # A shift that is not zero stays.
    model.layers[1].beta.assign([0.5, 0.0, -1.0])
    onnx_convert.to_onnx(model, tmp_path / "shifted.onnx")
    shifted = onnx.load(str(tmp_path / "shifted.onnx"))
    assert onnx_convert.count_ops(shifted, "Add") == 1


def test_opset_above_max_is_refused(tmp_path):
    with pytest.raises(ValueError, match="opset"):
        onnx_convert.to_onnx(models.chain()[0], tmp_path / "m.onnx", opset=19)


def test_a_model_over_the_weight_bound_is_refused_before_converting(
    tmp_path, monkeypatch
):
    model = models.chain()[0]
    weights = sum(int(np.prod(w.shape)) * 4 for w in model.weights)
    monkeypatch.setattr(onnx_convert, "MAX_WEIGHT_BYTES", weights - 1)
    with pytest.raises(onnx_convert.ConversionError, match="MiB of weights"):
        onnx_convert.to_onnx(model, tmp_path / "m.onnx")
    assert not (tmp_path / "m.onnx").exists()
    monkeypatch.setattr(onnx_convert, "MAX_WEIGHT_BYTES", weights)
    onnx_convert.to_onnx(model, tmp_path / "m.onnx")
    assert (tmp_path / "m.onnx").exists()


def _model_with_a_large_dense_kernel() -> keras.Model:
    """Conv2D, Dense on a sequence and on a vector: kernels of 4.5, 2, 36 KiB.

    Only the last is a Dense kernel of 4 KiB or more.
    """
    keras.utils.set_random_seed(0)
    inp = keras.Input((6, 6, 8))
    x = keras.layers.Conv2D(16, 3, padding="same")(inp)
    x = keras.layers.Dense(32)(keras.layers.Reshape((36, 16))(x))
    out = keras.layers.Dense(8)(keras.layers.Flatten()(x))
    return keras.Model(inp, out)


def test_large_dense_kernels_are_kept_out_of_tf2onnx(tmp_path, monkeypatch):
    model = _model_with_a_large_dense_kernel()
    # Below the 36 KiB kernel: converted only if tf2onnx is not handed it.
    monkeypatch.setattr(onnx_convert, "MAX_CONSTANT_BYTES", 16 * 2**10)
    path = tmp_path / "k.onnx"
    with pytest.raises(onnx_convert.ConversionError, match="of constants"):
        onnx_convert.to_onnx(model, path)
    assert not path.exists()
    monkeypatch.setattr(onnx_convert, "LARGE_KERNEL_BYTES", 4 * 2**10)
    info = onnx_convert.to_onnx(model, path)
    session = _session(path)
    assert [i.name for i in session.get_inputs()] == ["input_0"]
    x = np.random.default_rng(0).standard_normal((3, 6, 6, 8), "float32")
    (got,) = session.run(None, {info.input_names[0]: x})
    np.testing.assert_allclose(got, np.asarray(model(x)), rtol=1e-4, atol=1e-5)


def test_a_kept_out_kernel_changes_no_op_of_the_file(tmp_path, monkeypatch):
    import onnx

    model = _model_with_a_large_dense_kernel()
    onnx_convert.to_onnx(model, tmp_path / "a.onnx")
    monkeypatch.setattr(onnx_convert, "LARGE_KERNEL_BYTES", 4 * 2**10)
    onnx_convert.to_onnx(model, tmp_path / "b.onnx")
    a, b = (onnx.load(str(tmp_path / f)).graph for f in ("a.onnx", "b.onnx"))
    assert [n.op_type for n in a.node] == [n.op_type for n in b.node]
    assert len(a.initializer) == len(b.initializer)


def test_grouped_convolution_converts_without_a_function_call(tmp_path):
    import onnx

    # Keras runs a Conv2D with groups > 1 (ConvNeXt's depthwise ones)
    # through a nested tf.function that TensorFlow does not inline.
    keras.utils.set_random_seed(0)
    inp = keras.Input((8, 8, 8))
    x = keras.layers.Conv2D(8, 7, padding="same", groups=8)(inp)
    model = keras.Model(inp, keras.layers.Conv2D(4, 3, groups=2)(x))
    path = tmp_path / "g.onnx"
    info = onnx_convert.to_onnx(model, path)
    ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert "Conv" in ops and not any("Call" in op for op in ops)
    assert not tf.config.functions_run_eagerly()  # Restored after tracing.
    x = np.random.default_rng(0).standard_normal((2, 8, 8, 8), "float32")
    (got,) = _session(path).run(None, {info.input_names[0]: x})
    np.testing.assert_allclose(got, np.asarray(model(x)), rtol=1e-4, atol=1e-5)


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


def _conv_block() -> keras.Model:
    """Conv, BN, ReLU, max pooling: channels-first ops at both edges."""
    keras.utils.set_random_seed(0)
    inp = keras.Input((12, 12, 3))
    x = keras.layers.Conv2D(8, 3, padding="same")(inp)
    x = keras.layers.ReLU()(keras.layers.BatchNormalization()(x))
    return keras.Model(inp, keras.layers.MaxPooling2D()(x))


def _transposes(path) -> int:
    import onnx

    return onnx_convert.count_ops(onnx.load(str(path)), "Transpose")


def _run_as_keras(path, info, xs):
    """Runs a file on Keras-layout arrays; outputs in Keras's layout."""
    fed = [
        x.transpose(0, 3, 1, 2) if i in info.nchw_inputs else x
        for i, x in enumerate(xs)
    ]
    got = _session(path).run(
        None, dict(zip(info.input_names, fed, strict=True))
    )
    return [
        g.transpose(0, 2, 3, 1) if i in info.nchw_outputs else g
        for i, g in enumerate(got)
    ]


@pytest.mark.parametrize("boundary", onnx_convert.BOUNDARIES)
def test_every_brick_computes_its_keras_outputs_in_each_layout(
    tmp_path, boundary
):
    # G=1 bricks of convolutions, an Add and a Concatenate of two inputs,
    # a max pooling: single and multi-input bricks, conv-like or not.
    model, _ = models.residual()
    d = dlbricks_tf.decompose(model, granularity=1)
    rng = np.random.default_rng(0)
    nchw = 0
    for i, b in enumerate(d.bricks):
        brick = b.build(batch_size=None)
        path = tmp_path / f"b{i}.onnx"
        info = onnx_convert.to_onnx(brick, path, boundary=boundary)
        nchw += len(info.nchw_inputs) + len(info.nchw_outputs)
        xs = [
            rng.standard_normal((2, *t.shape[1:])).astype("float32")
            for t in brick.inputs
        ]
        packed = xs[0] if len(xs) == 1 else xs
        expected = keras.tree.flatten(brick(packed, training=False))
        got = _run_as_keras(path, info, xs)
        for g, e in zip(got, expected, strict=True):
            np.testing.assert_allclose(g, np.asarray(e), rtol=1e-4, atol=1e-5)
    if boundary == onnx_convert.KERAS_LAYOUT:
        assert nchw == 0
    else:
        assert nchw > 0  # The convolutions' bricks changed layout.


def test_conv_brick_as_nchw_has_no_edge_transposes(tmp_path):
    model = _conv_block()
    nhwc = onnx_convert.to_onnx(model, tmp_path / "nhwc.onnx")
    nchw = onnx_convert.to_onnx(
        model, tmp_path / "nchw.onnx", boundary=onnx_convert.CONV_NCHW
    )
    assert (nhwc.nchw_inputs, nhwc.nchw_outputs) == ((), ())
    assert (nchw.nchw_inputs, nchw.nchw_outputs) == ((0,), (0,))
    assert _transposes(tmp_path / "nhwc.onnx") == 2
    assert _transposes(tmp_path / "nchw.onnx") == 0
    session = _session(tmp_path / "nchw.onnx")
    assert [i.shape[1:] for i in session.get_inputs()] == [[3, 12, 12]]
    assert [o.shape[1:] for o in session.get_outputs()] == [[8, 6, 6]]


def test_channels_last_ops_keep_their_layout(tmp_path):
    # A LayerNormalization over the channels reads them last: a Transpose
    # would be added at its input, not removed.
    inp = keras.Input((6, 6, 4))
    model = keras.Model(inp, keras.layers.LayerNormalization()(inp))
    path = tmp_path / "ln.onnx"
    info = onnx_convert.to_onnx(model, path, boundary=onnx_convert.CONV_NCHW)
    assert (info.nchw_inputs, info.nchw_outputs) == ((), ())
    assert _transposes(path) == 0


def test_nchw_file_is_checked_in_its_layout(tmp_path):
    path = tmp_path / "c.onnx"
    model = _conv_block()
    info = onnx_convert.to_onnx(model, path, boundary=onnx_convert.CONV_NCHW)
    onnx_convert.check_outputs(model, path, info)
    # Read as if it were channels-last, its output is compared wrongly.
    keras_layout = onnx_convert.OnnxInfo(
        info.input_names, info.output_names, info.opset
    )
    with pytest.raises(onnx_convert.ConversionError):
        onnx_convert.check_outputs(model, path, keras_layout)


def test_unknown_boundary_is_refused(tmp_path):
    with pytest.raises(ValueError, match="boundary"):
        onnx_convert.to_onnx(
            _conv_block(), tmp_path / "m.onnx", boundary="nchw"
        )


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
