"""Tests for dlbricks_tf/storing/store.py."""

import contextlib
import csv
import dataclasses
import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from dlbricks_tf.machine.fingerprint import SystemFingerprint
from dlbricks_tf.machine.settings import RunSettings
from dlbricks_tf.stats import Timing
from dlbricks_tf.storing import database, merging
from dlbricks_tf.storing import store as store_lib
from tests import fakes

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETTINGS = RunSettings(batch_size=1, intra_op_threads=2, inter_op_threads=1)
FP = SystemFingerprint(
    cpu_model="Test CPU",
    physical_cores=2,
    logical_cpus=2,
    os="Linux-test",
    machine="x86_64",
    python="3.11.0",
    tensorflow="2.21.0",
    keras="3.15.1",
    onnxruntime="",
    onednn=True,
)


def _timing(ms, noisy=False):
    return Timing(ms, ms, ms, ms, 10, ms, ms, noisy, 5, 0.3, 0.004)


def _count(path, table="brick_results"):
    with sqlite3.connect(path) as db:
        return db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]


def test_put_get_has(tmp_path):
    with store_lib.Store(tmp_path / "s.sqlite") as store:
        assert store.get("sig", SETTINGS, FP) is None
        assert not store.has("sig", SETTINGS, FP)
        store.put("sig", SETTINGS, FP, _timing(1.5))
        assert store.get("sig", SETTINGS, FP) == _timing(1.5)
        assert store.has("sig", SETTINGS, FP)
        other = RunSettings(
            batch_size=8, intra_op_threads=2, inter_op_threads=1
        )
        assert store.get("sig", other, FP) is None


def test_put_twice_replaces_without_duplicates(tmp_path):
    path = tmp_path / "s.sqlite"
    with store_lib.Store(path) as store:
        store.put("sig", SETTINGS, FP, _timing(1.0, noisy=True))
        store.put("sig", SETTINGS, FP, _timing(2.0))
        assert store.get("sig", SETTINGS, FP).median_ms == 2.0
    assert _count(path) == 1
    with sqlite3.connect(path) as db, pytest.raises(sqlite3.IntegrityError):
        db.execute(
            "INSERT INTO brick_results (signature, settings_key,"
            " fingerprint_id, min_ms, median_ms, trimmed_mean_ms, max_ms,"
            " samples, ci_low_ms, ci_high_ms, noisy, calls_per_sample,"
            " dispatch_ms, loop_overhead_ms)"
            " VALUES (?, ?, ?, 1, 1, 1, 1, 1, 1, 1, 0, 1, 0, 0)",
            ("sig", SETTINGS.key(), FP.id),
        )


def test_missing_skips_good_results_and_retries_noisy(tmp_path):
    with store_lib.Store(tmp_path / "s.sqlite") as store:
        store.put("a", SETTINGS, FP, _timing(1.0))
        store.put("b", SETTINGS, FP, _timing(1.0, noisy=True))
        todo = store.missing(["a", "b", "c", "c"], SETTINGS, FP)
        assert todo == ["b", "c"]
        assert store.missing(["a", "b"], SETTINGS, FP, accept_noisy=True) == []
        assert set(store.results(SETTINGS, FP)) == {"a", "b"}
        assert set(store.results(SETTINGS, FP, accept_noisy=False)) == {"a"}


def test_model_results_are_separate(tmp_path):
    with store_lib.Store(tmp_path / "s.sqlite") as store:
        store.put_model("resnet", SETTINGS, FP, _timing(30.0))
        assert store.get_model("resnet", SETTINGS, FP).median_ms == 30.0
        assert store.get("resnet", SETTINGS, FP) is None


def test_schema_version_stored_and_newer_refused(tmp_path):
    path = tmp_path / "s.sqlite"
    with store_lib.Store(path) as store:
        assert store.schema_version == database.SCHEMA_VERSION
    with sqlite3.connect(path) as db:
        db.execute(
            "UPDATE meta SET value = ? WHERE key = 'schema_version'",
            (str(database.SCHEMA_VERSION + 1),),
        )
    with pytest.raises(database.StoreError, match="newer"):
        store_lib.Store(path)


def test_not_a_database_is_a_store_error(tmp_path):
    path = tmp_path / "junk.sqlite"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(database.StoreError):
        store_lib.Store(path)


