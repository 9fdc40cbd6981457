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
from pathlib import Path

import pytest

import dlbricks_tf
from dlbricks_tf.cutting.suite import Suite, build_suite
from dlbricks_tf.storing.store import Store
from tests import models
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


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
