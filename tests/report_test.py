"""Tests of dlbricks_tf/reporting/report.py: the text tables of a job."""

import pytest

import dlbricks_tf
from dlbricks_tf.machine.fingerprint import SystemFingerprint
from dlbricks_tf.reporting import report
from tests import models

REPORT = {
    "runs": [
        {
            "model": "a",
            "granularity": 1,
            "measured_ms": 2.0,
            "estimated_ms": 1.9,
            "estimated_parallel_ms": 1.5,
            "normalized": 0.95,
        },
        {
            "model": "b",
            "granularity": 1,
            "measured_ms": 4.0,
            "estimated_ms": 4.4,
            "estimated_parallel_ms": 4.4,
            "normalized": 1.1,
        },
    ],
    "corpus": [
        {
            "granularity": 1,
            "geomean_normalized": 1.0223,
            "min_normalized": 0.95,
            "max_normalized": 1.1,
            "speedup": 3.456,
            "unique_bricks": 7,
            "total_bricks": 12,
            "campaign_wall_s": 10.04,
            "end_to_end_wall_s": 20.0,
        }
    ],
}


def test_format_report():
    lines = report.format_report(REPORT).splitlines()
    # A report without `normalized_median` or `normalized_min` (older
    # runs) shows dashes there.
    assert lines[2] == "| a | 1 | 2.000 | 1.900 | 1.500 | 0.950 | - | - |"
    assert lines[3] == "| b | 1 | 4.000 | 4.400 | 4.400 | 1.100 | - | - |"
    assert lines[-1] == (
        "| 1 | 1.022 | 0.950 | 1.100 | 3.46 | 7/12 | 10.0 | 20.0 |"
    )
    assert "repeat diff" not in lines[-3]


def test_format_report_shows_the_median_ratio_and_the_steal():
    runs = [{**REPORT["runs"][0], "normalized_median": 0.875}]
    corpus = [
        {**REPORT["corpus"][0], "steal_share": 0.0123, "steal_peak_share": 0.2}
    ]
    lines = report.format_report(
        {**REPORT, "runs": runs, "corpus": corpus}
    ).splitlines()
    assert lines[0].endswith("| normalized (median) | normalized (min) |")
    assert lines[2] == "| a | 1 | 2.000 | 1.900 | 1.500 | 0.950 | 0.875 | - |"
    assert lines[-3].endswith("| steal % (peak) |")
    assert lines[-1].endswith("| 1.2 (20.0) |")


def test_format_report_shows_the_reference_after_the_steal():
    corpus = [
        {
            **REPORT["corpus"][0],
            "steal_share": 0.0,
            "steal_peak_share": 0.0,
            "reference_ratio": 1.0834,
            "reference_spread": 0.0412,
        }
    ]
    lines = report.format_report({**REPORT, "corpus": corpus}).splitlines()
    assert lines[-3].endswith("| steal % (peak) | reference x (spread) |")
    assert lines[-1].endswith("| 0.0 (0.0) | 1.083 (4.1%) |")


def test_format_report_shows_what_was_left_out_after_the_steal():
    corpus = [
        {
            **REPORT["corpus"][0],
            "steal_share": 0.0,
            "steal_peak_share": 0.0,
            "passes_left_out_share": 0.2345,
            "model_samples_left_out_share": None,
        }
    ]
    lines = report.format_report({**REPORT, "corpus": corpus}).splitlines()
    assert lines[-3].endswith(
        "| steal % (peak) | left out % (passes / models) |"
    )
    assert lines[-1].endswith("| 0.0 (0.0) | 23.4 / - |")


def test_format_report_adds_the_repeat_column():
    corpus = [{**REPORT["corpus"][0], "repeat_median_rel_diff": 0.0123}]
    text = report.format_report({**REPORT, "corpus": corpus})
    assert text.splitlines()[-3].endswith("| repeat diff |")
    assert text.splitlines()[-1].endswith("| 0.012 |")


