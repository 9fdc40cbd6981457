"""Tests for dlbricks_tf/estimating/cover.py: covers by bricks of several G.

The stores are real SQLite stores written by hand with chosen timings; the
models are real Keras models from tests/models.py.
"""

import numpy as np
import pytest

from dlbricks_tf.cutting import split
from dlbricks_tf.cutting.decompose import Cutter, decompose, model_graph
from dlbricks_tf.estimating import cover as cover_lib
from dlbricks_tf.estimating import estimate as estimate_lib
from dlbricks_tf.machine.fingerprint import SystemFingerprint
from dlbricks_tf.machine.settings import RunSettings
from dlbricks_tf.stats import Timing
from dlbricks_tf.storing.store import Store
from tests import models
from tests.fakes import FP, SETTINGS

OTHER_SETTINGS = RunSettings(
    batch_size=1, intra_op_threads=2, inter_op_threads=1
)
OTHER_FP = SystemFingerprint(**{**FP.to_dict(), "cpu_model": "Other CPU"})


def _timing(ms, half_width=None):
    h = 0.05 * ms if half_width is None else half_width
    return Timing(ms, ms, ms, ms, 10, ms - h, ms + h, False)


def _chain():
    """models.chain: conv, bn, relu, conv, bn, relu, pooling, dense."""
    model, inputs = models.chain()
    graph, factory = model_graph(model)
    names = [c.class_name for c in graph.calls]
    assert names == ["Conv2D", "BatchNormalization", "ReLU"] * 2 + [
        "GlobalAveragePooling2D",
        "Dense",
    ]
    return model, inputs, graph, factory


def _runs(c):
    """The (begin, end) call runs of a cover's bricks."""
    runs = []
    for b in c.bricks:
        index = sorted(call.index for call in b.calls)
        assert index == list(range(index[0], index[-1] + 1)), "contiguous"
        runs.append((index[0], index[-1] + 1))
    return runs


def _check_partition(c, graph):
    """Disjoint bricks that hold every call once, as a cut would."""
    calls = sorted(call.index for b in c.bricks for call in b.calls)
    assert calls == list(range(len(graph.calls)))
    for begin, end in _runs(c):
        assert split.buildable(graph, begin, end)
    models.check_decomposition(c.decomposition, c.max_granularity)


def test_cover_prefers_the_largest_stored_bricks(tmp_path):
    model, inputs, graph, factory = _chain()
    cut = Cutter(graph, factory)
    with Store(tmp_path / "s.sqlite") as store:
        for i in range(8):  # Every single call, 1 ms each.
            store.put(cut.brick(i, i + 1).signature, SETTINGS, FP, _timing(1))
        for begin in (0, 3):  # Both conv, bn, relu runs, 2.5 ms each.
            store.put(
                cut.brick(begin, begin + 3).signature,
                SETTINGS,
                FP,
                _timing(2.5),
            )
        results = store.results(SETTINGS, FP)
    c = cover_lib.cover(model, results, max_granularity=3)
    assert _runs(c) == [(0, 3), (3, 6), (6, 7), (7, 8)]
    assert c.sizes == (3, 3, 1, 1)
    _check_partition(c, graph)
    est = c.estimate(results)
    assert est.ms == pytest.approx(2.5 + 2.5 + 1 + 1)
    assert est.share("G=3") == pytest.approx(5 / 7)
    assert est.share("G=1") == pytest.approx(2 / 7)
    assert est.share(estimate_lib.PREDICTED) == 0
    # The most bricks: every call alone, the G=1 estimate.
    smallest = cover_lib.cover(model, results, objective="smallest")
    assert smallest.sizes == (1,) * 8
    assert smallest.estimate(results).ms == pytest.approx(8.0)
    assert smallest.estimate(results).ms == pytest.approx(
        estimate_lib.estimate(decompose(model, 1), results).ms
    )


