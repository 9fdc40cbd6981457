r"""A reproducible noisy neighbour to run beside a timing run.

On a shared VM the neighbours one cannot see move a timing by tens of
percent. This makes one on purpose, the same one each time: pinned to one
core, busy in random bursts drawn from `random.Random(seed)` and idle in
between, and it stops by itself (at --duration_s, when its parent dies, on
SIGTERM or SIGINT). Kinds: `cpu` spins the core; `memory` streams numpy
copies over two buffers many times the last-level cache. On exit it writes
a one-line JSON summary (kind, seed, busy and elapsed seconds, bursts) to
stdout or --summary.

Usage:
    python -m benchmarks.noisy_neighbour --kind=cpu --seed=0 --duration_s=600

From a benchmark script:
    with noisy_neighbour.running("memory", seed=1) as neighbour:
        ...  # time here
    record(neighbour.summary)
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import os
import random
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

KINDS = ("none", "cpu", "memory")
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_CHUNK = 8 << 20  # bytes per copy: the clock is read between chunks


class Burst(NamedTuple):
    """One planned busy window, in seconds from the neighbour's start."""

    start_s: float
    end_s: float


def schedule(
    seed: int,
    duration_s: float,
    burst_s: tuple[float, float] = (0.3, 3.0),
    pause_s: tuple[float, float] = (0.3, 3.0),
) -> tuple[Burst, ...]:
    """The busy windows of a neighbour: a burst first, then pause, burst...

    Args:
        seed: Seeds `random.Random`; the same seed gives the same windows.
        duration_s: Length of the run; the last burst is cut there.
        burst_s: Shortest and longest burst, drawn uniformly.
        pause_s: Shortest and longest pause between bursts.

    Raises:
        ValueError: A duration or range is not positive and ordered.
    """
    if duration_s <= 0:
        raise ValueError(f"duration_s={duration_s} must be positive")
    for name, span in (("burst_s", burst_s), ("pause_s", pause_s)):
        if len(span) != 2 or not 0 < span[0] <= span[1]:
            raise ValueError(f"{name}={list(span)} needs 0 < min <= max")
    rng = random.Random(seed)
    bursts, t = [], 0.0
    while t < duration_s:
        busy = rng.uniform(*burst_s)
        bursts.append(Burst(t, min(t + busy, duration_s)))
        t += busy + rng.uniform(*pause_s)
    return tuple(bursts)


def _spin(until: float, stopped) -> None:
    while not stopped() and time.monotonic() < until:
        x = 0
        for i in range(20_000):  # about a millisecond of one core
            x += i


def _streamer(buffer_mib: int):
    import numpy as np

    size = buffer_mib << 20
    # Filled now, so that every page is faulted in before the first burst.
    src, dst = np.full(size, 1, np.uint8), np.full(size, 2, np.uint8)
    offset = 0

    def stream(until: float, stopped) -> None:
        nonlocal offset
        while not stopped() and time.monotonic() < until:
            end = min(offset + _CHUNK, size)
            np.copyto(dst[offset:end], src[offset:end])
            offset = 0 if end == size else end

    return stream


def run(
    kind: str,
    seed: int,
    duration_s: float,
    *,
    cpu: int | None = None,
    burst_s: tuple[float, float] = (0.3, 3.0),
    pause_s: tuple[float, float] = (0.3, 3.0),
    buffer_mib: int = 256,
    parent_pid: int | None = None,
    ready_fd: int | None = None,
) -> dict[str, Any]:
    """Is the neighbour in this process (main thread only); returns a summary.

    Args:
        kind: "cpu" or "memory"; seed, duration_s, burst_s, pause_s as in
            `schedule`.
        cpu: The core to pin to (default: the last one this process may use).
        buffer_mib: Size of each of the memory kind's two buffers.
        parent_pid: Stop when no longer its child (default: the parent now).
        ready_fd: Gets one byte, and is closed, once set up and pinned.

    Raises:
        ValueError: An unknown kind or CPU, or a bad schedule.
    """
    plan = schedule(seed, duration_s, burst_s, pause_s)
    allowed = os.sched_getaffinity(0)
    cpu = max(allowed) if cpu is None else cpu
    if kind not in KINDS[1:]:
        raise ValueError(f"kind={kind!r} must be one of {KINDS[1:]}")
    if cpu not in allowed:
        raise ValueError(f"cpu={cpu} is not one of {sorted(allowed)}")
    parent = os.getppid() if parent_pid is None else parent_pid
    stop: list[str] = []

    def on_signal(signum, frame):
        stop.append("parent" if os.getppid() != parent else "signal")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if sys.platform.startswith("linux"):
        # SIGTERM when the parent (the thread that started us) exits.
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    os.sched_setaffinity(0, {cpu})
    work = _spin if kind == "cpu" else _streamer(buffer_mib)
    if ready_fd is not None:
        os.write(ready_fd, b"1")
        os.close(ready_fd)
    t0, cpu0 = time.monotonic(), time.process_time()
    deadline = t0 + duration_s

    def stopped() -> bool:
        if not stop and os.getppid() != parent:  # also where prctl is not
            stop.append("parent")
        if not stop and time.monotonic() >= deadline:
            stop.append("duration")
        return bool(stop)

    def idle(until: float) -> None:
        while not stopped() and time.monotonic() < until:
            time.sleep(min(0.05, max(0.0, until - time.monotonic())))

    busy_s, bursts = 0.0, 0
    for burst in plan:
        idle(t0 + burst.start_s)
        if stop:
            break
        bursts += 1
        begin = time.monotonic()
        work(t0 + burst.end_s, stopped)
        busy_s += time.monotonic() - begin
    idle(deadline)
    return {
        "kind": kind,
        "seed": seed,
        "cpu": cpu,
        "busy_s": round(busy_s, 3),
        "cpu_s": round(time.process_time() - cpu0, 3),
        "elapsed_s": round(time.monotonic() - t0, 3),
        "bursts": bursts,
        "stop": stop[0],
    }


