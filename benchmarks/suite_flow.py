r"""The suite flow across processes, against `run`, on a few models.

A user who cannot run the models where they are timed exports their
bricks, times the suite in one process (`dlbricks bench --suite`), times
the whole models later in another (`dlbricks measure`) and estimates from
the recipes and the store (`dlbricks estimate --recipe`). Nothing cancels
the machine's drift between those processes. This script runs that flow
as a user does, each command a process of its own, with `--measure_after_s`
between `bench --suite` and `measure`, then `dlbricks run` on the same
models into a store of its own, `--runs` times over; with `--neighbour`
a seeded noisy neighbour (benchmarks.noisy_neighbour) runs beside every
timing command.

Figures, per run and model: the suite flow's normalized latency (estimate
from the suite's bricks / `measure`'s latency) and `run`'s; and across
processes, the median relative difference between the suite's and `run`'s
timings of the same bricks (those of at least 20 us), of the same models'
estimates (each summed from one process's bricks) and of the same whole
models (`measure` against `run`), minutes apart.

With --bench_models, each pass also runs `bench --models` (the same
bricks cut from the models, in a process of its own, on the same scale),
and the table splits the suite's difference from `run` in two: the
suite's sums over `bench --models`' (the same command on bricks from the
suite's files or cut in memory), and, from the second pass on, the
suite's sums over the first pass's (the same command in two processes).

Usage:
    python -m benchmarks.suite_flow --models=MobileNetV2,ResNet50,\
EfficientNetB0,DenseNet121 --runs=2 --out=dlbricks_out/suite_flow
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

from absl import app, flags

from benchmarks import neighbour_flags
from dlbricks_tf.cli import (
    model_flags,
    settings_flags,
    shared_flags,
    timing_flags,
)

_RUNS = flags.DEFINE_integer("runs", 2, "Times the whole flow is run.")
_BENCH_MODELS = flags.DEFINE_bool(
    "bench_models",
    False,
    "Also time the bricks with `bench --models` in each pass: the suite's "
    "sums against bricks cut in memory, and against the first pass's.",
)
_MEASURE_AFTER = flags.DEFINE_float(
    "measure_after_s", 60.0, "Seconds between `bench --suite` and `measure`."
)
# The four models of the flow unless --models says otherwise.
MODELS = ["MobileNetV2", "ResNet50", "EfficientNetB0", "DenseNet121"]
# Bricks faster than this have meaningless relative differences.
_MIN_BRICK_MS = 0.02


def _models() -> list[str]:
    return model_flags.MODELS.value or MODELS


def _granularity() -> int:
    (g,) = model_flags.granularities()
    return g


def _threads() -> int:
    """--intra_op_threads, or the CLI's default (the physical cores)."""
    from dlbricks_tf.machine import process

    return settings_flags.INTRA.value or process.physical_cores()


def _timings(db: Path, kind: str) -> dict[str, float]:
    """{key: its latency (`Timing.center_ms`)} of a store's `kind` rows
    (one settings key per store)."""
    from dlbricks_tf.stats import Timing
    from dlbricks_tf.storing.store import Store

    with Store(db) as store:
        rows = store.rows(kind)
    column = "signature" if kind == "brick" else "model"
    return {r[column]: Timing.from_dict(r).center_ms for r in rows}


def _median(values: list[float]) -> float:
    from dlbricks_tf.stats import median

    return median(values) if values else math.nan


def _rel_diffs(a: dict[str, float], b: dict[str, float]) -> list[float]:
    """|b - a| / a of the keys both hold (bricks of 20 us or more)."""
    return [
        abs(b[k] - a[k]) / a[k]
        for k in sorted(a.keys() & b.keys())
        if a[k] >= _MIN_BRICK_MS
    ]


def _key():
    """(settings, fingerprint) of the commands' timings."""
    from dlbricks_tf.machine import settings as settings_lib
    from dlbricks_tf.machine.fingerprint import system_fingerprint

    settings = settings_lib.RunSettings.default(
        1, intra_op_threads=_threads(), inter_op_threads=1
    )
    return settings, system_fingerprint()


