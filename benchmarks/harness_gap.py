r"""How a whole model's latency depends on the harness that times it.

A model's estimate (its bricks' sum, timed between stamps in a chain) is
compared with the whole model timed in its in-graph loop
(`dlbricks_tf.measuring.timing.Timer`). This script times, in one process
and in interleaved rounds, each model four ways:

- `loop`: the whole model in the Timer's `tf.while_loop` (what `run`,
  `measure` and the accuracy benchmarks call "measured");
- `one link`: the whole model as the only brick of a chain
  (`dlbricks_tf.measuring.chain.ChainTimer`): one graph run per pass,
  stamps before and after it, the link cost taken off as for a brick;
- `call`: one call of a `tf.function` of the model from Python, timed
  around the call (dispatch included): the median and the fastest;
- `bricks`: the sum of its G bricks' means (times their counts) in one
  chain, as an estimate adds them.

The ratios say how much of an estimate's miss is the harness of the whole
model (`one link / loop`) and how much the cut (`bricks / one link`).

--granularity (one G) and --intra_op_threads are the command line's flags;
without --models, one model per family. --repeats (20 by default here,
`benchmarks.repeat_flags`) is the number of interleaved rounds per model:
one batch of each way of timing it per round.

Usage:
    python -m benchmarks.harness_gap --intra_op_threads=2 --repeats=20
"""

from __future__ import annotations

import datetime
import os
import platform
import sys
import time

from absl import app, flags

from benchmarks import repeat_flags, sampling_flags
from dlbricks_tf.cli import model_flags, settings_flags

# Shown by --helpshort.
for _name in ("granularity", "intra_op_threads", "models", "repeats"):
    flags.declare_key_flag(_name)
_CALLS = flags.DEFINE_integer(
    "calls", 5, "Python calls of the tf.function per round.", lower_bound=1
)


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
    process_lib.configure_threads(
        settings.intra_op_threads, settings.inter_op_threads
    )
    import tensorflow as tf

    from dlbricks_tf import stats
    from dlbricks_tf.cutting import suite as suite_lib
    from dlbricks_tf.cutting import synthetic
    from dlbricks_tf.cutting.decompose import decompose
    from dlbricks_tf.machine import fingerprint
    from dlbricks_tf.measuring import timing
    from dlbricks_tf.measuring.chain import ChainTimer
    from dlbricks_tf.models import corpus

    print(
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, "
        f"{fingerprint.cpu_model()}, TF {tf.__version__}, "
        f"{platform.python_version()}, settings {settings.key()}"
    )
    print("command: python -m benchmarks.harness_gap " + " ".join(sys.argv[1:]))
    print(
        "| model | loop ms | one link ms | call ms (median) | call ms (min) "
        f"| bricks G={g} ms | one link / loop | call min / loop "
        "| bricks / loop | bricks / one link |"
    )
    print("|---|" + "---:|" * 9)
    rows = []
    for name in sampling_flags.model_names():
        model = corpus.application(name)
        loop = timing.Timer(model, settings)
        loop.sample()  # Traces, warms up, chooses K.
        whole = ChainTimer([("whole", model)], settings)
        whole.sample()
        suite = suite_lib.build_suite({name: decompose(model, g)})
        built = [e.brick.build(1) for e in suite.entries]
        pairs = zip(suite.entries, built, strict=True)
        bricks = ChainTimer([(e.signature, b) for e, b in pairs], settings)
        bricks.sample()
        counts = [e.count(name) for e in suite.entries]
        inputs = [
            tf.constant(x) for x in synthetic.synthetic_inputs(model, 1, seed=0)
        ]
        arg = inputs if len(inputs) > 1 else inputs[0]
        call = tf.function(lambda x, m=model: m(x, training=False))
        call(arg)
        call(arg)
        loop_ms, call_ms = [], []
        for _ in range(repeat_flags.REPEATS.value):
            loop_ms += loop.sample()
            whole.sample()
            bricks.sample()
            for _ in range(_CALLS.value):
                start = time.perf_counter()
                call(arg)
                call_ms.append((time.perf_counter() - start) * 1e3)
        l_ms = stats.median(loop_ms)
        w_ms = whole.result(0, noisy=False).mean_ms
        b_ms = sum(
            c * bricks.result(i, noisy=False).mean_ms
            for i, c in enumerate(counts)
        )
        c_med, c_min = stats.median(call_ms), min(call_ms)
        rows.append((w_ms / l_ms, b_ms / l_ms, b_ms / w_ms))
        print(
            f"| {name} | {l_ms:.3f} | {w_ms:.3f} | {c_med:.3f} | {c_min:.3f} "
            f"| {b_ms:.3f} | {w_ms / l_ms:.3f} | {c_min / l_ms:.3f} "
            f"| {b_ms / l_ms:.3f} | {b_ms / w_ms:.3f} |",
            flush=True,
        )
    for label, column in zip(
        ("one link / loop", "bricks / loop", "bricks / one link"),
        zip(*rows, strict=True),
        strict=True,
    ):
        print(
            f"{label}: geomean {stats.geomean(column):.3f}, "
            f"{min(column):.3f}-{max(column):.3f}, within 0.90-1.10: "
            f"{sum(0.9 <= r <= 1.1 for r in column)}/{len(column)}"
        )


if __name__ == "__main__":
    flags.FLAGS.set_default("repeats", 20)
    app.run(main)
