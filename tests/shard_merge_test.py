"""Tests of sharded `dlbricks bench` workers and `dlbricks merge`.

Three real worker processes time one shard each of a tiny model's suite,
each into its own store, the way a fleet would; each learns its shard in
another way (flags, Slurm's variables, a Kubernetes Indexed Job's index):

    JOB_COMPLETION_INDEX=2 python -m tools.dlbricks bench --num_shards=3 \\
        --models=chain.keras --db=shard_2.sqlite
    python -m tools.dlbricks merge --db=all.sqlite shard_*.sqlite

The merged store must hold every signature of the suite exactly once.
`tests/slurm_test.py` reuses the helpers here with a real Slurm cluster.
"""

import collections
import contextlib
import shutil
import sqlite3
from pathlib import Path

import pytest

import dlbricks_tf
from dlbricks_tf import limits
from dlbricks_tf.cutting import description
from dlbricks_tf.cutting.suite import Suite, build_suite
from dlbricks_tf.storing.database import StoreError
from dlbricks_tf.storing.store import Store
from tests import fakes, models
from tests.cli import FAST, dlbricks


def tiny_model_and_suite(folder: Path) -> tuple[str, Suite]:
    """Saves tests.models.chain to a .keras file; returns it and its suite."""
    model = models.chain()[0]
    path = str(folder / "chain.keras")
    model.save(path)
    decomposition = dlbricks_tf.decompose(path, granularity=1)
    return path, build_suite({"chain": decomposition})


def stored_signatures(db: Path | str) -> collections.Counter:
    """How many results each brick signature has in a store."""
    with Store(db) as store:
        return collections.Counter(r["signature"] for r in store.rows())


def check_shards_and_merge(suite: Suite, stores: list[Path], merged: Path):
    """Checks the shard stores are the suite's disjoint shards, then merges.

    Asserts that store i holds exactly the signatures of
    `suite.shard(i, len(stores))`, once each, and that `dlbricks merge`
    puts every signature of the suite into `merged` exactly once.
    """
    count = len(stores)
    seen: set[str] = set()
    for i, db in enumerate(stores):
        held = stored_signatures(db)
        expected = suite.shard(i, count).signatures
        assert expected, "a shard is empty: use a model with more bricks"
        assert held == collections.Counter(expected), f"shard {i}"
        assert not seen & set(held), f"shard {i} overlaps an earlier one"
        seen |= set(held)
    proc = dlbricks("merge", f"--db={merged}", *map(str, stores))
    assert proc.returncode == 0, proc.stderr
    added = [
        int(line.split(": ")[1].split()[0])
        for line in proc.stdout.splitlines()
        if "result(s) added" in line
    ]
    assert added == [len(suite.shard(i, count)) for i in range(count)]
    assert stored_signatures(merged) == collections.Counter(suite.signatures)
    # Each brick's description, once, whichever shard timed it.
    assert described(merged) == collections.Counter(suite.signatures)


def described(db: Path | str) -> collections.Counter:
    """How many descriptions each signature has in a store (each must read
    back as the brick it is filed under)."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        rows = conn.execute("SELECT signature, json FROM brick_descriptions")
        rows = rows.fetchall()
    for signature, text in rows:
        description.parse(text, signature)
    return collections.Counter(s for s, _ in rows)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_model_and_suite(tmp_path_factory.mktemp("model"))


def test_three_workers_time_disjoint_shards_that_merge_once_each(
    tiny, tmp_path
):
    path, suite = tiny
    common = [f"--models={path}", *FAST]
    # Each worker learns its shard another way; shard i goes to store i.
    workers = [
        (["--shard_index=0", "--num_shards=3"], {}, "flags"),
        (
            [],
            {  # As Slurm sets them for task 11 of --array=10-12.
                "SLURM_ARRAY_TASK_ID": "11",
                "SLURM_ARRAY_TASK_MIN": "10",
                "SLURM_ARRAY_TASK_MAX": "12",
                "SLURM_ARRAY_TASK_COUNT": "3",
            },
            "Slurm job array",
        ),
        (
            ["--num_shards=3"],
            {"JOB_COMPLETION_INDEX": "2"},
            "Kubernetes Indexed Job and flags",
        ),
    ]
    stores = []
    for i, (flags, env, source) in enumerate(workers):
        stores.append(tmp_path / f"shard_{i}.sqlite")
        proc = dlbricks("bench", *common, f"--db={stores[-1]}", *flags, **env)
        assert proc.returncode == 0, proc.stderr
        assert f"Timing shard {i} of 3 ({source}: " in proc.stdout
        n = len(suite.shard(i, 3))
        assert f"G=1: {n} of the {len(suite)} unique bricks; {n} to time" in (
            proc.stdout
        )
        assert f"G=1: timed {n}, already stored 0" in proc.stdout
    check_shards_and_merge(suite, stores, tmp_path / "merged.sqlite")


def test_bad_shard_flags_are_a_usage_error():
    proc = dlbricks("bench", "--shard_index=3", "--num_shards=3")
    assert proc.returncode == 2
    assert proc.stderr.startswith("dlbricks: error: ")
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "--shard_index must be below --num_shards" in proc.stderr


def test_an_index_without_a_count_is_one_line(tiny, tmp_path):
    path, _ = tiny
    db = tmp_path / "never.sqlite"
    proc = dlbricks(
        "bench", f"--models={path}", f"--db={db}", JOB_COMPLETION_INDEX="1"
    )
    assert proc.returncode == 1
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "JOB_COMPLETION_INDEX=1" in proc.stderr
    assert "--num_shards" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not db.exists()  # Nothing is timed or written.


@pytest.fixture(scope="module")
def timed(tiny, tmp_path_factory):
    """A store `dlbricks bench` filled with the tiny model's bricks."""
    path, suite = tiny
    db = tmp_path_factory.mktemp("timed") / "timed.sqlite"
    proc = dlbricks("bench", f"--models={path}", f"--db={db}", *FAST)
    assert proc.returncode == 0, proc.stderr
    return db, suite