def test_export_json_and_csv(tmp_path):
    with store_lib.Store(tmp_path / "s.sqlite") as store:
        store.put("a", SETTINGS, FP, _timing(1.0))
        store.put("b", SETTINGS, FP, _timing(2.0, noisy=True))
        store.put_model("m", SETTINGS, FP, _timing(3.0))
        store.export_json(tmp_path / "out.json")
        store.export_csv(tmp_path / "bricks.csv")
        store.export_csv(tmp_path / "models.csv", kind="model")
    data = json.loads((tmp_path / "out.json").read_text())
    assert data["schema_version"] == database.SCHEMA_VERSION
    assert [b["signature"] for b in data["bricks"]] == ["a", "b"]
    assert data["bricks"][1]["noisy"] is True
    assert data["bricks"][0]["settings"] == SETTINGS.to_dict()
    assert data["bricks"][0]["fingerprint_id"] == FP.id
    assert data["models"][0]["model"] == "m"
    with open(tmp_path / "bricks.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["signature"] for r in rows] == ["a", "b"]
    assert float(rows[1]["median_ms"]) == 2.0
    assert rows[0]["batch_size"] == "1"
    with open(tmp_path / "models.csv", newline="") as f:
        assert next(csv.DictReader(f))["model"] == "m"


def test_merge_from_adds_only_absent_results(tmp_path):
    with store_lib.Store(tmp_path / "a.sqlite") as a:
        a.put("x", SETTINGS, FP, _timing(1.0))
        a.put("y", SETTINGS, FP, _timing(1.0))
    with store_lib.Store(tmp_path / "b.sqlite") as b:
        b.put("y", SETTINGS, FP, _timing(9.0))
        b.put_model("m", SETTINGS, FP, _timing(5.0))
        assert b.merge_from(tmp_path / "a.sqlite") == 1
        assert b.get("y", SETTINGS, FP).median_ms == 9.0
        assert b.get("x", SETTINGS, FP).median_ms == 1.0


_WRITER = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {root!r})
    from dlbricks_tf.storing import store as store_lib
    from tests.store_test import FP, SETTINGS, _timing
    with store_lib.Store({path!r}) as store:
        for sig in store.missing(["s%d" % i for i in range(50)], SETTINGS, FP):
            store.put(sig, SETTINGS, FP, _timing(1.0))
            time.sleep(0.02)
    """
)


def _count_while_writing(path):
    try:
        return _count(path) if os.path.exists(path) else 0
    except sqlite3.OperationalError:  # Schema not created yet.
        return 0


def test_resume_after_killed_writer(tmp_path):
    path = str(tmp_path / "s.sqlite")
    code = _WRITER.format(root=_ROOT, path=path)
    writer = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            if _count_while_writing(path) >= 3:
                break
            assert writer.poll() is None, "writer exited early"
            time.sleep(0.01)
    finally:
        writer.kill()
        writer.wait()
    partial = _count(path)
    assert 3 <= partial < 50
    # A resumed run times only what is missing, and nothing twice.
    with store_lib.Store(path) as store:
        todo = store.missing([f"s{i}" for i in range(50)], SETTINGS, FP)
        assert len(todo) == 50 - partial
        for sig in todo:
            store.put(sig, SETTINGS, FP, _timing(2.0))
        assert len(store.results(SETTINGS, FP)) == 50
    assert _count(path) == 50


def _digest(path):
    """Hashes of a store file and its -wal (None where absent)."""
    return {
        suffix: hashlib.sha256(open(f"{path}{suffix}", "rb").read()).digest()
        if os.path.exists(f"{path}{suffix}")
        else None
        for suffix in ("", "-wal")
    }


def _store_with_rows(path, n=300):
    with store_lib.Store(path) as store:
        for i in range(n):
            store.put(f"sig{i:04d}", SETTINGS, FP, _timing(1.0 + i))
    return path


def _corrupt_a_data_page(path):
    """Overwrites the middle of the brick_results table's last page."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        size = db.execute("PRAGMA page_size").fetchone()[0]
        pages = db.execute("PRAGMA page_count").fetchone()[0]
    with open(path, "r+b") as f:
        f.seek((pages - 2) * size + 8)
        f.write(b"\xff" * (size // 2))


def _foreign_database(path):
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, name)")
        db.execute("INSERT INTO accounts VALUES (1, 'x')")
        db.commit()


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda p: p.write_bytes(b"not sqlite" * 500), "not an SQLite file"),
        (
            lambda p: p.write_bytes(_store_with_rows(p).read_bytes()[:5000]),
            "corrupt",
        ),
        (lambda p: _corrupt_a_data_page(_store_with_rows(p)), "corrupt"),
        (_foreign_database, "not a dlbricks_tf store"),
    ],
    ids=["junk", "truncated", "bad_page", "foreign"],
)
def test_unusable_file_is_refused_and_left_as_it_was(tmp_path, make, words):
    path = tmp_path / "s.sqlite"
    make(path)
    before = _digest(path)
    with pytest.raises(database.StoreError, match=words):
        store_lib.Store(path)
    assert _digest(path) == before
    assert sorted(os.listdir(tmp_path)) == ["s.sqlite"]


def test_newer_schema_is_refused_and_left_as_it_was(tmp_path):
    path = _store_with_rows(tmp_path / "s.sqlite", n=3)
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("UPDATE meta SET value = '99'")
        db.commit()
    before = _digest(path)
    with pytest.raises(database.StoreError, match="schema version 99"):
        store_lib.Store(path)
    assert _digest(path) == before


def test_folder_is_refused(tmp_path):
    with pytest.raises(database.StoreError, match="is a folder"):
        store_lib.Store(tmp_path)


def test_write_retries_while_another_writer_holds_the_lock(tmp_path):
    path = _store_with_rows(tmp_path / "s.sqlite", n=1)
    holder = sqlite3.connect(
        path, isolation_level=None, check_same_thread=False
    )
    holder.execute("BEGIN IMMEDIATE")  # The write lock, for 0.5 s.
    holder.execute("INSERT INTO meta VALUES ('holder', 'x')")
    release = threading.Timer(0.5, holder.execute, ["COMMIT"])
    release.start()
    try:
        # A busy timeout far shorter than the lock: only retries get past.
        with store_lib.Store(path, timeout_s=0.01) as store:
            store.put("late", SETTINGS, FP, _timing(2.0))
            assert store.get("late", SETTINGS, FP) == _timing(2.0)
    finally:
        release.join()
        holder.close()
    assert _count(path) == 2
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute(
            "SELECT value FROM meta WHERE key = 'holder'"
        ).fetchone()


def test_write_gives_up_on_a_lock_that_stays(tmp_path):
    path = _store_with_rows(tmp_path / "s.sqlite", n=2)
    store = store_lib.Store(path, timeout_s=0.01, retries=2)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(database.StoreError, match="stayed locked"):
            store.put("blocked", SETTINGS, FP, _timing(1.0))
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    store.put("after", SETTINGS, FP, _timing(1.0))  # Usable again.
    store.close()
    assert _count(path) == 3


