"""Tests of `dlbricks bench` sharded by Bazel itself (`shard_count = 3`).

Bazel runs this file as three shards, each with its own TEST_SHARD_INDEX,
TEST_TOTAL_SHARDS=3 and TEST_SHARD_STATUS_FILE; each shard runs a real
`dlbricks bench` worker with Bazel's environment and checks that it timed
exactly its shard of a tiny model's suite:

    bazel test //tests:bazel_sharding_test

Run by pytest alone (no Bazel sharding) the test is skipped;
tests/shard_merge_test.py covers the same worker with other engines.
"""

import os
import subprocess
import sys

import pytest

from dlbricks_tf.running.sharding import resolve_shard
from tests import cli
from tests import shard_merge_test as shards

pytestmark = pytest.mark.skipif(
    "TEST_TOTAL_SHARDS" not in os.environ,
    reason="runs under Bazel's test sharding: "
    "bazel test //tests:bazel_sharding_test",
)


def test_bazel_shard_worker_times_its_shard(tmp_path):
    index = int(os.environ["TEST_SHARD_INDEX"])
    status = os.environ.get("TEST_SHARD_STATUS_FILE")
    shard = resolve_shard(None, None)
    assert tuple(shard) == (index, 3)
    assert shard.source == "Bazel test sharding"
    # Bazel's protocol: a test that shards touches this file.
    assert status and os.path.isfile(status)

    path, suite = shards.tiny_model_and_suite(tmp_path)
    db = tmp_path / "shard.sqlite"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")  # Bazel's variables.
    env["PYTHONPATH"] = os.pathsep.join(
        [str(cli.ROOT), env.get("PYTHONPATH", "")]
    )
    proc = subprocess.run(
        [sys.executable, "-m", "tools.dlbricks", "bench", f"--models={path}",
         f"--db={db}", *cli.FAST],
        cwd=cli.ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (
        f"Timing shard {index} of 3 (Bazel test sharding: "
        f"TEST_SHARD_INDEX={index}, TEST_TOTAL_SHARDS=3)" in proc.stdout
    )
    held = shards.stored_signatures(db)
    assert sorted(held) == sorted(suite.shard(index, 3).signatures)
    assert set(held.values()) == {1}


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
