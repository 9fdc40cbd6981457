r"""What a whole model pays that its chained bricks do not, per op type.

TensorFlow's profiler (`tf.profiler.experimental`) records every op the
runtime executes. This script profiles, in one process and under the same
thread pools, (a) the whole model in its timing loop and (b) its unique
bricks in one chain (`dlbricks_tf.measuring.chain`), and prints per op type the
time per model call: the whole model's, the chain's weighted by each brick's
count in the model, and their ratio. The op types where the two differ are
what the estimate misses (or counts twice).

--granularity (one G) and --intra_op_threads (1 by default here) are the
command line's flags.

With --xla_event, the events of that name (the kernels of an XLA cluster,
which carry no node name: `convolution.1` for the grouped convolutions
Keras runs under XLA) are also listed by their place in a model call and
in a chain pass: the fastest, the median and the share of them slower
than 1.4x the fastest (`modes`), which tells an op that runs in two
modes.

Usage:
    python -m benchmarks.profile_gap --model=MobileNetV3Small \
        --intra_op_threads=1 --granularity=1
    python -m benchmarks.profile_gap --model=ConvNeXtTiny \
        --intra_op_threads=2 --iterations=10 --xla_event=convolution.1
"""

from __future__ import annotations

import collections
import glob
import os
import re
import tempfile

from absl import app, flags

from dlbricks_tf import stats
from dlbricks_tf.cli import model_flags, settings_flags

# Shown by --helpshort.
for _name in ("granularity", "intra_op_threads"):
    flags.declare_key_flag(_name)
_MODEL = flags.DEFINE_string(
    "model", "MobileNetV3Small", "keras.applications model name."
)
_ITERATIONS = flags.DEFINE_integer(
    "iterations", 20, "Model calls (chain iterations) profiled.", lower_bound=1
)
_TOP = flags.DEFINE_integer("top", 15, "Op types printed.", lower_bound=1)
_XLA_EVENT = flags.DEFINE_string(
    "xla_event",
    "",
    "Also list the events of this name (an XLA kernel, e.g. "
    "convolution.1) by their place in a call: fastest, median, share slow.",
)
# An event slower than this times the fastest at its place is slow.
SLOW = 1.4


_CONTAINERS = ("Run", "Process", "Record", "StartRegion", "StopRegion")