WRITERS = 3
OWN_ROWS = 200  # Per writer, under its own signatures.
SHARED_ROWS = 40  # Signatures every writer puts (upserts of one row each).

_CONCURRENT_WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    sys.path.insert(0, {root!r})
    from dlbricks_tf.storing import store as store_lib
    from tests.store_test import FP, SETTINGS, _timing
    index, folder = int(sys.argv[1]), Path(sys.argv[2])
    (folder / f"ready{{index}}").touch()
    while len(list(folder.glob("ready*"))) < {writers}:
        time.sleep(0.005)  # Start together, on a store not yet created.
    with store_lib.Store(folder / "shared.sqlite") as store:
        for i in range({own}):
            store.put(f"w{{index}}-{{i}}", SETTINGS, FP, _timing(1.0 + i))
            if i < {shared}:
                store.put(f"shared-{{i}}", SETTINGS, FP, _timing(index))
            if i % 50 == 0:
                store.put_model(f"m{{index}}", SETTINGS, FP, _timing(i))
    """
)


def test_concurrent_writers_lose_nothing(tmp_path):
    code = _CONCURRENT_WRITER.format(
        root=_ROOT,
        writers=WRITERS,
        own=OWN_ROWS,
        shared=SHARED_ROWS,
    )
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(i), str(tmp_path)],
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(WRITERS)
    ]
    for w in writers:
        _, err = w.communicate(timeout=300)
        assert w.returncode == 0, err
    path = tmp_path / "shared.sqlite"
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert _count(path) == WRITERS * OWN_ROWS + SHARED_ROWS
    assert _count(path, "model_results") == WRITERS
    with store_lib.Store(path) as store:
        results = store.results(SETTINGS, FP)
    for w in range(WRITERS):
        for i in range(OWN_ROWS):
            assert results[f"w{w}-{i}"] == _timing(1.0 + i)
    # Each shared row holds one writer's last put, whole.
    assert {results[f"shared-{i}"].median_ms for i in range(SHARED_ROWS)} <= {
        float(w) for w in range(WRITERS)
    }


def test_failure_recorded_missing_and_replaced_by_a_timing(tmp_path):
    with store_lib.Store(tmp_path / "s.sqlite") as store:
        store.put("a", SETTINGS, FP, _timing(1.0))
        store.put_failure("b", SETTINGS, FP, "ValueError: no\n  such op")
        assert store.failures(SETTINGS, FP) == {"b": "ValueError: no such op"}
        other = RunSettings(
            batch_size=1, intra_op_threads=2, inter_op_threads=1,
            backend="onnxruntime",
        )  # fmt: skip
        assert store.failures(other, FP) == {}
        # A failed brick is not stored: a rerun tries it again.
        assert store.missing(["a", "b"], SETTINGS, FP) == ["b"]
        store.put_failure("b", SETTINGS, FP, "second reason")
        assert store.failures(SETTINGS, FP) == {"b": "second reason"}
        store.put("b", SETTINGS, FP, _timing(2.0))
        assert store.failures(SETTINGS, FP) == {}
        assert store.missing(["a", "b"], SETTINGS, FP) == []
        store.put_failure("c", SETTINGS, FP, "boom")
        store.export_json(tmp_path / "out.json")
    data = json.loads((tmp_path / "out.json").read_text())
    assert [(f["signature"], f["reason"]) for f in data["failed_bricks"]] == [
        ("c", "boom")
    ]
    assert data["failed_bricks"][0]["settings"] == SETTINGS.to_dict()


def test_version_1_store_is_upgraded_in_place_keeping_results(tmp_path):
    path = tmp_path / "v1.sqlite"
    with store_lib.Store(path) as store:
        store.put("a", SETTINGS, FP, _timing(1.0))
        store.put_model("m", SETTINGS, FP, _timing(3.0))
    # A version-1 file: the same tables without brick_failures and
    # predictors.
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute("DROP TABLE brick_failures")
        db.execute("DROP TABLE predictors")
        db.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    with store_lib.Store(path) as store:
        assert store.schema_version == database.SCHEMA_VERSION == 6
        assert store.get("a", SETTINGS, FP) == _timing(1.0)
        assert store.get_model("m", SETTINGS, FP) == _timing(3.0)
        store.put_failure("b", SETTINGS, FP, "boom")
        store.put_predictor(SETTINGS, FP, "k", "{}")
    with store_lib.Store(path) as store:
        assert store.failures(SETTINGS, FP) == {"b": "boom"}
        assert store.get_predictor(SETTINGS, FP, "k") == "{}"


def _version_3_file(path):
    """A store as schema 3 wrote it: its results tables have no means."""
    stats_ddl = database._STATS_DDL.replace(
        "mean_ms REAL, mean_half_ms REAL,", ""
    )
    schema = database._SCHEMA.replace(database._STATS_DDL, stats_ddl)
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        for statement in schema.split(";"):
            if statement.strip() and not any(
                t in statement for t in ("reference_states", "descriptions")
            ):
                db.execute(statement)
        db.execute("INSERT INTO meta VALUES ('schema_version', '3')")
        db.execute(
            "INSERT INTO settings VALUES (?, ?)",
            (SETTINGS.key(), SETTINGS.to_json()),
        )
        db.execute(
            "INSERT INTO fingerprints VALUES (?, ?)", (FP.id, FP.to_json())
        )
        old = [n for n in database._STATS if not n.startswith("mean")]
        values = _timing(2.0).to_dict()
        for table, column, name in (
            ("brick_results", "signature", "a"),
            ("model_results", "model", "m"),
        ):
            db.execute(
                f"INSERT INTO {table} ({column}, settings_key, fingerprint_id,"
                f" {', '.join(old)})"
                f" VALUES ({', '.join('?' * (len(old) + 3))})",
                [name, SETTINGS.key(), FP.id]
                + [int(values[k]) if k == "noisy" else values[k] for k in old],
            )


def test_version_3_store_gains_means_and_reads_back_the_same_figures(
    tmp_path,
):
    path = tmp_path / "v3.sqlite"
    _version_3_file(path)
    old = dataclasses.replace(_timing(2.0), mean_ms=None, mean_half_ms=None)
    with store_lib.Store(path) as store:
        assert store.schema_version == database.SCHEMA_VERSION
        brick = store.get("a", SETTINGS, FP)
        assert brick == old
        # No mean stored: the estimate's centre is the median, as before.
        assert brick.center_ms == brick.median_ms == 2.0
        assert store.get_model("m", SETTINGS, FP) == old
        new = dataclasses.replace(_timing(1.0), mean_ms=1.1, mean_half_ms=0.05)
        store.put("b", SETTINGS, FP, new)
    with store_lib.Store(path) as store:
        assert store.get("b", SETTINGS, FP) == new
        assert store.get("b", SETTINGS, FP).center_ms == 1.1
        assert store.get("a", SETTINGS, FP) == old


def test_reference_state_is_kept_once_per_settings_and_machine(tmp_path):
    other = dataclasses.replace(SETTINGS, batch_size=SETTINGS.batch_size + 1)
    with store_lib.Store(tmp_path / "s.sqlite") as store:
        assert store.reference_state(SETTINGS, FP) is None
        assert store.put_reference_state(SETTINGS, FP, 1.5, "w") == 1.5
        # The first state stays: timings scaled to it must stay comparable.
        assert store.put_reference_state(SETTINGS, FP, 3.0, "w") == 1.5
        assert store.reference_state(other, FP) is None
        assert store.reference_workload(other, FP) is None
        with pytest.raises(database.StoreError, match="finite and positive"):
            store.put_reference_state(other, FP, float("nan"), "w")
        # A state of another workload is never handed out as this one's.
        with pytest.raises(database.StoreError, match="of the 'w' workload"):
            store.put_reference_state(SETTINGS, FP, 3.0, "v")
    with store_lib.Store(tmp_path / "s.sqlite") as store:
        assert store.reference_state(SETTINGS, FP) == 1.5
        assert store.reference_workload(SETTINGS, FP) == "w"


def test_one_predictor_per_settings_and_machine_by_its_fit_key(tmp_path):
    other = dataclasses.replace(SETTINGS, batch_size=SETTINGS.batch_size + 1)
    with store_lib.Store(tmp_path / "s.sqlite") as store:
        store.put_predictor(SETTINGS, FP, "k1", '{"a": 1}')
        store.put_predictor(other, FP, "k1", '{"b": 2}')
        assert store.get_predictor(SETTINGS, FP, "k1") == '{"a": 1}'
        assert store.get_predictor(other, FP, "k1") == '{"b": 2}'
        # Fitted from something else: not this one.
        assert store.get_predictor(SETTINGS, FP, "k2") is None
        store.put_predictor(SETTINGS, FP, "k2", '{"a": 3}')
        assert store.get_predictor(SETTINGS, FP, "k1") is None
        assert store.get_predictor(SETTINGS, FP, "k2") == '{"a": 3}'


def test_what_the_probes_cut_into_is_kept_by_key_and_not_merged(tmp_path):
    with store_lib.Store(tmp_path / "s.sqlite") as store:
        assert store.probe_suite("k1") is None
        store.put_probe_suite("k1", ["b", "a", "b"])
        store.put_probe_suite("k2", ["c"])
        assert store.probe_suite("k1") == ["a", "b"]
        store.put_probe_suite("k2", ["d"])  # Cut again: replaced.
        assert store.probe_suite("k2") == ["d"]
    with store_lib.Store(tmp_path / "s.sqlite") as store:
        assert store.probe_suite("k1") == ["a", "b"]  # Read back.
    with sqlite3.connect(tmp_path / "s.sqlite") as connection:
        connection.execute(
            "UPDATE meta SET value = '{\"a\": 1}' WHERE key LIKE '%k1'"
        )
    with store_lib.Store(tmp_path / "s.sqlite") as store:
        assert store.probe_suite("k1") is None  # Not a list: cut again.
    with store_lib.Store(tmp_path / "b.sqlite") as b:
        b.merge_from(tmp_path / "s.sqlite")
        assert b.probe_suite("k2") is None


def test_merge_copies_failures_unless_a_timing_exists(tmp_path):
    with store_lib.Store(tmp_path / "a.sqlite") as a:
        a.put_failure("x", SETTINGS, FP, "bad x")
        a.put_failure("y", SETTINGS, FP, "bad y")
    with store_lib.Store(tmp_path / "b.sqlite") as b:
        b.put("y", SETTINGS, FP, _timing(1.0))
        assert b.merge_from(tmp_path / "a.sqlite") == 0
        assert b.failures(SETTINGS, FP) == {"x": "bad x"}
        assert b.get("y", SETTINGS, FP) == _timing(1.0)


def test_merge_carries_reference_states_keeping_the_first(tmp_path):
    other = dataclasses.replace(SETTINGS, batch_size=SETTINGS.batch_size + 1)
    with store_lib.Store(tmp_path / "a.sqlite") as a:
        a.put("x", SETTINGS, FP, _timing(1.0))
        a.put("x", other, FP, _timing(1.0))
        a.put_model("m", SETTINGS, FP, _timing(4.0))
        a.put_reference_state(SETTINGS, FP, 1.5, "w")
        a.put_reference_state(other, FP, 2.5, "w")
    with store_lib.Store(tmp_path / "b.sqlite") as b:
        b.put_reference_state(SETTINGS, FP, 3.0, "w")  # Calibrated here.
        assert b.merge_from(tmp_path / "a.sqlite") == 3
        # Every timing of b is scaled to its own state: it stays, and a's
        # timings, in ms at a's state (1.5), are twice as many ms at b's.
        assert b.reference_state(SETTINGS, FP) == 3.0
        assert b.reference_state(other, FP) == 2.5
        assert b.get("x", SETTINGS, FP) == _scaled(_timing(1.0), 2.0)
        assert b.get_model("m", SETTINGS, FP) == _scaled(_timing(4.0), 2.0)
        # b had no state of `other`: a's comes with its timings as they are.
        assert b.get("x", other, FP) == _timing(1.0)
    with store_lib.Store(tmp_path / "c.sqlite") as c:
        assert c.merge_from(tmp_path / "a.sqlite") == 3
        assert c.reference_state(SETTINGS, FP) == 1.5
        assert c.reference_workload(other, FP) == "w"
        assert c.get("x", SETTINGS, FP) == _timing(1.0)


def test_merge_refuses_states_of_another_workload(tmp_path):
    with store_lib.Store(tmp_path / "a.sqlite") as a:
        a.put("x", SETTINGS, FP, _timing(1.0))
        a.put_reference_state(SETTINGS, FP, 1.5, "w")
    with store_lib.Store(tmp_path / "b.sqlite") as b:
        b.put("y", SETTINGS, FP, _timing(2.0))
        b.put_reference_state(SETTINGS, FP, 3.0, "v")
    before = fakes.table_counts(tmp_path / "b.sqlite")
    with store_lib.Store(tmp_path / "b.sqlite") as b:
        with pytest.raises(database.StoreError) as info:
            b.merge_from(tmp_path / "a.sqlite")
    message = str(info.value)
    assert len(message.splitlines()) == 1, message
    assert "is a reading of the 'w' workload and this store's of 'v'" in (
        message
    )
    # Their milliseconds are not on one scale: nothing of it was added.
    assert fakes.table_counts(tmp_path / "b.sqlite") == before


def _scaled(t, factor):
    return dataclasses.replace(
        t,
        **{
            name: getattr(t, name) * factor
            for name in merging.SCALED
            if getattr(t, name) is not None
        },
    )


# Rows another program could have written to a store; each is refused.
_IMPOSSIBLE = {
    "negative_median": (
        "UPDATE brick_results SET median_ms = -1.0 WHERE signature = 'y'",
        "brick_results row (signature 'y', settings 'tf-b1-t2x1-onednn1-jit0"
        "-chain', fingerprint '{fp}') has median_ms=-1.0 is not a finite",
    ),
    "infinite_max": (
        "UPDATE model_results SET max_ms = 1e999",
        "model_results row (model 'm', settings 'tf-b1-t2x1-onednn1-jit0-"
        "chain', fingerprint '{fp}') has max_ms=inf is not a finite",
    ),
    "text_min": (
        "UPDATE brick_results SET min_ms = 'fast' WHERE signature = 'x'",
        "(signature 'x', settings ",
    ),
    "min_above_median": (
        "UPDATE brick_results SET min_ms = 2 * median_ms WHERE signature = 'x'",
        "has min_ms=2.0 > median_ms=1.0",
    ),
    "no_samples": (
        "UPDATE brick_results SET samples = 0 WHERE signature = 'x'",
        "has samples=0 is not a count of 1 or more",
    ),
    "mean_above_max": (
        "UPDATE model_results SET mean_ms = 9.0",
        "has mean_ms=9.0 is outside [min_ms, max_ms] = [5.0, 5.0]",
    ),
    "settings_of_another_key": (
        "UPDATE settings SET json = replace(json, '\"batch_size\": 1',"
        " '\"batch_size\": 2')",
        "settings row 'tf-b1-t2x1-onednn1-jit0-chain' holds settings whose"
        " key is 'tf-b2-t2x1-onednn1-jit0-chain'",
    ),
    "fingerprint_of_another_id": (
        "UPDATE fingerprints SET json = replace(json, 'Test CPU', 'Other')",
        "fingerprints row '{fp}' holds a fingerprint whose id is",
    ),
    "settings_absent": (
        "UPDATE brick_results SET settings_key = 'gone' WHERE signature = 'x'",
        "brick_results row (signature 'x', settings 'gone', fingerprint "
        "'{fp}') names settings it lacks",
    ),
    "failure_of_an_absent_machine": (
        "UPDATE brick_failures SET fingerprint_id = 'gone'",
        "brick_failures row (signature 'f', settings 'tf-b1-t2x1-onednn1-"
        "jit0-chain', fingerprint 'gone') names a fingerprint it lacks",
    ),
    "reference_below_zero": (
        "UPDATE reference_states SET state_ms = -2.0",
        "reference_states row (settings 'tf-b1-t2x1-onednn1-jit0-chain', "
        "fingerprint '{fp}') has state_ms=-2.0, not a finite positive time",
    ),
    "reference_workload_not_a_name": (
        "UPDATE reference_states SET workload = ''",
        "reference_states row (settings 'tf-b1-t2x1-onednn1-jit0-chain', "
        "fingerprint '{fp}') has workload='', not a workload's name",
    ),
}


@pytest.mark.parametrize("sql, words", _IMPOSSIBLE.values(), ids=_IMPOSSIBLE)
def test_merge_refuses_a_file_with_an_impossible_row(tmp_path, sql, words):
    bad = tmp_path / "bad.sqlite"
    with store_lib.Store(bad) as store:
        store.put("x", SETTINGS, FP, _timing(1.0))
        store.put("y", SETTINGS, FP, _timing(2.0))
        store.put_model("m", SETTINGS, FP, _timing(5.0))
        store.put_failure("f", SETTINGS, FP, "boom")
        store.put_reference_state(SETTINGS, FP, 1.5, "w")
    with contextlib.closing(sqlite3.connect(bad)) as db, db:
        db.execute("PRAGMA foreign_keys = OFF")
        db.execute(sql)
    into = tmp_path / "into.sqlite"
    with store_lib.Store(into) as store:
        store.put("z", SETTINGS, FP, _timing(3.0))
    before = fakes.table_counts(into)
    with store_lib.Store(into) as store:
        with pytest.raises(database.StoreError) as info:
            store.merge_from(bad)
    message = str(info.value)
    assert len(message.splitlines()) == 1, message
    assert message.startswith(f"Store {str(bad)!r} was not merged: its ")
    assert words.format(fp=FP.id) in message
    assert "nothing of it was added" in message
    assert fakes.table_counts(into) == before


def test_a_brick_keeps_one_description_whatever_its_settings(tmp_path):
    other = dataclasses.replace(SETTINGS, batch_size=SETTINGS.batch_size + 1)
    with store_lib.Store(tmp_path / "s.sqlite") as store:
        store.put("a", SETTINGS, FP, _timing(1.0), description="A")
        store.put("a", other, FP, _timing(2.0), description="A again")
        store.put("b", other, FP, _timing(2.0), description="B")
        store.put("c", SETTINGS, FP, _timing(2.0))
        assert store.descriptions(SETTINGS, FP) == {"a": "A"}
        assert store.descriptions(other, FP) == {"a": "A", "b": "B"}
        assert store.put_descriptions({"c": "C", "b": "B again"}) == 1
        assert store.descriptions(SETTINGS, FP) == {"a": "A", "c": "C"}
        assert store.described() == {"a", "b", "c"}
    assert _count(tmp_path / "s.sqlite", "brick_descriptions") == 3


def test_missing_times_again_a_timing_no_sum_can_use(tmp_path):
    path = tmp_path / "s.sqlite"
    with store_lib.Store(path) as store:
        store.put("a", SETTINGS, FP, _timing(1.0))
        store.put("b", SETTINGS, FP, _timing(1.0))
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute(
            "UPDATE brick_results SET mean_ms = -0.5 WHERE signature = 'b'"
        )
    with store_lib.Store(path) as store:
        assert store.missing(["a", "b"], SETTINGS, FP) == ["b"]
        store.put("b", SETTINGS, FP, _timing(1.0))
        assert store.missing(["a", "b"], SETTINGS, FP) == []


# A schema-1 store as the code before `SystemFingerprint.onednn_rule`
# wrote it: settings without a protocol, a fingerprint without the rule.
_OLD_SETTINGS_KEY = "tf-b1-t2x1-onednn1-jit0"
_OLD_SETTINGS_JSON = (
    '{"backend": "tf", "batch_size": 1, "inter_op_threads": 1, '
    '"intra_op_threads": 2, "jit_compile": false, "onednn": true}'
)
_OLD_FP_JSON = (
    '{"cpu_model":"Test CPU","keras":"3.15.1","logical_cpus":2,'
    '"machine":"x86_64","onednn":true,"onnxruntime":"","os":"Linux-test",'
    '"physical_cores":2,"python":"3.11.0","tensorflow":"2.21.0"}'
)
_OLD_FP_ID = "2f0be3936240"
_V1_SCHEMA = f"""
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE settings (key TEXT PRIMARY KEY, json TEXT NOT NULL);
CREATE TABLE fingerprints (id TEXT PRIMARY KEY, json TEXT NOT NULL);
CREATE TABLE brick_results (
    signature TEXT NOT NULL,
    settings_key TEXT NOT NULL REFERENCES settings(key),
    fingerprint_id TEXT NOT NULL REFERENCES fingerprints(id),
    {database._STATS_DDL},
    UNIQUE (signature, settings_key, fingerprint_id));
