"""Tests of dlbricks_tf/measuring/ort_layout.py: the NCHWc reorders a
model runs on ONNX Runtime, those its chains run as edges, and their price.

Real ONNX Runtime sessions of a small squeeze-and-excite model, whose
broadcast `Mul` makes ORT reorder between layouts; the pricing on exact
arithmetic.
"""

import json
import math

import keras
import numpy as np
import pytest

import dlbricks_tf
from dlbricks_tf.machine.fingerprint import system_fingerprint
from dlbricks_tf.measuring import (
    brick_timing,
    ort_chain,
    ort_layout,
    ort_session,
)
from dlbricks_tf.running import job, steps
from dlbricks_tf.storing.store import Store
from tests import models

pytest.importorskip("onnxruntime")

ORT = models.ort_settings("chain")
FAST = models.ORT_FAST


def _squeeze_excite() -> keras.Model:
    """Convolutions around a squeeze-and-excite block."""
    keras.utils.set_random_seed(0)
    inp = keras.Input((16, 16, 8))
    x = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(inp)
    s = keras.layers.GlobalAveragePooling2D(keepdims=True)(x)
    s = keras.layers.Conv2D(16, 1, activation="sigmoid")(s)
    x = keras.layers.Multiply()([x, s])
    return keras.Model(inp, keras.layers.Conv2D(16, 1)(x), name="se")


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    folder = tmp_path_factory.mktemp("onnx")
    return brick_timing.model_onnx_file(_squeeze_excite(), folder, "se", 1)


def _reorders_run(path, folder) -> dict[str, int]:
    """{key: count} of the reorders one profiled run of the file's own
    session (its weights, as timed) runs."""
    session = ort_session.session_for(
        path, ORT, profile_prefix=str(folder / "own")
    )
    feed = {session.get_inputs()[0].name: np.ones((1, 16, 16, 8), "float32")}
    session.run(None, feed)
    with open(session.end_profiling(), encoding="utf-8") as f:
        events = json.load(f)
    counts: dict[str, int] = {}
    for _, event in ort_chain.kernel_events(events, 0)[1]:
        key = ort_layout.reorder_key(event)
        if key is not None:
            counts[key] = counts.get(key, 0) + 1
    return counts


def test_a_models_reorders_are_read_from_its_skeleton_as_it_runs_them(
    model_file, tmp_path
):
    counts = ort_layout.model_reorders(model_file.path, ORT)
    assert counts == _reorders_run(model_file.path, tmp_path)
    ops = {key.split(":")[1] for key in counts}
    assert ops == set(ort_layout.REORDER_OPS)
    for key in counts:
        assert key.startswith(ort_layout.PREFIX)
        assert ort_layout.elements(key) > 0


def test_a_chains_edge_reorders_are_its_nodes_of_no_brick(tmp_path):
    d = dlbricks_tf.decompose(_squeeze_excite(), 1)
    paths = {}
    for b in d.bricks:
        paths.setdefault(
            b.signature,
            brick_timing.brick_onnx_file(
                b.build, tmp_path, b.signature, 1
            ).path,
        )
    chain = ort_chain.OrtChain(list(paths.values()), ORT, None, "c", FAST)
    while not chain.profile.done:
        chain.profile.sample()
    events = chain.profile.events()
    edges = ort_layout.edge_reorders(
        events, chain.profile.owners, ort_chain.WARMUP_RUNS
    )
    assert edges and all(k.startswith(ort_layout.PREFIX) for k in edges)
    # Each key's figure is one node's: the nodes of a key sum to no more
    # than the chain's edges.
    times = chain.profile.kernel_times()
    nodes = {}
    for node, event in ort_chain.kernel_events(events, ort_chain.WARMUP_RUNS)[
        1
    ]:
        key = ort_layout.reorder_key(event)
        if key is not None and chain.profile.owners(node) is None:
            nodes.setdefault(key, set()).add(node)
    assert set(nodes) == set(edges)
    total = sum(edges[k] * len(nodes[k]) for k in edges)
    assert 0 < total <= times.edge_us + 1e-6


def _event(op, shape_in, shape_out, dur=1, ts=0):
    return {
        "cat": "Node",
        "name": f"{op}_{ts}_kernel_time",
        "ts": ts,
        "dur": dur,
        "args": {
            "op_name": op,
            "input_type_shape": [{"float": list(shape_in)}],
            "output_type_shape": [{"float": list(shape_out)}],
        },
    }