def test_format_report_adds_the_model_drift_after_repeat():
    first = REPORT["corpus"][0]
    corpus = [first, {**first, "model_drift_median_rel_diff": 0.081}]
    lines = report.format_report({**REPORT, "corpus": corpus}).splitlines()
    assert lines[-4].endswith("| end-to-end s | model drift |")
    # The first pass has nothing to move from: a dash.
    assert lines[-2].endswith("| 20.0 | - |")
    assert lines[-1].endswith("| 20.0 | 0.081 |")


def test_format_report_adds_the_setup_column_before_repeat():
    corpus = [
        {
            **REPORT["corpus"][0],
            "campaign_setup_s": 6.25,
            "bricks_timed": 250,
            "repeat_median_rel_diff": 0.0123,
        }
    ]
    lines = report.format_report({**REPORT, "corpus": corpus}).splitlines()
    assert lines[-3].endswith(
        "| end-to-end s | setup s | setup ms/brick | repeat diff |"
    )
    # 6.25 s over 250 bricks: 25 ms a brick.
    assert lines[-1].endswith("| 10.0 | 20.0 | 6.2 | 25.0 | 0.012 |")


def test_format_report_adds_each_models_estimate_precision():
    runs = [{**REPORT["runs"][0], "estimate_precision": 0.0123}]
    lines = report.format_report({**REPORT, "runs": runs}).splitlines()
    assert lines[0].endswith("| normalized (min) | estimate +-% |")
    assert lines[2].endswith("| 1.2 |")


def test_format_decompositions_lists_bricks_and_counts():
    model, _ = models.chain()
    d = dlbricks_tf.decompose(model, granularity=1)
    text = report.format_decompositions({"x": d, "y": d})
    assert f"## x (G=1): {d.num_calls} layer calls" in text
    first = d.bricks[0]
    assert f"| 0 | {first.layers[0]} | {first.class_names[0]} |" in text
    assert "(16, 16, 3) float32" in text
    unique = len({b.signature for b in d.bricks})
    lines = text.splitlines()
    assert lines[-3] == f"| x | {len(d.bricks)} | {unique} | {unique} |"
    assert lines[-2] == f"| y | {len(d.bricks)} | {unique} | 0 |"
    assert (
        lines[-1] == f"| (corpus) | {2 * len(d.bricks)} | {unique} | {unique} |"
    )
    assert "## x" not in report.format_decompositions({"x": d}, bricks=False)


def test_format_decompositions_names_the_merged_calls():
    model, _ = models.repeated()
    d = dlbricks_tf.decompose(model, granularity=1)
    text = report.format_decompositions({"r": d})
    assert (
        f"## r (G=1): {d.num_calls} layer calls, {len(d.bricks)} bricks; "
        "3 calls repeat an earlier one and are merged into it"
    ) in text
    assert (
        "Merged (TensorFlow computes each once): relu_b = relu_a, "
        "pad_b = pad_a, pool_b = pool_a"
    ) in text


def test_format_estimates_shows_missing_measurements_as_dashes():
    row = {
        "model": "a",
        "granularity": 2,
        "mode": "parallel",
        "estimated_ms": 1.0,
        "low_ms": 0.9,
        "high_ms": 1.2,
        "measured_ms": None,
        "normalized": None,
        "noisy_bricks": 1,
    }
    assert report.format_estimates([row]).splitlines()[-1] == (
        "| a | 2 | parallel | 1.000 | 0.900 | 1.200 | - | - | 1 |"
    )


