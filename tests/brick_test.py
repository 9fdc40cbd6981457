"""Tests of dlbricks_tf/cutting/brick.py: bricks build into fresh Models."""

import keras
import numpy as np
import pytest
from keras import layers

import dlbricks_tf
from dlbricks_tf.cutting import fidelity
from tests import models


def test_build_fixes_the_batch_and_runs():
    model, _ = models.chain()
    d = dlbricks_tf.decompose(model, granularity=3)
    for batch in (1, 4):
        built = d.bricks[0].build(batch_size=batch)
        assert built.inputs[0].shape == (batch, 16, 16, 3)
        out = built(np.zeros((batch, 16, 16, 3), "float32"))
        assert out.shape == (batch, 16, 16, 8)
    dynamic = d.bricks[0].build(batch_size=None)
    assert dynamic.inputs[0].shape == (None, 16, 16, 3)


def test_bad_batch_size():
    model, _ = models.chain()
    with pytest.raises(ValueError, match="batch_size"):
        dlbricks_tf.decompose(model).bricks[0].build(batch_size=0)


def test_weights_are_fresh_and_not_shared():
    model, _ = models.chain()
    d = dlbricks_tf.decompose(model)
    built = d.bricks[0].build()
    conv = model.get_layer(d.bricks[0].layers[0])
    fresh = built.get_layer(d.bricks[0].layers[0])
    assert fresh is not conv
    source_ids = {id(v) for v in model.weights}
    assert not any(id(v) in source_ids for v in built.weights)


def test_a_brick_built_on_its_source_calls_the_source_layers():
    model, _ = models.chain()
    d = dlbricks_tf.decompose(model, granularity=2)
    brick = d.bricks[0]
    built = brick.build(1, source=model)
    conv = model.get_layer(brick.layers[0])
    assert any(op is conv for op in built.operations)
    assert {id(v) for v in built.weights} <= {id(v) for v in model.weights}
    x = np.random.default_rng(0).random((1, 16, 16, 3), "float32")
    expected = built(x)
    copy = brick.build(1)
    fidelity.copy_weights(model, brick, copy)
    np.testing.assert_allclose(copy(x), expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="keeps its names"):
        brick.build(1, anonymous=True, source=model)


def test_a_source_layer_of_another_config_is_not_used():
    # A model built twice in one process can number its auto-named layers
    # differently: a layer is reused only if its class and config match.
    x = keras.Input((8,))
    model = keras.Model(x, layers.Dense(4, name="d")(x))
    d = dlbricks_tf.decompose(model)
    other = keras.Model(x, layers.Dense(5, name="d")(x))
    built = d.bricks[0].build(1, source=other)
    assert not any(op is other.get_layer("d") for op in built.operations)
    assert built.outputs[0].shape == (1, 4)


def test_shared_layer_stays_shared_inside_a_brick():
    inp = keras.Input((4,))
    dense = layers.Dense(4, name="twice")
    model = keras.Model(inp, dense(dense(inp)))
    d = dlbricks_tf.decompose(model, granularity=2)
    assert d.bricks[0].layers == ("twice", "twice")
    built = d.bricks[0].build()
    assert len(built.weights) == 2  # One kernel, one bias: shared.


def test_brick_has_one_input_per_outside_tensor_and_named_outputs():
    model, _ = models.residual()
    d = dlbricks_tf.decompose(model, granularity=1)
    add = next(b for b in d.bricks if b.class_names == ("Add",))
    assert len(add.inputs) == 2
    built = add.build(batch_size=2)
    assert len(built.inputs) == 2


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
