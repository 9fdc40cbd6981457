r"""A suite's bricks on TF: rebuilt from `.keras` files or loaded SavedModels.

`bench --suite=DIR --backend=tf` times an exported suite in chains. Each
brick can come from its `.keras` file (fresh layers from their configs, in
Keras's safe mode) or from its SavedModel (in a `keras.layers.TFSMLayer`).
This script exports the suite of --models to a temporary folder, times it
both ways in alternating chains campaigns, and prints for each way the
campaign's wall-clock and the models' estimates, and the ratio of the two
ways' estimates (1.0: equally faithful).

--models and --granularity (one G) are the command line's flags.

Usage:
    python -m benchmarks.suite_sources --models=MobileNetV2,ResNet50
"""

from __future__ import annotations

import os
import tempfile
import time

from absl import app, flags

from dlbricks_tf.cli import model_flags

# Shown by --helpshort.
for _name in ("models", "granularity"):
    flags.declare_key_flag(_name)
_ROUNDS = flags.DEFINE_integer(
    "rounds", 2, "Campaigns per way, alternating.", lower_bound=1
)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    g = model_flags.one_granularity()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from dlbricks_tf.machine import process as process_lib
    from dlbricks_tf.machine import settings as settings_lib

    settings = settings_lib.RunSettings.default(1)
    process_lib.configure_threads(settings.intra_op_threads, 1)
    from dlbricks_tf.cutting import suite as suite_lib
    from dlbricks_tf.cutting.decompose import decompose
    from dlbricks_tf.estimating import estimate as estimate_lib
    from dlbricks_tf.machine.fingerprint import system_fingerprint
    from dlbricks_tf.models import corpus
    from dlbricks_tf.portable import export, suite_bench, suite_dir
    from dlbricks_tf.running import bench
    from dlbricks_tf.storing.store import Store

    decompositions = {
        name: decompose(corpus.application(name), g)
        for name in model_flags.MODELS.value
    }
    suite = suite_lib.build_suite(decompositions)
    fp = system_fingerprint()
    wall = {"keras": [], "saved_model": []}
    estimates = {"keras": {}, "saved_model": {}}
    with tempfile.TemporaryDirectory() as folder:
        export.export_suite(suite, folder, granularity=g)
        loaded = suite_dir.load_suite(folder)
        for _ in range(_ROUNDS.value):
            for source in wall:
                with Store(":memory:") as store:
                    start = time.perf_counter()
                    bench.time_suite(
                        loaded,
                        store,
                        settings,
                        fp,
                        build=suite_bench.builder(settings, source),
                    )
                    wall[source].append(time.perf_counter() - start)
                    results = store.results(settings, fp)
                for name, d in decompositions.items():
                    ms = estimate_lib.estimate(d, results).ms
                    estimates[source].setdefault(name, []).append(ms)
    print(
        f"{len(suite)} unique bricks of {', '.join(decompositions)} at "
        f"G={g}, {settings.key()}, {_ROUNDS.value} campaign(s) each"
    )
    print("| bricks from | campaign s (each) | " + " | ".join(
        f"{n} ms" for n in decompositions) + " |")  # fmt: skip
    print("|---|---|" + "---:|" * len(decompositions))
    for source, seconds in wall.items():
        cells = " | ".join(
            "/".join(f"{v:.2f}" for v in estimates[source][n])
            for n in decompositions
        )
        each = "/".join(f"{s:.1f}" for s in seconds)
        print(f"| {source} | {each} | {cells} |")
    for name in decompositions:
        k = sorted(estimates["keras"][name])
        s = sorted(estimates["saved_model"][name])
        ratio = k[len(k) // 2] / s[len(s) // 2]
        print(f"{name}: keras / saved_model estimate {ratio:.3f}")


if __name__ == "__main__":
    flags.FLAGS.set_default("models", ["MobileNetV2"])
    app.run(main)
