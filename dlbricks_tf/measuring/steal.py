"""Hypervisor steal: CPU time the host gave to other guests, from /proc/stat.

On a shared VM a model's latency moves with what the neighbours do, and
the kernel counts it: the `steal` column of /proc/stat holds the jiffies
a virtual CPU was ready to run but the hypervisor ran something else. A
batch-8 run that read normalized latency 0.70-1.27 during 14-36% steal
read 0.89-0.99 with 0-2% (DESIGN.md, "Hosts and noise"), so a run's
steal says how far its figures can be trusted.

A line of /proc/stat reads `cpu user nice system idle iowait irq softirq
steal guest guest_nice` (jiffies since boot; `cpu` sums all CPUs, `cpuN`
is one CPU). Guest time is already counted in user and nice, so a line's
total is the sum of its first eight columns. Kernels before 2.6.11 have
no steal column: a line without one has `steal` None, and every share
taken from it is None.

`StealMeter` keeps a running record over a run: call `start()` before,
`tick()` between samples (it only reads the clock until `min_interval_s`
has passed since the last reading, so it costs next to nothing), and
`stop()` after. Nothing here raises on a machine without /proc/stat: the
figures are None there. Nothing here imports TensorFlow.

Example:
    meter = StealMeter()
    meter.start()
    for _ in range(samples):
        time_one_sample()
        meter.tick()
    meter.stop()
    meter.summary()  # {"steal_share": 0.02, "steal_peak_share": 0.11}
"""

from __future__ import annotations

import dataclasses
import time

PROC_STAT = "/proc/stat"
# The columns a line's total is made of, in /proc/stat's order.
COLUMNS = (
    "user",
    "nice",
    "system",
    "idle",
    "iowait",
    "irq",
    "softirq",
    "steal",
)


@dataclasses.dataclass(frozen=True)
class CpuLine:
    """The jiffies counters of one `cpu` line of /proc/stat.

    Attributes:
        name: `cpu` for the sum over all CPUs, `cpuN` for CPU N.
        user: Time in user mode (guest time included).
        nice: Time in user mode at low priority (guest_nice included).
        system: Time in kernel mode.
        idle: Idle time.
        iowait: Idle time waiting for I/O (0 where the kernel has none).
        irq: Time serving interrupts (0 where the kernel has none).
        softirq: Time serving softirqs (0 where the kernel has none).
        steal: Time the hypervisor ran something else while this CPU was
            ready; None where the kernel has no steal column.
    """

    name: str
    user: int
    nice: int
    system: int
    idle: int
    iowait: int = 0
    irq: int = 0
    softirq: int = 0
    steal: int | None = None

    @property
    def total(self) -> int:
        """All jiffies of the line (guest time is inside user and nice)."""
        return (
            self.user
            + self.nice
            + self.system
            + self.idle
            + self.iowait
            + self.irq
            + self.softirq
            + (self.steal or 0)
        )


@dataclasses.dataclass(frozen=True)
class CpuTimes:
    """One reading of /proc/stat's CPU counters.

    Attributes:
        time_s: When it was read (`time.monotonic()`, or what the parser
            was given).
        cpu: The aggregate `cpu` line.
        cpus: The per-CPU lines, in the file's order.
    """

    time_s: float
    cpu: CpuLine
    cpus: tuple[CpuLine, ...] = ()

    @property
    def has_steal(self) -> bool:
        """Whether the aggregate line has a steal column."""
        return self.cpu.steal is not None


def parse_line(line: str) -> CpuLine | None:
    """A `cpu` or `cpuN` line of /proc/stat; None for any other line.

    A line with fewer than the four columns every kernel writes, or with
    a column that is not a non-negative integer, is None too.
    """
    fields = line.split()
    if not fields or not fields[0].startswith("cpu"):
        return None
    try:
        values = [int(v) for v in fields[1 : 1 + len(COLUMNS)]]
    except ValueError:
        return None
    if len(values) < 4 or min(values) < 0:
        return None
    return CpuLine(fields[0], *values)


def parse_stat(text: str, time_s: float = 0.0) -> CpuTimes | None:
    """The CPU counters in the text of /proc/stat.

    Args:
        text: The file's content.
        time_s: The time of the reading, kept in the result.

    Returns:
        The counters, or None if the text has no usable aggregate `cpu`
        line.
    """
    lines = [parse_line(line) for line in text.splitlines()]
    lines = [line for line in lines if line is not None]
    total = [line for line in lines if line.name == "cpu"]
    if not total:
        return None
    cpus = tuple(line for line in lines if line.name != "cpu")
    return CpuTimes(time_s, total[0], cpus)


def read_stat(path: str = PROC_STAT) -> CpuTimes | None:
    """Reads the CPU counters now; None if `path` cannot be read or parsed."""
    now = time.monotonic()
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    return parse_stat(text, now)


