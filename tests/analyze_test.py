"""Tests of dlbricks_tf/analyzing/analyze.py: run_analysis on tiny models."""

import csv
import io
import json
import math

import matplotlib.image
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator

import dlbricks_tf
from dlbricks_tf.analyzing import analyze
from dlbricks_tf.stats import Timing
from dlbricks_tf.storing.store import Store
from tests.analysis_test import repeated_blocks, small_head
from tests.fakes import FP, SETTINGS

BRICK_MS = 0.5
MEASURED_MS = {"blocks": 5.0, "head": 1.0}


def _timing(ms: float) -> Timing:
    return Timing(ms, ms, ms, ms, 10, ms, ms, False)


def _csv(path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _models(tmp_path) -> dict:
    """A builder and a .keras file: the two kinds run_analysis loads."""
    path = tmp_path / "head.keras"
    small_head().save(path)
    return {"blocks": repeated_blocks, "head": str(path)}


def _read_run(path) -> event_accumulator.EventAccumulator:
    acc = event_accumulator.EventAccumulator(
        str(path), size_guidance={event_accumulator.TENSORS: 0}
    )
    acc.Reload()
    return acc


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("analysis")
    lines = []
    result = analyze.run_analysis(_models(tmp), tmp / "out", log=lines.append)
    return result, tmp / "out", lines


def test_progress_one_line_per_model(analysed):
    _, _, lines = analysed
    assert lines[0].startswith("[1/2] blocks: 7 calls, 3 unique")
    assert lines[1].startswith("[2/2] head: 2 calls, 2 unique")
    assert lines[2] == (
        "Trade-off skipped: no store given: run the benchmark and pass its "
        "store."
    )


def test_repeatability_csv(analysed):
    rows = _csv(analysed[1] / "repeatability.csv")
    got = [(r["model"], int(r["calls"]), int(r["unique"])) for r in rows]
    assert got == [("blocks", 7, 3), ("head", 2, 2), ("(corpus)", 9, 4)]
    assert float(rows[0]["percent_unique"]) == pytest.approx(300 / 7)
    assert float(rows[2]["percent_unique"]) == pytest.approx(400 / 9)


def test_types_csv(analysed):
    rows = _csv(analysed[1] / "types.csv")
    got = [
        (r["model"], r["class_name"], int(r["repeated"]))
        for r in rows
        if r["model"] == "blocks"
    ]
    assert got == [("blocks", "Dense", 2), ("blocks", "ReLU", 2)]
    assert float(rows[0]["share_of_repeated"]) == 0.5


def test_similarity_csv_is_a_named_matrix(analysed):
    rows = _csv(analysed[1] / "similarity.csv")
    assert [r["model"] for r in rows] == ["blocks", "head"]
    assert float(rows[0]["blocks"]) == 1.0 == float(rows[1]["head"])
    assert float(rows[0]["head"]) == float(rows[1]["blocks"]) == 0.25


def test_reuse_csv_without_latencies(analysed):
    rows = {r["model"]: r for r in _csv(analysed[1] / "reuse.csv")}
    assert int(rows["blocks"]["covered"]) == 3  # Dense(8) three times.
    assert float(rows["blocks"]["brick_share"]) == pytest.approx(3 / 7)
    assert int(rows["head"]["new_unique"]) == 1
    assert rows["head"]["latency_share"] == ""


def test_json_and_no_tradeoff_files(analysed):
    result, out, _ = analysed
    data = json.loads((out / "analysis.json").read_text())
    assert data["corpus"]["calls"] == 9 and data["corpus"]["unique"] == 4
    assert data["similarity"]["matrix"] == [[1.0, 0.25], [0.25, 1.0]]
    assert data["reuse"][1]["latency_share"] is None
    assert data["tradeoff"]["note"].startswith("no store given")
    assert not (out / "tradeoff.csv").exists()
    assert "tradeoff.png" not in result.files
    for name in result.files:
        assert (out / name).is_file(), name


@pytest.mark.parametrize(
    "name", ["repeatability", "types", "similarity", "reuse"]
)
def test_pngs_decode(analysed, name):
    png = (analysed[1] / f"{name}.png").read_bytes()
    image = matplotlib.image.imread(io.BytesIO(png), format="png")
    assert image.shape[0] >= 200 and image.shape[1] >= 300


def test_tensorboard_images_and_tables(analysed):
    acc = _read_run(analysed[1] / "tensorboard" / "analysis")
    tags = set(acc.Tags()["tensors"])
    charts = {f"charts/{n}" for n in ("repeatability", "types", "similarity")}
    assert charts | {"charts/reuse"} <= tags
    assert {"tables/repeatability", "tables/reuse", "tables/tradeoff"} <= tags
    png = (analysed[1] / "similarity.png").read_bytes()
    (event,) = acc.Tensors("charts/similarity")
    width, height, encoded = tf.make_ndarray(event.tensor_proto)
    want = matplotlib.image.imread(io.BytesIO(png), format="png").shape
    assert (int(height), int(width)) == want[:2]
    assert tuple(tf.image.decode_png(encoded).shape[:2]) == want[:2]
    (table,) = acc.Tensors("tables/repeatability")
    text = tf.make_ndarray(table.tensor_proto).item().decode()
    assert "| (corpus) | 9 | 4 |" in text


def _store(tmp_path, models: dict) -> str:
    """Times every brick at G=1 and 2 (BRICK_MS) and each model."""
    path = tmp_path / "store.sqlite"
    with Store(path) as store:
        for name, source in models.items():
            model = source() if callable(source) else source
            for g in (1, 2):
                for b in dlbricks_tf.decompose(model, granularity=g).bricks:
                    store.put(b.signature, SETTINGS, FP, _timing(BRICK_MS))
            store.put_model(name, SETTINGS, FP, _timing(MEASURED_MS[name]))
    return str(path)


def test_tradeoff_from_a_store(tmp_path):
    models = _models(tmp_path)
    store = _store(tmp_path, models)
    result = analyze.run_analysis(
        models,
        tmp_path / "out",
        store_path=store,
        tradeoff_granularities=(1, 2, 3),
        log=None,
    )
    assert result.tradeoff_note == ""
    out = tmp_path / "out"
    rows = _csv(out / "tradeoff.csv")
    g1 = {r["model"]: r for r in rows if r["granularity"] == "1"}
    assert float(g1["blocks"]["estimate_ms"]) == pytest.approx(7 * BRICK_MS)
    assert float(g1["blocks"]["normalized"]) == pytest.approx(0.7)
    assert float(g1["head"]["normalized"]) == pytest.approx(1.0)

    summary = _csv(out / "tradeoff_summary.csv")
    summary = {int(r["granularity"]): r for r in summary}
    assert sorted(summary) == [1, 2, 3]
    # At G=3, "head" is its G=2 brick; the G=3 bricks of "blocks" are not
    # timed.
    assert summary[3]["models"] == "1"
    assert summary[3]["skipped"].startswith("blocks: ")
    assert float(summary[1]["geomean_normalized"]) == pytest.approx(
        math.sqrt(0.7)
    )
    # (5 + 1) ms of models over 4 unique bricks of 0.5 ms.
    assert float(summary[1]["speedup"]) == pytest.approx(3.0)
    assert summary[1]["system"] == f"{SETTINGS.key()} @ {FP.id}"

    reuse = {r["model"]: r for r in _csv(out / "reuse.csv")}
    assert float(reuse["blocks"]["latency_share"]) == pytest.approx(3 / 7)
    assert float(reuse["blocks"]["latency_ms"]) == pytest.approx(3.5)

    for name in ("tradeoff.png", "tradeoff_models.png"):
        assert matplotlib.image.imread(out / name).shape[0] > 0
    (run,) = (out / "tensorboard" / "tradeoff").iterdir()
    acc = _read_run(run)
    speedups = {
        e.step: float(tf.make_ndarray(e.tensor_proto))
        for e in acc.Tensors("tradeoff/speedup")
    }
    assert sorted(speedups) == [1, 2, 3]
    assert speedups[1] == pytest.approx(3.0)

    # A rerun without the store drops the trade-off files and events.
    analyze.run_analysis(models, out, log=None)
    assert not (out / "tradeoff.csv").exists()
    assert not list((out / "tensorboard" / "tradeoff").glob("**/events*"))
    assert len(list((out / "tensorboard" / "analysis").iterdir())) == 1


def test_store_without_these_models(tmp_path):
    store = _store(tmp_path, {"head": small_head})
    lines = []
    result = analyze.run_analysis(
        {"blocks": repeated_blocks},
        tmp_path / "out",
        store_path=store,
        log=lines.append,
    )
    assert result.tradeoff == ()
    assert "no end-to-end timing of these models" in result.tradeoff_note
    assert lines[-1].startswith("Trade-off skipped: the store")


def test_errors_name_what_is_wrong(tmp_path):
    with pytest.raises(analyze.AnalysisError, match="does not exist"):
        analyze.run_analysis(
            {"blocks": repeated_blocks}, tmp_path, store_path="nope.sqlite"
        )
    with pytest.raises(analyze.AnalysisError, match="'ghost'"):
        analyze.run_analysis(
            {"ghost": str(tmp_path / "ghost.keras")}, tmp_path, log=None
        )
    with pytest.raises(analyze.AnalysisError, match="No models"):
        analyze.run_analysis({}, tmp_path)
    with pytest.raises(ValueError, match="granularity"):
        analyze.run_analysis({"b": repeated_blocks}, tmp_path, granularity=0)


def test_granularity_changes_similarity_and_reuse(tmp_path):
    result = analyze.run_analysis(
        {"blocks": repeated_blocks, "head": small_head},
        tmp_path,
        granularity=2,
        log=None,
    )
    assert result.granularity == 2
    assert result.corpus.calls == 9  # Repeatability stays at G=1.
    assert sum(r.bricks for r in result.reuse) < 9


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
