"""Tests of dlbricks_tf/analyzing/analysis.py: the corpus figures, computed."""

import math
from types import SimpleNamespace

import keras
import pytest
from keras import layers

import dlbricks_tf
from dlbricks_tf.analyzing import analysis
from dlbricks_tf.stats import Timing


def repeated_blocks(shared: bool = False) -> keras.Model:
    """[Dense(8), ReLU] three times, then Dense(4): 7 calls, 3 unique.

    With `shared`, one Dense(8) layer is called three times instead of
    three equal layers being created.
    """
    x = inp = keras.Input((8,))
    dense = layers.Dense(8)
    for _ in range(3):
        x = layers.ReLU()((dense if shared else layers.Dense(8))(x))
    return keras.Model(inp, layers.Dense(4)(x), name="blocks_net")


def small_head() -> keras.Model:
    """Dense(8) (the same as in `repeated_blocks`), then Dense(2)."""
    inp = keras.Input((8,))
    out = layers.Dense(2)(layers.Dense(8)(inp))
    return keras.Model(inp, out, name="head_net")


def _timing(ms: float) -> Timing:
    return Timing(ms, ms, ms, ms, 10, ms * 0.9, ms * 1.1, False)


@pytest.mark.parametrize("shared", [False, True])
def test_repeatability_counts_repeated_calls(shared):
    d = dlbricks_tf.decompose(repeated_blocks(shared))
    r = analysis.repeatability(d)
    assert (r.calls, r.unique) == (7, 3)
    assert r.percent_unique == pytest.approx(300 / 7)


def test_figures_take_the_corpus_name():
    d = dlbricks_tf.decompose(repeated_blocks())
    assert analysis.repeatability(d).model == "blocks_net"  # Keras's name.
    assert analysis.repeatability(d, "A").model == "A"
    assert analysis.layer_types(d, "A").model == "A"


def test_corpus_repeatability_counts_calls_shared_across_models():
    ds = {
        "blocks": dlbricks_tf.decompose(repeated_blocks()),
        "head": dlbricks_tf.decompose(small_head()),
    }
    c = analysis.corpus_repeatability(ds)
    # Dense(8) on 8 features is in both: {Dense8, ReLU, Dense4, Dense2}.
    assert (c.calls, c.unique) == (9, 4)
    assert c.percent_unique == pytest.approx(400 / 9)


def test_repeatability_needs_g1():
    d = dlbricks_tf.decompose(repeated_blocks(), granularity=2)
    with pytest.raises(ValueError, match="G=2"):
        analysis.repeatability(d)


def test_layer_types_split_repeated_calls_by_class():
    t = analysis.layer_types(dlbricks_tf.decompose(repeated_blocks()))
    assert [(x.class_name, x.calls, x.unique, x.repeated) for x in t.types] == [
        ("Dense", 4, 2, 2),
        ("ReLU", 3, 1, 2),
    ]
    assert t.repeated == 4
    assert t.shares() == {"Dense": 0.5, "ReLU": 0.5}


def test_layer_types_without_repeats_have_zero_shares():
    t = analysis.layer_types(dlbricks_tf.decompose(small_head()))
    assert t.repeated == 0
    assert t.shares() == {"Dense": 0.0}


@pytest.mark.parametrize(
    "a, b, want",
    [
        ({"x", "y", "z"}, {"y", "z", "w"}, 2 / 4),
        ({"x"}, {"y"}, 0.0),
        ({"x", "y"}, {"y", "x"}, 1.0),
        ({"x", "y", "z", "w"}, {"x"}, 1 / 4),
        (set(), {"x"}, 0.0),
        (set(), set(), 1.0),
        (["x", "x", "y"], ["y"], 1 / 2),  # Repeats do not count.
    ],
)
def test_jaccard(a, b, want):
    assert analysis.jaccard(a, b) == pytest.approx(want)
    assert analysis.jaccard(b, a) == pytest.approx(want)


def test_similarity_matrix_symmetric_with_unit_diagonal():
    sets = {
        "a": ["s1", "s2", "s3", "s1"],
        "b": ["s2", "s3", "s4"],
        "c": ["s5"],
        "d": ["s1", "s5"],
    }
    sim = analysis.similarity(sets)
    assert sim.models == ("a", "b", "c", "d")
    n = len(sim.models)
    for i in range(n):
        assert sim.matrix[i][i] == 1.0
        for j in range(n):
            assert sim.matrix[i][j] == sim.matrix[j][i]
            assert 0.0 <= sim.matrix[i][j] <= 1.0
    assert sim.get("a", "b") == pytest.approx(2 / 4)
    assert sim.get("a", "c") == 0.0
    assert sim.get("c", "d") == pytest.approx(1 / 2)
    assert sim.get("a", "d") == pytest.approx(1 / 4)


