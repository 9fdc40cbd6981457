"""Tests of tools/dlbricks.py: the command line.

Tiny models saved to .keras files, tight timing caps: the checks are exit
codes, the one-line errors, the files written, the TensorBoard event files
read back, and the real TensorBoard server asked for its runs and tags.
The whole job (`run`) is a subprocess, as a user starts it: its thread
pools set from the flags, nothing on stderr; the other commands run in
this process.
"""

import dataclasses
import json
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request

import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator

import dlbricks_tf
from dlbricks_tf.machine.fingerprint import SystemFingerprint
from dlbricks_tf.machine.settings import RunSettings
from dlbricks_tf.stats import Timing
from dlbricks_tf.storing.store import Store
from tests import models
from tests.cli import FAST, dlbricks, subprocess_dlbricks


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    paths = []
    for builder in (models.chain, models.residual):
        model = builder()[0]
        paths.append(str(folder / f"{model.name}.keras"))
        model.save(paths[-1])
    return paths


@pytest.fixture(scope="module")
def ran(files, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "out"
    proc = subprocess_dlbricks(
        "run",
        f"--models={','.join(files)}",
        "--granularity=1,2",
        f"--out={out}",
        "--graphs=1",
        *FAST,
    )
    assert proc.returncode == 0, proc.stderr
    return out, proc


def test_run_writes_store_report_and_logs(ran):
    out, proc = ran
    assert proc.stderr == ""
    lines = proc.stdout.splitlines()
    assert (
        lines[-1] == f"TensorBoard: tensorboard --logdir {out / 'tensorboard'}"
    )
    assert "| model | G | measured ms | sequential ms | parallel ms " in (
        proc.stdout
    )
    report = json.loads((out / "report.json").read_text())
    assert [(r["model"], r["granularity"]) for r in report["runs"]] == [
        ("chain", 1),
        ("residual", 1),
        ("chain", 2),
        ("residual", 2),
    ]
    for r in report["runs"]:
        assert r["normalized"] == pytest.approx(
            r["estimated_ms"] / r["measured_ms"]
        )
        assert (
            f"| {r['model']} | {r['granularity']} | {r['measured_ms']:.3f} |"
            in proc.stdout
        )
    assert [c["granularity"] for c in report["corpus"]] == [1, 2]
    assert report["settings"]["intra_op_threads"] == 1
    assert (out / "store.sqlite").is_file()


def test_event_files_hold_the_report(ran):
    out, _ = ran
    report = json.loads((out / "report.json").read_text())
    acc = event_accumulator.EventAccumulator(
        str(out / "tensorboard" / "models" / "chain"),
        size_guidance={event_accumulator.TENSORS: 0},
    )
    acc.Reload()
    measured = {
        e.step: float(tf.make_ndarray(e.tensor_proto))
        for e in acc.Tensors("latency/measured_ms")
    }
    assert measured == pytest.approx(
        {
            r["granularity"]: r["measured_ms"]
            for r in report["runs"]
            if r["model"] == "chain"
        }
    )
    runs = {
        str(p.parent.relative_to(out / "tensorboard"))
        for p in (out / "tensorboard").glob("**/events.out.tfevents.*")
    }
    assert {"models/chain", "models/residual", "hparams", "hparams/G=1",
            "hparams/G=2", "tables", "charts"} <= runs  # fmt: skip
    assert sum(r.startswith("graphs/") for r in runs) == 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get_json(url: str):
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def test_tensorboard_server_serves_the_runs_and_tags(ran):
    out, _ = ran
    port = _free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensorboard.main",
            f"--logdir={out / 'tensorboard'}",
            "--host=127.0.0.1",
            f"--port={port}",
            "--load_fast=false",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        runs = []
        while time.monotonic() < deadline:
            assert server.poll() is None, "TensorBoard exited early"
            try:
                runs = _get_json(f"{base}/data/runs")
            except OSError:
                runs = []
            if "models/chain" in runs and "charts" in runs:
                break
            time.sleep(0.5)
        assert {"models/chain", "models/residual", "tables"} <= set(runs)
        scalars = _get_json(f"{base}/data/plugin/scalars/tags")
        assert "latency/normalized" in scalars["models/chain"]
        assert "corpus/speedup" in scalars["hparams/G=2"]
        text = _get_json(f"{base}/data/plugin/text/tags")
        assert "results" in text["tables"]
        images = _get_json(f"{base}/data/plugin/images/tags")
        assert "similarity" in images["charts"]
        graphs = _get_json(f"{base}/data/plugin/graphs/info")
        assert any(r.startswith("graphs/") for r in graphs)
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def test_decompose_estimate_and_merge(ran, files, tmp_path):
    out, _ = ran
    proc = dlbricks("decompose", f"--models={files[0]}", "--granularity=2")
    assert proc.returncode == 0, proc.stderr
    assert "## chain (G=2)" in proc.stdout
    assert "| (corpus) |" in proc.stdout

    db = out / "store.sqlite"
    proc = dlbricks(
        "estimate",
        f"--models={','.join(files)}",
        f"--db={db}",
        "--mode=parallel",
        "--intra_op_threads=1",
    )
    assert proc.returncode == 0, proc.stderr
    assert "| chain | 1 | parallel |" in proc.stdout
    assert "| residual | 1 | parallel |" in proc.stdout

    copy = tmp_path / "copy.sqlite"
    shutil.copy(db, copy)
    merged = tmp_path / "merged.sqlite"
    proc = dlbricks("merge", f"--db={merged}", str(copy), str(db))
    assert proc.returncode == 0, proc.stderr
    added = [int(line.split(": ")[1].split()[0]) for line in
             proc.stdout.splitlines() if "result(s) added" in line]  # fmt: skip
    assert added[0] > 0 and added[1] == 0  # The second copy adds nothing.


def test_bench_measure_then_estimate(files, tmp_path):
    db = tmp_path / "s.sqlite"
    common = [f"--models={files[0]}", f"--db={db}"]
    proc = dlbricks("bench", *common, *FAST)
    assert proc.returncode == 0, proc.stderr
    assert "G=1: timed" in proc.stdout
    proc = dlbricks("measure", *common, *FAST)
    assert proc.returncode == 0, proc.stderr
    assert "| chain |" in proc.stdout
    proc = dlbricks("estimate", *common)
    assert proc.returncode == 0, proc.stderr
    row = next(x for x in proc.stdout.splitlines() if x.startswith("| chain"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert float(cells[3]) > 0 and float(cells[6]) > 0  # estimate, measured


def test_bench_rotates_input_and_weight_copies(files, tmp_path):
    db = tmp_path / "s.sqlite"
    proc = dlbricks(
        "bench",
        f"--models={files[0]}",
        f"--db={db}",
        "--input_copies=3",
        "--weight_copies=2",
        "--protocol=loop",  # Copies are the loop protocol's.
        *FAST,
    )
    assert proc.returncode == 0, proc.stderr
    with sqlite3.connect(db) as con:
        ks = [k for (k,) in con.execute(
            "SELECT calls_per_sample FROM brick_results")]  # fmt: skip
    # An iteration calls each of max(3, 2) copies once: K is a multiple.
    assert len(ks) >= 4 and all(k % 3 == 0 for k in ks), ks


def test_fuse_cuts_conv_bn_relu_units_for_bench_and_estimate(files, tmp_path):
    proc = dlbricks("decompose", f"--models={files[0]}", "--fuse")
    assert proc.returncode == 0, proc.stderr
    assert "Conv2D, BatchNormalization, ReLU" in proc.stdout
    db = tmp_path / "s.sqlite"
    common = [f"--models={files[0]}", f"--db={db}"]
    proc = dlbricks("bench", "--fuse", *common, *FAST)
    assert proc.returncode == 0, proc.stderr
    # chain at G=1 fused: two conv units (3 and 8 channels in), the
    # pooling and the dense layer.
    assert "4 unique bricks of 4" in proc.stdout
    proc = dlbricks("estimate", "--fuse", *common)
    assert proc.returncode == 0, proc.stderr
    assert "| chain | 1 |" in proc.stdout
    # Cut the other way, the store lacks the lone Conv2D and BN bricks.
    proc = dlbricks("estimate", *common)
    assert proc.returncode == 1
    assert "missing" in proc.stderr.lower(), proc.stderr


def test_run_records_a_brick_that_cannot_be_timed_and_times_the_rest(
    files, tmp_path
):
    import dlbricks_tf
    from dlbricks_tf.machine.fingerprint import system_fingerprint
    from dlbricks_tf.machine.settings import RunSettings
    from dlbricks_tf.storing.store import Store

    loose = tmp_path / "loose.keras"
    models.loose().save(loose)
    out = tmp_path / "out"
    args = [
        "run",
        "--import=tests.models",  # Registers the loose model's layer.
        f"--models={loose},{files[0]}",
        f"--out={out}",
        "--graphs=0",
        *FAST,
    ]
    cut = {p: dlbricks_tf.decompose(p, 1) for p in (str(loose), files[0])}
    (relu,) = [
        b.signature
        for b in cut[str(loose)].bricks
        if b.class_names == ("ReLU",)
    ]
    everything = {b.signature for d in cut.values() for b in d.bricks}
    settings = RunSettings.default(1, intra_op_threads=1)
    fp = system_fingerprint()
    for _ in range(2):  # A rerun tries the failed brick again.
        proc = dlbricks(*args)
        assert proc.returncode == 1, proc.stderr
        (err,) = proc.stderr.strip().splitlines()
        assert err.startswith("dlbricks: error: 1 brick(s) could not")
        assert relu in err and "Run the same command again" in err
        assert f"brick {relu} failed: " in proc.stdout
        summary = proc.stdout.strip().splitlines()[-1]
        assert summary.startswith("Failed: 1 brick(s)"), proc.stdout
        assert relu in summary and "No estimate for loose G=1." in summary
        loose_row, chain_row = json.loads((out / "report.json").read_text())[
            "runs"
        ]
        assert loose_row["estimated_ms"] is None
        assert list(loose_row["failed_bricks"]) == [relu]
        # Measured all the same (three tiny layers: about 0 ms).
        assert loose_row["measured_ms"] >= 0
        assert chain_row["estimated_ms"] > 0 and chain_row["measured_ms"] > 0
        with Store(out / "store.sqlite") as store:
            failures = store.failures(settings, fp)
            stored = set(store.results(settings, fp, accept_noisy=True))
        assert list(failures) == [relu]
        assert "unknown dimension" in failures[relu]
        assert stored == everything - {relu}


# An unknown model name and a missing model file: bad_input_test.py
# (unknown_model, missing_file), which also checks the store is untouched.
@pytest.mark.parametrize(
    "args, code, words",
    [
        (["--granularity=0"], 2, "--granularity"),
        (["analyze", "--fuse"], 2, "analyze cuts models by layer calls"),
        (["--batch_size=0"], 2, "batch_size"),
        (["bogus"], 2, "Unknown command 'bogus'"),
        (["estimate", "--db=/no/such/store.sqlite"], 1, "does not exist"),
    ],
)
def test_bad_input_is_one_line(args, code, words, tmp_path):
    proc = dlbricks(*args, f"--out={tmp_path / 'out'}")
    assert proc.returncode == code
    assert proc.stderr.startswith("dlbricks: error: ")
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert words in proc.stderr
    assert "Traceback" not in proc.stderr


def test_corrupt_model_file_is_one_line(tmp_path):
    bad = tmp_path / "bad.keras"
    bad.write_bytes(b"not a zip archive")
    proc = dlbricks("decompose", f"--models={bad}")
    assert proc.returncode == 1
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "bad.keras" in proc.stderr


def test_report_notes_results_stored_before_the_onednn_rule(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.json").write_text(json.dumps({"runs": [], "corpus": []}))
    new = SystemFingerprint(
        "Test CPU", 2, 2, "Linux", "x86_64", "3.11", "2.21", "3.15", "", True
    )
    new = dataclasses.replace(new, cpu_kind="GenuineTest family 6")
    # As read back from a store written before the rule was recorded.
    old = SystemFingerprint.from_dict(
        {
            k: v
            for k, v in new.to_dict().items()
            if k not in ("onednn_rule", "cpu_kind")
        }
    )
    timing = Timing(1.0, 1.0, 1.0, 1.0, 10, 1.0, 1.0, False, 5, 0.3, 0.004)
    with Store(out / "store.sqlite") as store:
        store.put("a", RunSettings(1, 2, 1), old, timing)
        store.put("a", RunSettings(1, 2, 1), new, timing)
    proc = dlbricks("report", f"--out={out}")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-2:] == [
        f"Note: 1 result (fingerprint {old.id}) predates the oneDNN rule: "
        "its oneDNN label may be the old x86 default, not what TensorFlow "
        "did.",
        f"Note: 1 result (fingerprint {old.id}) predates the CPU's family "
        "and model in the fingerprint: its machine is known by its CPU's "
        "model name alone, which two CPU generations may share.",
    ]


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))


def test_a_flag_of_another_command_is_refused_in_one_line(files):
    proc = dlbricks("decompose", f"--models={files[0]}", "--retime")
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "dlbricks: error: decompose does not use --retime (a flag of run); "
        "drop it. See --helpfull."
    ]