CREATE TABLE model_results (
    model TEXT NOT NULL,
    settings_key TEXT NOT NULL REFERENCES settings(key),
    fingerprint_id TEXT NOT NULL REFERENCES fingerprints(id),
    {database._STATS_DDL},
    UNIQUE (model, settings_key, fingerprint_id));
"""


def _old_store(path):
    """Writes a schema-1 store: brick "a" at 1.25 ms, model "m" at 7.5 ms."""
    stats = "min_ms, median_ms, trimmed_mean_ms, max_ms, samples, ci_low_ms,"
    stats += " ci_high_ms, noisy, calls_per_sample, dispatch_ms,"
    stats += " loop_overhead_ms"
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.executescript(_V1_SCHEMA)
        db.execute("INSERT INTO meta VALUES ('schema_version', '1')")
        db.execute(
            "INSERT INTO settings VALUES (?, ?)",
            (_OLD_SETTINGS_KEY, _OLD_SETTINGS_JSON),
        )
        db.execute(
            "INSERT INTO fingerprints VALUES (?, ?)", (_OLD_FP_ID, _OLD_FP_JSON)
        )
        for table, name, ms in (("brick", "a", 1.25), ("model", "m", 7.5)):
            db.execute(
                f"INSERT INTO {table}_results ("
                f"{'signature' if table == 'brick' else 'model'},"
                f" settings_key, fingerprint_id, {stats}) VALUES"
                " (?, ?, ?, ?, ?, ?, ?, 10, ?, ?, 0, 5, 0.3, 0.004)",
                (name, _OLD_SETTINGS_KEY, _OLD_FP_ID, *[ms] * 6),
            )


def test_old_store_reads_back_under_its_key_and_old_fingerprint(tmp_path):
    path = tmp_path / "old.sqlite"
    _old_store(path)
    with store_lib.Store(path) as store:
        assert store.schema_version == database.SCHEMA_VERSION
        [row] = store.rows("brick")
        assert row["fingerprint_id"] == _OLD_FP_ID
        assert row["fingerprint"] == json.loads(_OLD_FP_JSON)
        assert row["settings"] == json.loads(_OLD_SETTINGS_JSON)
        assert row["median_ms"] == 1.25 and row["samples"] == 10
        old_fp = SystemFingerprint.from_dict(row["fingerprint"])
        settings = RunSettings.from_dict(row["settings"])
        assert old_fp.id == _OLD_FP_ID and old_fp.legacy_onednn
        assert settings.key() == _OLD_SETTINGS_KEY
        assert store.get("a", settings, old_fp) == _timing(1.25)
        assert store.get_model("m", settings, old_fp) == _timing(7.5)
        assert store.fingerprint_counts() == [(old_fp, 2)]
        store.export_json(tmp_path / "out.json")
    data = json.loads((tmp_path / "out.json").read_text())
    assert data["bricks"][0]["fingerprint"] == json.loads(_OLD_FP_JSON)


def test_new_rows_are_not_mixed_with_old_ones(tmp_path):
    path = tmp_path / "old.sqlite"
    _old_store(path)
    old_fp = SystemFingerprint.from_dict(json.loads(_OLD_FP_JSON))
    # The same machine and settings, fingerprinted under today's rule.
    new_fp = dataclasses.replace(old_fp, onednn_rule="tf")
    settings = RunSettings.from_dict(json.loads(_OLD_SETTINGS_JSON))
    with store_lib.Store(path) as store:
        assert store.missing(["a"], settings, new_fp) == ["a"]
        store.put("a", settings, new_fp, _timing(2.0))
        assert store.get("a", settings, old_fp) == _timing(1.25)
        assert store.get("a", settings, new_fp) == _timing(2.0)
        assert store.results(settings, old_fp) == {"a": _timing(1.25)}
        assert store.results(settings, new_fp) == {"a": _timing(2.0)}
        assert store.get_model("m", settings, new_fp) is None
        assert sorted(
            (r["fingerprint_id"], r["median_ms"]) for r in store.rows("brick")
        ) == sorted([(_OLD_FP_ID, 1.25), (new_fp.id, 2.0)])
        counts = {
            fp.id: (fp.legacy_onednn, n) for fp, n in store.fingerprint_counts()
        }
        assert counts == {_OLD_FP_ID: (True, 2), new_fp.id: (False, 1)}


# The schemas as store.py created them at versions 1 to 5 (from its
# history), frozen here: a change to today's schema must not change the
# old files these tests read back.
_OLD_STATS_DDL = """
    min_ms REAL NOT NULL, median_ms REAL NOT NULL,
    trimmed_mean_ms REAL NOT NULL, max_ms REAL NOT NULL,
    samples INTEGER NOT NULL, ci_low_ms REAL NOT NULL,
    ci_high_ms REAL NOT NULL, noisy INTEGER NOT NULL,
    calls_per_sample INTEGER NOT NULL, dispatch_ms REAL NOT NULL,
    loop_overhead_ms REAL NOT NULL,
    created TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
