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

That difference can also be the machine's drift between the moments the
timers ran. --interleave builds a model's timers first and samples them
in the same rounds, so a drift hits them all alike: what stays apart is
the instance. --reference reads the reference workload before every
batch (`dlbricks_tf.measuring.reference`) and prints each figure scaled
to the reference state calibrated at the start, beside the raw one: how
much of the drift the common scale takes out.

--intra_op_threads is the command line's flag, --repeats that of
`benchmarks.repeat_flags`.

Usage:
    python -m benchmarks.instance_spread --intra_op_threads=1
    python -m benchmarks.instance_spread --models=MobileNetV2,ResNet50 \
        --instances=4 --intra_op_threads=2 [--interleave] [--reference]
"""

from __future__ import annotations

import os
import statistics

from absl import app, flags

from benchmarks import repeat_flags
from dlbricks_tf.cli import model_flags, settings_flags, timing_flags

# Shown by --helpshort.
for _name in ("intra_op_threads", "repeats", "models", "reference"):
    flags.declare_key_flag(_name)
_INSTANCES = flags.DEFINE_integer(
    "instances", 10, "Fresh timers (traces) per brick.", lower_bound=2
)
# Raw samples; each batch scaled by its own factor (what a timer with a
# scale does); all of a timer's samples scaled by one factor, the state over
# the median reading taken beside its batches.
KINDS = ("raw", "per batch", "per timing")
_INTERLEAVE = flags.DEFINE_bool(
    "interleave",
    False,
    "Build a model's timers first, then sample them in the same rounds "
    "(time_interleaved), so that a drift of the machine hits every timer "
    "alike: what stays apart across timers is the traced instance itself.",
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
        options, figure = timing.TimingOptions(), statistics.fmean
    else:  # The campaign's brick options (benchmarks/accuracy.py's).
        models = _bricks()
        options = timing.TimingOptions(max_samples=60, max_seconds=1.0)
        figure = stats.median
    scale = None
    if timing_flags.REFERENCE.value:
        from dlbricks_tf.measuring import reference

        read = reference.Reference().read
        state = reference.ReferenceScale.calibrate(read)
        scale = reference.ReferenceScale(read, state)
        print(f"reference state {state:.3f} ms")

    def timer(model):
        t = timing.Timer(model, settings, options)
        if scale is not None:
            t.scale = _Recording(scale)
        return t

    def one_by_one(model):  # Each timer measured, then the next built.
        runs = [measure([timer(model)]) for _ in range(_INSTANCES.value)]
        return [[r[k][0] for r in runs] for k in range(len(KINDS))]

    def interleaved(model):
        return measure([timer(model) for _ in range(_INSTANCES.value)])

    def measure(group):
        """Per kind of `KINDS`: per timer, its figure at each repeat."""
        figures = [[[] for _ in group] for _ in KINDS]
        for r in range(repeat_flags.REPEATS.value):
            if r:
                group = [t.restart() for t in group]
            batches = [([], [], []) for _ in group]
            pending = list(range(len(group)))
            while pending:  # As timing.time_interleaved, keeping batches.
                for i in pending:
                    batch = group[i].sample()
                    f = group[i].scale.last if group[i].scale else 1.0
                    batches[i][0].extend(v / f for v in batch)
                    batches[i][1].extend(batch)
                    if group[i].scale:
                        batches[i][2].append(group[i].scale.reading)
                pending = [i for i in pending if not group[i].done]
            for i, (raw_samples, scaled_samples, readings) in enumerate(
                batches
            ):
                one = scale.state_ms / stats.median(readings) if readings else 1
                figures[0][i].append(figure(raw_samples) * 1e3)
                figures[1][i].append(figure(scaled_samples) * 1e3)
                figures[2][i].append(figure(raw_samples) * one * 1e3)
        return figures

    what = "means" if names else "medians"
    print(f"settings {settings.key()}")
    print(f"| model | samples | within one timer | across timers | {what} us |")
    print("|---|---|---:|---:|---|")
    for model in models:
        kinds = interleaved(model) if _INTERLEAVE.value else one_by_one(model)
        for kind, runs in zip(KINDS, kinds, strict=True):
            if kind != "raw" and scale is None:
                continue
            within = stats.median([max(m) / min(m) - 1 for m in runs])
            firsts = [m[0] for m in runs]
            across = max(firsts) / min(firsts) - 1
            cells = "; ".join(" ".join(f"{v:.1f}" for v in m) for m in runs)
            print(
                f"| {model.name} | {kind} | {within:.1%} | {across:.1%} |"
                f" {cells} |"
            )


class _Recording:
    """A reference scale that remembers the factor of the last batch."""

    def __init__(self, scale) -> None:
        self._scale = scale
        self.last = 1.0
        self.reading = None

    def factor(self) -> float:
        self.last = self._scale.factor()
        self.reading = self._scale.readings[-1]
        return self.last


if __name__ == "__main__":
    app.run(main)
