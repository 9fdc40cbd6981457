"""Faults a long benchmark meets: kills, signals, shared stores, noise.

Real subprocesses of `python -m tools.dlbricks bench` are killed (`kill -9`)
or signalled (SIGINT, SIGTERM) at seeded random moments after their first
result; after each, the store must pass SQLite's integrity check and hold
every result committed before, and a rerun must finish the job with every
signature once and nothing stored re-timed. Three processes time the three
shards of a suite into one store at once. A brick that never settles is
measured twice and stored flagged, in `bench` and in the interleaved `run`
path of `dlbricks_tf.running.job`, and the `estimate` command says so.
"""

import contextlib
import dataclasses
import json
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import keras
import pytest

import dlbricks_tf
from dlbricks_tf.cutting import suite as suite_lib
from dlbricks_tf.machine import settings as settings_lib
from dlbricks_tf.machine.fingerprint import system_fingerprint
from dlbricks_tf.measuring import timing
from dlbricks_tf.reporting import report
from dlbricks_tf.running import job
from dlbricks_tf.stats import Timing
from dlbricks_tf.storing.store import Store
from tests import models

ROOT = Path(__file__).resolve().parent.parent
# Tight caps; --precision=1.0 lets nearly every brick settle, so that a
# rerun has nothing noisy to time again and every stored result must keep
# its `created` time.
FAST = [
    "--min_samples=3",
    "--max_samples=5",
    "--max_seconds=0.1",
    "--target_sample_ms=0.5",
    "--intra_op_threads=1",
    "--precision=1.0",
]
WIDTHS = 60  # Bricks of the suite bench is stopped in, again and again.
SHARDED = 15  # Bricks of the suite three writers share.
SETTINGS = settings_lib.RunSettings.default(1, intra_op_threads=1)
SEED = 7


def _env() -> dict[str, str]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def _chain_of_widths(folder: Path, count: int):
    """A .keras file of `count` Dense layers of distinct widths, its suite."""
    layers = [keras.layers.Dense(8 + i) for i in range(count)]
    model = keras.Sequential([keras.Input((16,)), *layers], name="widths")
    path = folder / f"widths{count}.keras"
    model.save(path)
    d = dlbricks_tf.decompose(str(path))
    suite = suite_lib.build_suite({d.name: d})
    assert len(suite) == count  # One unique brick per layer at G=1.
    return str(path), suite


@pytest.fixture(scope="module")
def widths(tmp_path_factory):
    return _chain_of_widths(tmp_path_factory.mktemp("models"), WIDTHS)


def _start_bench(model: str, db: Path, log: Path) -> subprocess.Popen:
    with open(log.with_suffix(".out"), "w") as out:
        with open(log.with_suffix(".err"), "w") as err:
            return subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tools.dlbricks",
                    "bench",
                    f"--models={model}",
                    f"--db={db}",
                    # Several chains, so that a stop falls between commits.
                    "--chain_links=6",
                    *FAST,
                ],
                cwd=ROOT,
                env=_env(),
                stdout=out,
                stderr=err,
            )


def _rows(db: Path) -> dict[str, tuple[str, bool]]:
    """{signature: (created, noisy)} read without disturbing a writer."""
    if not db.exists():
        return {}
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            rows = conn.execute(
                "SELECT signature, created, noisy FROM brick_results"
            ).fetchall()
        finally:
            conn.close()
    except sqlite3.DatabaseError:  # Tables not created yet.
        return {}
    return {s: (c, bool(n)) for s, c, n in rows}


def _wait_for_new_row(proc, db: Path, before: int) -> None:
    deadline = time.monotonic() + 120
    while len(_rows(db)) <= before:
        assert proc.poll() is None, "bench ended before its first result"
        assert time.monotonic() < deadline, "no result within 120 s"
        time.sleep(0.02)