"""
_SCHEMA_1 = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, json TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS fingerprints (
    id TEXT PRIMARY KEY, json TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS brick_results (
    signature TEXT NOT NULL,
    settings_key TEXT NOT NULL REFERENCES settings(key),
    fingerprint_id TEXT NOT NULL REFERENCES fingerprints(id),
    {_OLD_STATS_DDL},
    UNIQUE (signature, settings_key, fingerprint_id));
CREATE TABLE IF NOT EXISTS model_results (
    model TEXT NOT NULL,
    settings_key TEXT NOT NULL REFERENCES settings(key),
    fingerprint_id TEXT NOT NULL REFERENCES fingerprints(id),
    {_OLD_STATS_DDL},
    UNIQUE (model, settings_key, fingerprint_id));
"""
_SCHEMA_2 = (
    _SCHEMA_1
    + """
CREATE TABLE IF NOT EXISTS brick_failures (
    signature TEXT NOT NULL,
    settings_key TEXT NOT NULL REFERENCES settings(key),
    fingerprint_id TEXT NOT NULL REFERENCES fingerprints(id),
    reason TEXT NOT NULL,
    created TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    UNIQUE (signature, settings_key, fingerprint_id));
"""
)
_SCHEMA_3 = (
    _SCHEMA_2
    + """
CREATE TABLE IF NOT EXISTS reference_states (
    settings_key TEXT NOT NULL REFERENCES settings(key),
    fingerprint_id TEXT NOT NULL REFERENCES fingerprints(id),
    state_ms REAL NOT NULL,
    created TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    UNIQUE (settings_key, fingerprint_id));
CREATE TABLE IF NOT EXISTS predictors (
    settings_key TEXT NOT NULL REFERENCES settings(key),
    fingerprint_id TEXT NOT NULL REFERENCES fingerprints(id),
    fit_key TEXT NOT NULL,
    json TEXT NOT NULL,
    created TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    UNIQUE (settings_key, fingerprint_id));
"""
)
_SCHEMA_4 = _SCHEMA_3.replace(
    "loop_overhead_ms REAL NOT NULL,",
    "loop_overhead_ms REAL NOT NULL,\n    mean_ms REAL, mean_half_ms REAL,",
)
_SCHEMA_5 = (
    _SCHEMA_4
    + """
CREATE TABLE IF NOT EXISTS brick_descriptions (
    signature TEXT PRIMARY KEY, json TEXT NOT NULL);
"""
)
_OLD_SCHEMAS = {
    1: _SCHEMA_1,
    2: _SCHEMA_2,
    3: _SCHEMA_3,
    4: _SCHEMA_4,
    5: _SCHEMA_5,
}
# What each old file holds: bricks "a" and "n" (noisy), model "m"; from
# schema 2 a failed brick "f"; from 3 a predictor and a reference state;
# schema 4's means are left NULL.
_OLD_BRICKS = {"a": _timing(1.25), "n": _timing(3.0, noisy=True)}


