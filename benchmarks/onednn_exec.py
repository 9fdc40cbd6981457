r"""How long oneDNN runs each primitive in a whole model and in its bricks.

A brick is timed in a chain of its model's unique bricks, each once a
pass. In the model, a layer that repeats (the cells of a NASNet, the blocks
of a MobileNet stage) runs its kernel again within a few layers. This
script reads oneDNN's own execution log (`ONEDNN_VERBOSE=profile_exec`:
one line per primitive run, with its problem and its milliseconds) in two
child processes per thread count, oneDNN on unless
`TF_ENABLE_ONEDNN_OPTS` says otherwise:

* *model*: the whole model as the only link of a chain
  (`dlbricks_tf.measuring.chain.ChainTimer`, the harness of its bricks);
* *bricks*: its unique bricks at --granularity in one chain, as a
  campaign times them.

Both run --samples samples after --warmup ones; only the later samples'
lines are read. For every problem (primitive kind and shape) that both
run, the model's executions per call weight the two mean durations, so
that the table says what the model's primitives cost, run as the model
runs them and as its bricks' chain runs them. oneDNN's log slows what it
times: read the ratios, not the microseconds. Nothing here is stored.

--models (keras.applications names; NASNetMobile without it) and
--granularity (one G) choose what is cut; --threads the intra-op thread
counts (one inter-op thread).

Usage:
    python -m benchmarks.onednn_exec --models=NASNetMobile --threads=1,2
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import os
import platform
import sys

from absl import app, flags

from benchmarks import child_lines
from dlbricks_tf.cli import model_flags

# Shown by --helpshort.
for _name in ("granularity", "models"):
    flags.declare_key_flag(_name)
_THREADS = flags.DEFINE_list("threads", ["1", "2"], "Intra-op thread counts.")
_WARMUP = flags.DEFINE_integer(
    "warmup", 5, "Samples before the log is read.", lower_bound=1
)
_SAMPLES = flags.DEFINE_integer(
    "samples", 10, "Samples whose log is read.", lower_bound=1
)
_CHILD = flags.DEFINE_enum(
    "exec_child", None, ["model", "bricks"], "Internal: run one way."
)
_CHILD_THREADS = flags.DEFINE_integer(
    "exec_child_threads", 1, "Internal: the child's intra-op threads."
)
_CHILD_MODEL = flags.DEFINE_string(
    "exec_child_model", None, "Internal: the child's model."
)

_MARK = "=== "
WAYS = ("model", "bricks")
DEFAULT_MODEL = "NASNetMobile"


@dataclasses.dataclass
class Tally:
    """oneDNN's execution lines of one child, after its `begin` mark.

    Attributes:
        durations: (primitive kind, problem) -> milliseconds of each run.
        calls: Model calls (or chain passes) the read lines cover.
    """

    durations: dict[tuple[str, str], list[float]] = dataclasses.field(
        default_factory=lambda: collections.defaultdict(list)
    )
    calls: int = 0
    _reading: bool = False

    def feed(self, line: str) -> bool:
        """Takes one line of the child's stdout; False if it is not ours."""
        if line.startswith(_MARK + "begin"):
            self._reading = True
            return True
        if line.startswith(_MARK + "calls "):
            self.calls = int(line[len(_MARK) + 6 :])
            return True
        if not line.startswith("onednn_verbose,"):
            return False
        parts = line.rstrip("\n").split(",")
        if self._reading and len(parts) > 6 and parts[3] == "exec":
            self.durations[parts[5], parts[-2]].append(float(parts[-1]))
        return True


@dataclasses.dataclass(frozen=True)
class Row:
    """One kind of primitive, run as the model runs it and in the chain.

    Attributes:
        kind: The primitive kind (convolution, reorder, ...), or "all".
        per_call: Its executions per model call (problems both ran).
        model_us: Mean microseconds of an execution in the model.
        bricks_us: The same problems' mean in the bricks' chain, weighted
            by the model's executions of each.
    """

    kind: str
    per_call: float
    model_us: float
    bricks_us: float


