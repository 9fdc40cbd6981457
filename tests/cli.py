"""Running the command line as a subprocess, as a user would, in tests.

Example:
    proc = cli.dlbricks("decompose", "--models=m.keras", *cli.FAST)
    assert proc.returncode == 0, proc.stderr
"""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Tight timing caps: the tests check behaviour, not figures.
FAST = [
    "--min_samples=3",
    "--max_samples=5",
    "--max_seconds=0.2",
    "--target_sample_ms=0.5",
    "--intra_op_threads=1",
]


# Variables of the engines that run workers: removed from the environment
# the command inherits, so a test run by Bazel or Slurm sets only its own.
SHARD_VARIABLES = (
    "TEST_SHARD_INDEX",
    "TEST_TOTAL_SHARDS",
    "TEST_SHARD_STATUS_FILE",
    "JOB_COMPLETION_INDEX",
    "SLURM_ARRAY_TASK_ID",
    "SLURM_ARRAY_TASK_COUNT",
    "SLURM_ARRAY_TASK_MIN",
    "SLURM_ARRAY_TASK_MAX",
    "SLURM_ARRAY_TASK_STEP",
)


def clean_environment(**extra: str) -> dict[str, str]:
    """os.environ without engine variables, the repo importable, + extra."""
    env = {k: v for k, v in os.environ.items() if k not in SHARD_VARIABLES}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


def dlbricks(*args: str, cwd=None, **env: str) -> subprocess.CompletedProcess:
    """Runs `python -m tools.dlbricks ARGS` from the repository root.

    The environment is `clean_environment(**env)`.
    """
    return subprocess.run(
        [sys.executable, "-m", "tools.dlbricks", *args],
        cwd=cwd or ROOT,
        env=clean_environment(**env),
        capture_output=True,
        text=True,
        timeout=300,
    )