def _old_schema_file(path, version):
    """Writes a store with the tables and rows schema `version` had."""
    old = [n for n in database._STATS if not n.startswith("mean")]
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.executescript(_OLD_SCHEMAS[version])
        db.execute(
            "INSERT INTO meta VALUES ('schema_version', ?)", (str(version),)
        )
        db.execute(
            "INSERT INTO settings VALUES (?, ?)",
            (SETTINGS.key(), SETTINGS.to_json()),
        )
        db.execute(
            "INSERT INTO fingerprints VALUES (?, ?)", (FP.id, FP.to_json())
        )
        results = [("brick_results", "signature", *kv) for kv in
                   _OLD_BRICKS.items()]  # fmt: skip
        results.append(("model_results", "model", "m", _timing(7.5)))
        for table, column, name, timing in results:
            values = timing.to_dict()
            db.execute(
                f"INSERT INTO {table} ({column}, settings_key, fingerprint_id,"
                f" {', '.join(old)})"
                f" VALUES ({', '.join('?' * (len(old) + 3))})",
                [name, SETTINGS.key(), FP.id]
                + [int(values[k]) if k == "noisy" else values[k] for k in old],
            )
        if version >= 2:
            db.execute(
                "INSERT INTO brick_failures (signature, settings_key,"
                " fingerprint_id, reason) VALUES ('f', ?, ?, 'boom')",
                (SETTINGS.key(), FP.id),
            )
        if version >= 3:
            db.execute(
                "INSERT INTO predictors (settings_key, fingerprint_id,"
                " fit_key, json) VALUES (?, ?, 'k', '{\"p\": 1}')",
                (SETTINGS.key(), FP.id),
            )
            db.execute(
                "INSERT INTO reference_states (settings_key, fingerprint_id,"
                " state_ms) VALUES (?, ?, 2.5)",
                (SETTINGS.key(), FP.id),
            )