def _estimates(db: Path, recipes: list[Path]) -> list[dict]:
    """The rows of the recipes' estimates from a store, as `estimate
    --recipe` computes them ("model", "normalized", "estimated_ms")."""
    from dlbricks_tf.portable import recipe as recipe_lib
    from dlbricks_tf.running import steps
    from dlbricks_tf.storing.store import Store

    plans = [recipe_lib.load(p) for p in recipes]
    with Store(db) as store:
        return steps.estimate_plans(
            ((p.name, p) for p in plans), *_key(), store
        )


def _sums(db: Path, recipes: list[Path]) -> dict[str, float]:
    """{model: the sum of its bricks' latencies in `db`} of the recipes
    whose bricks `db` holds: `_estimates`' estimated_ms, without its
    error on a model a brick of which `bench --models` could not time."""
    from dlbricks_tf.portable import recipe as recipe_lib

    timings = _timings(db, "brick")
    sums = {}
    for path in recipes:
        plan = recipe_lib.load(path)
        if all(k in timings for k in plan.signatures):
            sums[plan.name] = math.fsum(timings[k] for k in plan.signatures)
    return sums


def _share_reference_state(source: Path, target: Path) -> None:
    """Puts `source`'s reference state into `target`: `run` then scales
    to the state `bench --suite` calibrated, one scale for both stores."""
    from dlbricks_tf.storing.store import Store

    settings, fp = _key()
    with Store(source) as store:
        state = store.reference_state(settings, fp)
        workload = store.reference_workload(settings, fp)
    if state is None:
        sys.exit(f"{source} holds no reference state for {settings.key()}.")
    with Store(target) as store:
        store.put_reference_state(settings, fp, state, workload)


def _flow(run: int, out: Path, recipes: list[Path]) -> dict:
    """One pass: bench --suite, pause, measure, then run; its figures."""
    models = ",".join(_models())
    g = str(_granularity())
    threads = f"--intra_op_threads={_threads()}"
    reference = f"--{'' if timing_flags.REFERENCE.value else 'no'}reference"
    suite_db, run_db = out / f"suite{run}.sqlite", out / f"run{run}.sqlite"
    for db in (suite_db, run_db):
        db.unlink(missing_ok=True)
    bench_s = neighbour_flags.run_dlbricks(
        "bench",
        f"--suite={out / 'suite'}",
        f"--db={suite_db}",
        threads,
        reference,
    )
    if timing_flags.REFERENCE.value:
        _share_reference_state(suite_db, run_db)
    time.sleep(_MEASURE_AFTER.value)
    measure_s = neighbour_flags.run_dlbricks(
        "measure", f"--models={models}", f"--db={suite_db}", threads, reference
    )
    run_s = neighbour_flags.run_dlbricks(
        "run",
        f"--models={models}",
        f"--granularity={g}",
        f"--db={run_db}",
        f"--out={out / f'run{run}'}",
        threads,
        reference,
    )
    bench_db = out / f"bench{run}.sqlite"
    if _BENCH_MODELS.value:
        bench_db.unlink(missing_ok=True)
        if timing_flags.REFERENCE.value:
            _share_reference_state(suite_db, bench_db)
        neighbour_flags.run_dlbricks(
            "bench",
            f"--models={models}",
            f"--granularity={g}",
            f"--db={bench_db}",
            threads,
            reference,
        )
    flow = _estimates(suite_db, recipes)
    with open(out / f"run{run}" / "report.json") as f:
        runs = json.load(f)["runs"]
    bricks = _rel_diffs(_timings(suite_db, "brick"), _timings(run_db, "brick"))
    whole = _rel_diffs(_timings(suite_db, "model"), _timings(run_db, "model"))
    # The same model's estimate, summed from each process's bricks.
    sums = _rel_diffs(
        {r["model"]: r["estimated_ms"] for r in flow},
        {r["model"]: r["estimated_ms"] for r in runs},
    )
    extra = {}
    if _BENCH_MODELS.value:
        extra["suite_sums"] = {r["model"]: r["estimated_ms"] for r in flow}
        extra["bench_sums"] = _sums(bench_db, recipes)
    return {
        **extra,
        "run": run,
        "suite_flow": {r["model"]: r["normalized"] for r in flow},
        "run_command": {r["model"]: r["normalized"] for r in runs},
        "bricks_compared": len(bricks),
        "brick_median_rel_diff": _median(bricks),
        "estimate_median_rel_diff": _median(sums),
        "model_median_rel_diff": _median(whole),
        "bench_s": bench_s,
        "measure_s": measure_s,
        "run_s": run_s,
    }


