"""Tests of dlbricks_tf.decompose on every kind of model it handles."""

import keras
import numpy as np
import pytest

import dlbricks_tf
from tests import models


@pytest.mark.parametrize("granularity", [1, 2, 3, 5])
@pytest.mark.parametrize("kind", sorted(models.ALL))
def test_bricks_reproduce_the_model(kind, granularity):
    model, inputs = models.ALL[kind]()
    d = dlbricks_tf.decompose(model, granularity=granularity)
    models.check_decomposition(d, granularity)
    got, want = models.bricks_reproduce(model, d, inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("granularity", [1, 2])
@pytest.mark.parametrize("kind", sorted(models.ALL))
def test_fused_bricks_reproduce_the_model(kind, granularity):
    model, inputs = models.ALL[kind]()
    d = dlbricks_tf.decompose(model, granularity=granularity, fuse=True)
    assert d.fuse
    models.check_decomposition(d, granularity)
    got, want = models.bricks_reproduce(model, d, inputs)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-3)


def test_fused_g1_bricks_of_an_application_hold_conv_bn_activation():
    model = keras.applications.MobileNetV2(weights=None)
    plain = dlbricks_tf.decompose(model, 1)
    fused = dlbricks_tf.decompose(model, 1, fuse=True)
    classes = [b.class_names for b in fused.bricks]
    assert ("Conv2D", "BatchNormalization", "ReLU") in classes
    assert ("DepthwiseConv2D", "BatchNormalization", "ReLU") in classes
    assert not any(c == ("BatchNormalization",) for c in classes)
    assert len(fused.bricks) < len(plain.bricks) == plain.num_calls
    assert sum(len(b.layers) for b in fused.bricks) == plain.num_calls


def test_fresh_weights_do_not_reproduce_the_model():
    # Guards the fidelity check itself: without copied weights it must fail.
    model, inputs = models.chain()
    d = dlbricks_tf.decompose(model, granularity=2)
    built = [b.build(batch_size=2) for b in d.bricks]
    got = dlbricks_tf.cutting.fidelity.evaluate(d, built, inputs)
    want = model(inputs[0], training=False)
    assert not np.allclose(np.asarray(got[0]), np.asarray(want), atol=1e-6)


def test_shared_layer_calls_each_count():
    model, _ = models.shared_and_ops()
    d = dlbricks_tf.decompose(model)
    names = [name for b in d.bricks for name in b.layers]
    assert names.count("shared") == 3
    assert d.num_calls == len(names)


def test_nested_models_are_flattened_with_qualified_names():
    model, _ = models.transfer()
    d = dlbricks_tf.decompose(model)
    names = [name for b in d.bricks for name in b.layers]
    assert names[:2] == ["base/stem", "base/stem_relu"]
    assert [n for n in names if n.startswith("head/")] == [
        "head/dense",
        "head/dense_1",
    ] or all(n.startswith("head/") for n in names[-2:])
    assert not any(n in ("base", "head") for n in names)


def test_raw_ops_are_calls():
    model, _ = models.shared_and_ops()
    d = dlbricks_tf.decompose(model)
    classes = [c for b in d.bricks for c in b.class_names]
    for op in ("GetItem", "Concatenate", "Square", "Multiply", "Add"):
        assert op in classes


def test_g1_bricks_are_single_calls_and_g_bounds_bricks():
    model, _ = models.residual()
    for g in (1, 2, 4, 100):
        d = dlbricks_tf.decompose(model, granularity=g)
        assert max(len(b.layers) for b in d.bricks) <= g
    assert max(len(b.layers) for b in d.bricks) > 2  # Chains do merge.


def test_int_and_bool_inputs_keep_their_dtype():
    model, _ = models.multi_io()
    d = dlbricks_tf.decompose(model)
    dtypes = {spec.dtype for b in d.bricks for spec in b.inputs}
    assert {"int32", "bool", "float32"} <= dtypes


def test_mixed_precision_policy_reaches_the_brick():
    model, _ = models.mixed_precision()
    d = dlbricks_tf.decompose(model)
    first = d.bricks[0]
    built = first.build()
    dense = [op for op in built.operations if op.name == first.layers[0]]
    assert dense[0].dtype_policy.name == "mixed_float16"
    assert d.bricks[2].inputs[0].dtype == "float16"


def test_inferred_specs_in_a_sequential_follow_autocast():
    # Shapes inside a Sequential are inferred, not recorded. The float32
    # Flatten casts the mixed_float16 ReLU's output back to float32, as a
    # real call does, so the Dense brick reads float32.
    model = keras.Sequential(
        [
            keras.Input((4, 4, 3)),
            keras.layers.ReLU(dtype="mixed_float16"),
            keras.layers.Flatten(),
            keras.layers.Dense(2),
        ]
    )
    d = dlbricks_tf.decompose(model)
    assert [b.inputs[0].dtype for b in d.bricks] == [
        "float32",
        "float16",
        "float32",
    ]
    flatten = d.bricks[1].build()
    assert flatten.outputs[0].dtype == d.bricks[2].inputs[0].dtype


def test_subclassed_model_is_refused_with_its_name():
    class Net(keras.Model):
        def __init__(self):
            super().__init__(name="my_subclassed")
            self.dense = keras.layers.Dense(2)

        def call(self, x):
            return self.dense(x)

    net = Net()
    net(np.zeros((1, 3), "float32"))
    with pytest.raises(dlbricks_tf.DecompositionError, match="my_subclassed"):
        dlbricks_tf.decompose(net)


def test_unregistered_custom_layer_from_file_is_named(tmp_path):
    model = models.unregistered()
    path = tmp_path / "unreg.keras"
    model.save(path)
    with pytest.raises(dlbricks_tf.DecompositionError, match="plus_one"):
        dlbricks_tf.decompose(path)
    # custom_objects opts in, and a model in memory needs nothing.
    d = dlbricks_tf.decompose(
        path, custom_objects={"Unregistered": models.Unregistered}
    )
    assert d.bricks[0].build()(np.zeros((1, 3), "float32")).shape == (1, 3)
    assert dlbricks_tf.decompose(model).num_calls == 1


def test_lambda_from_file_needs_unsafe_mode(tmp_path):
    model, inputs = models.custom_layers()
    path = tmp_path / "custom.keras"
    model.save(path)
    with pytest.raises(dlbricks_tf.DecompositionError, match="halve.*safe"):
        dlbricks_tf.decompose(path)
    d = dlbricks_tf.decompose(path, safe_mode=False)
    assert [n for b in d.bricks for n in b.layers][-1] == "halve"


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_bad_granularity_is_a_value_error(bad):
    model, _ = models.chain()
    with pytest.raises(ValueError, match="granularity"):
        dlbricks_tf.decompose(model, granularity=bad)


def test_public_names_stay_the_api_once_their_modules_are_imported():
    import importlib

    module = importlib.import_module("dlbricks_tf.cutting.decompose")
    assert dlbricks_tf.decompose is module.decompose
    from dlbricks_tf import decompose

    assert decompose is module.decompose
    errors = importlib.import_module("dlbricks_tf.errors")
    assert dlbricks_tf.Error is errors.Error
    assert set(dlbricks_tf.__all__) <= set(dir(dlbricks_tf))
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        dlbricks_tf.nothing  # noqa: B018


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
