"""Writes a corpus analysis as CSV, JSON, PNG charts and TensorBoard logs.

`write_all` lays out the folder `analyze.run_analysis` documents. Every
table is built once as records (dicts with the same keys, in column order)
and written as CSV, as JSON and as a Markdown table in TensorBoard. CSV
cells hold plain numbers (no units, no rounding) so a spreadsheet or a test
can read them back; a missing value is an empty cell, and `null` in JSON.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dlbricks_tf import json_files
from dlbricks_tf.analyzing import analysis
from dlbricks_tf.analyzing.analysis import AnalysisResult
from dlbricks_tf.drawing import bar_charts, charts, summaries

CORPUS_ROW = "(corpus)"
TENSORBOARD = "tensorboard"
ANALYSIS_RUN = "analysis"
TRADEOFF_RUN = "tradeoff"
_TRADEOFF_FILES = (
    "tradeoff.csv",
    "tradeoff_summary.csv",
    "tradeoff.png",
    "tradeoff_models.png",
)
# Types drawn in the stacked chart; the rest are summed as "other".
_TOP_TYPES = 15
_TOP_PAIRS = 20

Records = list[dict[str, Any]]


def write_all(result: AnalysisResult, out: Path) -> list[str]:
    """Writes every file of `result` under `out`.

    Returns:
        The paths written, relative to `out`, in writing order.
    """
    out.mkdir(parents=True, exist_ok=True)
    tables = records(result)
    pngs = _charts(result)
    for stale in _TRADEOFF_FILES:  # From an earlier run with a store.
        (out / stale).unlink(missing_ok=True)
    written = []
    for name, rows in tables.items():
        if rows:
            _write_csv(out / f"{name}.csv", rows)
            written.append(f"{name}.csv")
    (out / "analysis.json").write_text(
        json.dumps(json_files.finite(to_dict(result, tables)), indent=1),
        encoding="utf-8",
    )
    written.append("analysis.json")
    for name, png in pngs.items():
        (out / name).write_bytes(png)
        written.append(name)
    written += _tensorboard(result, tables, pngs, out / TENSORBOARD)
    return written


def records(result: AnalysisResult) -> dict[str, Records]:
    """The tables of an analysis, {table name: rows}, as in the CSV files."""
    c = result.corpus
    rep = [_repeatability(r) for r in result.repeatability]
    rep.append(_repeatability(c, CORPUS_ROW))
    sim = result.similarity
    return {
        "repeatability": rep,
        "types": [
            {"model": t.model, "class_name": x.class_name, "calls": x.calls,
             "unique": x.unique, "repeated": x.repeated,
             "share_of_repeated": share}
            for t in result.types
            for x, share in zip(t.types, t.shares().values(), strict=True)
        ],
        "similarity": [
            {"model": m, **dict(zip(sim.models, row, strict=True))}
            for m, row in zip(sim.models, sim.matrix, strict=True)
        ],
        "reuse": [
            {"model": r.model, "bricks": r.bricks, "covered": r.covered,
             "brick_share": r.brick_share, "unique": r.unique,
             "new_unique": r.new_unique, "latency_ms": r.latency_ms,
             "covered_ms": r.covered_ms, "latency_share": r.latency_share}
            for r in result.reuse
        ],
        "tradeoff": [
            {"system": r.system, "granularity": r.granularity,
             "model": r.model, "estimate_ms": r.estimate_ms,
             "measured_ms": r.measured_ms, "normalized": r.normalized}
            for r in result.tradeoff_rows
        ],
        "tradeoff_summary": [
            {"system": s.system, "granularity": s.granularity,
             "models": len(s.models), "geomean_normalized": s.geomean,
             "speedup": s.speedup, "bricks": s.bricks,
             "unique_bricks": s.unique_bricks,
             "skipped": "; ".join(f"{m}: {why}" for m, why in s.skipped)}
            for s in result.tradeoff
        ],
    }  # fmt: skip


def _repeatability(r: analysis.Repeatability, name: str = "") -> dict:
    return {
        "model": name or r.model,
        "calls": r.calls,
        "unique": r.unique,
        "percent_unique": r.percent_unique,
    }


def to_dict(
    result: AnalysisResult, tables: dict[str, Records] | None = None
) -> dict[str, Any]:
    """The JSON form of an analysis: its tables and the similarity matrix."""
    tables = tables or records(result)
    return {
        "granularity": result.granularity,
        "models": list(result.similarity.models),
        "repeatability": tables["repeatability"][:-1],
        "corpus": _repeatability(result.corpus, CORPUS_ROW),
        "types": tables["types"],
        "similarity": {
            "models": list(result.similarity.models),
            "matrix": [list(r) for r in result.similarity.matrix],
        },
        "reuse": tables["reuse"],
        "tradeoff": {
            "note": result.tradeoff_note,
            "rows": tables["tradeoff"],
            "summary": tables["tradeoff_summary"],
        },
    }


def _write_csv(path: Path, rows: Records) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(rows[0])
        for row in rows:
            writer.writerow("" if v is None else v for v in row.values())


def _charts(result: AnalysisResult) -> dict[str, bytes]:
    names = [r.model for r in result.repeatability]
    c = result.corpus
    g = result.granularity
    pngs = {
        "repeatability.png": bar_charts.bar_chart(
            names,
            [r.percent_unique for r in result.repeatability],
            title="Unique layer calls per model (G=1)",
            value_label="% of layer calls that are unique",
            annotations=tuple(
                f"{r.unique}/{r.calls}" for r in result.repeatability
            ),
            reference=c.percent_unique,
            reference_label=(
                f"corpus: {c.unique:,} unique of {c.calls:,} calls "
                f"({c.percent_unique:.1f}%)"
            ),
        ),
        "types.png": bar_charts.stacked_bar_chart(
            names,
            _type_series(result.types),
            title="Repeated layer calls by layer type (G=1)",
            value_label="% of the model's repeated calls",
        ),
        "similarity.png": charts.heatmap(
            result.similarity.models,
            result.similarity.matrix,
            title=f"Jaccard similarity of unique bricks (G={g})",
            colorbar_label="|L1 ∩ L2| / |L1 ∪ L2|",
        ),
    }
    series = {"bricks": [100 * r.brick_share for r in result.reuse]}
    if all(r.latency_share is not None for r in result.reuse):
        series["estimated latency"] = [
            100 * r.latency_share for r in result.reuse
        ]
    pngs["reuse.png"] = bar_charts.grouped_bar_chart(
        [r.model for r in result.reuse],
        series,
        title=f"Share of each model covered by the other models (G={g})",
        value_label="% covered",
    )
    if result.tradeoff:
        pngs.update(_tradeoff_charts(result))
    return pngs


def _type_series(types: Sequence[analysis.LayerTypes]) -> dict[str, list]:
    totals: dict[str, int] = {}
    for t in types:
        for x in t.types:
            totals[x.class_name] = totals.get(x.class_name, 0) + x.repeated
    top = sorted(totals, key=lambda k: (-totals[k], k))[:_TOP_TYPES]
    top = [k for k in top if totals[k] > 0]
    series: dict[str, list] = {k: [] for k in top}
    other = []
    for t in types:
        shares = t.shares()
        for k in top:
            series[k].append(100 * shares.get(k, 0.0))
        other.append(100 * sum(v for k, v in shares.items() if k not in top))
    if any(other):
        series["other"] = other
    return series


def _tradeoff_charts(result: AnalysisResult) -> dict[str, bytes]:
    gs = sorted({s.granularity for s in result.tradeoff})
    systems = list(dict.fromkeys(s.system for s in result.tradeoff))
    by_key = {(s.system, s.granularity): s for s in result.tradeoff}

    def series(field: str) -> tuple:
        return tuple(
            (
                name,
                tuple(
                    getattr(by_key[name, g], field)
                    if (name, g) in by_key
                    else 0.0
                    for g in gs
                ),
            )
            for name in systems
        )

    labels = tuple(f"G={g}" for g in gs)
    overview = bar_charts.bar_panels(
        [
            bar_charts.Bars(
                labels,
                series("geomean"),
                title="Estimate / measured (geometric mean)",
                value_label="normalized latency",
                reference=1.0,
                reference_label="exact",
            ),
            bar_charts.Bars(
                labels,
                series("speedup"),
                title="Benchmarking speed-up",
                value_label="sum of models / sum of unique bricks",
            ),
        ],
        horizontal=False,
    )
    first = systems[0]
    rows = [r for r in result.tradeoff_rows if r.system == first]
    models = list(dict.fromkeys(r.model for r in rows))
    ratio = {(r.model, r.granularity): r.normalized for r in rows}
    per_model = bar_charts.grouped_bar_chart(
        models,
        {f"G={g}": [ratio.get((m, g), 0.0) for m in models] for g in gs},
        title=f"Estimate / measured per model ({first})",
        value_label="normalized latency",
        reference=1.0,
        reference_label="exact",
    )
    return {"tradeoff.png": overview, "tradeoff_models.png": per_model}


def _tensorboard(
    result: AnalysisResult,
    tables: dict[str, Records],
    pngs: dict[str, bytes],
    log_dir: Path,
) -> list[str]:
    for run in (ANALYSIS_RUN, TRADEOFF_RUN):  # A rerun replaces its runs.
        for f in (log_dir / run).glob("**/events.out.tfevents.*"):
            f.unlink()
    g = result.granularity
    types = [
        {"model": t.model, "repeated calls": t.repeated,
         "most repeated types": ", ".join(
             f"{k} {100 * v:.0f}%"
             for k, v in list(t.shares().items())[:4] if v > 0)}
        for t in result.types
    ]  # fmt: skip
    text = {
        "repeatability": tables["repeatability"],
        "types": types,
        "similarity": _top_pairs(result.similarity),
        "reuse": tables["reuse"],
        "tradeoff": tables["tradeoff_summary"],
    }
    with summaries.run_writer(log_dir, ANALYSIS_RUN) as w:
        for name, png in pngs.items():
            summaries.write_image(
                w, f"charts/{name.removesuffix('.png')}", png, step=g
            )
        for tag, rows in text.items():
            if rows:
                summaries.write_table(
                    w,
                    f"tables/{tag}",
                    list(rows[0]),
                    [list(r.values()) for r in rows],
                    step=g,
                )
        if not result.tradeoff:
            summaries.write_text(
                w,
                "tables/tradeoff",
                f"Skipped: {result.tradeoff_note}.",
                step=g,
            )
    for system in dict.fromkeys(s.system for s in result.tradeoff):
        run = f"{TRADEOFF_RUN}/{re.sub(r'[^A-Za-z0-9._-]+', '_', system)}"
        mine = [s for s in result.tradeoff if s.system == system]
        with summaries.run_writer(log_dir, run) as w:
            summaries.write_scalars(
                w,
                "tradeoff/geomean_normalized_latency",
                {s.granularity: s.geomean for s in mine},
            )
            summaries.write_scalars(
                w, "tradeoff/speedup", {s.granularity: s.speedup for s in mine}
            )
    return [
        str(p.relative_to(log_dir.parent))
        for run in (ANALYSIS_RUN, TRADEOFF_RUN)
        for p in sorted((log_dir / run).glob("**/events.out.tfevents.*"))
    ]


def _top_pairs(sim: analysis.Similarity) -> Records:
    pairs = [
        {"model": a, "other model": b, "jaccard": sim.matrix[i][j]}
        for i, a in enumerate(sim.models)
        for j, b in enumerate(sim.models)
        if i < j
    ]
    pairs.sort(key=lambda p: -p["jaccard"])
    return pairs[:_TOP_PAIRS]