def _check_store(db: Path, committed: dict[str, tuple[str, bool]]) -> int:
    """Integrity, every committed row kept as it was; returns the rows."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    rows = _rows(db)
    for signature, row in committed.items():
        assert rows[signature] == row, f"{signature} lost or re-timed"
    with Store(db) as store:  # The store opens and reads.
        assert len(store.rows("brick")) == len(rows)
    return len(rows)


def _finish(model: str, db: Path, log: Path, suite, earlier) -> None:
    """Reruns bench to the end; every brick once, nothing settled re-timed."""
    proc = _start_bench(model, db, log)
    assert proc.wait(timeout=300) == 0, log.with_suffix(".err").read_text()
    assert log.with_suffix(".err").read_text() == ""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        counts = dict(
            conn.execute(
                "SELECT signature, COUNT(*) FROM brick_results "
                "GROUP BY signature"
            ).fetchall()
        )
    assert counts == dict.fromkeys(suite.signatures, 1)
    final = _rows(db)
    settled = {s: r for s, r in earlier.items() if not r[1]}
    assert len(settled) >= len(earlier) // 2  # The check has teeth.
    for signature, row in settled.items():
        assert final[signature] == row, f"{signature} was timed again"


def _stop_message(err: Path, name: str) -> int:
    lines = err.read_text().splitlines()
    assert len(lines) == 1, lines
    match = re.fullmatch(
        rf"dlbricks: error: Stopped by {name} after the chain in flight: "
        r"(\d+) brick\(s\) timed and stored at G=1, \d+ left; run the same "
        r"command again to resume\.",
        lines[0],
    )
    assert match, lines[0]
    return int(match.group(1))


# What each bench run is stopped by, in turn, then one runs to the end:
# each signal, and a kill both of the first run and of one that resumed.
STOPS = (
    signal.SIGKILL,
    signal.SIGINT,
    signal.SIGKILL,
    signal.SIGTERM,
)


def test_bench_survives_kills_and_signals_at_random_moments(widths, tmp_path):
    model, suite = widths
    db = tmp_path / "store.sqlite"
    rng = random.Random(SEED)
    committed: dict[str, tuple[str, bool]] = {}
    for run, signum in enumerate(STOPS):
        name = signal.Signals(signum).name
        before = _rows(db)
        log = tmp_path / f"run{run}-{name}"
        proc = _start_bench(model, db, log)
        _wait_for_new_row(proc, db, len(before))
        time.sleep(rng.uniform(0.0, 0.5))
        snapshot = _rows(db)  # Committed before the signal, at least.
        assert proc.poll() is None, f"bench finished before {name}"
        proc.send_signal(signum)
        code = proc.wait(timeout=120)
        committed.update(snapshot)
        rows = _check_store(db, committed)
        assert len(before) < rows < len(suite)
        if signum == signal.SIGKILL:
            assert code == -signal.SIGKILL
            continue
        # A clean stop: 130 or 143, one line counting what was stored (the
        # brick in flight included).
        assert code == 128 + signum
        timed = _stop_message(log.with_suffix(".err"), name)
        after = _rows(db)
        assert timed == sum(after[s] != before.get(s) for s in after)
        assert "Traceback" not in log.with_suffix(".err").read_text()
        committed.update(after)
    _finish(model, db, tmp_path / "final", suite, committed)


_SHARD_WRITER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from dlbricks_tf.machine import settings as settings_lib
    from dlbricks_tf.machine import process as process_lib
    process_lib.configure_threads(1, 1)
    import dlbricks_tf
    from dlbricks_tf.running import bench
    from dlbricks_tf.measuring import timing
    from dlbricks_tf.cutting import suite as suite_lib
    from dlbricks_tf.machine.fingerprint import system_fingerprint
    from dlbricks_tf.storing.store import Store

    model, db, index, folder = sys.argv[1:]
    d = dlbricks_tf.decompose(model)
    shard = suite_lib.build_suite({d.name: d}).shard(int(index), 3)
    settings = settings_lib.RunSettings.default(1, intra_op_threads=1)
    options = timing.TimingOptions(
        precision=1.0, min_samples=3, max_samples=5, max_seconds=0.1,
        target_sample_ms=0.5,
    )
    Path(folder, f"ready{index}").touch()
    while len(list(Path(folder).glob("ready*"))) < 3:
        time.sleep(0.01)  # All three open the new store together.
    with Store(db) as store:
        summary = bench.time_suite(
            shard, store, settings, system_fingerprint(), options,
            accept_noisy=True,
        )
    print(json.dumps({"timed": summary.timed, "shard": shard.signatures}))
    """
)


