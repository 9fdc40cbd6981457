"""Tests for dlbricks_tf/estimating/predict.py, features.py, cost.py, beyond.py.

The bricks are those of real Keras models; their "timings" follow a known
law of the bricks' features and are written to real SQLite stores, so what
the predictor should find is known exactly.
"""

import contextlib
import math
import sqlite3

import keras
import numpy as np
import pytest
from keras import layers

from dlbricks_tf.cutting import split
from dlbricks_tf.cutting.decompose import Cutter, from_runs, model_graph
from dlbricks_tf.estimating import beyond, cost, features, regressors
from dlbricks_tf.estimating import estimate as estimate_lib
from dlbricks_tf.estimating import predict as predict_lib
from dlbricks_tf.machine.fingerprint import system_fingerprint
from dlbricks_tf.machine.settings import RunSettings
from dlbricks_tf.storing.store import Store
from tests import models
from tests.cli import FAST, dlbricks
from tests.fakes import FP, SETTINGS
from tests.law import law_ms
from tests.law import law_store as _law_store
from tests.law import net as _net
from tests.law import timing as _timing

# How far the predictor may miss the law on bricks of a model it never saw:
# the median brick within 5%, every brick within 20%.
MEDIAN_TOLERANCE = 0.05
MAX_TOLERANCE = 0.20


@pytest.fixture(scope="module")
def graphs():
    return {f"net{s}": model_graph(_net(s)) for s in range(10)}


def test_features_count_flops_and_bytes_of_a_convolution():
    inp = keras.Input((8, 8, 3))
    model = keras.Model(inp, layers.Conv2D(4, 3, padding="same")(inp))
    graph, factory = model_graph(model)
    f = features.brick_features(Cutter(graph, factory).brick(0, 1), graph.specs)
    # 8 x 8 x 4 outputs, each 3 x 3 x 3 multiply-adds.
    assert f["flops"] == f["matrix_flops"] == 2 * 8 * 8 * 4 * 27
    assert f["params"] == 27 * 4 + 4
    assert f["bytes"] == 4 * (f["params"] + 8 * 8 * 3 + 8 * 8 * 4)
    assert f["conv_calls"] == 1 and f["calls"] == 1 and f["max_kernel"] == 3
    assert list(f) == list(features.feature_names())