def _host_planes(logdir: str) -> list:
    """The host planes of the profile in `logdir`."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    (path,) = glob.glob(os.path.join(logdir, "plugins/profile/*/*.xplane.pb"))
    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    return [plane for plane in space.planes if plane.name == "/host:CPU"]


def _named_events(logdir: str, wanted: str) -> list[float]:
    """The durations (us) of the host events named `wanted`, in time order."""
    found = []
    for plane in _host_planes(logdir):
        names = {k: v.name for k, v in plane.event_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                if names.get(event.metadata_id) == wanted:
                    found.append((event.offset_ps, event.duration_ps / 1e6))
    return [us for _, us in sorted(found)]


def modes(
    durations: list[float], per_call: int
) -> list[tuple[float, float, float]]:
    """Per place in a call (`per_call` events a call, in order): the
    fastest duration, the median and the share slower than `SLOW` x the
    fastest. Events past the last whole call are left out."""
    calls = len(durations) // per_call if per_call else 0
    rows = []
    for place in range(per_call if calls else 0):
        values = durations[place : calls * per_call : per_call]
        fastest = min(values)
        slow = sum(v > SLOW * fastest for v in values) / len(values)
        rows.append((fastest, stats.median(values), slow))
    return rows


def _op_events(logdir: str) -> list[tuple[str, str, float]]:
    """(node name, op type, us) of the TF ops in a profile's host plane."""
    events = []
    for plane in _host_planes(logdir):
        names = {k: v.name for k, v in plane.event_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                name = names.get(event.metadata_id, "")
                # TF op events are named "node_name:OpType".
                if ":" not in name or name.startswith("Tf"):
                    continue
                node, op_type = name.rsplit(":", 1)
                # Op types are CamelCase; oneDNN's start with "_".
                if not op_type or not (
                    op_type[0].isupper() or op_type[0] == "_"
                ):
                    continue
                events.append((node, op_type, event.duration_ps / 1e6))
    return events


def _profile(fn) -> tuple[list[tuple[str, str, float]], list[float]]:
    """The TF ops `fn` ran, and the durations of the `--xla_event` ones."""
    import tensorflow as tf

    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        try:
            fn()
        finally:
            tf.profiler.experimental.stop()
        named = (
            _named_events(logdir, _XLA_EVENT.value) if _XLA_EVENT.value else []
        )
        return _op_events(logdir), named


def _print_modes(what: str, durations: list[float], calls: int) -> None:
    """The `--xla_event` events of `calls` calls, by place in a call."""
    per_call = len(durations) // calls if calls else 0
    print(f"\n{what}: {_XLA_EVENT.value}, {per_call} a call")
    print(f"| place | fastest ms | median ms | share slower than {SLOW}x |")
    print("|---:|---:|---:|---:|")
    for place, (fastest, middle, slow) in enumerate(modes(durations, per_call)):
        ms = f"{fastest / 1e3:.2f} | {middle / 1e3:.2f}"
        print(f"| {place} | {ms} | {slow:.2f} |")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    g = model_flags.one_granularity()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from dlbricks_tf.machine import process as process_lib
    from dlbricks_tf.machine import settings as settings_lib

    settings = settings_lib.RunSettings.default(
        1, intra_op_threads=settings_flags.INTRA.value
    )
    process_lib.configure_threads(settings.intra_op_threads, 1)
    from dlbricks_tf.cutting import suite as suite_lib
    from dlbricks_tf.cutting.decompose import decompose
    from dlbricks_tf.measuring import timing
    from dlbricks_tf.measuring.chain import ChainTimer
    from dlbricks_tf.models import corpus

    name, n = _MODEL.value, _ITERATIONS.value
    model = corpus.application(name)
    d = decompose(model, g)
    suite = suite_lib.build_suite({name: d})
    timer = timing.Timer(model, settings)
    timer.sample()  # Traces and warms up.
    built = [e.brick.build(1) for e in suite.entries]
    chain = ChainTimer(
        [(e.signature, b) for e, b in zip(suite.entries, built, strict=True)],
        settings,
    )
    chain.sample()
    # A chained op belongs to the brick whose model name is in its node
    # name; it counts as often as the brick occurs in the model.
    count_of = {
        b.name: e.count(name) for e, b in zip(suite.entries, built, strict=True)
    }
    whole: dict[str, float] = collections.defaultdict(float)
    calls = n * timer.calls_per_iteration
    ops, whole_named = _profile(lambda: timer.durations_ms(n, 1))
    for _, op, us in ops:
        whole[op] += us / calls
    chained: dict[str, float] = collections.defaultdict(float)
    ops, chain_named = _profile(lambda: chain._call(n))
    for node, op, us in ops:
        # The brick's scope is its model name, uniquified ("brick_ab_1").
        parts = [re.sub(r"_\d+$", "", p) for p in node.split("/")]
        count = next((count_of[p] for p in parts if p in count_of), None)
        if count is not None:  # Else: the chain's own stamps and sums.
            chained[op] += us / n * count
    for scope in _CONTAINERS:  # Events that hold the ops, not ops.
        whole.pop(scope, None)
        chained.pop(scope, None)
    rows = []
    for op in set(whole) | set(chained):
        w, c = whole.get(op, 0.0), chained.get(op, 0.0)
        rows.append((abs(w - c), op, w, c))
    rows.sort(reverse=True)
    print(
        f"{name} G={g}, intra {settings.intra_op_threads}: us per "
        "model call, ops of the chained bricks weighted by their counts"
    )
    print("| op type | whole model us | chained bricks us | ratio |")
    print("|---|---:|---:|---:|")
    for _, op, w, c in rows[: _TOP.value]:
        ratio = f"{w / c:.2f}" if c else "-"
        print(f"| {op} | {w:.1f} | {c:.1f} | {ratio} |")
    w_all, c_all = sum(whole.values()), sum(chained.values())
    print(f"| all TF ops | {w_all:.1f} | {c_all:.1f} | {w_all / c_all:.2f} |")
    if _XLA_EVENT.value:
        _print_modes("Whole model", whole_named, calls)
        _print_modes("Chain, each unique brick once a pass", chain_named, n)


if __name__ == "__main__":
    flags.FLAGS.set_default("intra_op_threads", 1)
    app.run(main)