def _old_rows(path, columns):
    """Every row of the old tables, in their old columns only."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        return {
            table: db.execute(
                f"SELECT {', '.join(names)} FROM {table} ORDER BY rowid"
            ).fetchall()
            for table, names in columns.items()
        }


@pytest.mark.parametrize("version", [1, 2, 3, 4, 5])
def test_old_schema_file_reads_back_unchanged(tmp_path, version):
    path = tmp_path / f"v{version}.sqlite"
    _old_schema_file(path, version)
    with contextlib.closing(sqlite3.connect(path)) as db:
        tables = [t for (t,) in db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")]  # fmt: skip
        columns = {
            t: [r[1] for r in db.execute(f"PRAGMA table_info({t})")]
            for t in tables
            if t != "meta"  # Its version is upgraded.
        }
    before = _old_rows(path, columns)
    # No means stored: the estimates add medians, as when it was written.
    old = {k: dataclasses.replace(t, mean_ms=None, mean_half_ms=None)
           for k, t in _OLD_BRICKS.items()}  # fmt: skip
    for _ in range(2):  # Upgraded when first opened, then as it is now.
        with store_lib.Store(path) as store:
            assert store.schema_version == database.SCHEMA_VERSION
            assert store.results(SETTINGS, FP, accept_noisy=True) == old
            assert store.missing(["a", "n", "x"], SETTINGS, FP) == ["n", "x"]
            assert store.get_model("m", SETTINGS, FP) == dataclasses.replace(
                _timing(7.5), mean_ms=None, mean_half_ms=None
            )
            assert store.failures(SETTINGS, FP) == (
                {"f": "boom"} if version >= 2 else {}
            )
            assert store.get_predictor(SETTINGS, FP, "k") == (
                '{"p": 1}' if version >= 3 else None
            )
            assert store.reference_state(SETTINGS, FP) == (
                2.5 if version >= 3 else None
            )
            # Its state is a reading of the one workload there was.
            assert store.reference_workload(SETTINGS, FP) == (
                "matmul-reduce" if version >= 3 else None
            )
            rows = store.rows("brick")
            assert [(r["signature"], r["median_ms"]) for r in rows] == [
                ("a", 1.25),
                ("n", 3.0),
            ]
            assert {r["settings"]["protocol"] for r in rows} == {"chain"}
            assert all(r["fingerprint"] == FP.to_dict() for r in rows)
            # Its bricks were timed before descriptions were kept.
            assert store.descriptions(SETTINGS, FP) == {}
    assert _old_rows(path, columns) == before  # Row by row, column by column.


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
