"""Tests for dlbricks_tf/models/probes.py: the layer probes are
deterministic, within their budgets, cover their kinds, and every probe
builds, runs and cuts into bricks as models do; `bench --probes` times the
probe corpus (the probe nets, tests/probe_nets_test.py) and a model is
priced from it alone."""

import collections

import numpy as np
import pytest

from dlbricks_tf.cutting import split
from dlbricks_tf.cutting.decompose import decompose, from_runs, model_graph
from dlbricks_tf.estimating import features
from dlbricks_tf.models import corpus, probes


def test_the_same_seed_gives_the_same_probes_and_another_others():
    assert probes.specs(30) == probes.specs(30)
    assert probes.specs(30, seed=1) != probes.specs(30)
    # A shorter corpus is the start of a longer one.
    assert probes.specs(30) == probes.specs(probes.LAYER_COUNT)[:30]
    names = [s.name for s in probes.specs()]
    assert len(set(names)) == probes.LAYER_COUNT == len(names)
    assert all(probes.is_probe(n) for n in names)
    assert {corpus.family(n) for n in names} == {probes.FAMILY}
    with pytest.raises(ValueError, match="count"):
        probes.specs(-1)


def test_the_corpus_holds_every_kind_and_the_layers_models_use():
    specs = probes.specs()
    kinds = collections.Counter(s.kind for s in specs)
    assert set(kinds) == {k for k, _ in probes._KINDS}
    classes = {layer.class_name for s in specs for layer in s.layers}
    for name in (
        "Conv2D", "DepthwiseConv2D", "SeparableConv2D", "Dense",
        "BatchNormalization", "LayerNormalization", "Activation", "Add",
        "Multiply", "Concatenate", "MaxPooling2D", "GlobalAveragePooling2D",
        "ZeroPadding2D", "Cropping2D", "Reshape", "Flatten", "Dropout",
    ):  # fmt: skip
        assert name in classes, name
    # Squeeze-and-excitation's 1x1 convolutions on 1x1 maps.
    squeeze = [s for s in specs if s.kind == "squeeze"]
    assert squeeze and all(s.inputs[0][:2] == (1, 1) for s in squeeze)
    assert {s.layers[0].class_name for s in squeeze} == {"Conv2D"}
    grouped = [
        dict(s.layers[0].args)["groups"] for s in specs if s.kind == "grouped"
    ]
    assert grouped and min(grouped) > 1
    assert all(1 <= len(s.layers) <= 3 for s in specs)


@pytest.fixture(scope="module")
def sample():
    """One probe of each kind and the first few, built."""
    specs = probes.specs()
    chosen = {s.kind: s for s in reversed(specs)}
    chosen.update({s.name: s for s in specs[:6]})
    return {s.name: (s, probes.build(s)) for s in chosen.values()}


def test_probes_build_run_and_stay_within_their_budgets(sample):
    for spec, model in sample.values():
        inputs = [
            np.random.default_rng(0).normal(size=(1, *shape)).astype("float32")
            for shape in spec.inputs
        ]
        out = model(inputs if len(inputs) > 1 else inputs[0])
        assert np.all(np.isfinite(np.asarray(out))), spec.name
        graph, factory = model_graph(model)
        assert len(graph.calls) == len(spec.layers)
        plan = from_runs(graph, factory, split.split(graph, 1), granularity=1)
        for b in plan.bricks:
            f = features.brick_features(b, graph.specs)
            window = f["depthwise_flops"] + f["grouped_flops"]
            assert window <= probes.WINDOW_FLOPS, spec.name
            assert f["flops"] <= 2 * probes.MATRIX_FLOPS, spec.name


def test_a_probe_cuts_as_a_model_does(sample):
    spec, model = next(v for v in sample.values() if len(v[0].layers) == 3)
    d = decompose(model, granularity=3)
    assert len(d.bricks) == 1 and len(d.bricks[0].layers) == 3
    assert d.bricks[0].class_names == tuple(
        layer.class_name.replace("ReLU6", "ReLU") for layer in spec.layers
    )
    d1 = decompose(model, granularity=1)
    assert [len(b.layers) for b in d1.bricks] == [1, 1, 1]
    first = d1.bricks[0].build()
    shape = (1, *d1.bricks[0].inputs[0].shape)
    out = first(np.zeros(shape, "float32"))
    assert tuple(out.shape) == (1, *d1.bricks[0].outputs[0].shape)


def test_probe_sources_build_their_probe():
    (source,) = probes.layer_sources(1)
    assert source.name == "probe-000"
    model = source.build()
    assert len(model.inputs) == len(probes.specs(1)[0].inputs)
    # The probe corpus is the probe nets.
    assert [s.name for s in probes.sources(2)] == [
        "probe-net-000",
        "probe-net-001",
    ]
    assert probes.COUNT == len(probes.sources())


def test_the_cut_key_moves_with_what_the_nets_cut_into():
    key = probes.cut_key(2, 1, False)
    assert probes.cut_key(2, 1, False) == key  # A digest: stable.
    others = {
        probes.cut_key(3, 1, False),
        probes.cut_key(2, 2, False),
        probes.cut_key(2, 1, True),
        probes.cut_key(2, 1, False, seed=1),
    }
    assert key not in others and len(others) == 4


def test_cli_times_probes_and_estimates_a_model_from_them_alone(tmp_path):
    """`bench --probes` stores the probes' bricks; `estimate --predict`
    then prices a model none of whose bricks was timed, from the probes
    alone, reading back the predictor `bench --probes` fitted and kept."""
    from dlbricks_tf.storing.store import Store
    from tests import models
    from tests.cli import FAST, dlbricks

    db = tmp_path / "s.sqlite"
    common = [f"--db={db}", f"--out={tmp_path / 'out'}"]
    proc = dlbricks("bench", "--probes", "--probe_count=2", *common, *FAST)
    assert proc.returncode == 0, proc.stderr
    assert "Predictor of the store's" in proc.stdout  # Fitted and kept.
    want = {
        b.signature for s in probes.sources(2) for b in s.decompose(1).bricks
    }
    with Store(db) as store:
        stored = {r["signature"] for r in store.rows("brick")}
    assert stored == want
    model = models.chain()[0]
    path = str(tmp_path / "chain.keras")
    model.save(path)
    proc = dlbricks("estimate", f"--models={path}", *common)
    assert proc.returncode == 1  # No brick of it is stored.
    proc = dlbricks("estimate", "--predict", f"--models={path}", *common)
    assert proc.returncode == 0, proc.stderr
    assert "Predictor: kept in the store" in proc.stdout
    row = next(x for x in proc.stdout.splitlines() if x.startswith("| chain"))
    assert "predicted 100%" in row, row
    proc = dlbricks("estimate", "--predict", f"--models={path}", *common)
    assert proc.returncode == 0, proc.stderr
    assert "Predictor: kept in the store" in proc.stdout
    assert row in proc.stdout.splitlines()  # The same estimate.
    proc = dlbricks("bench", "--probes", "--suite=x", *common, *FAST)
    assert proc.returncode != 0 and "--suite" in proc.stderr


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