@dataclasses.dataclass
class Neighbour:
    """A neighbour of `running`: its pid (None for "none"), planned
    schedule, and once the `with` block ends its summary (None if none)."""

    kind: str
    seed: int
    pid: int | None = None
    schedule: tuple[Burst, ...] = ()
    summary: dict[str, Any] | None = None


@contextlib.contextmanager
def running(
    kind: str,
    seed: int = 0,
    *,
    duration_s: float = 3600.0,
    cpu: int | None = None,
    burst_s: tuple[float, float] = (0.3, 3.0),
    pause_s: tuple[float, float] = (0.3, 3.0),
    buffer_mib: int = 256,
    grace_s: float = 5.0,
) -> Iterator[Neighbour]:
    """Runs a neighbour (see `run`) in a subprocess for the `with` block.

    It yields once the neighbour is set up and pinned, and on exit sends it
    SIGTERM, then SIGKILL after `grace_s`, and reaps it. Start it from the
    thread that lives longest: the neighbour also stops when that thread
    ends. `kind="none"` runs nothing.

    Raises:
        ValueError: A bad kind or schedule.
        RuntimeError: The neighbour exited before it was set up.
    """
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} must be one of {KINDS}")
    if kind == "none":
        yield Neighbour(kind, seed)
        return
    neighbour = Neighbour(
        kind, seed, schedule=schedule(seed, duration_s, burst_s, pause_s)
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    fd, summary = tempfile.mkstemp(prefix="noisy_neighbour_", suffix=".json")
    os.close(fd)
    read_end, write_end = os.pipe()
    args = dict(
        kind=kind,
        seed=seed,
        duration_s=duration_s,
        cpu=cpu,
        burst_s=",".join(map(str, burst_s)),
        pause_s=",".join(map(str, pause_s)),
        buffer_mib=buffer_mib,
        summary=summary,
        parent_pid=os.getpid(),
        ready_fd=write_end,
    )
    argv = [sys.executable, "-m", "benchmarks.noisy_neighbour"]
    argv += [f"--{k}={v}" for k, v in args.items() if v is not None]
    try:
        proc = subprocess.Popen(  # its summary goes to the file
            argv, cwd=root, stdout=subprocess.DEVNULL, pass_fds=(write_end,)
        )
        os.close(write_end)
        try:
            # One byte once the neighbour is set up; EOF if it exits first.
            ready, _, _ = select.select([read_end], [], [], 120.0)
            if not ready:
                raise RuntimeError(f"neighbour {kind!r} not set up in 120 s")
            if not os.read(read_end, 1):
                raise RuntimeError(
                    f"neighbour {kind!r} exited with code {proc.wait()} "
                    "before it was set up; see its stderr"
                )
            neighbour.pid = proc.pid
            yield neighbour
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        with open(summary) as f:
            text = f.read()
        neighbour.summary = json.loads(text) if text.strip() else None
    finally:
        os.close(read_end)
        os.remove(summary)


def main(argv: list[str]) -> None:
    from absl import app

    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    values = {name: holder.value for name, holder in _FLAGS.items()}
    path = values.pop("summary")
    try:
        for name in ("burst_s", "pause_s"):
            values[name] = tuple(float(v) for v in values[name])
        line = json.dumps(run(**values)) + "\n"
    except ValueError as e:
        raise app.UsageError(str(e)) from None
    if path:
        with open(path, "w") as out:
            out.write(line)
    else:
        sys.stdout.write(line)


if __name__ == "__main__":
    from absl import app, flags

    # Defined only when run as a program: a benchmark that imports `running`
    # may have a --seed of its own. Named as `run`'s arguments.
    _FLAGS = {
        "kind": flags.DEFINE_enum("kind", "cpu", KINDS[1:], "What to load."),
        "seed": flags.DEFINE_integer("seed", 0, "Seeds the burst schedule."),
        "duration_s": flags.DEFINE_float("duration_s", 600.0, "Stop after."),
        "cpu": flags.DEFINE_integer("cpu", None, "Core (default: the last)."),
        "burst_s": flags.DEFINE_list("burst_s", "0.3,3", "min,max seconds."),
        "pause_s": flags.DEFINE_list("pause_s", "0.3,3", "min,max seconds."),
        "buffer_mib": flags.DEFINE_integer(
            "buffer_mib", 256, "Memory: each buffer, MiB.", lower_bound=1
        ),
        "summary": flags.DEFINE_string("summary", None, "File, or stdout."),
        "parent_pid": flags.DEFINE_integer("parent_pid", None, "Its parent."),
        "ready_fd": flags.DEFINE_integer("ready_fd", None, "Told when ready."),
    }
    app.run(main)
