"""`dlbricks estimate`: models' latencies from the brick timings in --db.

From --models (cut again, at every G) or from --recipe files (no model
needed), with the timings of --backend; --mode picks the sequential or
the parallel estimate.
"""

from __future__ import annotations

import dataclasses

from absl import app

from dlbricks_tf.cli import outputs, shared_flags, startup, timing_flags


def estimate(sources, gs, safe_mode) -> None:
    """Prints the estimates of --models (or of --recipe files)."""
    from dlbricks_tf import job
    from dlbricks_tf.fingerprint import system_fingerprint

    if shared_flags.RECIPE.value:
        _estimate_recipes(shared_flags.RECIPE.value)
        return
    _, db, _ = outputs.paths()
    backend = shared_flags.BACKEND.value
    settings = dataclasses.replace(
        startup.start_tensorflow(),
        backend=backend,
        protocol=timing_flags.protocol(backend),
    )
    # Cut as bench cut them (--fuse, --input_shape), one model at a time.
    plans = (
        (s.name, shared_flags.decompose(s, g, safe_mode))
        for g in gs
        for s in sources
    )
    with outputs.open_store(db, must_exist=True) as store:
        rows = job.estimate_plans(
            plans,
            settings,
            system_fingerprint(),
            store,
            shared_flags.MODE.value,
        )
    _print(rows)


def _estimate_recipes(paths: list[str]) -> None:
    """estimate --recipe: models rebuilt from recipes and the store alone."""
    from dlbricks_tf import job
    from dlbricks_tf import recipe as recipe_lib
    from dlbricks_tf import settings as settings_lib
    from dlbricks_tf.fingerprint import system_fingerprint

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
        protocol=timing_flags.protocol(backend),
    )
    with outputs.open_store(db, must_exist=True) as store:
        rows = job.estimate_plans(
            ((r.name, r) for r in recipes),
            settings,
            system_fingerprint(),
            store,
            shared_flags.MODE.value,
        )
    _print(rows)
    print(f"\nStore: {db} ({settings.key()})")


def _print(rows) -> None:
    from dlbricks_tf import report

    print(report.format_estimates(rows))
    if noisy := report.format_noisy(rows):
        print(f"\n{noisy}")
