"""`dlbricks estimate`: models' latencies from the brick timings in --db.

From --models (cut again, at every G) or from --recipe files (no model
needed), with the timings of --backend; --mode picks the sequential or
the parallel estimate.
"""

from __future__ import annotations

import dataclasses
import os

from absl import app, flags

from dlbricks_tf.cli import outputs, shared_flags, startup, timing_flags
from dlbricks_tf.machine import settings as settings_lib
from dlbricks_tf.machine.fingerprint import system_fingerprint
from dlbricks_tf.portable import recipe as recipe_lib
from dlbricks_tf.reporting import estimates_board, report
from dlbricks_tf.running import steps

COVER = flags.DEFINE_bool(
    "cover",
    False,
    "estimate: cover each model by the stored bricks of any G up to "
    "--granularity (fewest bricks), not only those of its cut at G.",
)
PREDICT = flags.DEFINE_bool(
    "predict",
    False,
    "estimate: predict the bricks the store lacks with a latency model "
    "fitted on the store's bricks of these settings and this machine "
    "(every one it keeps a description of; for bricks timed before "
    "stores kept them, those of the keras.applications models the store "
    "timed, or of --models if it timed none, and of the probes `bench "
    "--probes` timed), kept in the store for the next call; without it a "
    "missing brick is an error.",
)


def estimate(sources, gs, safe_mode) -> None:
    """Prints the estimates of --models (or of --recipe files)."""

    if shared_flags.RECIPE.value:
        if COVER.value or PREDICT.value:
            raise app.UsageError(
                "--cover and --predict need the models (--models): a recipe "
                "holds only the signatures of its bricks."
            )
        _estimate_recipes(shared_flags.RECIPE.value)
        return
    out, db, logdir = outputs.paths()
    backend = shared_flags.BACKEND.value
    settings = dataclasses.replace(
        startup.start_tensorflow(),
        backend=backend,
        protocol=timing_flags.PROTOCOL.value,
    )
    # Cut as bench cut them (--fuse, --input_shape), one model at a time.
    plans = (
        (s.name, shared_flags.decompose(s, g, safe_mode))
        for g in gs
        for s in sources
    )
    fp = system_fingerprint()
    with outputs.open_store(db, must_exist=True) as store:
        if COVER.value or PREDICT.value:
            rows = []
            for g in gs:
                rows += _estimate_beyond(
                    sources, g, settings, fp, store, safe_mode
                )
        else:
            extra = None
            if backend == "onnxruntime":  # As `run` adds them.
                print(
                    "Reading each model's NCHWc reorders (converting it "
                    "to ONNX)...",
                    flush=True,
                )
                extra = steps.layout_ms(
                    sources,
                    settings,
                    fp,
                    store,
                    os.path.join(out, "onnx"),
                    safe_mode=safe_mode,
                    log=lambda line: print(line, flush=True),
                )
            rows = steps.estimate_plans(
                plans, settings, fp, store, shared_flags.MODE.value, extra
            )
    _print(rows)
    if COVER.value or PREDICT.value:
        outputs.make_dirs(logdir)
        estimates_board.write_estimates(logdir, rows)
        print(f"\nTensorBoard: tensorboard --logdir {logdir}", flush=True)


def _estimate_beyond(sources, g, settings, fp, store, safe_mode) -> list:
    """estimate --cover/--predict: rows that say where each estimate is from."""
    from dlbricks_tf.estimating import beyond

    return beyond.cover_and_predict(
        sources, g, settings, fp, store, shared_flags.MODE.value,
        cover=COVER.value, predict=PREDICT.value, safe_mode=safe_mode,
        fuse=shared_flags.FUSE.value, log=lambda line: print(line, flush=True),
    )  # fmt: skip


def _estimate_recipes(paths: list[str]) -> None:
    """estimate --recipe: models rebuilt from recipes and the store alone."""

    if shared_flags.MODELS.value:
        raise app.UsageError("estimate takes --models or --recipe, not both.")
    _, db, _ = outputs.paths()
    recipes = [recipe_lib.load(p) for p in paths]
    backend = shared_flags.BACKEND.value
    # Nothing runs here: the settings only pick the stored timings.
    settings = settings_lib.RunSettings.default(
        shared_flags.BATCH.value,
        intra_op_threads=shared_flags.INTRA.value,
        inter_op_threads=shared_flags.INTER.value,
        backend=backend,
        protocol=timing_flags.PROTOCOL.value,
    )
    with outputs.open_store(db, must_exist=True) as store:
        rows = steps.estimate_plans(
            ((r.name, r) for r in recipes),
            settings,
            system_fingerprint(),
            store,
            shared_flags.MODE.value,
        )
    _print(rows)
    if backend == "onnxruntime":
        print(
            "\nA recipe holds no model's NCHWc reorders: these ONNX Runtime "
            "estimates leave them out (`estimate --models` and `run` add "
            "them)."
        )
    print(f"\nStore: {db} ({settings.key()})")


def _print(rows) -> None:

    print(report.format_estimates(rows))
    if noisy := report.format_noisy(rows):
        print(f"\n{noisy}")
