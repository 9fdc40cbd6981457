"""Tests of dlbricks_tf/running/job.py: the whole job on two tiny models.

Brick timings are planted in the store where a test needs exact numbers
(the estimate is then their sum); whole models are timed for real with
tight caps, and only the shape of what comes out is checked.
"""

import dataclasses
import json
import math
import shutil

import pytest

from dlbricks_tf import errors
from dlbricks_tf.machine.fingerprint import system_fingerprint
from dlbricks_tf.measuring import timing
from dlbricks_tf.reporting import report
from dlbricks_tf.running import job, report_json, steps
from dlbricks_tf.stats import Timing
from dlbricks_tf.storing.store import Store
from tests import models

FAST = timing.TimingOptions(
    min_samples=3, max_samples=5, max_seconds=0.2, target_sample_ms=0.5
)
SETTINGS, _ = models.settings()
FP = system_fingerprint()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    paths = {}
    for name, builder in (("chain", models.chain), ("res", models.residual)):
        paths[name] = str(folder / f"{name}.keras")
        builder()[0].save(paths[name])
    return paths


def _timing(ms: float) -> Timing:
    return Timing(ms, ms, ms, ms, 10, ms, ms, False)


def test_resolve_models_names_and_files(files, tmp_path):
    other = tmp_path / "chain.keras"
    other.write_bytes(b"")
    sources = job.resolve_models(["ResNet50", files["chain"], str(other)])
    assert [s.name for s in sources] == ["ResNet50", "chain", "chain-2"]
    assert sources[0].path is None
    assert sources[1].path == files["chain"]


@pytest.mark.parametrize(
    "spec, message",
    [
        ("ResNet51", "Unknown model 'ResNet51'"),
        ("missing/model.keras", "does not exist"),
        ("nope.h5", "does not exist"),
    ],
)
def test_resolve_models_refuses_bad_specs(spec, message):
    with pytest.raises(job.ModelSourceError, match=message):
        job.resolve_models([spec])


def test_resolve_models_needs_a_model():
    with pytest.raises(job.ModelSourceError, match="No models"):
        job.resolve_models([])


def test_build_refuses_a_corrupt_file(tmp_path):
    bad = tmp_path / "bad.keras"
    bad.write_bytes(b"not a zip")
    (source,) = job.resolve_models([str(bad)])
    with pytest.raises(job.ModelSourceError, match="bad.keras"):
        source.build()


def test_run_job_uses_stored_bricks(files, tmp_path):
    sources = job.resolve_models([files["chain"], files["res"]])
    brick_ms = 0.25
    with Store(tmp_path / "s.sqlite") as store:
        counts = {}
        for s in sources:
            d = s.decompose(1)
            counts[s.name] = len(d.bricks)
            for b in d.bricks:
                store.put(b.signature, SETTINGS, FP, _timing(brick_ms))
        calls = []
        report, details = job.run_job(
            sources,
            [1],
            SETTINGS,
            store,
            FAST,
            fingerprint=FP,
            report_path=tmp_path / "report.json",
            check_settings=False,
            progress=lambda *a: calls.append(a),
        )
        stored = {
            s.name: store.get_model(s.name, SETTINGS, FP) for s in sources
        }
    # Only the two whole models were timed: every brick was stored.
    assert calls[0] == ("chain", 0, 2)
    assert calls[-1] == ("res", 2, 2)
    assert [r["new_unique_bricks"] for r in report["runs"]] == [0, 0]
    for row in report["runs"]:
        assert row["estimated_ms"] == pytest.approx(
            brick_ms * counts[row["model"]]
        )
        assert row["measured_ms"] == stored[row["model"]].center_ms
        assert row["normalized"] == pytest.approx(
            row["estimated_ms"] / row["measured_ms"]
        )
        assert row["estimated_parallel_ms"] <= row["estimated_ms"] + 1e-9
    (corpus,) = report["corpus"]
    assert corpus["granularity"] == 1
    assert corpus["unique_bricks"] == len(details[1].suite)
    assert corpus["total_bricks"] == sum(counts.values())
    normalized = [r["normalized"] for r in report["runs"]]
    assert corpus["geomean_normalized"] == pytest.approx(
        math.sqrt(normalized[0] * normalized[1])
    )
    on_disk = json.loads((tmp_path / "report.json").read_text())
    assert on_disk["runs"] == report["runs"]
    assert on_disk["system"]["id"] == FP.id


