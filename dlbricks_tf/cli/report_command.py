"""`dlbricks report`: the last run's tables, or machines compared.

Without flags, prints <out>/report.json; with --compare, estimates
--models (or --recipe files) on every machine and backend --db holds,
names the fastest, and logs the comparison to TensorBoard (--logdir).
Either way, a line more says when --db holds results whose oneDNN label
predates TensorFlow's rule (`reporting.report.format_onednn_note`), and
one when it holds results of fingerprints that name the CPU by its model
name alone (`format_cpu_note`).
"""

from __future__ import annotations

import json
import os

from absl import app, flags

from dlbricks_tf.cli import exits, outputs, shared_flags, startup
from dlbricks_tf.portable import recipe as recipe_lib
from dlbricks_tf.reporting import compare, estimates_board
from dlbricks_tf.reporting import report as report_lib

COMPARE = flags.DEFINE_bool(
    "compare",
    False,
    "report: compare the estimates of each model on every machine "
    "(fingerprint) and backend the store holds.",
)


def report(sources, gs, safe_mode) -> None:
    """Prints report.json as tables, or the comparison of --compare."""

    out, db, logdir = outputs.paths()
    if COMPARE.value:
        _compare(sources, gs, safe_mode, db, logdir)
        return
    path = os.path.join(out, "report.json")
    if not os.path.isfile(path):
        raise exits.Fail(
            f"No report at {path!r}: run `dlbricks run` first, or pass --out "
            "(or --compare to compare machines in --db).",
            1,
        )
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        text = report_lib.format_report(data)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise exits.Fail(f"Cannot read report {path!r}: {e}", 1) from e
    print(text)
    if os.path.isfile(db):
        with outputs.open_store(db) as store:
            _print_notes(store.fingerprint_counts())


def _print_notes(counts) -> None:
    """Says when the store holds results of older fingerprints."""

    notes = [
        note
        for note in (
            report_lib.format_onednn_note(counts),
            report_lib.format_cpu_note(counts),
        )
        if note
    ]
    if notes:
        print("\n" + "\n".join(notes))


def _compare(sources, gs, safe_mode, db, logdir) -> None:
    """report --compare: each model's estimate per machine and backend."""

    recipes, models = shared_flags.RECIPE.value, shared_flags.MODELS.value
    if len(gs) > 1:
        raise app.UsageError("report --compare takes one --granularity.")
    if recipes and models:
        raise app.UsageError("report takes --models or --recipe, not both.")
    if recipes:
        plans = {r.name: r for r in map(recipe_lib.load, recipes)}
    else:
        startup.start_tensorflow()
        plans = {
            s.name: shared_flags.decompose(s, gs[0], safe_mode) for s in sources
        }
    batch_size = shared_flags.BATCH.value
    with outputs.open_store(db, must_exist=True) as store:
        table = compare.compare(
            plans, store, mode=shared_flags.MODE.value, batch_size=batch_size
        )
        counts = store.fingerprint_counts()
    if not table.configurations:
        raise exits.Fail(
            f"Store {db!r} holds no brick timing at batch size "
            f"{batch_size}: run `dlbricks bench` first.",
            1,
        )
    print(compare.format_comparison(table))
    _print_notes(counts)
    outputs.make_dirs(logdir)
    estimates_board.write_comparison(logdir, table)
    print(f"\nTensorBoard: tensorboard --logdir {logdir}", flush=True)
