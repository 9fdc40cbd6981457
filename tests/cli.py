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


def dlbricks(*args: str, cwd=None) -> subprocess.CompletedProcess:
    """Runs `python -m tools.dlbricks ARGS` from the repository root."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "tools.dlbricks", *args],
        cwd=cwd or ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
