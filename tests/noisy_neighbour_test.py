"""Tests for benchmarks/noisy_neighbour.py: real neighbours, a second each."""

import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from benchmarks import noisy_neighbour

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI = [sys.executable, "-m", "benchmarks.noisy_neighbour"]
LAST_CPU = max(os.sched_getaffinity(0))


def _alive(pid):
    """Whether `pid` runs; a zombie (ended, not yet reaped) does not."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _gone_within(pid, seconds):
    deadline = time.monotonic() + seconds
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


def _check_summary(summary, kind, seed, stop):
    assert (summary["kind"], summary["seed"]) == (kind, seed)
    assert (summary["cpu"], summary["stop"]) == (LAST_CPU, stop)
    assert 0 < summary["busy_s"] <= summary["elapsed_s"]
    assert summary["bursts"] >= 1


def test_the_same_seed_gives_the_same_schedule():
    plan = noisy_neighbour.schedule(7, 60.0)
    assert plan == noisy_neighbour.schedule(7, 60.0)
    assert plan != noisy_neighbour.schedule(8, 60.0)
    assert plan[0].start_s == 0.0 and plan[-1].end_s <= 60.0
    for burst, after in zip(plan, plan[1:], strict=False):
        assert 0.3 <= burst.end_s - burst.start_s <= 3.0
        assert 0.3 <= after.start_s - burst.end_s <= 3.0
    fixed = noisy_neighbour.schedule(0, 9.5, burst_s=(1, 1), pause_s=(2, 2))
    assert fixed == ((0, 1), (3, 4), (6, 7), (9, 9.5))


@pytest.mark.parametrize(
    "args, message",
    [
        ({"duration_s": 0}, "duration_s=0 must be positive"),
        ({"burst_s": (3, 1)}, r"burst_s=\[3, 1\] needs 0 < min <= max"),
        ({"pause_s": (0, 1)}, r"pause_s=\[0, 1\] needs 0 < min <= max"),
    ],
)
def test_a_bad_schedule_is_refused(args, message):
    with pytest.raises(ValueError, match=message):
        noisy_neighbour.schedule(0, **{"duration_s": 5, **args})


@pytest.mark.parametrize("kind", ["cpu", "memory"])
def test_each_kind_stops_by_itself_at_its_duration(kind):
    done = subprocess.run(
        [*CLI, f"--kind={kind}", "--seed=2", "--duration_s=1.5"]
        + ["--buffer_mib=16"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    _check_summary(summary, kind, 2, "duration")
    assert summary["elapsed_s"] >= 1.5


def test_sigint_stops_it_and_it_writes_its_summary_file(tmp_path):
    read_end, write_end = os.pipe()
    path = tmp_path / "summary.json"
    proc = subprocess.Popen(
        [*CLI, "--duration_s=60", f"--summary={path}"]
        + [f"--ready_fd={write_end}"],
        cwd=ROOT,
        pass_fds=(write_end,),
    )
    os.close(write_end)
    try:
        assert os.read(read_end, 1) == b"1"  # set up and pinned
        assert os.sched_getaffinity(proc.pid) == {LAST_CPU}
        time.sleep(0.5)  # into its first burst, which starts at once
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    finally:
        os.close(read_end)
        proc.kill()
        proc.wait()
    _check_summary(json.loads(path.read_text()), "cpu", 0, "signal")


def test_a_neighbour_whose_parent_is_gone_stops_at_once():
    # Its parent is this test, not --parent_pid: as if that one had died
    # before the neighbour started, which prctl would not catch.
    done = subprocess.run(
        [*CLI, "--duration_s=60", "--parent_pid=1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["stop"] == "parent"


@pytest.mark.parametrize("kind", ["cpu", "memory"])
def test_running_leaves_no_process_behind(kind):
    with noisy_neighbour.running(kind, seed=3, buffer_mib=16) as neighbour:
        assert _alive(neighbour.pid)
        assert os.sched_getaffinity(neighbour.pid) == {LAST_CPU}
        time.sleep(0.5)  # into its first burst
    assert not _alive(neighbour.pid)
    assert neighbour.schedule == noisy_neighbour.schedule(3, 3600.0)
    _check_summary(neighbour.summary, kind, 3, "signal")


def test_running_none_runs_nothing():
    with noisy_neighbour.running("none", seed=1) as neighbour:
        assert (neighbour.pid, neighbour.schedule) == (None, ())
    assert neighbour.summary is None


def test_running_refuses_a_bad_kind_and_a_neighbour_that_cannot_start():
    with pytest.raises(ValueError, match="kind='gpu' must be one of"):
        with noisy_neighbour.running("gpu"):
            pass
    with pytest.raises(RuntimeError, match="'cpu' exited with code 1 before"):
        with noisy_neighbour.running("cpu", cpu=LAST_CPU + 1):
            pass


_PARENT = """
import os, signal, time
from benchmarks import noisy_neighbour
with noisy_neighbour.running("cpu", duration_s=60.0) as neighbour:
    print(neighbour.pid, flush=True)
    time.sleep(0.5)  # into its first burst, so that it has been busy
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_parent_leaves_no_orphan(tmp_path):
    # The killed parent cannot remove its summary file: keep it in tmp_path.
    # Only stdout is read: the neighbour does not hold it open.
    parent = subprocess.run(
        [sys.executable, "-c", _PARENT],
        cwd=ROOT,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        stdout=subprocess.PIPE,
        text=True,
        timeout=120,
    )
    assert parent.returncode == -signal.SIGKILL
    assert _gone_within(int(parent.stdout), 30.0)
    (path,) = glob.glob(str(tmp_path / "noisy_neighbour_*.json"))
    with open(path) as f:
        _check_summary(json.loads(f.read()), "cpu", 0, "parent")


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
