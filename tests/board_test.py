"""Tests of dlbricks_tf/reporting/board.py: every TensorBoard view read back."""

import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.plugins.hparams import plugin_data_pb2

import dlbricks_tf
from dlbricks_tf.cutting import suite as suite_lib
from dlbricks_tf.drawing import charts
from dlbricks_tf.reporting import board, estimates_board
from dlbricks_tf.running import job
from dlbricks_tf.stats import Timing
from tests import chart_images, models

SETTINGS = {"batch_size": 1, "intra_op_threads": 2, "inter_op_threads": 1}
# chain's ranges at each G: measured 1.0 ms, estimated 0.5 * G ms.
RANGES = {
    g: {
        "estimated_low_ms": 0.4 * g,
        "estimated_high_ms": 0.7 * g,
        "measured_ci_low_ms": 0.9,
        "measured_ci_high_ms": 1.25,
    }
    for g in (1, 2)
}


def _read(path) -> event_accumulator.EventAccumulator:
    acc = event_accumulator.EventAccumulator(
        str(path), size_guidance={event_accumulator.TENSORS: 0}
    )
    acc.Reload()
    return acc


def _values(acc, tag) -> dict[int, float]:
    return {
        e.step: float(tf.make_ndarray(e.tensor_proto)) for e in acc.Tensors(tag)
    }


def _job():
    """A two-model report at G=1 and G=2, with planted brick timings."""
    chain, res = models.chain()[0], models.residual()[0]
    runs, corpus, details = [], [], {}
    for g in (1, 2):
        ds = {
            "chain": dlbricks_tf.decompose(chain, g),
            "res/x": dlbricks_tf.decompose(res, g),
        }
        suite = suite_lib.build_suite(ds)
        results = {
            s: Timing(*[0.1] * 4, 10, 0.1, 0.1, False) for s in suite.signatures
        }
        for i, name in enumerate(ds):
            runs.append(
                {
                    "model": name,
                    "granularity": g,
                    "measured_ms": 1.0 + i,
                    "estimated_ms": 0.5 * g + i,
                    "estimated_parallel_ms": 0.4 * g + i,
                    "normalized": (0.5 * g + i) / (1.0 + i),
                    "bricks": len(ds[name].bricks),
                    # Only chain has ranges: res/x draws without.
                    **(RANGES[g] if name == "chain" else {}),
                }
            )
        corpus.append(
            {
                "granularity": g,
                "geomean_normalized": 0.7 + 0.1 * g,
                "min_normalized": 0.5,
                "max_normalized": 1.0,
                "speedup": 2.0 * g,
                "unique_bricks": len(suite),
                "total_bricks": suite.total_bricks,
                "campaign_wall_s": 1.0,
                "end_to_end_wall_s": 2.0,
                "steal_share": 0.05 * g,
                "steal_peak_share": 0.25 * g,
                "passes_left_out_share": 0.1 * g,
                "model_samples_left_out_share": 0.02 * g,
                "reference_ratio": 1.0 + 0.1 * g,
                "reference_spread": 0.02,
                "range_holds": 2,
                "flagged": g - 1,
            }
        )
        details[g] = job.GranularityResult(
            runs[-2:], corpus[-1], ds, suite, results, {}
        )
    report = {
        "system": {"cpu_model": "Test CPU", "id": "abc"},
        "settings": SETTINGS,
        "runs": runs,
        "corpus": corpus,
    }
    return report, details


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("tb")
    report, details = _job()
    board.write_board(log_dir, report, details, graphs=2)
    files = board.write_board(log_dir, report, details, graphs=2)
    return log_dir, files, details


def test_rewrite_replaces_the_event_files(logs):
    log_dir, files, _ = logs
    assert len(files) == len(set(files))
    runs = {f.rsplit("/", 1)[0] for f in files}
    assert len(files) == len(runs)  # One event file per run, not two.
    assert {"models/chain", "models/res_x", "hparams", "hparams/G=1",
            "hparams/G=2", "tables", "charts"} <= runs  # fmt: skip
    assert sum(r.startswith("graphs/") for r in runs) == 2


def test_model_scalars_over_g(logs):
    log_dir, _, _ = logs
    acc = _read(log_dir / "models" / "res_x")
    assert set(acc.Tags()["tensors"]) == {
        "latency/measured_ms",
        "latency/estimated_ms",
        "latency/estimated_parallel_ms",
        "latency/normalized",
    }
    assert _values(acc, "latency/estimated_ms") == pytest.approx(
        {1: 1.5, 2: 2.0}
    )
    assert _values(acc, "latency/normalized") == pytest.approx(
        {1: 0.75, 2: 1.0}
    )