def test_rows_say_how_their_estimate_was_obtained():
    base = {
        "model": "a",
        "granularity": 3,
        "mode": "sequential",
        "estimated_ms": 1.0,
        "low_ms": 0.9,
        "high_ms": 1.2,
        "measured_ms": 1.0,
        "normalized": 1.0,
        "noisy_bricks": 0,
    }
    covered = {
        **base,
        "method": "covered+predicted",
        "sources": {"G=1": 0.1, "G=3": 0.7, "predicted": 0.2},
        "predicted_bricks": 2,
    }
    timed = {**base, "model": "b", "method": "timed"}
    lines = report.format_estimates([covered, timed]).splitlines()
    assert lines[0].endswith("| noisy bricks | source |")
    assert lines[2].endswith(
        "| covered: G=3 70%, G=1 10%; predicted 20% (2 bricks) |"
    )
    assert lines[3].endswith("| 0 | timed |")
    assert report.format_source(
        {"method": "predicted", "sources": {"timed": 0.9, "predicted": 0.1}}
    ) == ("predicted 10%")
    # Rows without a method (older rows) get no column.
    assert "source" not in report.format_estimates([base])
    # A report whose rows were all timed keeps its columns; one that is
    # not shows where each estimate came from.
    runs = [{**r, "method": "timed"} for r in REPORT["runs"]]
    assert "source" not in report.format_report({**REPORT, "runs": runs})
    runs[1] = {**runs[1], "method": "covered", "sources": {"G=2": 1.0}}
    lines = report.format_report({**REPORT, "runs": runs}).splitlines()
    assert lines[0].endswith("| source |")
    assert lines[2].endswith("| timed |")
    assert lines[3].endswith("| covered: G=2 100% |")


_MACHINE = {
    "cpu_model": "Test CPU",
    "physical_cores": 2,
    "logical_cpus": 2,
    "os": "Linux-test",
    "machine": "x86_64",
    "python": "3.11.0",
    "tensorflow": "2.21.0",
    "keras": "3.15.1",
    "onnxruntime": "",
    "onednn": True,
}


def test_onednn_note_names_results_of_old_fingerprints():
    # Read back from a store written before the rule: no `onednn_rule`.
    old = SystemFingerprint.from_dict(_MACHINE)
    other = SystemFingerprint.from_dict({**_MACHINE, "cpu_model": "Other"})
    new = SystemFingerprint(**_MACHINE)
    note = report.format_onednn_note([(old, 12), (new, 5), (other, 1)])
    assert note == (
        f"Note: 13 results (fingerprints {old.id}, {other.id}) predate the "
        "oneDNN rule: their oneDNN label may be the old x86 default, not "
        "what TensorFlow did."
    )
    assert "\n" not in note
    single = report.format_onednn_note([(old, 1)])
    assert single.startswith(
        f"Note: 1 result (fingerprint {old.id}) predates the oneDNN rule: its "
    )
    many = [
        (SystemFingerprint.from_dict({**_MACHINE, "physical_cores": n}), 1)
        for n in range(1, 6)
    ]
    ids = ", ".join(fp.id for fp, _ in many[:3])
    assert report.format_onednn_note(many).startswith(
        f"Note: 5 results (fingerprints {ids} and 2 more) predate"
    )


def test_cpu_note_names_results_of_fingerprints_without_cpu_kind():
    old = SystemFingerprint(**_MACHINE)
    new = SystemFingerprint(**_MACHINE, cpu_kind="AuthenticAMD family 25")
    assert old.legacy_cpu and not new.legacy_cpu
    assert report.format_cpu_note([(old, 3), (new, 5)]) == (
        f"Note: 3 results (fingerprint {old.id}) predate the CPU's family "
        "and model in the fingerprint: their machine is known by its CPU's "
        "model name alone, which two CPU generations may share."
    )
    assert report.format_cpu_note([(new, 5), (old, 0)]) == ""


def test_onednn_note_is_empty_without_old_results():
    old = SystemFingerprint.from_dict(_MACHINE)
    new = SystemFingerprint(**_MACHINE)
    assert report.format_onednn_note([]) == ""
    assert report.format_onednn_note([(new, 5)]) == ""
    # An old fingerprint that keys no result (only a failure) says nothing.
    assert report.format_onednn_note([(old, 0), (new, 5)]) == ""


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