def line_steal_share(before: CpuLine, after: CpuLine) -> float | None:
    """Steal jiffies over all jiffies between two readings of one line.

    Returns:
        A share in [0, 1]; 0 if no jiffy passed; None if either line has
        no steal column or a counter went backwards (not the same CPU, or
        its counters were reset).
    """
    if before.steal is None or after.steal is None:
        return None
    total = after.total - before.total
    steal = after.steal - before.steal
    if total < 0 or steal < 0 or steal > total:
        return None
    return steal / total if total else 0.0


def steal_share(
    before: CpuTimes | None, after: CpuTimes | None
) -> float | None:
    """The share of all CPUs' time stolen between two readings.

    Returns:
        Steal jiffies / all jiffies of the aggregate line, in [0, 1]; 0 if
        no jiffy passed; None if a reading is missing or has no steal.
    """
    if before is None or after is None:
        return None
    return line_steal_share(before.cpu, after.cpu)


def per_cpu_steal_shares(
    before: CpuTimes | None, after: CpuTimes | None
) -> dict[str, float | None]:
    """{`cpuN`: share stolen} between two readings, for the CPUs in both.

    One busy neighbour can steal from one virtual CPU only: the aggregate
    share then hides a CPU that lost much more.
    """
    if before is None or after is None:
        return {}
    earlier = {line.name: line for line in before.cpus}
    return {
        line.name: line_steal_share(earlier[line.name], line)
        for line in after.cpus
        if line.name in earlier
    }


class StealMeter:
    """The steal over a run: its total, its peak and its course.

    Attributes:
        min_interval_s: The shortest interval `tick` closes; the peak is
            the largest share over intervals at least this long (shorter
            ones hold a handful of jiffies, so their share jumps).
    """

    def __init__(
        self, path: str = PROC_STAT, *, min_interval_s: float = 1.0
    ) -> None:
        """A meter that reads `path`; `start` begins its record."""
        if min_interval_s < 0:
            raise ValueError(
                f"min_interval_s must be >= 0. Received: {min_interval_s}"
            )
        self.path = path
        self.min_interval_s = min_interval_s
        self._first: CpuTimes | None = None
        self._closed: CpuTimes | None = None
        self._latest: CpuTimes | None = None
        self._intervals: list[tuple[float, float]] = []

    def snapshot(self) -> CpuTimes | None:
        """Reads the counters now (None where they cannot be read)."""
        return read_stat(self.path)

    steal_share = staticmethod(steal_share)

    def start(self) -> None:
        """Forgets any earlier record and takes the first reading."""
        self._first = self._closed = self._latest = None
        self._intervals = []
        self.add(self.snapshot())

    def tick(self) -> float | None:
        """Closes an interval if `min_interval_s` has passed since the last.

        Cheap to call between samples: it reads /proc/stat only when an
        interval is due.

        Returns:
            The closed interval's share, or None if none was closed.
        """
        if self._closed is None:
            return None
        if time.monotonic() - self._closed.time_s < self.min_interval_s:
            return None
        return self.add(self.snapshot())

    def stop(self) -> None:
        """Takes the last reading: the total runs up to now."""
        if self._first is not None:
            self.add(self.snapshot())

    def add(self, reading: CpuTimes | None) -> float | None:
        """Records a reading taken elsewhere (`snapshot` or `parse_stat`).

        The first reading with a steal column starts the record; a later
        one extends the total, and closes an interval if it comes at least
        `min_interval_s` after the last closed one. A reading without
        steal, or earlier than the last, is ignored.

        Returns:
            The share of the interval it closed, or None.
        """
        if reading is None or not reading.has_steal:
            return None
        if self._first is None:
            self._first = self._closed = self._latest = reading
            return None
        if reading.time_s < self._latest.time_s:
            return None
        self._latest = reading
        if reading.time_s - self._closed.time_s < self.min_interval_s:
            return None
        share = steal_share(self._closed, reading)
        self._closed = reading
        if share is not None:
            self._intervals.append((reading.time_s - self._first.time_s, share))
        return share

    @property
    def total_share(self) -> float | None:
        """The share stolen from the first reading to the last.

        None if there is no record (no reading with a steal column).
        """
        if self._first is None:
            return None
        return steal_share(self._first, self._latest)

    @property
    def peak_share(self) -> float | None:
        """The largest share of a closed interval (None if none closed)."""
        return max((s for _, s in self._intervals), default=None)

    @property
    def intervals(self) -> list[tuple[float, float]]:
        """(time, share) of each closed interval, in order.

        The time is the interval's end in seconds after the first reading:
        the course of steal over the run, for a chart.
        """
        return list(self._intervals)

    def summary(self) -> dict[str, float | None]:
        """The figures a report keeps: `steal_share`, `steal_peak_share`."""
        return {
            "steal_share": self.total_share,
            "steal_peak_share": self.peak_share,
        }
