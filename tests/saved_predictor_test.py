"""Tests for dlbricks_tf/estimating/saved_predictor.py and the predictor a
store keeps (`beyond.kept_predictor`).

The predictors are fitted on real bricks of real Keras models whose
"timings" follow a known law, in real SQLite stores.
"""

import json

import numpy as np
import pytest
from sklearn.ensemble import HistGradientBoostingRegressor

from dlbricks_tf.cutting import split
from dlbricks_tf.cutting.decompose import from_runs, model_graph
from dlbricks_tf.estimating import beyond, features, saved_predictor
from dlbricks_tf.estimating import predict as predict_lib
from dlbricks_tf.models.sources import ModelSource
from tests.fakes import FP, SETTINGS
from tests.law import law_ms, law_store, net, timing


@pytest.fixture(scope="module")
def graphs():
    return {f"net{s}": model_graph(net(s)) for s in range(6)}


@pytest.fixture(scope="module")
def data(graphs, tmp_path_factory):
    path = tmp_path_factory.mktemp("law") / "s.sqlite"
    with law_store(path, graphs) as store:
        results = store.results(SETTINGS, FP)
    return predict_lib.examples(graphs, results, max_granularity=2)


def test_forest_gives_what_scikit_learn_gives_on_every_row():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 6))
    x[rng.random(x.shape) < 0.1] = np.nan  # Missing values take a side.
    y = np.nan_to_num(x[:, 0]) * 3 + np.sin(np.nan_to_num(x[:, 1]))
    model = HistGradientBoostingRegressor(max_iter=50, random_state=0)
    model.fit(x, y)
    forest = saved_predictor.Forest.from_sklearn(model)
    assert len(forest.trees) == model.n_iter_
    probe = rng.normal(size=(300, 6))
    probe[rng.random(probe.shape) < 0.2] = np.nan
    np.testing.assert_allclose(
        forest.predict(probe), model.predict(probe), rtol=1e-12, atol=1e-12
    )


@pytest.mark.parametrize("method", predict_lib.METHODS)
def test_a_saved_predictor_predicts_as_the_fitted_one(data, graphs, method):
    # Two folds: what is saved is the fit on all of `data` and the CV's
    # figures, whatever the folds; more would only refit it more often.
    fitted = predict_lib.Predictor.fit(data, method=method, folds=2)
    text = saved_predictor.to_json(fitted)
    json.loads(text)  # Plain JSON: data only.
    loaded = saved_predictor.from_json(text)
    assert loaded.method == method and loaded.cv == fitted.cv
    graph, factory = graphs["net0"]
    bricks = from_runs(
        graph, factory, split.split(graph, 1), granularity=1
    ).bricks
    rows = [features.brick_features(b, graph.specs) for b in bricks]
    np.testing.assert_allclose(
        loaded.predict_ms(rows), fitted.predict_ms(rows), rtol=1e-9
    )
    assert loaded.predict_bricks(bricks, graph.specs) == pytest.approx(
        fitted.predict_bricks(bricks, graph.specs)
    )
    # Saved again, it is the same text.
    assert saved_predictor.to_json(loaded) == text


def test_another_format_or_damaged_text_is_refused(data):
    text = saved_predictor.to_json(predict_lib.Predictor.fit(data, folds=2))
    other = json.loads(text)
    other["format"] = saved_predictor.FORMAT + 1
    with pytest.raises(saved_predictor.SavedPredictorError, match="format"):
        saved_predictor.from_json(json.dumps(other))
    other = json.loads(text)
    other["features"] = other["features"][:-1]
    with pytest.raises(saved_predictor.SavedPredictorError, match="features"):
        saved_predictor.from_json(json.dumps(other))
    with pytest.raises(saved_predictor.SavedPredictorError):
        saved_predictor.from_json(text[: len(text) // 2])


def test_the_fit_key_changes_with_what_is_learnt_from():
    results = {"a": timing(1.0), "b": timing(2.0)}
    key = saved_predictor.fit_key("efficiency", 1, False, ["m", "n"], results)
    assert key == saved_predictor.fit_key(
        "efficiency", 1, False, ["n", "m"], dict(reversed(results.items()))
    )
    changed = [
        saved_predictor.fit_key("trees", 1, False, ["m", "n"], results),
        saved_predictor.fit_key("efficiency", 2, False, ["m", "n"], results),
        saved_predictor.fit_key("efficiency", 1, True, ["m", "n"], results),
        saved_predictor.fit_key("efficiency", 1, False, ["m"], results),
        saved_predictor.fit_key(
            "efficiency", 1, False, ["m", "n"], {**results, "c": timing(3.0)}
        ),
        saved_predictor.fit_key(
            "efficiency", 1, False, ["m", "n"], {**results, "a": timing(1.1)}
        ),
        saved_predictor.fit_key(
            "efficiency", 1, False, ["m", "n"], results, described=["a"]
        ),
    ]
    assert key not in changed and len(set(changed)) == len(changed)


def _sources(names):
    return [ModelSource(n, builder=lambda s=int(n[3:]): net(s)) for n in names]


def test_the_store_keeps_its_predictor_until_its_bricks_change(
    graphs, tmp_path
):
    lines = []
    with law_store(tmp_path / "s.sqlite", graphs) as store:
        results = store.results(SETTINGS, FP)
        target = {"net5": graphs["net5"]}
        training = _sources(["net0", "net1", "net2", "net3", "net4"])

        def kept(results):
            return beyond.kept_predictor(
                store, SETTINGS, FP, results, target, training,
                max_granularity=2, probe_corpus=False, log=lines.append,
            )  # fmt: skip

        first = kept(results)
        assert lines[-1].startswith("Predictor: ") and "kept" not in lines[-1]
        second = kept(results)
        assert lines[-1].startswith("Predictor: kept in the store")
        assert second.cv == first.cv
        graph, factory = graphs["net5"]
        bricks = from_runs(
            graph, factory, split.split(graph, 1), granularity=1
        ).bricks
        assert second.predict_bricks(bricks, graph.specs) == pytest.approx(
            first.predict_bricks(bricks, graph.specs)
        )
        # Another model to estimate: the same predictor (it learns from
        # the training models only).
        beyond.kept_predictor(
            store, SETTINGS, FP, results, {"net4": graphs["net4"]}, training,
            max_granularity=2, probe_corpus=False, log=lines.append,
        )  # fmt: skip
        assert lines[-1].startswith("Predictor: kept in the store")
        # A brick timed again: fitted again, and kept in its place.
        some = next(iter(results))
        store.put(some, SETTINGS, FP, timing(2 * results[some].median_ms))
        kept(store.results(SETTINGS, FP))
        assert "kept" not in lines[-1]
        kept(store.results(SETTINGS, FP))
        assert lines[-1].startswith("Predictor: kept in the store")


def test_a_law_store_with_probe_bricks_teaches_the_probes(tmp_path):
    """The probes' stored bricks are learnt from, as any model's are."""
    from dlbricks_tf.models import corpus, probes

    specs = probes.specs(12, seed=1)
    probe_graphs = {s.name: model_graph(probes.build(s)) for s in specs}
    with law_store(tmp_path / "s.sqlite", probe_graphs) as store:
        results = store.results(SETTINGS, FP)
    data = predict_lib.examples(
        probe_graphs, results, max_granularity=1, group_of=corpus.family
    )
    calls = sum(len(g.calls) for g, _ in probe_graphs.values())
    assert 0 < len(data) <= calls
    assert {e.group for e in data} == {probes.FAMILY}
    law = [law_ms(e.features) for e in data]
    assert [e.median_ms for e in data] == pytest.approx(law)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