def compare(model: Tally, bricks: Tally) -> tuple[list[Row], float]:
    """Rows per primitive kind (costliest in the model first) then "all",
    and the share of the model's primitive time in problems both ran."""
    if model.calls < 1 or bricks.calls < 1:
        raise ValueError("Each way needs one call or more after its mark.")
    sums = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
    total = 0.0
    for key, times in model.durations.items():
        total += sum(times)
        other = bricks.durations.get(key)
        if not other:
            continue
        n = len(times) / model.calls
        row = sums[key[0]]
        row[0] += n
        row[1] += n * 1e3 * sum(times) / len(times)
        row[2] += n * 1e3 * sum(other) / len(other)
    rows = [
        Row(kind, n, model_us / n, bricks_us / n)
        for kind, (n, model_us, bricks_us) in sorted(
            sums.items(), key=lambda kv: -kv[1][1]
        )
    ]
    # Totals over the kinds (none when the two ways share no problem).
    n, model_us, bricks_us = [
        sum(column) for column in zip(*sums.values(), strict=True)
    ] or [0.0, 0.0, 0.0]
    if n:
        rows.append(Row("all", n, model_us / n, bricks_us / n))
    share = model_us / 1e3 / (total / model.calls) if total else 0.0
    return rows, share


def _run_child(way: str, threads: int, name: str) -> None:
    from dlbricks_tf.machine import process as process_lib
    from dlbricks_tf.machine import settings as settings_lib

    settings = settings_lib.RunSettings.default(1, intra_op_threads=threads)
    process_lib.configure_threads(threads, 1)
    from dlbricks_tf.cutting import suite as suite_lib
    from dlbricks_tf.cutting.decompose import decompose
    from dlbricks_tf.measuring.chain import ChainTimer
    from dlbricks_tf.models import corpus

    model = corpus.application(name)
    if way == "model":
        items = [("model", model)]
    else:
        g = model_flags.one_granularity()
        suite = suite_lib.build_suite({name: decompose(model, g)})
        items = [(e.signature, e.brick.build(1)) for e in suite.entries]
    chain = ChainTimer(items, settings)
    for _ in range(_WARMUP.value):
        chain.sample()
    # Unbuffered, on the stream oneDNN's log goes to (stdout).
    os.write(1, f"{_MARK}begin\n".encode())
    passes = 0
    for _ in range(_SAMPLES.value):
        chain.sample()
        passes += chain.iterations
    os.write(1, f"{_MARK}calls {passes}\n".encode())


def _tally(way: str, threads: int, name: str, env: dict[str, str]) -> Tally:
    args = [a for a in sys.argv[1:] if not a.startswith("--exec_child")]
    tally = Tally()
    child_lines.read_child(
        [
            "benchmarks.onednn_exec",
            f"--exec_child={way}",
            f"--exec_child_threads={threads}",
            f"--exec_child_model={name}",
            *args,
        ],
        env,
        tally.feed,
    )
    return tally


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    if _CHILD.value:
        _run_child(_CHILD.value, _CHILD_THREADS.value, _CHILD_MODEL.value)
        return
    from dlbricks_tf.machine import fingerprint

    env = dict(os.environ, ONEDNN_VERBOSE="profile_exec")
    env.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    g = model_flags.one_granularity()
    print(
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, "
        f"{fingerprint.cpu_model()}, Python {platform.python_version()}, "
        f"TF_ENABLE_ONEDNN_OPTS={env['TF_ENABLE_ONEDNN_OPTS']}, G={g}"
    )
    print("command: python -m benchmarks.onednn_exec " + " ".join(sys.argv[1:]))
    lines = [
        "| model | threads | primitive | runs a model call "
        "| us a run, model | us a run, bricks | bricks / model |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    shares = []
    for name in model_flags.MODELS.value or [DEFAULT_MODEL]:
        for threads in map(int, _THREADS.value):
            tallies = {way: _tally(way, threads, name, env) for way in WAYS}
            rows, share = compare(tallies["model"], tallies["bricks"])
            shares.append(f"{name} at {threads} thread(s) {share:.0%}")
            for r in rows:
                lines.append(
                    f"| {name} | {threads} | {r.kind} | {r.per_call:.0f} "
                    f"| {r.model_us:.1f} | {r.bricks_us:.1f} "
                    f"| {r.bricks_us / r.model_us:.2f} |"
                )
    print("\n".join(lines))
    print(
        "Share of the model's primitive time in problems its bricks run: "
        + ", ".join(shares)
    )


if __name__ == "__main__":
    app.run(main)