def test_run_job_times_missing_bricks_and_stores_them(files, tmp_path):
    sources = job.resolve_models([files["chain"]])
    with Store(":memory:") as store:
        report, details = job.run_job(
            sources,
            [1, 2],
            SETTINGS,
            store,
            FAST,
            fingerprint=FP,
            check_settings=False,
        )
        for g in (1, 2):
            sigs = details[g].suite.signatures
            assert store.missing(sigs, SETTINGS, FP, accept_noisy=True) == []
    assert [c["granularity"] for c in report["corpus"]] == [1, 2]
    for c in report["corpus"]:
        # Setup (decompose, build, trace, warm up) is part of the campaign.
        assert 0 < c["campaign_setup_s"] < c["campaign_wall_s"]
        # What was left out as disturbed: a share of what was taken.
        assert 0 <= c["passes_left_out_share"] <= 1
        assert 0 <= c["model_samples_left_out_share"] <= 1
    for row in report["runs"]:
        assert row["estimated_ms"] > 0 and row["measured_ms"] > 0
        assert row["new_unique_bricks"] >= 1


def test_each_range_gains_the_machine_term_of_the_other_models(files, tmp_path):
    paths = list(files.values())
    for i, path in enumerate(list(paths)):  # four models: three others each
        copy = tmp_path / f"copy{i}.keras"
        shutil.copy(path, copy)
        paths.append(str(copy))
    with Store(":memory:") as store:
        report, _ = job.run_job(
            job.resolve_models(paths),
            [1],
            SETTINGS,
            store,
            FAST,
            fingerprint=FP,
            check_settings=False,
        )
    runs = report["runs"]
    assert len(runs) == 4
    for row in runs:
        assert row["machine_half"] is not None
        assert row["range_half"] >= row["estimate_precision"]
        est = row["estimated_ms"]
        assert row["estimated_low_ms"] <= est <= row["estimated_high_ms"]
        assert row["range_flag"] == "" or row["range_half"] > 0.1
    (corpus,) = report["corpus"]
    assert corpus["flagged"] == sum(bool(r["range_flag"]) for r in runs)
    assert corpus["range_holds"] == sum(
        r["estimated_low_ms"] <= r["measured_ms"] <= r["estimated_high_ms"]
        for r in runs
    )


def test_measure_and_estimate_models(files):
    sources = job.resolve_models([files["chain"]])
    with Store(":memory:") as store:
        with pytest.raises(errors.Error, match="no timing"):
            steps.estimate_models(sources, 1, SETTINGS, FP, store)
        d = sources[0].decompose(1)
        for b in d.bricks:
            store.put(b.signature, SETTINGS, FP, _timing(0.5))
        (row,) = steps.estimate_models(sources, 1, SETTINGS, FP, store)
        assert row["estimated_ms"] == pytest.approx(0.5 * len(d.bricks))
        assert row["measured_ms"] is None and row["normalized"] is None
        measured = steps.measure_models(
            sources, SETTINGS, FP, store, FAST, check_settings=False
        )
        (row,) = steps.estimate_models(
            sources, 1, SETTINGS, FP, store, "parallel"
        )
    assert row["measured_ms"] == measured["chain"].center_ms
    assert row["normalized"] == pytest.approx(
        row["estimated_ms"] / row["measured_ms"]
    )


