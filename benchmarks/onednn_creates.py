r"""Where oneDNN creates its primitives during a run: before or in samples.

A oneDNN primitive created inside a timed sample (a miss of TensorFlow's
per-thread primitive cache, or an op that creates one on every execution)
is charged to the brick or model as latency. This script runs
`benchmarks.accuracy` with the given flags in a child process with oneDNN's
creation log on (`ONEDNN_VERBOSE=profile_create`; `TF_ENABLE_ONEDNN_OPTS=1`
unless the environment sets it) and marks every timer's `sample()` and
every reference reading on the same stream, so that each creation is
counted by where it fell:

* *preparation*: a timer's first `sample()` (trace, first call, warm-up,
  then its first batch), where creating primitives is expected;
* *chain samples*, *model samples*: a later `sample()` of a chain of
  bricks or of a whole model, inside the timed calls;
* *reference readings*: a reading from Python, outside any timer;
* *elsewhere*: anything else (cutting, calibration, the store).

For the later samples it prints what was created (primitive kind and
algorithm) and, per timer, how many creations each later sample made: a
count that is the same for every sample is an op that creates on every
execution (in the model as in its bricks), one that falls to 0 is a cache
that was still filling, one that grows is a cache that overflows.

The accuracy benchmark's own table is printed too, but its timings carry
the log's cost: take figures from runs without it. Nothing here is timed.

Usage:
    python -m benchmarks.onednn_creates --granularities=1 --recheck=0 \
        --out=<folder>
"""

from __future__ import annotations

import collections
import functools
import os
import sys

from absl import app, flags

from benchmarks import accuracy, child_lines

_CHILD = flags.DEFINE_bool(
    "census_child",
    False,
    "Internal: run the accuracy benchmark with its timers marked.",
)

_MARK = "=== "
PHASES = (
    "preparation",
    "chain samples",
    "model samples",
    "reference readings",
    "elsewhere",
)


def _mark(text: str) -> None:
    # Unbuffered, on the stream oneDNN's log goes to (stdout).
    os.write(1, f"{_MARK}{text}\n".encode())


def _marked(method, kind: str):
    """Wraps a public `sample`/`read` method with begin/end marks."""
    seen: set[int] = set()

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if kind == "reference":
            phase = "reference readings"
        elif id(self) not in seen:
            seen.add(id(self))
            phase = "preparation"
        else:
            phase = f"{kind} samples"
        _mark(f"begin {phase}|{kind}:{id(self)}")
        try:
            return method(self, *args, **kwargs)
        finally:
            _mark("end")

    return wrapper


def _run_child(argv: list[str]) -> None:
    from dlbricks_tf.measuring import chain, reference, timing

    chain.ChainTimer.sample = _marked(chain.ChainTimer.sample, "chain")
    timing.Timer.sample = _marked(timing.Timer.sample, "model")
    reference.Reference.read = _marked(reference.Reference.read, "reference")
    accuracy.main(argv)


class Census:
    """Counts oneDNN creation lines by the phase they fall in."""

    def __init__(self) -> None:
        self.by_phase: collections.Counter = collections.Counter()
        self.kinds: collections.Counter = collections.Counter()
        # timer -> creations in each of its later samples.
        self.per_sample: dict[str, list[int]] = collections.defaultdict(list)
        self._stack: list[tuple[str, str]] = []

    def feed(self, line: str) -> bool:
        """Takes one line of the child's stdout; False if it is not ours."""
        if line.startswith(_MARK + "begin "):
            phase, timer = line[len(_MARK) + 6 :].rstrip("\n").split("|")
            self._stack.append((phase, timer))
            if phase.endswith(" samples"):
                self.per_sample[timer].append(0)
            return True
        if line.startswith(_MARK + "end"):
            if self._stack:
                self._stack.pop()
            return True
        if not line.startswith("onednn_verbose,"):
            return False
        parts = line.split(",")
        if len(parts) > 5 and parts[3].startswith("create"):
            # The outermost timer decides: a chain reads the reference
            # right after its own call, inside its `sample()`.
            phase, timer = self._stack[0] if self._stack else ("elsewhere", "")
            self.by_phase[phase] += 1
            if phase.endswith(" samples"):
                self.per_sample[timer][-1] += 1
                alg = next(
                    (p for p in parts if p.startswith("alg:")), "alg:-"
                ).split()[0]
                self.kinds[(phase, parts[5], alg)] += 1
        return True

    def table(self) -> str:
        rows = [
            "| where | oneDNN primitives created |",
            "|---|---:|",
            *(f"| {p} | {self.by_phase[p]} |" for p in PHASES),
            "",
            "| in | primitive | algorithm | created |",
            "|---|---|---|---:|",
            *(
                f"| {phase} | {kind} | {alg[4:]} | {n} |"
                for (phase, kind, alg), n in self.kinds.most_common(10)
            ),
            "",
            "| timers | later samples | samples that created | "
            "creations in those (min-max) | timers whose count held |",
            "|---:|---:|---:|---|---:|",
        ]
        counts = list(self.per_sample.values())
        creating = [c for c in counts if any(c)]
        samples = sum(len(c) for c in counts)
        made = [n for c in counts for n in c if n]
        spread = f"{min(made)}-{max(made)}" if made else "-"
        steady = sum(1 for c in creating if len(set(c)) == 1)
        rows.append(
            f"| {len(counts)} | {samples} | {len(made)} | {spread} | "
            f"{steady} of {len(creating)} |"
        )
        return "\n".join(rows)


def main(argv: list[str]) -> None:
    if _CHILD.value:
        _run_child(argv)
        return
    args = [a for a in sys.argv[1:] if not a.startswith("--census_child")]
    env = dict(os.environ, ONEDNN_VERBOSE="profile_create")
    env.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
    census = Census()
    child_lines.read_child(
        ["benchmarks.onednn_creates", "--census_child", *args],
        env,
        census.feed,
    )
    print()
    print(
        "oneDNN primitive creations by where they fell "
        f"(TF_ENABLE_ONEDNN_OPTS={env['TF_ENABLE_ONEDNN_OPTS']}):"
    )
    print(census.table())


if __name__ == "__main__":
    app.run(main)
