r"""What the timing harness amortises: dispatch, loop overhead, time vs K.

For a few typical single-layer bricks, prints the `tf.function` dispatch
overhead (a call that runs the loop zero times), the per-call cost of the
loop machinery (an empty model), and the time per model call when K calls
run inside one `tf.while_loop`, for several K. Per-call time flat in K
(after the dispatch is subtracted) shows the loop really runs the model K
times and is not hoisted; the last column is what one call per timing
(dispatch included) would overshoot by. Medians of --repeats calls, all in
one process.

--intra_op_threads is the command line's flag, --repeats (15 by default
here) that of `benchmarks.repeat_flags`.

Usage:
    python -m benchmarks.timing_overhead --intra_op_threads=2
"""

from __future__ import annotations

import os

from absl import app, flags

from benchmarks import repeat_flags
from dlbricks_tf.cli import settings_flags

# Shown by --helpshort.
for _name in ("intra_op_threads", "repeats"):
    flags.declare_key_flag(_name)
_KS = flags.DEFINE_list("ks", ["1", "10", "100", "1000"], "Values of K.")
_JIT = flags.DEFINE_bool("jit_compile", False, "Compile with XLA.")


def _bricks():
    import keras
    from keras import layers

    def one(shape, layer, dtype="float32"):
        x = keras.Input(shape, dtype=dtype)
        return keras.Model(x, layer(x), name=layer.name)

    return [
        one((64,), layers.Dense(64, name="dense_64")),
        one((56, 56, 64), layers.ReLU(name="relu_56x56x64")),
        one((56, 56, 64), layers.BatchNormalization(name="bn_56x56x64")),
        one((56, 56, 64), layers.Conv2D(64, 3, padding="same", name="conv")),
        one((32,), layers.Embedding(1000, 64, name="embedding"), "int32"),
    ]


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from dlbricks_tf.machine import process as process_lib
    from dlbricks_tf.machine import settings as settings_lib

    settings = settings_lib.RunSettings.default(
        1,
        intra_op_threads=settings_flags.INTRA.value,
        jit_compile=_JIT.value,
    )
    process_lib.configure_threads(
        settings.intra_op_threads, settings.inter_op_threads
    )
    from dlbricks_tf import stats
    from dlbricks_tf.measuring import timing, timing_loop

    ks = [int(k) for k in _KS.value]
    repeats = repeat_flags.REPEATS.value
    print(f"settings {settings.key()}")
    loop_ms = timing_loop.loop_overhead_ms(settings)
    print(f"loop overhead per call: {loop_ms * 1e3:.2f} us")
    header = " | ".join(f"K={k} us" for k in ks)
    print(f"| brick | dispatch us | {header} | naive / K={ks[-1]} |")
    print("|---" * (len(ks) + 3) + "|")
    for model in _bricks():
        timer = timing.Timer(model, settings)
        timer.sample()  # Trace, warm up, calibrate.
        per_call = []
        for k in ks:
            ms = stats.median([timer.run_ms(k) for _ in range(repeats)])
            per_call.append((ms - timer.dispatch_ms) / k)
        naive = stats.median([timer.run_ms(1) for _ in range(repeats)])
        cells = " | ".join(f"{p * 1e3:.1f}" for p in per_call)
        print(
            f"| {model.name} | {timer.dispatch_ms * 1e3:.0f} | {cells} "
            f"| {naive / per_call[-1]:.2f} |"
        )


if __name__ == "__main__":
    flags.FLAGS.set_default("repeats", 15)
    app.run(main)