def test_three_shard_writers_share_one_store(tmp_path):
    model, suite = _chain_of_widths(tmp_path, SHARDED)
    db = tmp_path / "shared.sqlite"
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", _SHARD_WRITER, model, str(db), str(i)]
            + [str(tmp_path)],
            cwd=ROOT,
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(3)
    ]
    outputs = [w.communicate(timeout=300) for w in writers]
    for w, (_, err) in zip(writers, outputs, strict=True):
        assert w.returncode == 0, err
    timed = [json.loads(out)["timed"] for out, _ in outputs]
    shards = [json.loads(out)["shard"] for out, _ in outputs]
    assert timed == shards  # Each writer timed all of its shard.
    assert sorted(s for t in timed for s in t) == sorted(suite.signatures)
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        rows = conn.execute(
            "SELECT signature, COUNT(*) FROM brick_results GROUP BY signature"
        ).fetchall()
    assert dict(rows) == dict.fromkeys(suite.signatures, 1)


NEVER_SETTLES = timing.TimingOptions(
    precision=-1.0,
    absolute_precision_ms=-1.0,
    min_samples=3,
    max_samples=4,
    max_seconds=0.1,
    target_sample_ms=0.5,
)


def test_run_path_remeasures_noisy_bricks_in_its_rounds(tmp_path):
    path = tmp_path / "chain.keras"
    models.chain()[0].save(path)
    sources = job.resolve_models([str(path)])
    settled = dataclasses.replace(
        NEVER_SETTLES, precision=1.0, absolute_precision_ms=1e9
    )
    fp = system_fingerprint()
    # Re-measuring a brick is the loop protocol's way; chains flag instead.
    looped, checked = models.settings(protocol="loop")
    with Store(tmp_path / "s.sqlite") as store:
        result = job.run_granularity(
            sources,
            2,
            looped,
            fp,
            store,
            settled,
            NEVER_SETTLES,
            check_settings=checked,
        )
        stored = store.results(looped, fp)
    signatures = result.suite.signatures
    assert sorted(result.remeasured) == sorted(signatures)
    assert all(stored[s].noisy for s in signatures)
    (row,) = result.runs
    assert row["noisy_bricks"] == len(signatures)
    assert not row["measured_noisy"]
    assert "Noisy: chain G=2 (" in report.format_noisy(result.runs)


def test_estimate_command_says_it_rests_on_noisy_bricks(tmp_path):
    path = tmp_path / "chain.keras"
    models.chain()[0].save(path)
    d = dlbricks_tf.decompose(str(path))
    signatures = list(dict.fromkeys(b.signature for b in d.bricks))
    db = tmp_path / "s.sqlite"
    fp = system_fingerprint()
    with Store(db) as store:
        for i, s in enumerate(signatures):
            noisy = i < 2
            store.put(s, SETTINGS, fp, Timing(1, 1, 1, 1, 5, 0.9, 1.1, noisy))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.dlbricks",
            "estimate",
            f"--models={path}",
            f"--db={db}",
            "--intra_op_threads=1",
        ],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    row = next(x for x in proc.stdout.splitlines() if x.startswith("| chain"))
    assert row.endswith("| 2 |")  # The table's noisy bricks column.
    assert "Noisy: chain G=1 (2 brick(s)): " in proc.stdout


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
