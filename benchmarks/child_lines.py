"""A benchmark's child process, its stdout read line by line.

`onednn_creates` and `onednn_exec` run the timing in a child with oneDNN's
log on and read that log from the child's stdout: `read_child` hands every
line to a reader, and the lines the reader does not take are the child's
own output, passed on.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence


def read_child(
    args: Sequence[str], env: Mapping[str, str], feed: Callable[[str], bool]
) -> None:
    """Runs `python -m <args>` with `env`, feeding each stdout line to
    `feed`; a line it returns False for is written to our stdout.

    Raises:
        SystemExit: With the child's exit status, if it failed.
    """
    with subprocess.Popen(
        [sys.executable, "-m", *args],
        env=dict(env),
        stdout=subprocess.PIPE,
        text=True,
    ) as child:
        for line in child.stdout:
            if not feed(line):
                sys.stdout.write(line)
    if child.returncode:
        raise SystemExit(child.returncode)
