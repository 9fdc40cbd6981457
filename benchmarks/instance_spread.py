r"""How far apart one brick's medians fall: within one timer, across timers.

With --models, the same for whole models (keras.applications names), on
their means, as `run` measures them: whether a whole model's own trace
sets its speed too, so that one measurement of it is one draw.

A brick "timed in two runs" is traced into two `tf.function`s, each with
its own executor. For a few single-layer bricks, this times each one with
--instances fresh `Timer`s (a new trace each) and --repeats measurements
per timer (`Timer.restart`: fresh samples, same traced loop), all in one
process, back to back. It prints, per brick, the spread of the medians
within one timer (the median over timers of max/min - 1) against the
spread across timers (max/min - 1 of their first medians), and each
timer's medians in microseconds.

When the spread across timers is much larger than within one, the
difference belongs to the traced instance, not to the moment it was
sampled: a second run of the same brick cannot be expected to agree more
closely than that, however many samples it takes.

--intra_op_threads is the command line's flag, --repeats that of
`benchmarks.repeat_flags`.

Usage:
    python -m benchmarks.instance_spread --intra_op_threads=1
    python -m benchmarks.instance_spread --models=MobileNetV2,ResNet50 \
        --instances=4 --intra_op_threads=2
"""

from __future__ import annotations

import os

from absl import app, flags

from benchmarks import repeat_flags
from dlbricks_tf.cli import model_flags, settings_flags

# Shown by --helpshort.
for _name in ("intra_op_threads", "repeats", "models"):
    flags.declare_key_flag(_name)
_INSTANCES = flags.DEFINE_integer(
    "instances", 10, "Fresh timers (traces) per brick.", lower_bound=2
)


def _bricks():
    import keras
    from keras import layers

    def one(shape, layer):
        x = keras.Input(shape, batch_size=1)
        return keras.Model(x, layer(x), name=layer.name)

    a = keras.Input((14, 14, 96), batch_size=1)
    b = keras.Input((14, 14, 96), batch_size=1)
    add = keras.Model([a, b], layers.Add()([a, b]), name="add_14x14x96")
    return [
        one((8, 8, 16), layers.ReLU(name="relu_8x8x16")),
        add,
        one((28, 28, 32), layers.BatchNormalization(name="bn_28x28x32")),
        one((28, 28, 32), layers.Conv2D(32, 3, padding="same", name="conv")),
    ]


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from dlbricks_tf.machine import process as process_lib
    from dlbricks_tf.machine import settings as settings_lib

    settings = settings_lib.RunSettings.default(
        1, intra_op_threads=settings_flags.INTRA.value
    )
    process_lib.configure_threads(
        settings.intra_op_threads, settings.inter_op_threads
    )
    from dlbricks_tf import stats
    from dlbricks_tf.measuring import timing

    names = model_flags.MODELS.value
    if names:  # Whole models, to their own precision; their means.
        from dlbricks_tf.models import sources

        models = [s.build(True) for s in sources.resolve_models(names)]
        options, figure = timing.TimingOptions(), "center_ms"
    else:  # The campaign's brick options (benchmarks/accuracy.py's).
        models = _bricks()
        options = timing.TimingOptions(max_samples=60, max_seconds=1.0)
        figure = "median_ms"
    what = "means" if names else "medians"
    print(f"settings {settings.key()}")
    print(f"| model | within one timer | across timers | {what} us |")
    print("|---|---:|---:|---|")
    for model in models:
        runs = []
        for _ in range(_INSTANCES.value):
            timer = timing.Timer(model, settings, options)
            values = []
            for r in range(repeat_flags.REPEATS.value):
                if r:
                    timer.restart()
                result = timing.time_interleaved([timer])[0]
                values.append(getattr(result, figure) * 1e3)
            runs.append(values)
        within = stats.median([max(m) / min(m) - 1 for m in runs])
        firsts = [m[0] for m in runs]
        across = max(firsts) / min(firsts) - 1
        cells = "; ".join(" ".join(f"{v:.1f}" for v in m) for m in runs)
        print(f"| {model.name} | {within:.1%} | {across:.1%} | {cells} |")


if __name__ == "__main__":
    app.run(main)
