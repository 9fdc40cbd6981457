"""Tests of dlbricks_tf/cutting/signature.py: when two bricks are the same."""

import keras
import pytest
from keras import layers

import dlbricks_tf
from dlbricks_tf.cutting import signature


def _net(
    filters=8,
    kernel=3,
    strides=1,
    activation="relu",
    shape=(16, 16, 3),
    dtype="float32",
    prefix="",
    initializer="glorot_uniform",
):
    inp = keras.Input(shape, dtype=dtype, name=prefix + "in")
    x = layers.Conv2D(
        filters,
        kernel,
        strides=strides,
        activation=activation,
        kernel_initializer=initializer,
        name=prefix + "conv",
        dtype=dtype,
    )(inp)
    x = layers.BatchNormalization(name=prefix + "bn", dtype=dtype)(x)
    x = layers.Dense(4, name=prefix + "dense", dtype=dtype)(x)
    return keras.Model(inp, x, name=prefix + "net")


def _signatures(model, granularity=1):
    d = dlbricks_tf.decompose(model, granularity=granularity)
    return [b.signature for b in d.bricks]


@pytest.mark.parametrize("granularity", [1, 3])
def test_same_model_twice_same_signatures(granularity):
    assert _signatures(_net(), granularity) == _signatures(_net(), granularity)


def test_renamed_layers_same_signatures():
    assert _signatures(_net()) == _signatures(_net(prefix="renamed_"))


def test_new_weights_and_initializers_same_signatures():
    model = _net()
    other = _net(initializer="he_normal")
    other.set_weights([w * 0 + 3 for w in other.get_weights()])
    assert _signatures(model) == _signatures(other)


@pytest.mark.parametrize(
    "change",
    [
        {"filters": 16},
        {"kernel": 5},
        {"strides": 2},
        {"activation": "tanh"},
        {"shape": (32, 32, 3)},
        {"dtype": "float16"},
    ],
)
def test_performance_changes_change_the_first_signature(change):
    assert _signatures(_net())[0] != _signatures(_net(**change))[0]


def test_signature_includes_internal_topology():
    # Same calls, different wiring: Add(x, f(x)) against Add(f(x), f(x)).
    inp = keras.Input((4,))
    y = layers.ReLU()(inp)
    a = keras.Model(inp, layers.Add()([inp, y]))
    inp = keras.Input((4,))
    y = layers.ReLU()(inp)
    b = keras.Model(inp, layers.Add()([y, y]))
    assert _signatures(a, 2) != _signatures(b, 2)


def test_strip_config_drops_names_and_initializers_keeps_the_rest():
    config = {
        "name": "conv",
        "trainable": False,
        "filters": 8,
        "kernel_initializer": {"class_name": "GlorotUniform"},
        "bias_regularizer": None,
        "kernel_constraint": None,
        "seed": 3,
        "dtype": {
            "module": "keras",
            "class_name": "DTypePolicy",
            "config": {"name": "mixed_float16"},
        },
        "nested": [{"name": "x", "units": 2}],
    }
    assert signature.strip_config(config) == {
        "filters": 8,
        "dtype": "mixed_float16",
        "nested": [{"units": 2}],
    }


@pytest.mark.parametrize(
    "make", [layers.BatchNormalization, lambda: layers.Dropout(0.5)]
)
def test_one_signature_inside_a_sequential_and_outside(make):
    # A Functional config records the call arguments Keras fills in
    # (mask=None, Dropout's training=False); a Sequential's does not.
    inp = keras.Input((4, 4, 3))
    seq = keras.Sequential([keras.Input((4, 4, 3)), make()])
    inside = keras.Model(inp, seq(inp))
    inp = keras.Input((4, 4, 3))
    outside = keras.Model(inp, make()(inp))
    assert _signatures(inside) == _signatures(outside)


def test_training_true_stays_in_the_signature():
    inp = keras.Input((4,))
    active = keras.Model(inp, layers.Dropout(0.5)(inp, training=True))
    inp = keras.Input((4,))
    default = keras.Model(inp, layers.Dropout(0.5)(inp))
    assert _signatures(active) != _signatures(default)


def _fork(nested):
    """relu -> (dense, dense -> bn), the first dense in a nested model."""
    inp = keras.Input((4,))
    if nested:
        block_in = keras.Input((4,))
        x = layers.ReLU()(block_in)
        block = keras.Model(block_in, [layers.Dense(3)(x), x])
        plain, x = block(inp)
    else:
        x = layers.ReLU()(inp)
        plain = layers.Dense(3)(x)
    bn = layers.BatchNormalization()(layers.Dense(3)(x))
    return keras.Model(inp, [plain, bn] if not nested else bn)


def test_same_dag_same_signature_whatever_the_walk_order():
    # A nested model's calls are walked together: relu, dense, dense, bn;
    # the flat model's chain is followed first: relu, dense, bn, dense.
    nested = dlbricks_tf.decompose(_fork(True), granularity=4).bricks
    flat = dlbricks_tf.decompose(_fork(False), granularity=4).bricks
    assert len(nested) == len(flat) == 1
    assert nested[0].signature == flat[0].signature


def test_a_built_brick_decomposes_into_itself():
    brick = dlbricks_tf.decompose(_fork(True), granularity=4).bricks[0]
    assert len(brick.layers) == 4
    again = dlbricks_tf.decompose(brick.build(), granularity=4).bricks
    assert [b.signature for b in again] == [brick.signature]


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
