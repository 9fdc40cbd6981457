"""Other work on this process's CPUs during a sample, from /proc/stat.

`dlbricks_tf.measuring.disturbed` tells a neighbour's burst by a sample's
own time: much slower than its timer's lower quartile. A sample longer
than the bursts defeats that: every one holds a piece of a burst, so the
lower quartile moves up with them and none is left out, while the
bricks' short passes, left out when a burst hits them, read the machine
undisturbed. Beside a seeded neighbour spinning one of two cores in
bursts of 0.3-3 s, the bricks of ConvNeXtLarge (about 1 s a call)
summed to 0.76 of its measured time for that reason, ConvNeXtXLarge's
to 0.73 (2026-12-06). A model whose every sample is crowded still
falls back on its samples' times (`disturbed.kept`): ConvNeXtXLarge's
1.6-2 s calls seldom fit in that neighbour's pauses.

The kernel counts what the CPUs did meanwhile. Between two readings of
/proc/stat, the jiffies the CPUs this process may run on spent busy
(user, system, interrupts, and steal: the hypervisor running another
guest) less this process's own CPU time are other work. A sample during
which other work took more than `SHARE` of those CPUs' time, plus
`SLACK_JIFFIES` for the counters' tick-granularity, is *crowded*. Timed
around each ConvNeXtLarge call (2 threads on 2 vCPUs; a throw-away
script, 2026-12-06): quiet, other work took -2% to 1% of the CPUs; beside
the spinner 0-45%, and the 17 of 60 calls under 3% took 0.98-1.11 s, as
the quiet calls did (1.00-1.09 s), against up to 1.83 s for the others.

What it sees: processes beside this one and other guests' steal. What
it does not: a neighbour in another guest that slows the memory bus
without taking CPU time (the lower-quartile rule is left for that), and
a sample shorter than a few jiffies (a jiffy is 10 ms; such samples are
seldom longer than a burst). A crowded sample is one that other work
overlapped; it may not have been slowed (another process on a CPU this
one left idle), and leaving it out costs a sample, never biases one.

Nothing here raises: without /proc/stat every reading is None and no
sample is crowded. Imports no TensorFlow.

Example:
    before = crowding.read()
    run_the_sample()
    crowded = crowding.crowded(before, crowding.read())
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time

from dlbricks_tf.measuring import steal

# Other work above this share of the CPUs' time (plus the slack) makes a
# sample crowded: quiet, other work took -2% to 1% of a 1 s sample.
SHARE = 0.03
# Jiffies of other work always allowed: the counters advance by whole
# ticks, and this process's own CPU time is exact.
SLACK_JIFFIES = 2


@dataclasses.dataclass(frozen=True)
class Reading:
    """The counters at one moment.

    Attributes:
        busy: Jiffies the CPUs spent not idle (steal included), summed
            over the CPUs this process may run on.
        total: All their jiffies.
        own_s: This process's CPU time, seconds (`time.process_time`).
    """

    busy: int
    total: int
    own_s: float


@functools.cache
def _cpus() -> frozenset[str]:
    """Names of the /proc/stat lines of the CPUs this process may use."""
    try:
        return frozenset(f"cpu{i}" for i in os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return frozenset()


@functools.cache
def _hz() -> int:
    """Jiffies per second of /proc/stat (USER_HZ)."""
    try:
        return int(os.sysconf("SC_CLK_TCK")) or 100
    except (AttributeError, ValueError, OSError):
        return 100


def reading_of(times: steal.CpuTimes | None, own_s: float) -> Reading | None:
    """The counters of the CPUs this process may use, from one reading of
    /proc/stat (the aggregate line if none of them is listed)."""
    if times is None:
        return None
    cpus = _cpus()
    lines = [line for line in times.cpus if line.name in cpus] or [times.cpu]
    total = sum(line.total for line in lines)
    idle = sum(line.idle + line.iowait for line in lines)
    return Reading(busy=total - idle, total=total, own_s=own_s)


def read(path: str = steal.PROC_STAT) -> Reading | None:
    """Reads the counters now; None without a readable /proc/stat."""
    own_s = time.process_time()
    return reading_of(steal.read_stat(path), own_s)


def others_jiffies(before: Reading, after: Reading) -> float:
    """Jiffies of other work between two readings (may dip below 0 by a
    tick or two: the kernel's counters advance by whole ticks)."""
    own = (after.own_s - before.own_s) * _hz()
    return (after.busy - before.busy) - own


def crowded(before: Reading | None, after: Reading | None) -> bool:
    """Whether other work took more than `SHARE` of the CPUs' time (plus
    `SLACK_JIFFIES`) between two readings; False if either is None."""
    if before is None or after is None:
        return False
    total = after.total - before.total
    return others_jiffies(before, after) > SLACK_JIFFIES + SHARE * total