def _copy(db: Path, folder: Path, sql: str = "") -> tuple[Path, str]:
    """A copy of a store with `sql` run on it; the signature of the row
    `sql` may name as `{sig}` (the first brick's, by signature)."""
    copy = folder / f"copy{len(list(folder.glob('copy*')))}.sqlite"
    shutil.copy(db, copy)
    with contextlib.closing(sqlite3.connect(copy)) as conn, conn:
        (sig,) = conn.execute(
            "SELECT MIN(signature) FROM brick_results"
        ).fetchone()
        if sql:
            conn.execute(sql.format(sig=sig))
    return copy, sig


_IMPOSSIBLE = {
    "negative_median": (
        "UPDATE brick_results SET median_ms = -median_ms - 1"
        " WHERE signature = '{sig}'",
        "median_ms=-",
    ),
    "infinite_median": (
        "UPDATE brick_results SET median_ms = 1e999 WHERE signature = '{sig}'",
        "median_ms=inf is not a finite latency of 0 ms or more",
    ),
    "min_above_median": (
        "UPDATE brick_results SET min_ms = 2 * median_ms + 1"
        " WHERE signature = '{sig}'",
        "> median_ms=",
    ),
}


@pytest.mark.parametrize("sql, words", _IMPOSSIBLE.values(), ids=_IMPOSSIBLE)
def test_merge_of_a_store_with_an_impossible_row_adds_nothing(
    timed, tmp_path, sql, words
):
    db, _ = timed
    bad, sig = _copy(db, tmp_path, sql)
    into, _ = _copy(db, tmp_path, "DELETE FROM brick_results")
    before = fakes.table_counts(into)
    with Store(into) as store, pytest.raises(StoreError) as info:
        store.merge_from(bad)
    message = str(info.value)
    assert len(message.splitlines()) == 1, message
    assert f"Store {str(bad)!r} was not merged" in message
    assert f"brick_results row (signature {sig!r}, settings " in message
    assert words in message and "nothing of it was added" in message
    assert fakes.table_counts(into) == before
    proc = dlbricks("merge", f"--db={into}", str(bad))
    assert proc.returncode == 1
    assert proc.stderr.startswith("dlbricks: error: Store ")
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr and words in proc.stderr
    assert fakes.table_counts(into) == before


def test_a_store_merged_twice_keeps_each_description_once(timed, tmp_path):
    db, suite = timed
    assert described(db) == collections.Counter(suite.signatures)
    merged = tmp_path / "merged.sqlite"
    with Store(merged) as store:
        assert store.merge_from(db) == len(suite)
        assert store.merge_from(_copy(db, tmp_path)[0]) == 0
    assert described(merged) == collections.Counter(suite.signatures)


def test_merge_refuses_a_description_it_cannot_trust(timed, tmp_path):
    db, _ = timed
    swapped = (
        "UPDATE brick_descriptions SET json = (SELECT json FROM"
        " brick_descriptions WHERE signature != '{sig}' LIMIT 1)"
        " WHERE signature = '{sig}'"
    )
    cut = "UPDATE brick_descriptions SET json = substr(json, 1, 40)"
    for sql, words in (
        (swapped, "describes brick "),
        (cut, "is not valid JSON"),
    ):
        bad, _ = _copy(db, tmp_path, sql)
        with Store(tmp_path / "into.sqlite") as store:
            with pytest.raises(StoreError) as info:
                store.merge_from(bad)
        message = str(info.value)
        assert len(message.splitlines()) == 1, message
        assert "brick_descriptions row (signature " in message
        assert words in message, message
        counts = fakes.table_counts(tmp_path / "into.sqlite")
        assert counts["brick_results"] == 0
    # Over the limits every reader has: refused too.
    with limits.using(limits.Limits(json_depth=3)):
        with Store(tmp_path / "into.sqlite") as store:
            with pytest.raises(StoreError, match="over the limit of 3"):
                store.merge_from(db)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
