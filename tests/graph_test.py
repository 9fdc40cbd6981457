"""Tests of dlbricks_tf/cutting/graph.py: the Keras config walked into calls."""

import keras
import numpy as np
import pytest
from keras import layers

import dlbricks_tf
from dlbricks_tf.cutting import graph, loading
from tests import models


def _graph(model):
    return graph.walk(loading.load(model).entry)


@pytest.mark.parametrize("kind", sorted(models.ALL))
def test_calls_are_in_topological_order(kind):
    g = _graph(models.ALL[kind]()[0])
    seen = set(g.inputs)
    for c in g.calls:
        assert all(t in seen for t in c.inputs), c.name
        seen.update(c.outputs)
    assert all(t in seen for t in g.outputs)
    assert [c.index for c in g.calls] == list(range(len(g.calls)))


def test_every_operation_of_the_model_is_a_call():
    model, _ = models.shared_and_ops()
    g = _graph(model)
    # model.operations counts each operation once; `shared` is called 3x.
    ops = [
        op for op in model.operations if op.__class__.__name__ != "InputLayer"
    ]
    assert len(g.calls) == len(ops) + 2


def test_dict_inputs_and_outputs_flatten_in_sorted_key_order():
    model, _ = models.multi_io()
    g = _graph(model)
    assert [g.specs[t].dtype for t in g.inputs] == ["float32", "int32", "bool"]
    producers = [g.calls[g.producers[t]].name for t in g.outputs]
    assert producers == ["klass", "score"]


def test_chain_is_followed_through_branches():
    # After a call, its consumer comes next when it can (chains stay
    # consecutive), so a branch's conv -> bn -> relu is one run.
    inp = keras.Input((8, 8, 3))
    a = layers.Conv2D(2, 1, name="a_conv")(inp)
    b = layers.Conv2D(2, 1, name="b_conv")(inp)
    a = layers.ReLU(name="a_relu")(layers.BatchNormalization(name="a_bn")(a))
    b = layers.ReLU(name="b_relu")(layers.BatchNormalization(name="b_bn")(b))
    model = keras.Model(inp, layers.Add(name="add")([a, b]))
    names = [c.name for c in _graph(model).calls]
    assert names == [
        "a_conv",
        "a_bn",
        "a_relu",
        "b_conv",
        "b_bn",
        "b_relu",
        "add",
    ]


def test_sequential_shapes_are_inferred():
    model, _ = models.transfer()
    g = graph.walk(loading.load(model).entry)
    unknown = [t for c in g.calls for t in c.inputs if g.specs[t] is None]
    assert unknown  # A Sequential records no shapes between its layers...
    d = dlbricks_tf.decompose(model)  # ...so decompose infers them.
    assert d.bricks[-1].inputs[0].shape == (8,)


def test_built_sequential_without_input():
    model = keras.Sequential([layers.Dense(3), layers.Dense(2)])
    model.build((None, 5))
    d = dlbricks_tf.decompose(model)
    assert [b.inputs[0].shape for b in d.bricks] == [(5,), (3,)]


def test_unbuilt_sequential_is_refused():
    model = keras.Sequential([layers.Dense(3)], name="lazy")
    with pytest.raises(dlbricks_tf.DecompositionError, match="lazy.*build"):
        dlbricks_tf.decompose(model)


def test_a_nested_model_casts_its_inputs_in_a_call_of_its_own():
    # Keras converts a nested model's inputs to its keras.Input's dtype; the
    # raw op inside does not autocast, so the cast must stay in the graph.
    block_in = keras.Input((4,), name="block_in")
    block = keras.Model(block_in, block_in + block_in, name="block")
    inp = keras.Input((4,))
    half = layers.ReLU(dtype="mixed_float16", name="half")(inp)
    model = keras.Model(inp, block(half))
    g = _graph(model)
    assert [c.name for c in g.calls][:2] == ["half", "block/block_in/cast"]
    assert [c.class_name for c in g.calls] == ["ReLU", "Cast", "Add"]
    cast = g.calls[1]
    assert g.specs[cast.inputs[0]].dtype == "float16"
    assert g.specs[cast.outputs[0]] == graph.TensorSpec((4,), "float32")
    x = np.random.default_rng(0).standard_normal((2, 4)).astype("float32")
    d = dlbricks_tf.decompose(model, granularity=1)
    got, want = models.bricks_reproduce(model, d, [x])
    assert got[0].dtype == want[0].dtype == np.float32
    np.testing.assert_allclose(got[0], want[0])
    # Same dtype on both sides: no cast.
    same = keras.Model(inp, block(layers.ReLU()(inp)))
    assert [c.class_name for c in _graph(same).calls] == ["ReLU", "Add"]


def test_legacy_nodes_are_converted():
    entry = {
        "class_name": "Functional",
        "config": {
            "name": "legacy",
            "layers": [
                {
                    "class_name": "InputLayer",
                    "name": "x",
                    "config": {"batch_shape": [None, 4], "dtype": "float32"},
                    "inbound_nodes": [],
                },
                {
                    "class_name": "Dense",
                    "name": "d",
                    "config": {"name": "d", "units": 2},
                    "inbound_nodes": [[["x", 0, 0, {}]]],
                },
            ],
            "input_layers": [["x", 0, 0]],
            "output_layers": [["d", 0, 0]],
        },
    }
    g = graph.walk(entry)
    assert [c.name for c in g.calls] == ["d"]
    assert g.calls[0].inputs == (g.inputs[0],)


def test_malformed_config_names_the_layer():
    entry = {
        "class_name": "Functional",
        "config": {
            "name": "broken",
            "layers": [
                {
                    "class_name": "Dense",
                    "name": "orphan",
                    "config": {"name": "orphan", "units": 2},
                    "inbound_nodes": [[["ghost", 0, 0, {}]]],
                },
            ],
            "input_layers": [],
            "output_layers": [["orphan", 0, 0]],
        },
    }
    with pytest.raises(dlbricks_tf.DecompositionError, match="orphan"):
        graph.walk(entry)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