def test_hparams_experiment_and_sessions(logs):
    log_dir, _, _ = logs
    acc = _read(log_dir / "hparams")
    content = acc.PluginTagToContent("hparams")
    data = plugin_data_pb2.HParamsPluginData.FromString(
        content["_hparams_/experiment"]
    )
    names = {h.name for h in data.experiment.hparam_infos}
    assert names == {
        "granularity",
        "batch_size",
        "intra_op_threads",
        "inter_op_threads",
    }
    metrics = {m.name.tag for m in data.experiment.metric_infos}
    assert metrics == {
        *board.METRICS,
        *board.STEAL_METRICS,
        *board.LEFT_OUT_METRICS,
        *board.REFERENCE_METRICS,
        "corpus/range_holds",
        "corpus/flagged",
    }

    session = _read(log_dir / "hparams" / "G=2")
    start = plugin_data_pb2.HParamsPluginData.FromString(
        session.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    ).session_start_info
    assert start.hparams["granularity"].number_value == 2
    assert start.hparams["intra_op_threads"].number_value == 2
    assert _values(session, "corpus/speedup") == {2: 4.0}
    assert _values(session, "corpus/geomean_normalized") == pytest.approx(
        {2: 0.9}
    )


def test_steal_and_range_scalars_per_g(logs):
    log_dir, _, _ = logs
    for g in (1, 2):
        session = _read(log_dir / "hparams" / f"G={g}")
        assert _values(session, "corpus/steal_share") == pytest.approx(
            {g: 0.05 * g}
        )
        assert _values(session, "corpus/steal_peak_share") == pytest.approx(
            {g: 0.25 * g}
        )
        assert _values(
            session, "corpus/passes_left_out_share"
        ) == pytest.approx({g: 0.1 * g})
        assert _values(
            session, "corpus/model_samples_left_out_share"
        ) == pytest.approx({g: 0.02 * g})
        assert _values(session, "corpus/reference_ratio") == pytest.approx(
            {g: 1.0 + 0.1 * g}
        )
        assert _values(session, "corpus/flagged") == {g: g - 1}
        assert _values(session, "corpus/range_holds") == {g: 2}
    (corpus,) = _read(log_dir / "tables").Tensors("corpus")
    text = tf.make_ndarray(corpus.tensor_proto).item().decode()
    assert text.splitlines()[0].endswith(
        "| steal_share | steal_peak_share | passes_left_out_share |"
        " model_samples_left_out_share | reference_ratio |"
        " reference_spread | range_holds | flagged |"
    )


def test_a_report_without_steal_or_ranges_writes_neither(tmp_path):
    report, _ = _job()
    for row in report["corpus"]:
        del row["steal_share"], row["steal_peak_share"]
        del row["passes_left_out_share"], row["model_samples_left_out_share"]
        del row["reference_ratio"], row["reference_spread"]
        del row["range_holds"], row["flagged"]
    for row in report["runs"]:
        for key in RANGES[1]:
            row.pop(key, None)
    board.write_board(tmp_path, report)
    data = plugin_data_pb2.HParamsPluginData.FromString(
        _read(tmp_path / "hparams").PluginTagToContent("hparams")[
            "_hparams_/experiment"
        ]
    )
    metrics = {m.name.tag for m in data.experiment.metric_infos}
    assert metrics == set(board.METRICS)
    session = _read(tmp_path / "hparams" / "G=1")
    tags = set(session.Tags()["tensors"])
    assert not set(board.STEAL_METRICS) & tags
    assert not set(board.LEFT_OUT_METRICS) & tags
    assert not set(board.REFERENCE_METRICS) & tags
    figures = board.result_figures(report["runs"][:2], 1)
    for figure in figures.values():
        assert chart_images.error_segments(figure.axes[0]) == {}