def _table(results: list[dict]) -> str:
    lines = [
        "| run | model | suite flow | run |",
        "|---:|---|---:|---:|",
    ]
    for r in results:
        for model in _models():
            name = Path(model).stem if model.endswith(".keras") else model
            flow = r["suite_flow"].get(name, math.nan)
            direct = r["run_command"].get(name, math.nan)
            lines.append(f"| {r['run']} | {name} | {flow:.3f} | {direct:.3f} |")
    lines += [
        "",
        "| run | suite flow within +-10% | run within +-10% "
        "| bricks across processes | estimates across processes "
        "| models across processes |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        flow = sum(0.9 <= v <= 1.1 for v in r["suite_flow"].values())
        direct = sum(0.9 <= v <= 1.1 for v in r["run_command"].values())
        n = len(_models())
        lines.append(
            f"| {r['run']} | {flow}/{n} | {direct}/{n} "
            f"| {100 * r['brick_median_rel_diff']:.1f}% "
            f"({r['bricks_compared']}) "
            f"| {100 * r.get('estimate_median_rel_diff', math.nan):.1f}% "
            f"| {100 * r['model_median_rel_diff']:.1f}% |"
        )
    if any("bench_sums" in r for r in results):
        lines += [
            "",
            "| run | model | suite / `bench --models` | suite / first pass |",
            "|---:|---|---:|---:|",
        ]
        first = results[0].get("suite_sums", {})
        for r in results:
            suite_sums, bench_sums = r["suite_sums"], r["bench_sums"]
            for model in sorted(suite_sums):
                ratio = suite_sums[model] / bench_sums.get(model, math.nan)
                again = (
                    f"{suite_sums[model] / first[model]:.3f}"
                    if r is not results[0] and model in first
                    else "-"
                )
                lines.append(
                    f"| {r['run']} | {model} | {ratio:.3f} | {again} |"
                )
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    if len(model_flags.granularities()) != 1:
        raise app.UsageError("--granularity takes one G here.")
    if _RUNS.value < 1 or _MEASURE_AFTER.value < 0:
        raise app.UsageError(
            "--runs must be 1 or more and --measure_after_s >= 0."
        )
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    out = Path(shared_flags.OUT.value)
    out.mkdir(parents=True, exist_ok=True)
    recipes_dir = out / "recipes"
    if not (out / "suite" / "manifest.json").exists():
        neighbour_flags.run_dlbricks(
            "export",
            f"--models={','.join(_models())}",
            f"--granularity={_granularity()}",
            f"--suite={out / 'suite'}",
            f"--recipes={recipes_dir}",
            neighbour=False,
        )
    recipes = sorted(recipes_dir.glob("*.json"))
    results = []
    for run in range(1, _RUNS.value + 1):
        results.append(_flow(run, out, recipes))
        (out / "suite_flow.json").write_text(json.dumps(results, indent=1))
    print(_table(results))
    print(f"\nResults: {out / 'suite_flow.json'}")


if __name__ == "__main__":
    flags.FLAGS.set_default("out", "dlbricks_out/suite_flow")
    app.run(main)