@pytest.mark.parametrize("protocol", ["chain", "loop"])
def test_a_brick_that_cannot_be_timed_is_recorded_and_the_rest_go_on(
    files, tmp_path, protocol
):
    path = tmp_path / "loose.keras"
    models.loose().save(path)
    settings = dataclasses.replace(SETTINGS, protocol=protocol)
    sources = job.resolve_models([str(path), files["chain"]])
    d = sources[0].decompose(1)
    (relu,) = [b.signature for b in d.bricks if b.class_names == ("ReLU",)]
    logged = []
    with Store(tmp_path / "s.sqlite") as store:
        result = job.run_granularity(
            sources, 1, settings, FP, store, FAST,
            check_settings=False, log=logged.append,
        )  # fmt: skip
        failures = store.failures(settings, FP)
        stored = store.results(settings, FP, accept_noisy=True)
        measured = store.get_model("loose", settings, FP)
    # Only the ReLU's brick (its input's last dimension is open) failed.
    assert list(result.failed) == [relu] == list(failures)
    assert "unknown dimension" in failures[relu]
    assert set(stored) == set(result.suite.signatures) - {relu}
    loose, chain = result.runs
    assert loose["failed_bricks"] == {relu: failures[relu]}
    assert math.isnan(loose["estimated_ms"]) and math.isnan(loose["normalized"])
    assert loose["measured_ms"] == measured.center_ms >= 0  # Tiny: ~0 ms.
    assert chain["failed_bricks"] == {} and chain["estimated_ms"] > 0
    # The corpus figures are those of the model that has an estimate.
    assert result.corpus["failed_bricks"] == 1
    assert result.corpus["geomean_normalized"] == pytest.approx(
        chain["normalized"]
    )
    assert any(f"brick {relu} failed" in line for line in logged)
    assert any(
        line.startswith("G=1 loose:") and "not estimated" in line
        for line in logged
    )
    text = report.format_report({"runs": result.runs, "corpus": []})
    assert "| failed bricks |" in text and relu in text
    assert relu in report.format_failed(result.runs)
    assert report.format_failed([chain]) == ""


def test_recipes_and_decompositions_estimate_alike(files):
    from dlbricks_tf.portable import recipe

    (source,) = job.resolve_models([files["chain"]])
    d = source.decompose(1)
    plans = [("chain", d), ("chain", recipe.from_decomposition("chain", d))]
    with Store(":memory:") as store:
        for b in d.bricks:
            store.put(b.signature, SETTINGS, FP, _timing(0.25))
        store.put_model("chain", SETTINGS, FP, _timing(1.0))
        from_d, from_recipe = steps.estimate_plans(plans, SETTINGS, FP, store)
    assert from_d == from_recipe
    assert from_d["granularity"] == 1 and from_d["measured_ms"] == 1.0
    assert from_d["estimated_ms"] == pytest.approx(0.25 * len(d.bricks))


def test_corpus_row_keeps_the_wall_clock_figures_in_order(files):
    from dlbricks_tf.cutting import suite as suite_lib

    (source,) = job.resolve_models([files["chain"]])
    d = source.decompose(1)
    results = {b.signature: _timing(0.5) for b in d.bricks}
    measured = {"chain": Timing(1.8, 2.0, 2.0, 2.5, 10, 1.9, 2.2, False)}
    run = job.model_row("chain", 1, SETTINGS, measured["chain"], results, d)
    # The measured interval (the median's, without a mean), for the charts.
    assert (run["measured_ci_low_ms"], run["measured_ci_high_ms"]) == (1.9, 2.2)
    suite = suite_lib.build_suite({"chain": d})
    row = job.corpus_row(
        1, False, [run], measured, results, suite, b_s=2.0, a_s=1.0
    )
    keys = list(row)
    at = keys.index("split")
    assert keys[at : at + 4] == ["split", "b_s", "a_s", "unique_bricks"]
    assert row["geomean_normalized"] == pytest.approx(run["normalized"])
    assert row["speedup"] == pytest.approx(2.0 / (0.5 * len(suite)))
    assert run["normalized"] == pytest.approx(0.5 * len(d.bricks) / 2.0)


def test_write_report_replaces_non_finite_numbers(tmp_path):
    report_json.write_report(
        {"runs": [{"normalized": math.inf}]}, tmp_path / "r"
    )
    assert json.loads((tmp_path / "r").read_text()) == {
        "runs": [{"normalized": None}]
    }


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