@pytest.mark.parametrize(
    "command, flag",
    [
        ("decompose", "--min_samples=3"),
        ("estimate", "--max_samples=50"),
        ("export", "--protocol=loop"),
        ("merge", "--reference"),
        ("report", "--chain_links=4"),
        ("analyze", "--input_copies=2"),
    ],
)
def test_a_timing_flag_is_refused_by_a_command_that_does_not_time(
    files, command, flag, tmp_path
):
    name = flag.split("=")[0]
    # Before anything is read or written: no model, store or output.
    proc = dlbricks(command, flag, f"--out={tmp_path / 'out'}")
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"dlbricks: error: {command} does not use {name} (a timing flag of "
        "run, bench and measure); drop it. See --helpfull."
    ]
    assert not (tmp_path / "out").exists()


def test_estimate_reads_the_protocol_of_the_timings_it_adds(files, tmp_path):
    # --protocol picks the stored timings: those of bench's protocol.
    db = tmp_path / "s.sqlite"
    common = [f"--models={files[0]}", f"--db={db}"]
    proc = dlbricks("bench", "--protocol=loop", *common, *FAST)
    assert proc.returncode == 0, proc.stderr
    proc = dlbricks("estimate", "--protocol=loop", *common)
    assert proc.returncode == 0, proc.stderr
    assert "| chain | 1 |" in proc.stdout
    proc = dlbricks("estimate", *common)  # Chains: none stored.
    assert proc.returncode == 1 and "no timing" in proc.stderr, proc.stderr