@pytest.mark.parametrize("method", ["efficiency", "kinds"])
def test_the_predictor_recovers_a_known_law(graphs, tmp_path, method):
    held_out = "net9"
    learn = {k: v for k, v in graphs.items() if k != held_out}
    with _law_store(tmp_path / "s.sqlite", graphs) as store:
        results = store.results(SETTINGS, FP)
    graph, factory = graphs[held_out]
    unseen = {
        b.signature: b
        for b in from_runs(
            graph, factory, split.split(graph, 1), granularity=1
        ).bricks
    }
    data = predict_lib.examples(
        learn, results, max_granularity=2, exclude=frozenset(unseen)
    )
    assert len(data) > 100
    # Two folds: the predictor is fitted on all of `data` whatever the
    # folds; more would only refit it more often for the CV.
    predictor = predict_lib.Predictor.fit(data, method=method, folds=2)
    assert predictor.cv.grouped and predictor.cv.bricks == len(data)
    assert predictor.cv.folds == 2
    got = predictor.predict_bricks(list(unseen.values()), graph.specs)
    errors = sorted(
        abs(got[s].median_ms / results[s].median_ms - 1) for s in unseen
    )
    assert errors[len(errors) // 2] <= MEDIAN_TOLERANCE, errors
    assert errors[-1] <= MAX_TOLERANCE, errors
    for s in unseen:  # Nothing was run: no samples, an interval from CV.
        t = got[s]
        assert t.samples == 0 and t.ci_low_ms <= t.median_ms <= t.ci_high_ms


def test_a_brick_is_of_the_kind_of_its_costliest_call():
    inp = keras.Input((8, 8, 16))
    x = layers.Conv2D(16, 3, padding="same")(inp)
    x = layers.BatchNormalization()(x)
    x = layers.ReLU()(x)
    x = layers.Conv2D(16, 3, padding="same", groups=16)(x)
    x = layers.Add()([x, inp])
    graph, factory = model_graph(keras.Model(inp, x))
    cut = Cutter(graph, factory)
    rows = [
        features.vector(features.brick_features(cut.brick(i, j), graph.specs))
        for i, j in ((0, 3), (1, 3), (2, 3), (3, 4), (2, 5), (4, 5))
    ]
    assert regressors.brick_kinds(np.array(rows)) == [
        "conv", "batchnorm", "activation", "grouped", "grouped", "elementwise",
    ]  # fmt: skip
    # A kind of few bricks is priced by the model of all kinds.
    many = np.array(rows[:1] * regressors.MIN_KIND_BRICKS + rows[3:4] * 3)
    model = regressors.Kinds(0).fit(many, np.log(np.arange(1.0, 24.0)))
    assert set(model.kinds) == {"conv"}


def efficiency_law_ms(f) -> float:
    """Another synthetic latency: the physical guess times an efficiency.

    The efficiency depends on what a brick computes, not on its size: wide
    windows run at half the rate, and a piecewise activation costs 3x.
    """
    ms = cost.brick_cost_ms(f)
    if f["max_kernel"] >= 5:
        ms *= 2.0
    if f["act_class_piecewise"]:
        ms *= 3.0
    return ms


def _wide_net(seed: int) -> keras.Model:
    """A network far larger than `_net`'s: 64-96 pixels, 64-128 filters."""
    rng = np.random.default_rng(seed)
    x = inp = keras.Input((int(rng.choice([64, 96])),) * 2 + (16,))
    for _ in range(3):
        kernel = int(rng.choice([1, 3, 5]))
        x = layers.Conv2D(int(rng.choice([64, 128])), kernel, padding="same")(x)
        x = layers.Activation("hard_silu" if rng.random() < 0.5 else "relu")(x)
    return keras.Model(inp, x, name=f"wide{seed}")


@pytest.mark.parametrize("method", ["efficiency", "kinds"])
def test_efficiency_extrapolates_to_bricks_larger_than_any_learnt(
    tmp_path, method
):
    """Trained on small bricks, priced right on ones 10-100x as large."""
    small = {}
    for seed in range(8):  # The small nets, with hard_silu activations too.
        rng = np.random.default_rng(seed)
        x = inp = keras.Input((int(rng.choice([8, 16])),) * 2 + (4,))
        for _ in range(3):
            kernel = int(rng.choice([1, 3, 5]))
            filters = int(rng.choice([4, 8, 16]))
            x = layers.Conv2D(filters, kernel, padding="same")(x)
            x = layers.Activation(str(rng.choice(["hard_silu", "relu"])))(x)
        small[f"small{seed}"] = model_graph(keras.Model(inp, x))
    graph, factory = model_graph(_wide_net(0))
    store = Store(tmp_path / "s.sqlite")
    learn_ms = []
    for g, f in [*small.values(), (graph, factory)]:
        cut = Cutter(g, f)
        for i in range(len(g.calls)):
            b = cut.brick(i, i + 1)
            ms = efficiency_law_ms(features.brick_features(b, g.specs))
            store.put(b.signature, SETTINGS, FP, _timing(ms))
            if g is not graph:
                learn_ms.append(ms)
    results = store.results(SETTINGS, FP)
    store.close()
    data = predict_lib.examples(small, results, max_granularity=1)
    predictor = predict_lib.Predictor.fit(data, method=method)
    assert predictor.method == method
    bricks = from_runs(graph, factory, split.split(graph, 1), granularity=1)
    got = predictor.predict_bricks(bricks.bricks, graph.specs)
    assert max(results[s].median_ms for s in got) > 10 * max(learn_ms)
    for s, t in got.items():
        assert t.median_ms == pytest.approx(results[s].median_ms, rel=0.10)


def test_cost_is_the_larger_of_arithmetic_and_memory_time():
    # 1 GFLOP of products: 10 ms at 100 GFLOP/s; 1 MB: 0.1 ms at 10 GB/s.
    assert cost.cost_ms(1, 1e9, 0, 0, 1e6) == pytest.approx(0.01 + 10)
    # Memory-bound: 100 MB and 1 MFLOP of vector work.
    assert cost.cost_ms(2, 0, 0, 1e6, 1e8) == pytest.approx(0.02 + 10)
    # Arithmetic of each kind at its own rate, summed.
    assert cost.cost_ms(0, 1e8, 1e7, 3e6, 0) == pytest.approx(3.0)


def test_features_name_activations_however_a_layer_applies_them():
    inp = keras.Input((8, 8, 3))
    x = layers.Conv2D(4, (1, 7), padding="same", activation="relu")(inp)
    x = layers.ReLU(max_value=6.0)(x)
    x = layers.Activation("hard_silu")(x)
    x = layers.Softmax()(x)
    graph, factory = model_graph(keras.Model(inp, x))
    cut = Cutter(graph, factory)
    conv, relu6, hard, soft = (
        features.brick_features(cut.brick(i, i + 1), graph.specs)
        for i in range(4)
    )
    assert conv["act_relu"] == conv["act_class_cheap"] == 1
    assert conv["max_kernel"] == 7 and conv["max_kernel_area"] == 7
    assert relu6["act_relu6"] == relu6["act_class_cheap"] == 1
    assert hard["act_class_piecewise"] == 1 and hard["act_relu"] == 0
    assert soft["act_softmax"] == soft["act_class_transcendental"] == 1


def test_too_few_bricks_to_learn_from_is_an_error(graphs, tmp_path):
    with _law_store(tmp_path / "s.sqlite", graphs) as store:
        results = store.results(SETTINGS, FP)
    data = predict_lib.examples(
        {"net0": graphs["net0"]}, results, max_granularity=1
    )[:6]
    with pytest.raises(predict_lib.PredictorError, match="Only 6 timed"):
        predict_lib.Predictor.fit(data)


@pytest.fixture(scope="module")
def chain_missing_dense(graphs, tmp_path_factory):
    """The chain model's graph and factory, its dense brick's signature,
    and the timings of a store lacking that brick."""
    graph, factory = model_graph(models.chain()[0])
    cut = Cutter(graph, factory)
    dense = cut.brick(7, 8).signature
    everything = {**graphs, "chain": (graph, factory)}
    # No brick holding the dense layer (alone, or after the pooling).
    skip = {dense, cut.brick(6, 8).signature}
    path = tmp_path_factory.mktemp("chain") / "s.sqlite"
    with _law_store(path, everything, skip=skip) as store:
        results = store.results(SETTINGS, FP)
    return graph, factory, dense, results


def test_a_predicted_estimate_says_how_much_was_predicted(
    graphs, chain_missing_dense
):
    graph, factory, dense, results = chain_missing_dense
    predictor = beyond.train(graphs, results, max_granularity=2)
    est, method, count = beyond.estimate_graph(
        graph, factory, 1, results, predictor=predictor
    )
    assert (method, count) == ("predicted", 1)
    predicted_ms = predictor.predict_bricks(
        [Cutter(graph, factory).brick(7, 8)], graph.specs
    )[dense].median_ms
    assert est.share(estimate_lib.PREDICTED) == pytest.approx(
        predicted_ms / est.ms
    )
    assert est.share("timed") == pytest.approx(1 - predicted_ms / est.ms)
    assert [s.bricks for s in est.sources if s.label == "predicted"] == [1]
    # The predictor's error widens the bounds beyond the timed bricks'.
    timed = sum(
        results[b.signature].ci_high_ms - results[b.signature].ci_low_ms
        for b in from_runs(
            graph, factory, split.split(graph, 1), granularity=1
        ).bricks
        if b.signature != dense
    )
    assert est.high_ms - est.low_ms > timed
    # Covered too: the missing brick is predicted as part of a cover.
    est, method, count = beyond.estimate_graph(
        graph, factory, 2, results, cover=True, predictor=predictor
    )
    assert method == "covered+predicted" and count == 1
    assert 0 < est.share(estimate_lib.PREDICTED) < 1
    row = beyond.row(est, method, count, 2)
    assert row["predicted_share"] == est.share(estimate_lib.PREDICTED)
    assert sum(row["sources"].values()) == pytest.approx(1.0)


def test_without_predict_a_missing_brick_is_still_an_error(
    chain_missing_dense,
):
    graph, factory, dense, results = chain_missing_dense
    for cover in (False, True):
        with pytest.raises(estimate_lib.MissingResultsError) as info:
            beyond.estimate_graph(graph, factory, 1, results, cover=cover)
        assert dense in info.value.signatures


def test_estimating_needs_no_timing(graphs, tmp_path):
    """Every figure is read from the store: a store holding nothing for
    the settings asked gives no estimate, and one holding the bricks
    gives the law's sum."""
    model, _ = models.chain()
    graph, factory = model_graph(model)
    with _law_store(tmp_path / "s.sqlite", {"c": (graph, factory)}) as store:
        results = store.results(SETTINGS, FP)
        other = RunSettings(2, intra_op_threads=1, inter_op_threads=1)
        assert store.results(other, FP) == {}
    est, method, _ = beyond.estimate_graph(graph, factory, 1, results)
    want = sum(
        law_ms(features.brick_features(b, graph.specs))
        for b in from_runs(
            graph, factory, split.split(graph, 1), granularity=1
        ).bricks
    )
    assert method == "timed" and est.ms == pytest.approx(want)
    assert est.sources == (estimate_lib.Source("timed", 1.0, 8),)


CLI_SCALE = 100.0


def _cli_store(tmp_path, files, skip_last: bool):
    """A store for this machine and the CLI's settings, by the law."""
    settings = RunSettings.default(1, intra_op_threads=1)
    fp = system_fingerprint()
    skip = set()
    found = {}
    for path in files:
        graph, factory = model_graph(path)
        found[path] = (graph, factory)
        if skip_last and path == files[0]:
            skip.add(Cutter(graph, factory).brick(7, 8).signature)
    db = tmp_path / "s.sqlite"
    with Store(db) as store:
        for graph, factory in found.values():
            cut = Cutter(graph, factory)
            for i in range(len(graph.calls)):
                b = cut.brick(i, i + 1)
                if b.signature not in skip:  # In ms the table shows.
                    ms = CLI_SCALE * law_ms(
                        features.brick_features(b, graph.specs)
                    )
                    store.put(b.signature, settings, fp, _timing(ms))
    return db


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    paths = []
    for builder in (models.chain, models.residual):
        model = builder()[0]
        paths.append(str(folder / f"{model.name}.keras"))
        model.save(paths[-1])
    return paths


def test_the_predictor_learns_from_the_applications_the_store_timed(
    tmp_path, monkeypatch
):
    import dataclasses

    other_fp = dataclasses.replace(FP, cpu_model="Other CPU")
    with Store(tmp_path / "s.sqlite") as store:
        store.put_model("MobileNetV2", SETTINGS, FP, _timing(3.0))
        store.put_model("ResNet50", SETTINGS, FP, _timing(9.0))
        store.put_model("mine", SETTINGS, FP, _timing(1.0))  # A file's.
        store.put_model(
            "VGG16",
            dataclasses.replace(SETTINGS, batch_size=2),
            FP,
            _timing(5.0),
        )
        store.put_model("DenseNet121", SETTINGS, other_fp, _timing(5.0))
        timed = beyond.timed_applications(store, SETTINGS, FP)
        assert [s.name for s in timed] == ["MobileNetV2", "ResNet50"]
        assert beyond.timed_applications(store, SETTINGS, other_fp)[0].name == (
            "DenseNet121"
        )
        # estimate_models hands them to the predictor unless told otherwise.
        taught = []

        def kept_predictor(*args, **kwargs):
            taught.append([s.name for s in args[5]])
            raise predict_lib.PredictorError("enough")

        monkeypatch.setattr(beyond, "kept_predictor", kept_predictor)
        for training in (None, []):
            with pytest.raises(predict_lib.PredictorError, match="enough"):
                beyond.cover_and_predict(
                    [], 1, SETTINGS, FP, store, predict=True, training=training
                )
    assert taught == [["MobileNetV2", "ResNet50"], []]


def test_cli_estimate_cover_and_predict(files, tmp_path):
    db = _cli_store(tmp_path, files, skip_last=True)
    common = [
        f"--models={','.join(files)}",
        f"--db={db}",
        f"--out={tmp_path / 'out'}",
    ]
    proc = dlbricks("estimate", *common)
    assert proc.returncode == 1
    assert "1 brick(s) have no timing" in proc.stderr, proc.stderr
    proc = dlbricks("estimate", "--predict", *common)
    assert proc.returncode == 0, proc.stderr
    assert "Predictor: " in proc.stdout
    row = next(x for x in proc.stdout.splitlines() if x.startswith("| chain"))
    assert "| predicted " in row and "(1 bricks)" in row
    row = next(
        x for x in proc.stdout.splitlines() if x.startswith("| residual")
    )
    assert row.rstrip().endswith("| timed |")
    assert (tmp_path / "out" / "tensorboard" / "estimates").is_dir()
    proc = dlbricks(
        "estimate", "--cover", "--predict", "--granularity=3", *common
    )
    assert proc.returncode == 0, proc.stderr
    row = next(x for x in proc.stdout.splitlines() if x.startswith("| chain"))
    assert "covered: G=1 " in row and "predicted " in row


def test_cli_cover_uses_bricks_of_several_g(files, tmp_path):
    db = _cli_store(tmp_path, files, skip_last=False)
    common = [
        f"--models={files[0]}",
        f"--db={db}",
        f"--out={tmp_path / 'out'}",
    ]
    proc = dlbricks("estimate", "--granularity=2", *common)
    assert proc.returncode == 1  # Only G=1 bricks are stored.
    proc = dlbricks("estimate", "--cover", "--granularity=2", *common)
    assert proc.returncode == 0, proc.stderr
    row = next(x for x in proc.stdout.splitlines() if x.startswith("| chain"))
    assert row.rstrip().endswith("| covered: G=1 100% |")
    cells = [c.strip() for c in row.strip("|").split("|")]
    want = CLI_SCALE * sum(
        law_ms(features.brick_features(b, g.specs))
        for g, f in [model_graph(files[0])]
        for b in from_runs(g, f, split.split(g, 1), granularity=1).bricks
    )
    assert math.isclose(float(cells[3]), want, rel_tol=1e-3)


def test_a_description_gives_the_features_of_the_brick_it_describes(
    graphs, tmp_path
):
    with _law_store(tmp_path / "s.sqlite", graphs) as store:
        results = store.results(SETTINGS, FP)
    walked = predict_lib.examples(graphs, results, max_granularity=2)
    texts = {}
    for name, (graph, factory) in graphs.items():
        cut = Cutter(graph, factory)
        for i in range(len(graph.calls)):
            b = cut.brick(i, i + 1)
            texts[b.signature] = b.describe()
            # What the signature hashes only: no layer or model name.
            for named in (name, *b.layers):
                assert f'"{named.split("/")[-1]}"' not in texts[b.signature]
    read, unread = predict_lib.described_examples(
        {**texts, "0" * 16: "{}"}, {**results, "0" * 16: _timing(1.0)}
    )
    assert list(unread) == ["0" * 16]
    assert len(read) == len(texts) and len(read) < len(walked)
    by_signature = {e.signature: e for e in walked}
    for e in read:  # Each a group of its own: no model is named.
        assert e.features == by_signature[e.signature].features
        assert e.median_ms == by_signature[e.signature].median_ms
        assert e.group == e.signature


@pytest.fixture(scope="module")
def unseen(tmp_path_factory):
    """A model none of the chain's and residual's bricks come from."""
    model = models.shared_and_ops()[0]
    path = tmp_path_factory.mktemp("unseen") / "shared_and_ops.keras"
    model.save(path)
    return str(path)


def test_a_store_filled_by_bench_alone_teaches_the_predictor(
    files, unseen, tmp_path
):
    """`bench --models` stores each brick's description: the predictor
    learns from them with no model to walk, and prices a model whose
    bricks were never timed."""
    db = tmp_path / "bench.sqlite"
    proc = dlbricks(
        "bench", f"--models={','.join(files)}", "--granularity=1,2",
        f"--db={db}", *FAST,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    with Store(db) as store:
        assert store.described() == {r["signature"] for r in store.rows()}
    common = [f"--models={unseen}", f"--db={db}", f"--out={tmp_path / 'o'}"]
    proc = dlbricks("estimate", *common)
    assert proc.returncode == 1, proc.stderr  # Never timed.
    proc = dlbricks("estimate", "--predict", *common)
    assert proc.returncode == 0, proc.stderr
    assert "Predictor: learning from the descriptions of the " in proc.stdout
    assert "walking" not in proc.stdout
    row = next(
        x for x in proc.stdout.splitlines() if x.startswith("| shared_and_ops")
    )
    assert "predicted 100%" in row
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert all(math.isfinite(float(c)) and float(c) > 0 for c in cells[3:6])


def test_an_old_schema_store_still_estimates_by_walking_its_models(
    files, tmp_path
):
    db = _cli_store(tmp_path, files, skip_last=True)
    # As schema 4 left it: no table of descriptions.
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("DROP TABLE brick_descriptions")
        conn.execute("UPDATE meta SET value = '4'")
    proc = dlbricks(
        "estimate", "--predict", f"--models={','.join(files)}",
        f"--db={db}", f"--out={tmp_path / 'out'}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    said = [x for x in proc.stdout.splitlines() if "descriptions" in x]
    assert said == [
        "Predictor: the store keeps no brick descriptions (its bricks were "
        "timed before stores kept them): learning from the models walked "
        "again, as before"
    ]
    row = next(x for x in proc.stdout.splitlines() if x.startswith("| chain"))
    assert "| predicted " in row and "(1 bricks)" in row


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