def test_a_tie_in_bricks_goes_to_the_smaller_variance():
    model, _, graph, factory = _chain()
    cut = Cutter(graph, factory)

    def store(runs):
        return {cut.brick(b, e).signature: _timing(1.0, h) for b, e, h in runs}

    singles = [(i, i + 1, 0.1) for i in range(5, 8)]
    # Calls 0-4 as 3 + 2 (wide intervals) or 2 + 3 (narrow ones).
    wide = [(0, 3, 0.5), (3, 5, 0.5)]
    narrow = [(0, 2, 0.01), (2, 5, 0.01)]
    results = store(singles + wide + narrow)
    c = cover_lib.cover(model, results, max_granularity=3)
    assert _runs(c)[:2] == [(0, 2), (2, 5)]
    results = store(singles + wide + [(0, 2, 0.9), (2, 5, 0.9)])
    c = cover_lib.cover(model, results, max_granularity=3)
    assert _runs(c)[:2] == [(0, 3), (3, 5)]
    # "precise" puts the variance first, even at more bricks.
    results = store(singles + wide + [(i, i + 1, 0.01) for i in range(5)])
    assert len(cover_lib.cover(model, results).bricks) == 5
    assert len(cover_lib.cover(model, results, objective="precise").bricks) == 8


def test_bricks_of_other_settings_or_machines_are_never_used(tmp_path):
    model, _, graph, factory = _chain()
    cut = Cutter(graph, factory)
    whole_head = cut.brick(5, 8).signature  # relu, pooling, dense
    with Store(tmp_path / "s.sqlite") as store:
        for i in range(8):
            store.put(cut.brick(i, i + 1).signature, SETTINGS, FP, _timing(1))
        # Larger bricks, but timed with other threads or on another CPU.
        store.put(whole_head, OTHER_SETTINGS, FP, _timing(0.1))
        store.put(cut.brick(0, 3).signature, SETTINGS, OTHER_FP, _timing(0.1))
        results = store.results(SETTINGS, FP)
        assert store.results(OTHER_SETTINGS, FP).keys() == {whole_head}
    c = cover_lib.cover(model, results, max_granularity=3)
    assert c.sizes == (1,) * 8
    assert whole_head not in {b.signature for b in c.bricks}
    assert c.estimate(results).ms == pytest.approx(8.0)


def test_the_cut_at_g_is_found_when_only_its_bricks_are_stored():
    """Signatures are made as decompose makes them, the model around."""
    model, *_ = models.residual()
    for g in (2, 3):
        d = decompose(model, g)
        results = {b.signature: _timing(1.0) for b in d.bricks}
        c = cover_lib.cover(model, results, max_granularity=g)
        assert [b.signature for b in c.bricks] == [
            b.signature for b in d.bricks
        ]
        assert c.dependencies == d.dependencies


def test_a_cover_of_a_branching_model_runs_as_the_model():
    model, inputs = models.residual()
    graph, factory = model_graph(model)
    options = cover_lib.candidates(graph, 3)
    for here in options:
        for c in here:
            assert split.buildable(graph, c.begin, c.end)
    # Every candidate stored, the larger ones relatively cheaper.
    results = {
        c.signature: _timing(1.0 + 0.1 * c.size) for h in options for c in h
    }
    c = cover_lib.cover(model, results, max_granularity=3)
    _check_partition(c, graph)
    assert max(c.sizes) > 1
    got, want = models.bricks_reproduce(model, c.decomposition, inputs)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_fused_steps_count_units():
    model, _, graph, factory = _chain()
    d = decompose(model, 1, fuse=True)
    results = {b.signature: _timing(1.0) for b in d.bricks}
    c = cover_lib.cover(model, results, max_granularity=1, fuse=True)
    assert [b.signature for b in c.bricks] == [b.signature for b in d.bricks]
    assert c.sizes == (1, 1, 1, 1)


def test_without_a_cover_the_missing_bricks_are_named():
    model, _, graph, factory = _chain()
    cut = Cutter(graph, factory)
    results = {
        cut.brick(i, i + 1).signature: _timing(1.0) for i in range(7)
    }  # Not the dense layer.
    with pytest.raises(estimate_lib.MissingResultsError) as info:
        cover_lib.cover(model, results, max_granularity=2)
    # Named as the cut at G=2 has it: pooling and dense in one brick.
    assert info.value.signatures == (cut.brick(6, 8).signature,)
    with pytest.raises(ValueError, match="objective"):
        cover_lib.cover(model, results, objective="cheapest")


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
