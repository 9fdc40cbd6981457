"""Tests of dlbricks_tf/split.py: the paper's Algorithms 1 and 2."""

import keras
import pytest
from keras import layers

from dlbricks_tf import graph, loading, split


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
