"""Progress lines of long commands: timings done, rate and ETA."""

from __future__ import annotations

import sys
import time


class Progress:
    """One progress line per G: timings done, rate and ETA.

    On a terminal the line is redrawn in place; otherwise (a log file) a
    line is printed at most every 30 s and at the end.
    """

    def __init__(self, label: str = "", verb: str = "timed") -> None:
        self._label = label
        self._verb = verb
        self._tty = sys.stdout.isatty()
        self._start = 0.0
        self._last = 0.0
        self._open = False  # A tty line is drawn and not yet ended.

    def __call__(self, model: str, done: int, total: int) -> None:
        now = time.perf_counter()
        if done == 0 or not self._start:
            self._start, self._last = now, 0.0
        finished = done >= total
        if not self._tty and now - self._last < 30.0 and not finished:
            return
        self._last = now
        elapsed = now - self._start
        eta = duration(elapsed / done * (total - done)) if done else "-"
        line = (
            f"{self._label}{done}/{total} {self._verb} ({model}), "
            f"{duration(elapsed)} elapsed, ETA {eta}"
        )
        if self._tty:
            sys.stdout.write(f"\r\033[K{line}")
            self._open = not finished
            if finished:
                sys.stdout.write("\n")
        else:
            sys.stdout.write(line + "\n")
        sys.stdout.flush()

    def log(self, line: str) -> None:
        """Prints a line without breaking the progress line."""
        if self._open:
            sys.stdout.write("\r\033[K")
        print(line, flush=True)


def duration(seconds: float) -> str:
    """`seconds` as 7s or 2m05s."""
    minutes, s = divmod(int(round(seconds)), 60)
    return f"{minutes}m{s:02d}s" if minutes else f"{s}s"
