"""Tests of dlbricks_tf/cutting/split.py: the paper's Algorithms 1 and 2."""

import keras
import pytest
from keras import layers

from dlbricks_tf.cutting import graph, loading, split


def _graph(model):
    return graph.walk(loading.load(model).entry)


def _block():
    """conv -> relu -> add(input, relu) -> dense: the add reads outside."""
    inp = keras.Input((4,))
    x = layers.Dense(4, name="d1")(inp)
    x = layers.ReLU(name="r1")(x)
    x = layers.Add(name="add")([inp, x])
    x = layers.Dense(2, name="d2")(x)
    return keras.Model(inp, x)


def test_chain_is_buildable_and_entry_inputs_may_be_reread():
    g = _graph(_block())
    # d1, r1, add: add re-reads the run's own input (d1's): allowed.
    assert split.buildable(g, 0, 3)
    assert split.buildable(g, 0, 4)


def test_a_call_reading_outside_the_run_is_not_buildable():
    g = _graph(_block())
    # r1, add: add reads the model input, which r1 does not read.
    assert not split.buildable(g, 1, 3)
    assert split.buildable(g, 2, 4)


def test_fallback_emits_the_first_call_and_retries_from_the_next():
    g = _graph(_block())
    # G=2: [d1, r1] ok, [add, d2] ok.
    assert split.split(g, 2) == [(0, 2), (2, 4)]
    # Starting at r1 (as after a fallback), [r1, add] fails: r1 alone,
    # then [add, d2].
    inp = keras.Input((4,))
    x = layers.ReLU(name="r0")(inp)
    x = layers.Add(name="add")([inp, layers.ReLU(name="r1")(x)])
    g = _graph(keras.Model(inp, x))
    assert [c.name for c in g.calls] == ["r0", "r1", "add"]
    assert split.split(g, 2) == [(0, 2), (2, 3)]
    assert split.split(g, 3) == [(0, 3)]


@pytest.mark.parametrize("granularity", [1, 2, 3, 7])
def test_runs_cover_every_call_once_and_respect_g(granularity):
    model = keras.applications.MobileNetV2(
        weights=None, input_shape=(96, 96, 3)
    )
    g = _graph(model)
    runs = split.split(g, granularity)
    assert runs[0][0] == 0 and runs[-1][1] == len(g.calls)
    for (_, end), (begin, _) in zip(runs, runs[1:], strict=False):
        assert end == begin
    assert all(1 <= e - b <= granularity for b, e in runs)
    assert all(split.buildable(g, b, e) for b, e in runs)


def test_bad_granularity():
    with pytest.raises(ValueError, match="granularity"):
        split.split(_graph(_block()), 0)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))


def _conv_bn_relu_net():
    """conv-bn-relu, conv-bn (read twice), relu, dense-relu, bn-relu."""
    inp = keras.Input((8, 8, 3))
    x = layers.Conv2D(4, 3, padding="same", name="c1")(inp)
    x = layers.BatchNormalization(name="b1")(x)
    x = layers.ReLU(name="r1")(x)
    y = layers.Conv2D(4, 1, name="c2")(x)
    y = layers.BatchNormalization(name="b2")(y)  # Read by r2 and add.
    z = layers.ReLU(name="r2")(y)
    z = layers.Add(name="add")([y, z])
    z = layers.GlobalAveragePooling2D(name="gap")(z)
    z = layers.Dense(4, activation=None, name="d")(z)
    z = layers.Activation("relu", name="a")(z)
    z = layers.BatchNormalization(name="b3")(z)
    z = layers.Activation("sigmoid", name="a3")(z)
    return keras.Model(inp, z)


def _names(g, runs):
    return [tuple(g.calls[i].name for i in range(b, e)) for b, e in runs]


def test_fusion_units_keep_conv_bn_activation_chains():
    g = _graph(_conv_bn_relu_net())
    assert _names(g, split.fusion_units(g)) == [
        ("c1", "b1", "r1"),
        ("c2", "b2"),  # b2's output has two readers: r2 is not fused.
        ("r2",),
        ("add",),
        ("gap",),
        ("d", "a"),
        ("b3", "a3"),
    ]


def test_fused_split_counts_units_and_plain_split_is_unchanged():
    g = _graph(_conv_bn_relu_net())
    assert _names(g, split.split(g, 1, fuse=True)) == _names(
        g, split.fusion_units(g)
    )
    fused2 = _names(g, split.split(g, 2, fuse=True))
    assert fused2[0] == ("c1", "b1", "r1", "c2", "b2")
    assert all(len(run) >= 1 for run in fused2)
    assert sum(len(run) for run in fused2) == len(g.calls)
    plain = split.split(g, 1)
    assert plain == [(i, i + 1) for i in range(len(g.calls))]


def test_a_unit_never_swallows_a_model_output():
    inp = keras.Input((4,))
    x = layers.Dense(4, name="d")(inp)
    y = layers.ReLU(name="r")(x)
    g = _graph(keras.Model(inp, [x, y]))  # d's output is a model output.
    assert _names(g, split.fusion_units(g)) == [("d",), ("r",)]
