"""Bad input to the command line: one line, a non-zero exit, nothing lost.

Each case runs the command line against a store that exists before it (a
real one, written by `Store` from hand-made timings, or a broken one when
the store is the bad input) and checks the exit code, that stderr is
exactly one line `dlbricks: error: ...` naming the problem, with no
traceback, and that the store file and its -wal are byte for byte what
they were. Most cases run in this process (`cli.dlbricks`); those of
`SUBPROCESS` run `python -m tools.dlbricks`, side by side with the others,
for the exit codes and stderr of a fresh process (and to hide
onnxruntime from it). Each test checks its own case.
"""

import concurrent.futures
import contextlib
import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import zipfile
from pathlib import Path

import keras
import pytest

import dlbricks_tf
from dlbricks_tf.cutting import suite
from dlbricks_tf.machine.fingerprint import system_fingerprint
from dlbricks_tf.machine.settings import RunSettings
from dlbricks_tf.portable import export
from dlbricks_tf.stats import Timing
from dlbricks_tf.storing.store import Store
from tests import cli, models

# The cases set their own thread counts; the rest as for every CLI test,
# to the commands that time.
FAST = [a for a in cli.FAST if not a.startswith("--intra_op_threads")]
TIMING_COMMANDS = ("run", "bench", "measure")
TOO_MANY = len(os.sched_getaffinity(0)) + 1  # Threads beyond the machine.

# (id, arguments, exit code, words stderr must hold, store the case gets).
# In arguments, {d} is the folder of input files, {db} the case's store
# and {case} the case's own folder; the store is "good" unless named.
CASES = [
    # Models that cannot be found or read.
    (
        "unknown_model",
        "bench --models=NoSuchNet",
        1,
        "Unknown model 'NoSuchNet'",
        "good",
    ),
    ("missing_file", "run --models={d}/absent.keras", 1, "does not exist"),
    ("truncated_keras", "bench --models={d}/truncated.keras", 1, "truncated"),
    ("corrupt_h5", "run --models={d}/junk.h5", 1, "junk.h5"),
    ("malformed_json", "decompose --models={d}/malformed.json", 1, "JSON"),
    ("json_not_a_model", "estimate --models={d}/list.json", 1, "config"),
    # Layers Keras does not know, and code it must not run.
    ("unregistered_json", "bench --models={d}/custom.json", 1, "MyLayer"),
    ("unregistered_keras", "run --models={d}/custom.keras", 1, "MyLayer"),
    ("lambda_bench", "bench --models={d}/lambda.keras", 1, "--unsafe_"),
    ("lambda_estimate", "estimate --models={d}/lambda.keras", 1, "--unsafe_"),
    # Flags out of range.
    ("granularity_0", "bench --granularity=0", 2, "--granularity"),
    ("granularity_neg", "run --granularity=1,-2", 2, "--granularity"),
    ("granularity_text", "estimate --granularity=two", 2, "--granularity"),
    ("batch_0", "bench --batch_size=0", 2, "--batch_size"),
    ("batch_neg", "run --batch_size=-4", 2, "--batch_size"),
    ("intra_0", "bench --intra_op_threads=0", 2, "--intra_op_threads"),
    ("inter_0", "run --inter_op_threads=0", 2, "--inter_op_threads"),
    (
        "intra_too_many",
        f"bench --intra_op_threads={TOO_MANY}",
        2,
        "--intra_op_threads must be at most",
    ),
    (
        "inter_too_many",
        f"run --inter_op_threads={TOO_MANY}",
        2,
        "--inter_op_threads must be at most",
    ),
    # Places that cannot be written.
    ("db_is_a_folder", "bench --db={case}", 1, "is a folder"),
    ("db_under_a_file", "bench --db={db}/x.sqlite", 1, "is a file, not a"),
    ("out_under_a_file", "run --out={d}/chain.keras/o", 1, "is a file, not"),
    # Stores that must not be written to.
    ("store_junk", "bench", 1, "not an SQLite file", "junk"),
    ("store_truncated", "estimate", 1, "corrupt", "truncated"),
    ("store_bad_page", "bench", 1, "corrupt", "bad_page"),
    ("store_foreign", "run", 1, "not a dlbricks_tf store", "foreign"),
    ("store_newer", "estimate", 1, "schema version 99", "newer"),
    # Exported suites: files that do not match the manifest, no manifest,
    # and a backend whose runtime is not installed.
    ("suite_tampered", "bench --suite={d}/tampered", 1, "re-export"),
    ("suite_no_manifest", "bench --suite={d}", 1, "manifest.json"),
    (
        "suite_no_onnxruntime",
        "bench --suite={d}/suite --backend=onnxruntime {no_ort}",
        1,
        "pip install onnxruntime",
    ),
    ("suite_and_models", "bench --suite={d}/suite --models=x", 2, "not both"),
]
STORES = ("good", "junk", "truncated", "bad_page", "foreign", "newer")
# Run as subprocesses: a usage error, bad input, a refused store, and the
# case that hides onnxruntime (a module this process already imported).
SUBPROCESS = ("granularity_0", "truncated_keras", "store_newer")
SUBPROCESS += ("suite_no_onnxruntime",)
SETTINGS = RunSettings.default(1, intra_op_threads=1)