def test_similarity_of_decompositions():
    ds = [repeated_blocks(), repeated_blocks(shared=True), small_head()]
    sets = {
        str(i): analysis.signatures(dlbricks_tf.decompose(m))
        for i, m in enumerate(ds)
    }
    sim = analysis.similarity(sets)
    assert sim.get("0", "1") == 1.0  # Shared or not, the same calls.
    assert sim.get("0", "2") == pytest.approx(1 / 4)


def test_reuse_shares_by_occurrence_and_latency():
    bricks = {
        "a": ["s1", "s1", "s2", "s3"],
        "b": ["s1", "s4"],
        "c": ["s5"],
    }
    latency = {"s1": 1.0, "s2": 2.0, "s3": 3.0, "s4": 4.0, "s5": 5.0}
    a, b, c = analysis.reuse(bricks, latency)
    assert (a.bricks, a.covered, a.unique, a.new_unique) == (4, 2, 3, 2)
    assert a.brick_share == 0.5
    assert (a.latency_ms, a.covered_ms) == (7.0, 2.0)
    assert a.latency_share == pytest.approx(2 / 7)
    assert (b.covered, b.new_unique, b.brick_share) == (1, 1, 0.5)
    assert b.latency_share == pytest.approx(1 / 5)
    assert (c.covered, c.new_unique, c.brick_share, c.latency_share) == (
        0,
        1,
        0.0,
        0.0,
    )


def test_reuse_without_every_latency_has_no_latency_share():
    (a, b) = analysis.reuse({"a": ["s1", "s2"], "b": ["s1"]}, {"s1": 1.0})
    assert a.latency_ms is None and a.latency_share is None
    assert b.latency_share == 1.0
    assert a.brick_share == 0.5
    (a,) = analysis.reuse({"a": ["s1"]})
    assert (a.covered, a.new_unique, a.latency_share) == (0, 1, None)


def _fake(name, sigs, g=1):
    return SimpleNamespace(
        name=name,
        granularity=g,
        bricks=[SimpleNamespace(signature=s) for s in sigs],
        dependencies=[(i - 1,) if i else () for i in range(len(sigs))],
    )


def test_tradeoff_normalized_geomean_and_speedup():
    ds = {
        "a": _fake("a", ["s1", "s1", "s2"]),  # Estimate 1 + 1 + 2 = 4 ms.
        "b": _fake("b", ["s1", "s3"]),  # Estimate 1 + 4 = 5 ms.
        "c": _fake("c", ["s9"]),  # Untimed brick: skipped.
        "d": _fake("d", ["s1"]),  # Not measured: skipped.
    }
    measured = {"a": _timing(5.0), "b": _timing(4.0), "c": _timing(1.0)}
    results = {"s1": _timing(1.0), "s2": _timing(2.0), "s3": _timing(4.0)}
    rows, summary = analysis.tradeoff(ds, measured, results, "sys")
    assert [(r.model, r.estimate_ms, r.measured_ms) for r in rows] == [
        ("a", 4.0, 5.0),
        ("b", 5.0, 4.0),
    ]
    assert rows[0].normalized == pytest.approx(0.8)
    assert summary.models == ("a", "b")
    assert summary.geomean == pytest.approx(math.sqrt(0.8 * 1.25))
    # (5 + 4) ms of models over (1 + 2 + 4) ms of unique bricks.
    assert summary.speedup == pytest.approx(9 / 7)
    assert (summary.bricks, summary.unique_bricks) == (5, 3)
    assert [m for m, _ in summary.skipped] == ["c", "d"]
    assert summary.system == "sys" and summary.granularity == 1


def test_tradeoff_without_complete_models_is_nan():
    rows, summary = analysis.tradeoff({"a": _fake("a", ["s1"])}, {}, {}, "sys")
    assert rows == ()
    assert math.isnan(summary.geomean) and math.isnan(summary.speedup)


def test_tradeoff_refuses_mixed_granularities():
    ds = {"a": _fake("a", ["s1"], g=1), "b": _fake("b", ["s1"], g=2)}
    with pytest.raises(ValueError, match="several G"):
        analysis.tradeoff(ds, {}, {}, "sys")


def test_geomean():
    assert analysis.geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert math.isnan(analysis.geomean([]))


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
