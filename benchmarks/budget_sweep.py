r"""A new machine within a budget: accuracy against the share of seconds.

`dlbricks run --budget=SECONDS` times the probes (once per machine and
settings, counted apart), then the bricks worth most per second until the
budget is spent, predicts the others, and measures every whole model as
`run` always does. This script runs that as a user does, each command a
process of its own:

1. `dlbricks bench --probes` into a store of probes alone (skipped when
   `--out` already holds it);
2. `dlbricks run` on the models with every brick timed (the full
   campaign) into a store of its own: its end-to-end seconds E (timing
   every model to the run's precision) set the budgets, and it is the
   sweep's 100% row;
3. per fraction f of `--fractions`, `dlbricks run --budget=f*E` into a copy
   of the probes' store.

It prints, per budget: the seconds granted and spent (probes apart), the
bricks timed and predicted, how many models fall within ±10%, the
geomean (and range) of the normalized latency, how many printed ranges
hold the measured latency, how many are wider than ±10%, and the
campaign over the end to end of that same run. Writes `budget_sweep.json`.

Usage:
    python -m benchmarks.budget_sweep --fractions=0.05,0.1,0.25,0.5 \
        --out=dlbricks_out/budget_sweep    # the 13 models, one per family
    python -m benchmarks.budget_sweep --all    # the 40
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from absl import app, flags

from benchmarks import neighbour_flags, sampling_flags
from dlbricks_tf.cli import settings_flags, shared_flags

_FRACTIONS = flags.DEFINE_list(
    "fractions",
    ["0.05", "0.1", "0.25", "0.5"],
    "Budgets, as fractions of the full run's end-to-end seconds.",
)


def _figures(report_path: Path, label: str, budget_s: float | None) -> dict:
    """The sweep's row of one run's report.json (its corpus row's figures)."""
    report = json.loads(report_path.read_text())
    (corpus,) = report["corpus"]
    runs = report["runs"]
    return {
        "budget": label,
        "budget_s": budget_s,
        "spent_s": corpus.get("budget_spent_s"),
        "probes_s": corpus.get("probes_s"),
        "first_fit_s": corpus.get("first_fit_s"),
        "bricks_timed": corpus.get("bricks_timed", corpus["unique_bricks"]),
        "bricks_predicted": corpus.get("bricks_predicted", 0),
        "models": corpus["models"],
        "within": corpus["within_10pct"],
        "geomean": corpus["geomean_normalized"],
        "min": corpus["min_normalized"],
        "max": corpus["max_normalized"],
        "range_holds": corpus["range_holds"],
        "ranges_wide": corpus["flagged"],
        "predicted_share": [r.get("predicted_share", 0.0) for r in runs],
        "campaign_s": corpus["campaign_wall_s"],
        "end_to_end_s": corpus["end_to_end_wall_s"],
        "steal": corpus.get("steal_share"),
        "per_model": {r["model"]: r["normalized"] for r in runs},
    }


def _table(rows: list[dict]) -> str:
    lines = [
        "| budget | seconds (spent) | bricks timed / predicted | within "
        "+-10% | geomean (range) | range holds | ranges > +-10% | "
        "campaign / end-to-end | probes + first fit s (apart) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        seconds = (
            f"{r['budget_s']:.1f} ({r['spent_s']:.1f})"
            if r["budget_s"] is not None
            else "-"
        )
        lines.append(
            f"| {r['budget']} | {seconds} | {r['bricks_timed']} / "
            f"{r['bricks_predicted']} | {r['within']}/{r['models']} | "
            f"{r['geomean']:.3f} ({r['min']:.3f}-{r['max']:.3f}) | "
            f"{r['range_holds']}/{r['models']} | {r['ranges_wide']} | "
            f"{r['campaign_s']:.1f} / {r['end_to_end_s']:.1f} s "
            f"({r['campaign_s'] / r['end_to_end_s']:.2f}) | "
            f"{_apart(r)} |"
        )
    return "\n".join(lines)


def _apart(row: dict) -> str:
    """Seconds of the probes and the first predictor, apart from a budget."""
    if row["budget_s"] is None:
        return "-"
    return f"{row['probes_s'] or 0:.1f} + {row['first_fit_s'] or 0:.1f}"


def main(argv: list[str]) -> None:
    del argv
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    out = Path(shared_flags.OUT.value)
    out.mkdir(parents=True, exist_ok=True)
    models = ",".join(sampling_flags.model_names())
    common = [
        f"--models={models}",
        "--granularity=1",
        "--graphs=0",
        f"--batch_size={shared_flags.BATCH.value}",
    ]
    if settings_flags.INTRA.value:
        common.append(f"--intra_op_threads={settings_flags.INTRA.value}")
    probes = out / "probes.sqlite"
    if not probes.exists():
        partial = out / "probes.partial.sqlite"
        partial.unlink(missing_ok=True)
        neighbour_flags.run_dlbricks("bench", "--probes", f"--db={partial}")
        partial.rename(probes)
    rows = []
    full = out / "full"
    if not (full / "report.json").exists():
        shutil.rmtree(full, ignore_errors=True)
        neighbour_flags.run_dlbricks(
            "run", *common, f"--db={full / 'store.sqlite'}", f"--out={full}"
        )
    rows.append(_figures(full / "report.json", "every brick", None))
    end_to_end = rows[0]["end_to_end_s"]
    for fraction in map(float, _FRACTIONS.value):
        label = f"{100 * fraction:g}%"
        folder = out / f"budget{100 * fraction:g}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        db = folder / "store.sqlite"
        shutil.copyfile(probes, db)
        budget_s = fraction * end_to_end
        neighbour_flags.run_dlbricks(
            "run", *common, f"--budget={budget_s:.1f}", f"--db={db}",
            f"--out={folder}",
        )  # fmt: skip
        rows.append(_figures(folder / "report.json", label, budget_s))
        (out / "budget_sweep.json").write_text(json.dumps(rows, indent=1))
    (out / "budget_sweep.json").write_text(json.dumps(rows, indent=1))
    print(_table(rows))
    print(f"\nResults: {out / 'budget_sweep.json'}")


if __name__ == "__main__":
    flags.FLAGS.set_default("out", "dlbricks_out/budget_sweep")
    app.run(main)