def test_tables_and_images(logs):
    log_dir, _, details = logs
    tables = _read(log_dir / "tables")
    tags = set(tables.Tags()["tensors"])
    assert {"results", "corpus", "system", "bricks/chain"} <= tags
    (results,) = tables.Tensors("results")
    text = tf.make_ndarray(results.tensor_proto).item().decode()
    assert text.splitlines()[0].startswith("| model | granularity |")
    assert "| res/x | 2 |" in text
    bricks = {e.step: e for e in tables.Tensors("bricks/chain")}
    assert set(bricks) == {1, 2}
    text = tf.make_ndarray(bricks[2].tensor_proto).item().decode()
    assert len(text.splitlines()) == 2 + len(
        details[2].decompositions["chain"].bricks
    )
    assert details[2].decompositions["chain"].bricks[0].signature in text

    charts = _read(log_dir / "charts")
    assert set(charts.Tags()["tensors"]) == {
        "normalized_latency",
        "measured_vs_estimated",
        "similarity",
    }
    for tag in ("normalized_latency", "measured_vs_estimated", "similarity"):
        steps = {e.step for e in charts.Tensors(tag)}
        assert steps == {1, 2}
        width, height, png = tf.make_ndarray(
            charts.Tensors(tag)[0].tensor_proto
        )
        image = chart_images.decode(png)
        assert image.shape[:2] == (int(height), int(width))
        if tag != "similarity":
            # Wide enough to read when TensorBoard scales it to a card.
            assert 1000 <= int(width) <= 1400


def test_charts_draw_the_rows_ranges(logs):
    log_dir, _, _ = logs
    report, _ = _job()
    mine = [r for r in report["runs"] if r["granularity"] == 2]
    assert [r["model"] for r in mine] == ["chain", "res/x"]
    figures = board.result_figures(mine, 2)
    # chain (first bar, at 0): estimate 1.0 ms in 0.8..1.4 over 1.0 ms.
    assert board.normalized_range(mine[0]) == pytest.approx((0.8, 1.4))
    assert board.normalized_range(mine[1]) is None
    bars = chart_images.error_segments(figures["normalized_latency"].axes[0])
    np.testing.assert_allclose(
        bars["estimate's range / measured"], [[(0.8, 0), (1.4, 0)]]
    )
    # Measured 1.0 ms (CI 0.9..1.25) against estimated 1.0 (0.8..1.4).
    points = chart_images.error_segments(
        figures["measured_vs_estimated"].axes[0]
    )
    np.testing.assert_allclose(
        points["estimate's range"], [[(1, 0.8), (1, 1.4)]]
    )
    np.testing.assert_allclose(points["measured CI"], [[(0.9, 1), (1.25, 1)]])
    # The board's images are these figures.
    (event,) = [
        e
        for e in _read(log_dir / "charts").Tensors("normalized_latency")
        if e.step == 2
    ]
    _, _, png = tf.make_ndarray(event.tensor_proto)
    drawn = charts.to_png(figures["normalized_latency"])
    np.testing.assert_array_equal(
        chart_images.decode(png), chart_images.decode(drawn)
    )


def test_estimates_show_their_sources(tmp_path):
    rows = [
        {
            "model": "m",
            "granularity": g,
            "mode": "sequential",
            "estimated_ms": 2.0 * g,
            "low_ms": 1.0,
            "high_ms": 3.0,
            "measured_ms": 2.0,
            "normalized": float(g),
            "method": "covered+predicted",
            "sources": {"G=1": 0.75, "predicted": 0.25},
            "predicted_bricks": 1,
        }
        for g in (1, 2)
    ]
    written = estimates_board.write_estimates(tmp_path, rows)
    assert any(p.startswith("estimates/m/") for p in written)
    (table,) = _read(tmp_path / "estimates").Tensors("estimates")
    text = tf.make_ndarray(table.tensor_proto).item().decode()
    assert text.splitlines()[0].endswith("| source |")
    assert "covered: G=1 75%; predicted 25% (1 bricks)" in text
    acc = _read(tmp_path / "estimates" / "m")
    assert _values(acc, "source_share/predicted") == {1: 0.25, 2: 0.25}
    assert _values(acc, "estimated_ms") == {1: 2.0, 2: 4.0}


def test_brick_graphs_hold_layer_scopes(logs):
    log_dir, files, details = logs
    graph_runs = sorted(
        {f.rsplit("/", 1)[0] for f in files if f.startswith("graphs/")}
    )
    acc = _read(log_dir / graph_runs[0])
    assert acc.Tags()["graph"]
    graph = acc.Graph()
    ops = {n.op for n in graph.node}
    assert "Conv2D" in ops or "_FusedConv2D" in ops
    # The largest brick of the last G comes first: its layers are scopes.
    largest = max(details[2].suite.entries, key=lambda e: len(e.brick.layers))
    assert len(largest.brick.layers) == 2
    names = " ".join(n.name for n in graph.node)
    for layer in largest.brick.layers:
        assert layer.replace("/", "__") in names


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
