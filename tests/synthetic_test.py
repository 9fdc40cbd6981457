"""Tests for dlbricks_tf/cutting/synthetic.py."""

import keras
import numpy as np
import pytest
from keras import layers

from dlbricks_tf.cutting import synthetic


def _mixed_model():
    ids = keras.Input((10,), dtype="int32", name="ids")
    nested_ids = keras.Input((3,), dtype="int64", name="nested_ids")
    mask = keras.Input((10,), dtype="bool", name="mask")
    dense_in = keras.Input((4,), name="dense_in")
    count = keras.Input((2,), dtype="int32", name="count")

    inner_in = keras.Input((3,), dtype="int64")
    inner = keras.Model(inner_in, layers.Embedding(5, 2)(inner_in))

    e = layers.Embedding(7, 4)(ids)
    e = e * keras.ops.expand_dims(keras.ops.cast(mask, "float32"), -1)
    n = inner(layers.Reshape((3,))(nested_ids))
    c = layers.Dense(4)(keras.ops.cast(count, "float32"))
    out = layers.Concatenate()(
        [
            layers.Flatten()(e),
            layers.Flatten()(n),
            layers.Dense(4)(dense_in),
            c,
        ]
    )
    return keras.Model([ids, nested_ids, mask, dense_in, count], out)


def test_id_bounds_follow_the_graph():
    model = _mixed_model()
    assert synthetic.id_bounds(model) == [7, 5, None, None, None]


def test_inputs_respect_dtype_and_range():
    model = _mixed_model()
    ids, nested, mask, floats, count = synthetic.synthetic_inputs(
        model, batch_size=64, seed=3
    )
    assert ids.shape == (64, 10) and ids.dtype == np.int32
    assert ids.min() >= 0 and ids.max() < 7
    assert len(np.unique(ids)) == 7  # 640 draws cover the range.
    assert nested.dtype == np.int64 and nested.max() < 5
    assert mask.dtype == np.bool_ and mask.any() and not mask.all()
    assert floats.dtype == np.float32 and abs(floats.mean()) < 0.5
    assert count.min() >= 0 and count.max() < synthetic.SMALL_INT_HIGH
    model([ids, nested, mask, floats, count])  # Runs: ids are valid.


def test_same_seed_same_inputs():
    model = _mixed_model()
    a = synthetic.synthetic_inputs(model, 2, seed=1)
    b = synthetic.synthetic_inputs(model, 2, seed=1)
    c = synthetic.synthetic_inputs(model, 2, seed=2)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not np.array_equal(a[3], c[3])


def test_smallest_bound_wins_for_an_input_used_twice():
    ids = keras.Input((6,), dtype="int32")
    out = layers.Add()(
        [layers.Embedding(50, 3)(ids), layers.Embedding(9, 3)(ids)]
    )
    model = keras.Model(ids, out)
    assert synthetic.id_bounds(model) == [9]


def test_sequential_embedding():
    model = keras.Sequential(
        [keras.Input((5,), dtype="int32"), layers.Embedding(11, 3)]
    )
    assert synthetic.id_bounds(model) == [11]
    (x,) = synthetic.synthetic_inputs(model, batch_size=20)
    assert x.shape == (20, 5) and x.max() < 11


def test_float16_and_fixed_batch():
    x = keras.Input((3,), batch_size=2, dtype="float16")
    model = keras.Model(x, layers.Dense(2, dtype="float16")(x))
    (arr,) = synthetic.synthetic_inputs(model, batch_size=2)
    assert arr.dtype == np.float16 and arr.shape == (2, 3)
    with pytest.raises(ValueError, match="batch"):
        synthetic.synthetic_inputs(model, batch_size=4)


def test_unknown_dimension_raises():
    x = keras.Input((None, 3))
    model = keras.Model(x, layers.Dense(2)(x))
    with pytest.raises(ValueError, match="unknown dimension"):
        synthetic.input_specs(model, 1)


def test_input_shapes_give_open_dimensions():
    tokens = keras.Input((None,), dtype="int32", name="tokens")
    image = keras.Input((None, None, 3), name="image")
    e = layers.GlobalAveragePooling1D()(layers.Embedding(9, 4)(tokens))
    f = layers.GlobalAveragePooling2D()(image)
    model = keras.Model([tokens, image], layers.Concatenate()([e, f]))
    shapes = {"*": (5,), "image": (6, 7, 3)}
    assert synthetic.input_specs(model, 2, shapes) == [
        ((2, 5), "int32"),
        ((2, 6, 7, 3), "float32"),
    ]
    ids, pixels = synthetic.synthetic_inputs(model, 2, input_shapes=shapes)
    assert (
        ids.shape == (2, 5) and ids.max() < 9 and pixels.shape[1:] == (6, 7, 3)
    )
    with pytest.raises(ValueError, match="unknown dimension"):
        synthetic.input_specs(model, 1, {"tokens": (5,)})  # image left open.
    with pytest.raises(ValueError, match="no input named 'ids'; its inputs"):
        synthetic.input_specs(model, 1, {"ids": (5,)})
    with pytest.raises(ValueError, match=r"\(6, 7, 4\) does not fit"):
        synthetic.input_specs(model, 1, {"*": (5,), "image": (6, 7, 4)})


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