def test_run_and_measure_on_onnx_runtime(files, tmp_path):
    pytest.importorskip("onnxruntime")
    out = tmp_path / "out"
    proc = dlbricks(
        "run",
        f"--models={files[0]}",
        "--backend=onnxruntime",
        f"--out={out}",
        "--graphs=0",
        *FAST,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["backend"] == "onnxruntime"
    assert report["settings"]["protocol"] == "chain"
    (row,) = report["runs"]
    assert row["measured_ms"] > 0 and row["estimated_ms"] > 0
    assert list((out / "onnx").glob("brick-*.onnx"))
    ort = RunSettings.from_dict(report["settings"])
    system = {k: v for k, v in report["system"].items() if k != "id"}
    fp = SystemFingerprint.from_dict(system)
    assert fp.id == report["system"]["id"]
    unique = {b.signature for b in dlbricks_tf.decompose(files[0], 1).bricks}
    with Store(out / "store.sqlite") as store:
        assert set(store.results(ort, fp)) == unique
        tf_settings = dataclasses.replace(ort, backend="tf", protocol=None)
        assert store.results(tf_settings, fp) == {}
    measured = dlbricks(
        "measure",
        f"--models={files[0]}",
        "--backend=onnxruntime",
        f"--out={out}",
        *FAST,
    )
    assert measured.returncode == 0, measured.stderr
    name = row["model"]
    assert any(
        line.startswith(f"| {name} |") for line in measured.stdout.splitlines()
    )
