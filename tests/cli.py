"""Running the command line in tests: in this process, or as a subprocess.

`dlbricks` calls the command line's `main` here, with the flags parsed as
`app.run` parses them and reset after, and returns what a subprocess would:
the exit code, stdout and stderr. It saves the TensorFlow import and
start-up each command would pay in a fresh process. `subprocess_dlbricks`
starts a real `python -m tools.dlbricks` for what only a fresh process
shows: its exit code as the shell sees it, its thread pools set up from
the flags, TensorFlow's start-up kept off stderr, signals, and modules
imported with `--import`.

Example:
    proc = cli.dlbricks("decompose", "--models=m.keras")
    assert proc.returncode == 0, proc.stderr
"""

import contextlib
import io
import os
import signal
import subprocess
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Tight timing caps: the tests check behaviour, not figures. Timing flags:
# for the commands that time (run, bench, measure) only; the others refuse
# them.
FAST = [
    "--min_samples=3",
    "--max_samples=5",
    "--max_seconds=0.2",
    "--target_sample_ms=0.5",
    "--intra_op_threads=1",
]
# The thread pools of this process (tests/conftest.py): TensorFlow fixes
# them at its first op, so a command run here must ask for the same.
THREADS = ["--intra_op_threads=1", "--inter_op_threads=1"]


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


def subprocess_dlbricks(
    *args: str, cwd=None, **env: str
) -> subprocess.CompletedProcess:
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


@contextlib.contextmanager
def _environment(**extra: str):
    """os.environ as `clean_environment(**extra)` sets it, then restored."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(clean_environment(**extra))
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def dlbricks(*args: str, cwd=None, **env: str) -> subprocess.CompletedProcess:
    """Runs the command line's main in this process, as `subprocess_dlbricks`.

    The flags are parsed as `dlbricks_tf.cli.main.run` parses them (a bad
    flag is exit code 2) and reset after; the environment is
    `clean_environment(**env)` and the working folder `cwd` (default: the
    repository root) while it runs. The thread pools are this process's
    (`THREADS`) unless `args` set them: a command asking for others ends in
    a ThreadPoolError, as TensorFlow allows one set-up per process. A bug
    (any other exception) is exit code 1 with its traceback on stderr, as
    in a subprocess.

    Returns:
        A CompletedProcess with the exit code, stdout and stderr.
    """
    from absl import flags

    from dlbricks_tf.cli import main
    from dlbricks_tf.machine import process

    argv = ["dlbricks", *args]
    for default in THREADS:
        if not any(a.startswith(default.split("=")[0] + "=") for a in args):
            argv.append(default)
    process.configure_threads(1, 1)  # What conftest.py's tests run with.
    out, err = io.StringIO(), io.StringIO()
    sigterm = signal.getsignal(signal.SIGTERM)
    cwd_before = os.getcwd()
    code = 0
    flags.FLAGS.unparse_flags()  # Each run parses from the defaults.
    try:
        with _environment(**env), contextlib.redirect_stdout(out):
            with contextlib.redirect_stderr(err):
                os.chdir(cwd or ROOT)
                try:
                    main.main(main._parse_flags(argv))
                except SystemExit as e:
                    code = _exit_code(e.code)
                except Exception:  # A bug: the interpreter's exit code.
                    traceback.print_exc()
                    code = 1
    finally:
        os.chdir(cwd_before)
        signal.signal(signal.SIGTERM, sigterm)
        flags.FLAGS.unparse_flags()
    return subprocess.CompletedProcess(
        argv, code, out.getvalue(), err.getvalue()
    )


def _exit_code(code) -> int:
    """SystemExit's code as a process's exit status (a message: 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1
