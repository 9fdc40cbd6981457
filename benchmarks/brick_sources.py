r"""The same bricks from three sources, timed in the same rounds.

`run` chains a model's bricks as programs on the model's own layers
(`dlbricks_tf.cutting.program`); `bench --suite` chains an exported
suite's bricks from their SavedModels (in a `keras.layers.TFSMLayer`, the
default) or rebuilt from their `.keras` files. If the three do not time
the same, estimates from a suite carry the difference. This script
exports the suite of --models (at one G, into --out), then for each
model builds one chain per source of the same bricks in the same order
and samples the three chains in alternating rounds in one process, so
that the machine's drift hits all three alike. It prints, per model and
source, the sum of the bricks' means and its ratio to the programs',
and the median of the bricks' own ratios (bricks of 20 us or more).

Usage:
    python -m benchmarks.brick_sources \
        --models=MobileNetV2,ResNet50,EfficientNetB0 --chain_rounds=30
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path

from absl import app, flags

from dlbricks_tf.cli import model_flags, settings_flags, shared_flags

for _name in ("models", "granularity", "intra_op_threads", "out"):
    flags.declare_key_flag(_name)
_ROUNDS = flags.DEFINE_integer(
    "chain_rounds",
    30,
    "Samples of every chain, in alternating order.",
    lower_bound=3,
)
# Bricks faster than this have meaningless relative differences.
_MIN_BRICK_MS = 0.02
SOURCES = ("program", "saved_model", "keras")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    g = model_flags.one_granularity()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from dlbricks_tf.machine import process as process_lib
    from dlbricks_tf.machine import settings as settings_lib

    intra = settings_flags.INTRA.value or process_lib.physical_cores()
    settings = settings_lib.RunSettings(
        batch_size=1, intra_op_threads=intra, inter_op_threads=1
    )
    process_lib.configure_threads(intra, 1)
    from dlbricks_tf.cutting import program
    from dlbricks_tf.cutting import suite as suite_lib
    from dlbricks_tf.cutting.decompose import decompose
    from dlbricks_tf.measuring import chain
    from dlbricks_tf.models import corpus
    from dlbricks_tf.portable import export, suite_bricks, suite_dir

    folder = Path(shared_flags.OUT.value) / "suite"
    names = model_flags.MODELS.value
    if not (folder / "manifest.json").exists():
        suite = suite_lib.build_suite(
            {n: decompose(corpus.application(n), g) for n in names}
        )
        export.export_suite(suite, folder, granularity=g)
    entries = {e.signature: e for e in suite_dir.load_suite(folder).entries}
    links = sampling_links()
    print(
        f"G={g}, {settings.key()}, {_ROUNDS.value} rounds; sums of the "
        "bricks' means (ms), and against the programs'"
    )
    print(
        "| model | bricks | "
        + " | ".join(SOURCES)
        + " | sum / program | median brick / program |"
    )
    print("|---|---:|" + "---:|" * len(SOURCES) + "---|---|")
    for name in names:
        model = corpus.application(name)
        programs = {}
        for b in decompose(model, g).bricks:
            if b.signature in entries and b.signature not in programs:
                programs[b.signature] = program.program(b, 1, model)
        keys = list(programs)[:links]
        built = {
            "program": [(k, programs[k]) for k in keys],
            "saved_model": [
                (k, suite_bricks.load_saved_model(entries[k], 1)) for k in keys
            ],
            "keras": [
                (k, suite_bricks.load_keras_brick(entries[k], 1)) for k in keys
            ],
        }
        timers = {
            s: chain.ChainTimer(built[s], settings, check_settings=False)
            for s in SOURCES
        }
        for r in range(_ROUNDS.value):
            for s in SOURCES if r % 2 == 0 else reversed(SOURCES):
                timers[s].sample()
        means = {
            s: [t.result(i, False).mean_ms for i in range(len(keys))]
            for s, t in timers.items()
        }
        sums = {s: sum(v) for s, v in means.items()}
        base = means["program"]
        ratios = {
            s: statistics.median(
                x / b
                for x, b in zip(v, base, strict=True)
                if b >= _MIN_BRICK_MS
            )
            for s, v in means.items()
        }
        print(
            f"| {name} | {len(keys)} | "
            + " | ".join(f"{sums[s]:.3f}" for s in SOURCES)
            + " | "
            + " / ".join(f"{sums[s] / sums['program']:.3f}" for s in SOURCES)
            + " | "
            + " / ".join(f"{ratios[s]:.3f}" for s in SOURCES)
            + " |",
            flush=True,
        )
        del model, timers, built, programs


def sampling_links() -> int:
    """The bricks of one chain, at most (one chain per model and source)."""
    from dlbricks_tf.measuring.sampling import TimingOptions

    return TimingOptions().chain_links


if __name__ == "__main__":
    flags.FLAGS.set_default(
        "models", ["MobileNetV2", "ResNet50", "EfficientNetB0"]
    )
    flags.FLAGS.set_default("out", "dlbricks_out/brick_sources")
    app.run(main)
