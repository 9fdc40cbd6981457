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

Usage:
    python -m benchmarks.profile_gap --model=MobileNetV3Small \
        --intra_op_threads=1 --granularity=1
"""

from __future__ import annotations

import collections
import glob
import os
import re
import tempfile

from absl import app, flags

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


_CONTAINERS = ("Run", "Process", "Record", "StartRegion", "StopRegion")


def _op_events(logdir: str) -> list[tuple[str, str, float]]:
    """(node name, op type, us) of the TF ops in a profile's host plane."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    (path,) = glob.glob(os.path.join(logdir, "plugins/profile/*/*.xplane.pb"))
    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    events = []
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
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


def _profile(fn) -> list[tuple[str, str, float]]:
    import tensorflow as tf

    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        try:
            fn()
        finally:
            tf.profiler.experimental.stop()
        return _op_events(logdir)


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
    for _, op, us in _profile(lambda: timer.durations_ms(n, 1)):
        whole[op] += us / (n * timer.calls_per_iteration)
    chained: dict[str, float] = collections.defaultdict(float)
    for node, op, us in _profile(lambda: chain._call(n)):
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


if __name__ == "__main__":
    flags.FLAGS.set_default("intra_op_threads", 1)
    app.run(main)
