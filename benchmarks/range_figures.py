r"""Ranges of report.json files, recomputed: how many hold, how many are wide.

A report's ranges depend only on its rows (each model's estimate,
measurement and bricks' precision; `dlbricks_tf.estimating.ranges`), so
they can be recomputed for reports written before the ranges gained the
machine's variation, or under another rule, without timing anything. For
each report and G this prints the models, how many are within +-10%, how
many ranges hold the measured latency, how many ranges are wider than
+-10%, the models' RMS log miss and the median range half-width.

Usage:
    python -m benchmarks.range_figures dlbricks_out/accuracy/report.json
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

from absl import app

from benchmarks import figures as figures_lib
from dlbricks_tf import stats
from dlbricks_tf.estimating import ranges


def figures(rows: Sequence[dict]) -> dict:
    """The range figures of one G's model rows (widened in place)."""
    ranges.widen(rows)
    estimated = [r for r in rows if not math.isnan(r["estimated_ms"])]
    halves = [r["range_half"] for r in estimated if "range_half" in r]
    normalized = [r["normalized"] for r in estimated]
    return {
        "models": len(estimated),
        "within_10pct": figures_lib.within(normalized),
        **ranges.summary(estimated),
        "median_range_half": stats.median(halves) if halves else math.nan,
    }


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        raise app.UsageError("Give one or more report.json files.")
    print(
        "| report | G | models | within +-10% | range holds "
        "| ranges > +-10% | RMS log miss | median range +-% |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for path in argv[1:]:
        with open(path) as f:
            report = json.load(f)
        groups: dict[tuple, list[dict]] = {}
        for row in report["runs"]:
            key = (row["granularity"], row.get("split", "plain"))
            groups.setdefault(key, []).append(row)
        for (g, split), rows in groups.items():
            f = figures(rows)
            label = f"{g}{' fused' if split == 'fused' else ''}"
            print(
                f"| {path} | {label} | {f['models']} "
                f"| {f['within_10pct']}/{f['models']} "
                f"| {f['range_holds']}/{f['models']} "
                f"| {f['flagged']}/{f['models']} "
                f"| {100 * f['machine_variation']:.1f}% "
                f"| {100 * f['median_range_half']:.1f} |"
            )


if __name__ == "__main__":
    app.run(main)
