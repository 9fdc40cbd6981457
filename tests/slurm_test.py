"""Tests of deploy/slurm_array.sh on a real one-node Slurm cluster.

The module fixture starts the cluster with `.ci/slurm_up` (Debian's
slurmctld, slurmd, slurm-client and munge; root only) and stops afterwards
only the daemons it started. The test submits the repository's array
script the way a user would, three shards one at a time:

    DLBRICKS_ARGS="--models=chain.keras ..." \\
        sbatch --array=0-2%1 --wait deploy/slurm_array.sh

and checks that each task timed the shard its SLURM_ARRAY_TASK_ID names
and that `dlbricks merge` of the three stores holds every signature of
the suite exactly once. Without Slurm the test is skipped, unless the
environment variable CI is set: CI must run it, so there it fails.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests import cli
from tests import shard_merge_test as shards

ROOT = cli.ROOT
INSTALL = "apt-get install -y slurmctld slurmd slurm-client munge"
# Pid files of the daemons .ci/slurm_up starts (its slurm.conf sets them).
PID_FILES = {
    "munged": "/run/munge/munged.pid",
    "slurmctld": "/run/slurmctld.pid",
    "slurmd": "/run/slurmd.pid",
}


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"CI is set, so Slurm must run here: {reason}")
    pytest.skip(f"{reason} (with CI set, this fails instead)")


def _cluster_up() -> bool:
    proc = subprocess.run(
        ["scontrol", "ping"], capture_output=True, text=True, timeout=30
    )
    return "is UP" in proc.stdout


def _stop(pid: int) -> None:
    """Sends SIGTERM to a daemon the fixture started; waits until it ends."""
    try:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            os.kill(pid, 0)  # Raises once the process is gone.
            time.sleep(0.2)
    except ProcessLookupError:
        return


@pytest.fixture(scope="module")
def cluster():
    """A running Slurm cluster; stops the daemons it had to start."""
    if shutil.which("sbatch") is None:
        _unavailable(f"Slurm is not installed: {INSTALL}")
    started = {}
    if os.geteuid() == 0:
        proc = subprocess.run(
            [str(ROOT / ".ci" / "slurm_up")],
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        last = proc.stdout.strip().splitlines()[-1]
        assert last.startswith("started:"), proc.stdout
        started = dict(item.split("=") for item in last.split()[1:])
    elif not _cluster_up():
        _unavailable("no Slurm controller answers, and only root can start")
    yield
    # Node daemon first, munge last: the others need it to shut down.
    for name in ("slurmd", "slurmctld", "munged"):
        if started.get(name):
            _stop(int(started[name]))


def _sbatch(*args: str, env: dict[str, str], timeout: float = 600):
    """Runs sbatch --wait; cancels the job if it outlives `timeout`."""
    command = ["sbatch", "--parsable", "--wait", *args]
    try:
        return subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout
        job = (out or "").strip().split(";")[0]
        if job.isdigit():
            subprocess.run(["scancel", job], timeout=30, check=False)
        raise


def test_array_tasks_time_their_shards_and_merge_once_each(cluster, tmp_path):
    path, suite = shards.tiny_model_and_suite(tmp_path)
    stores = tmp_path / "stores"
    logs = tmp_path / "logs"
    logs.mkdir()
    env = cli.clean_environment(
        DLBRICKS_ARGS=" ".join([f"--models={path}", *cli.FAST]),
        DLBRICKS_STORES=str(stores),
        DLBRICKS_PYTHON=sys.executable,
    )
    proc = _sbatch(
        "--array=0-2%1",
        f"--chdir={ROOT}",
        f"--output={logs}/task_%a.out",
        "--job-name=dlbricks-test",
        str(ROOT / "deploy" / "slurm_array.sh"),
        env=env,
    )
    outputs = {p.name: p.read_text() for p in sorted(logs.iterdir())}
    assert proc.returncode == 0, (proc.stderr, outputs)
    assert re.fullmatch(r"\d+", proc.stdout.strip().split(";")[0])
    assert sorted(outputs) == ["task_0.out", "task_1.out", "task_2.out"]
    for i in range(3):
        out = outputs[f"task_{i}.out"]
        assert (
            f"Timing shard {i} of 3 (Slurm job array: "
            f"SLURM_ARRAY_TASK_ID={i}, SLURM_ARRAY_TASK_COUNT=3)" in out
        ), out
        n = len(suite.shard(i, 3))
        assert f"G=1: timed {n}, already stored 0" in out, out
    # The local copies are gone; only the shard stores remain.
    assert sorted(p.name for p in stores.iterdir()) == [
        "shard_0.sqlite",
        "shard_1.sqlite",
        "shard_2.sqlite",
    ]
    shards.check_shards_and_merge(
        suite,
        [stores / f"shard_{i}.sqlite" for i in range(3)],
        tmp_path / "merged.sqlite",
    )


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
