"""Tests of dlbricks_tf/cutting/merge.py: calls that repeat an earlier one."""

import collections

import keras
import numpy as np
import pytest
from keras import layers

import dlbricks_tf
from dlbricks_tf.cutting import decompose, merge
from tests import models


def test_repeated_calls_merge_into_the_first_and_nothing_else_does():
    model, _ = models.repeated()
    d = dlbricks_tf.decompose(model, granularity=1)
    assert dict(d.merged) == {
        "relu_b": "relu_a",
        "pad_b": "pad_a",
        "pool_b": "pool_a",
    }
    layers_in_bricks = [name for b in d.bricks for name in b.layers]
    assert d.num_calls == len(layers_in_bricks) == 8
    assert not set(layers_in_bricks) & {"relu_b", "pad_b", "pool_b"}
    assert {"conv_b", "pool_c"} <= set(layers_in_bricks)


def test_readers_of_a_merged_call_read_the_call_it_repeats():
    model, _ = models.repeated()
    graph, _ = decompose.model_graph(model)
    by_name = {c.name: c for c in graph.calls}
    assert by_name["conv_b"].inputs == by_name["conv_a"].inputs
    # pool_b was a model output: the model now outputs pool_a's tensor.
    assert graph.outputs[1] in by_name["pool_a"].outputs
    for c in graph.calls:
        assert graph.producers[c.outputs[0]] == c.index


def test_merged_bricks_still_reproduce_the_model_at_every_granularity():
    model, inputs = models.repeated()
    for granularity in (1, 2, 3):
        d = dlbricks_tf.decompose(model, granularity=granularity)
        models.check_decomposition(d, granularity)
        got, want = models.bricks_reproduce(model, d, inputs)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_layers_with_weights_or_randomness_are_never_merged():
    inp = keras.Input((4,))
    outs = [
        layers.Dense(3, name="d1")(inp),
        layers.Dense(3, name="d2")(inp),
        layers.Dropout(0.5, name="drop1")(inp),
        layers.Dropout(0.5, name="drop2")(inp),
    ]
    model = keras.Model(inp, [layers.Concatenate()(outs[:2]), *outs[2:]])
    graph, _ = decompose.model_graph(model)
    assert graph.merged == ()
    assert not merge.mergeable(next(c for c in graph.calls if c.name == "d1"))


def test_a_model_without_repeats_keeps_its_graph():
    model, _ = models.chain()
    graph, _ = decompose.model_graph(model)
    assert graph.merged == ()
    assert merge.merge_equal_calls(graph) is graph


def test_nasnet_cells_merge_their_repeated_relus_and_pools():
    model = keras.applications.NASNetMobile(weights=None)
    d = dlbricks_tf.decompose(model, granularity=1)
    kinds = collections.Counter(
        type(model.get_layer(name)).__name__ for name, _ in d.merged
    )
    assert kinds == {
        "Activation": 60,
        "AveragePooling2D": 12,
        "MaxPooling2D": 4,
        "ZeroPadding2D": 4,
    }
    assert d.num_calls + len(d.merged) == len(model.layers) - 1


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