def _save_inputs(folder: Path) -> None:
    """The model files of the cases (one good, the others bad)."""
    chain = models.chain()[0]
    chain.save(folder / "chain.keras")
    good = (folder / "chain.keras").read_bytes()
    (folder / "truncated.keras").write_bytes(good[: len(good) // 2])
    (folder / "junk.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + b"\x00junk" * 99)
    text = chain.to_json()
    (folder / "malformed.json").write_text(text[:-40])
    (folder / "list.json").write_text("[1, 2, 3]")
    config = json.loads(text)
    for layer in config["config"]["layers"]:
        if layer["class_name"] == "ReLU":
            layer["class_name"] = layer["registered_name"] = "MyLayer"
            layer["module"] = "my_private_layers"
    (folder / "custom.json").write_text(json.dumps(config))
    with zipfile.ZipFile(folder / "chain.keras") as src:
        with zipfile.ZipFile(folder / "custom.keras", "w") as dst:
            for item in src.infolist():
                data = src.read(item)
                if item.filename == "config.json":
                    data = json.dumps(config).encode()
                dst.writestr(item, data)
    inp = keras.Input((4,))
    out = keras.layers.Lambda(lambda x: x * 2.0)(inp)
    keras.Model(inp, out, name="doubled").save(folder / "lambda.keras")
    # An exported suite, a copy with one ONNX file changed after export,
    # and an onnxruntime module that cannot be imported.
    unique = suite.build_suite({"chain": dlbricks_tf.decompose(chain, 3)})
    export.export_suite(unique, folder / "suite", granularity=3)
    shutil.copytree(folder / "suite", folder / "tampered")
    onnx_file = sorted((folder / "tampered").glob("bricks/*/brick.onnx"))[0]
    onnx_file.write_bytes(onnx_file.read_bytes() + b"\0")
    (folder / "no_ort").mkdir()
    (folder / "no_ort" / "onnxruntime.py").write_text(
        "raise ImportError('onnxruntime is not installed')\n"
    )


def _save_stores(folder: Path) -> None:
    """One store file per kind of `STORES`: a real one and broken ones."""
    fp = system_fingerprint()
    good = folder / "good.sqlite"
    with Store(good) as store:
        for i in range(40):
            ms = 0.1 * (i + 1)
            timing = Timing(ms, ms, ms, ms, 10, ms, ms, i % 7 == 0)
            store.put(f"{i:016x}", SETTINGS, fp, timing)
        store.put_model("chain", SETTINGS, fp, Timing(2, 2, 2, 2, 9, 2, 2, 0))
    (folder / "junk.sqlite").write_bytes(b"this is not sqlite\n" * 300)
    data = good.read_bytes()
    (folder / "truncated.sqlite").write_bytes(data[: len(data) // 2 + 100])
    shutil.copy(good, folder / "bad_page.sqlite")
    with contextlib.closing(sqlite3.connect(good)) as db:
        size = db.execute("PRAGMA page_size").fetchone()[0]
        pages = db.execute("PRAGMA page_count").fetchone()[0]
    with open(folder / "bad_page.sqlite", "r+b") as f:
        f.seek((pages - 2) * size + 8)  # Inside a b-tree page.
        f.write(b"\xff" * (size // 2))
    with contextlib.closing(sqlite3.connect(folder / "foreign.sqlite")) as db:
        db.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, name)")
        db.execute("INSERT INTO accounts VALUES (1, 'kept')")
        db.commit()
    shutil.copy(good, folder / "newer.sqlite")
    with contextlib.closing(sqlite3.connect(folder / "newer.sqlite")) as db:
        db.execute("UPDATE meta SET value = '99'")
        db.commit()


def _digest(path: Path) -> dict[str, str | None]:
    """Hashes of a store file and its -wal (None where absent)."""
    return {
        suffix: hashlib.sha256(Path(f"{path}{suffix}").read_bytes()).hexdigest()
        if os.path.exists(f"{path}{suffix}")
        else None
        for suffix in ("", "-wal")
    }


def _run_case(case, inputs: Path, folder: Path):
    name, args, code, words, *kind = case
    folder.mkdir()
    db = folder / "store.sqlite"
    shutil.copy(inputs / f"{(kind or ['good'])[0]}.sqlite", db)
    before = _digest(db)
    argv = args.format(d=inputs, db=db, case=folder, no_ort="-").split()
    hide_ort = "-" in argv
    argv = [a for a in argv if a != "-"]
    if not any(a.startswith(("--models=", "--suite=")) for a in argv):
        argv.append(f"--models={inputs / 'chain.keras'}")
    if not any(a.startswith("--db=") for a in argv):
        argv.append(f"--db={db}")
    if not any(a.startswith("--out=") for a in argv):
        argv.append(f"--out={folder / 'out'}")
    if not any(a.startswith("--intra_op_threads") for a in argv):
        argv.append("--intra_op_threads=1")
    if argv[0] in TIMING_COMMANDS:
        argv += FAST
    if name not in SUBPROCESS:
        return cli.dlbricks(*argv), before, _digest(db)
    env = cli.clean_environment()
    if hide_ort:  # Found before the installed onnxruntime.
        paths = [str(inputs / "no_ort"), env["PYTHONPATH"]]
        env["PYTHONPATH"] = os.pathsep.join(paths)
    proc = subprocess.run(
        [sys.executable, "-m", "tools.dlbricks", *argv],
        cwd=cli.ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc, before, _digest(db)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """{case id: future of (process, store digest before, after)}."""
    inputs = tmp_path_factory.mktemp("inputs")
    _save_inputs(inputs)
    _save_stores(inputs)
    cases = tmp_path_factory.mktemp("cases")
    # The subprocesses start first and run while this process runs the
    # other cases, one at a time (flags and stdout are process-wide).
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        done = {
            case[0]: pool.submit(_run_case, case, inputs, cases / case[0])
            for case in CASES
            if case[0] in SUBPROCESS
        }
        for case in CASES:
            if case[0] not in SUBPROCESS:
                future = concurrent.futures.Future()
                future.set_result(_run_case(case, inputs, cases / case[0]))
                done[case[0]] = future
        yield done


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_keeps_the_store(case, outcomes):
    _, _, code, words, *_ = case
    proc, before, after = outcomes[case[0]].result()
    assert proc.returncode == code, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("dlbricks: error: ")
    assert words in lines[0]
    assert "Traceback" not in proc.stderr
    assert after == before  # The store and its -wal, byte for byte.


def test_every_kind_of_store_is_tried():
    assert {c[4] for c in CASES if len(c) > 4} == set(STORES)
    assert set(SUBPROCESS) <= {c[0] for c in CASES}


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