def test_a_reorder_key_names_its_op_and_shapes():
    key = ort_layout.reorder_key(
        _event("ReorderOutput", (1, 128, 7, 7), (1, 120, 7, 7))
    )
    assert key == "nchwc:ReorderOutput:1x128x7x7>1x120x7x7"
    assert ort_layout.elements(key) == 120 * 49
    assert ort_layout.reorder_key(_event("Conv", (1, 8), (1, 8))) is None


def test_price_takes_the_same_reorder_else_its_ops_time_per_element():
    a = "nchwc:ReorderInput:1x8x4x4>1x8x4x4"  # 128 elements
    b = "nchwc:ReorderInput:1x16x4x4>1x16x4x4"  # 256
    c = "nchwc:ReorderInput:1x32x4x4>1x32x4x4"  # 512: no chain ran it
    d = "nchwc:ReorderOutput:1x8x2x2>1x8x2x2"  # No ReorderOutput known.
    known = {a: 0.010, b: 0.038}
    price = ort_layout.price({a: 2, c: 1, d: 3}, known)
    per_element = (0.010 + 0.038) / (128 + 256)
    assert math.isclose(price.ms, 2 * 0.010 + 512 * per_element)
    assert (price.reorders, price.exact, price.unpriced) == (6, 2, 3)
    assert ort_layout.price({}, known) == ort_layout.LayoutPrice()


def test_run_and_estimate_on_onnx_runtime_add_each_models_reorders(
    tmp_path,
):
    path = tmp_path / "se.keras"
    _squeeze_excite().save(path)
    fp = system_fingerprint()
    sources = job.resolve_models([str(path)])
    with Store(tmp_path / "s.sqlite") as store:
        report, _ = job.run_job(
            sources,
            [1],
            ORT,
            store,
            FAST,
            fingerprint=fp,
            check_settings=False,
            onnx_folder=tmp_path / "onnx",
        )
        layout = store.results(ORT, fp, layout=True)
        bricks = store.results(ORT, fp)
        # `estimate` from the store adds the same, its model converted.
        extra = steps.layout_ms(sources, ORT, fp, store, tmp_path / "again")
        (estimated,) = steps.estimate_models(
            sources, 1, ORT, fp, store, onnx_folder=tmp_path / "again"
        )
    (row,) = report["runs"]
    counts = ort_layout.model_reorders(tmp_path / "onnx" / "model-se.onnx", ORT)
    assert row["layout_reorders"] == sum(counts.values()) > 0
    # The reorders the chains ran are stored apart from the bricks.
    assert layout and all(k.startswith(ort_layout.PREFIX) for k in layout)
    assert not any(k.startswith(ort_layout.PREFIX) for k in bricks)
    price = ort_layout.price(counts, ort_layout.known_ms(layout))
    assert math.isclose(row["layout_ms"], price.ms)
    # Added once to the estimate, over the bricks' sum.
    summed = sum(
        bricks[b.signature].center_ms
        for b in dlbricks_tf.decompose(str(path), 1).bricks
    )
    assert math.isclose(row["estimated_ms"], summed + price.ms)
    assert extra == {"se": pytest.approx(price.ms)}
    assert estimated["estimated_ms"] == pytest.approx(row["estimated_ms"])


def test_a_job_converts_each_whole_model_once_for_all_its_g(
    tmp_path, monkeypatch
):
    path = tmp_path / "se.keras"
    _squeeze_excite().save(path)
    real, made = brick_timing.model_onnx_file, []

    def counted(*args, **kwargs):  # The real conversion, counted.
        made.append(args[2])
        return real(*args, **kwargs)

    monkeypatch.setattr(brick_timing, "model_onnx_file", counted)
    with Store(tmp_path / "s.sqlite") as store:
        report, _ = job.run_job(
            job.resolve_models([str(path)]),
            [1, 2],
            ORT,
            store,
            FAST,
            check_settings=False,
            onnx_folder=tmp_path / "onnx",
        )
    assert made == ["se"]
    first, second = report["runs"]
    assert (first["granularity"], second["granularity"]) == (1, 2)
    # The reorders read at G=1 are the model's at G=2 as well.
    assert first["layout_reorders"] == second["layout_reorders"] > 0


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
