"""TensorBoard views of a job's results (`tensorboard --logdir LOG_DIR`).

Runs written under the log directory:

    models/<model>   scalars over G (the step): latency/measured_ms,
                     latency/estimated_ms, latency/estimated_parallel_ms,
                     latency/normalized; one run per model, so charts overlay
    hparams          the HParams experiment (granularity, batch size,
                     threads; metrics: geomean normalized latency, speed-up)
    hparams/G=<g>    one session per G with its metric scalars
    tables           Markdown tables (text dashboard): results, corpus,
                     bricks/<model> at step G
    charts           images at step G: normalized latency per model,
                     measured vs estimated, the models' similarity heatmap
    graphs/<brick>   the layer-level op graph of a few bricks (the largest
                     of the last G), one run each
    compare          `write_comparison`: estimates of each model on each
                     machine and backend (table and chart), the fastest
    estimates        `write_estimates`: the `estimate` command's rows, with
                     how each estimate was obtained (timed, covered,
                     predicted) and each source's share

A rewrite replaces these runs (their old event files are deleted), so the
views always show one job.

Example:
    report, details = job.run_job(sources, [1], settings, store)
    write_board("dlbricks_out/tensorboard", report, details)
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dlbricks_tf.analyzing import analysis
from dlbricks_tf.reporting import charts, summaries
from dlbricks_tf.reporting.report import format_inputs, format_source

MODELS_RUN = "models"
HPARAMS_RUN = "hparams"
TABLES_RUN = "tables"
CHARTS_RUN = "charts"
GRAPHS_RUN = "graphs"
COMPARE_RUN = "compare"
ESTIMATES_RUN = "estimates"
METRICS = {
    "corpus/geomean_normalized": "geomean normalized latency",
    "corpus/speedup": "speed-up",
    "corpus/min_normalized": "min normalized latency",
    "corpus/max_normalized": "max normalized latency",
}


def run_name(name: str) -> str:
    """A folder-safe run name: runs of other characters become `_`."""
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", name).strip("_") or "_"


def write_board(
    log_dir: str | Path,
    report: Mapping[str, Any],
    details: Mapping[int, Any] | None = None,
    *,
    graphs: int = 3,
) -> list[str]:
    """Writes every view of a job's report under `log_dir`.

    Args:
        log_dir: The folder to point TensorBoard at.
        report: The job's report (report.json's content).
        details: {G: job.GranularityResult}, for the brick tables, the
            similarity heatmap and the brick graphs; None skips them.
        graphs: How many bricks' graphs to write.

    Returns:
        The event files written, relative to `log_dir`.
    """
    log_dir = Path(log_dir)
    for run in (MODELS_RUN, HPARAMS_RUN, TABLES_RUN, CHARTS_RUN, GRAPHS_RUN):
        for f in (log_dir / run).glob("**/events.out.tfevents.*"):
            f.unlink()  # A rewrite replaces the views.
    details = details or {}
    runs = report["runs"]
    _model_scalars(log_dir, runs)
    _hparams(log_dir, report)
    _tables(log_dir, report, details)
    _charts(log_dir, runs, details)
    if details and graphs > 0:
        _graphs(log_dir, details[max(details)], graphs, report)
    return sorted(
        str(p.relative_to(log_dir))
        for p in log_dir.glob("**/events.out.tfevents.*")
    )


def _model_scalars(log_dir: Path, runs: Sequence[Mapping[str, Any]]) -> None:
    fields = {
        "latency/measured_ms": "measured_ms",
        "latency/estimated_ms": "estimated_ms",
        "latency/estimated_parallel_ms": "estimated_parallel_ms",
        "latency/normalized": "normalized",
    }
    for model in dict.fromkeys(r["model"] for r in runs):
        mine = [r for r in runs if r["model"] == model]
        with summaries.run_writer(
            log_dir, f"{MODELS_RUN}/{run_name(model)}"
        ) as w:
            for tag, field in fields.items():
                summaries.write_scalars(
                    w,
                    tag,
                    {r["granularity"]: r[field] for r in mine},
                    description=f"{field} of {model}; the step is G.",
                )


def _hparams(log_dir: Path, report: Mapping[str, Any]) -> None:
    settings = report["settings"]
    values = {
        "batch_size": settings["batch_size"],
        "intra_op_threads": settings["intra_op_threads"],
        "inter_op_threads": settings["inter_op_threads"],
    }
    corpus = report["corpus"]
    if not corpus:
        return
    with summaries.run_writer(log_dir, HPARAMS_RUN) as w:
        summaries.write_hparams_config(
            w,
            {
                "granularity": [c["granularity"] for c in corpus],
                **{k: [v] for k, v in values.items()},
            },
            METRICS,
        )
    for c in corpus:
        g = c["granularity"]
        with summaries.run_writer(log_dir, f"{HPARAMS_RUN}/G={g}") as w:
            summaries.write_hparams(
                w, {"granularity": g, **values}, trial_id=f"G={g}"
            )
            for tag in METRICS:
                summaries.write_scalars(
                    w, tag, {g: c[tag.removeprefix("corpus/")]}
                )


def _tables(
    log_dir: Path, report: Mapping[str, Any], details: Mapping[int, Any]
) -> None:
    with summaries.run_writer(log_dir, TABLES_RUN) as w:
        if report["runs"]:
            columns = [
                "model",
                "granularity",
                "measured_ms",
                "estimated_ms",
                "estimated_parallel_ms",
                "normalized",
                "bricks",
            ]
            summaries.write_table(
                w,
                "results",
                columns + ["source"],
                [
                    [r[c] for c in columns] + [format_source(r)]
                    for r in report["runs"]
                ],
                description="Measured vs estimated latency per model and G, "
                "and how each estimate was obtained.",
            )
        if report["corpus"]:
            columns = [
                "granularity",
                "geomean_normalized",
                "min_normalized",
                "max_normalized",
                "speedup",
                "unique_bricks",
                "total_bricks",
                "campaign_wall_s",
                "campaign_setup_s",
                "end_to_end_wall_s",
            ]
            summaries.write_table(
                w,
                "corpus",
                columns,
                [[c.get(k) for k in columns] for c in report["corpus"]],
                description="Per G: accuracy and speed-up over the corpus.",
            )
        system = report.get("system", {})
        if system:
            summaries.write_table(
                w,
                "system",
                ["field", "value"],
                [[k, str(v)] for k, v in system.items()]
                + [[k, str(v)] for k, v in report["settings"].items()],
            )
        for g, detail in sorted(details.items()):
            for model, d in detail.decompositions.items():
                rows = []
                for i, b in enumerate(d.bricks):
                    t = detail.results.get(b.signature)
                    rows.append(
                        [
                            i,
                            ", ".join(b.layers),
                            ", ".join(b.class_names),
                            format_inputs(b.inputs),
                            b.signature,
                            None if t is None else t.median_ms,
                            "" if t is None else ("yes" if t.noisy else "no"),
                        ]
                    )
                summaries.write_text(
                    w,
                    f"bricks/{run_name(model)}",
                    summaries.markdown_table(
                        [
                            "#",
                            "layers",
                            "classes",
                            "inputs",
                            "signature",
                            "median ms",
                            "noisy",
                        ],
                        rows,
                        align=["r", "l", "l", "l", "l", "r", "l"],
                    ),
                    step=g,
                    description=f"The bricks of {model} at G={g}.",
                )


def _charts(
    log_dir: Path,
    runs: Sequence[Mapping[str, Any]],
    details: Mapping[int, Any],
) -> None:
    with summaries.run_writer(log_dir, CHARTS_RUN) as w:
        for g in dict.fromkeys(r["granularity"] for r in runs):
            mine = [r for r in runs if r["granularity"] == g]
            labels = [r["model"] for r in mine]
            summaries.write_image(
                w,
                "normalized_latency",
                charts.bar_chart(
                    labels,
                    [r["normalized"] for r in mine],
                    title=f"Estimate / measured, G={g}",
                    value_label="normalized latency",
                    reference=1.0,
                    annotations=tuple(f"{r['normalized']:.3f}" for r in mine),
                ),
                step=g,
            )
            summaries.write_image(
                w,
                "measured_vs_estimated",
                charts.grouped_bar_chart(
                    labels,
                    {
                        "measured": [r["measured_ms"] for r in mine],
                        "sequential estimate": [
                            r["estimated_ms"] for r in mine
                        ],
                        "parallel estimate": [
                            r["estimated_parallel_ms"] for r in mine
                        ],
                    },
                    title=f"Latency, G={g}",
                    value_label="ms",
                ),
                step=g,
            )
        for g, detail in sorted(details.items()):
            sim = analysis.similarity(
                {
                    m: analysis.signatures(d)
                    for m, d in detail.decompositions.items()
                }
            )
            summaries.write_image(
                w,
                "similarity",
                charts.heatmap(
                    list(sim.models),
                    sim.matrix,
                    title=f"Shared unique bricks (Jaccard), G={g}",
                    colorbar_label="similarity",
                ),
                step=g,
            )


def _graphs(
    log_dir: Path, detail: Any, count: int, report: Mapping[str, Any]
) -> None:
    """Graphs of the `count` largest bricks (most layer calls, then first)."""
    entries = sorted(
        enumerate(detail.suite.entries),
        key=lambda ie: (-len(ie[1].brick.layers), ie[0]),
    )[:count]
    batch = report["settings"]["batch_size"]
    for i, entry in entries:
        brick = entry.brick
        name = f"{i:04d}_{'-'.join(brick.class_names)}"
        with summaries.run_writer(
            log_dir, f"{GRAPHS_RUN}/{run_name(name)}"
        ) as w:
            summaries.write_model_graph(w, brick.build(batch), batch)
            summaries.write_text(
                w,
                "brick",
                summaries.markdown_table(
                    ["layers", "classes", "inputs", "signature", "models"],
                    [
                        [
                            ", ".join(brick.layers),
                            ", ".join(brick.class_names),
                            format_inputs(brick.inputs),
                            entry.signature,
                            ", ".join(f"{m} x{n}" for m, n in entry.counts),
                        ]
                    ],
                ),
            )


def write_comparison(log_dir: str | Path, comparison: Any) -> list[str]:
    """Writes a `compare.Comparison` under `log_dir/compare`.

    A text table (per model: the estimate on each configuration and the
    fastest), a grouped bar chart of the estimates, and one scalar per
    model and configuration (`estimate_ms/<configuration>`). Replaces an
    earlier comparison.

    Returns:
        The event files written, relative to `log_dir`.
    """
    from dlbricks_tf.reporting import compare

    log_dir = Path(log_dir)
    for f in (log_dir / COMPARE_RUN).glob("**/events.out.tfevents.*"):
        f.unlink()
    header, rows = compare.table(comparison)
    labels = [c.label for c in comparison.configurations]
    models = [
        m
        for m in comparison.models
        if any((m, i) in comparison.estimates for i in range(len(labels)))
    ]
    with summaries.run_writer(log_dir, COMPARE_RUN) as w:
        summaries.write_table(
            w,
            "comparison",
            header,
            rows,
            description=f"{comparison.mode} estimates per configuration",
        )
        if models and labels:
            series = {
                label: [
                    getattr(comparison.estimates.get((m, i)), "ms", 0.0)
                    for m in models
                ]
                for i, label in enumerate(labels)
            }
            summaries.write_image(
                w,
                "estimates",
                charts.grouped_bar_chart(
                    models,
                    series,
                    title="Estimated latency per machine and backend",
                    value_label="ms",
                ),
            )
        for (model, i), est in sorted(comparison.estimates.items()):
            summaries.write_scalar(
                w, f"estimate_ms/{run_name(labels[i])}/{model}", est.ms
            )
    return sorted(
        str(p.relative_to(log_dir))
        for p in (log_dir / COMPARE_RUN).glob("**/events.out.tfevents.*")
    )


def write_estimates(
    log_dir: str | Path, rows: Sequence[Mapping[str, Any]]
) -> list[str]:
    """Writes the `estimate` command's rows under `log_dir/estimates`.

    A text table (per model and G: the estimate, its bounds, measured,
    normalized and how it was obtained, `report.format_source`), and per
    model the share of each source (`source_share/<label>`, step G) and
    the estimate (`estimated_ms`). Replaces earlier estimates.

    Args:
        log_dir: The folder to point TensorBoard at.
        rows: Rows of `beyond.estimate_models` or `job.estimate_models`.

    Returns:
        The event files written, relative to `log_dir`.
    """
    log_dir = Path(log_dir)
    for f in (log_dir / ESTIMATES_RUN).glob("**/events.out.tfevents.*"):
        f.unlink()
    columns = [
        "model",
        "granularity",
        "mode",
        "estimated_ms",
        "low_ms",
        "high_ms",
        "measured_ms",
        "normalized",
    ]
    with summaries.run_writer(log_dir, ESTIMATES_RUN) as w:
        summaries.write_table(
            w,
            "estimates",
            columns + ["source"],
            [[r.get(c) for c in columns] + [format_source(r)] for r in rows],
            description="Estimates and how each was obtained: timed, "
            "covered by stored bricks of several G, or with predicted "
            "bricks (and each source's share).",
        )
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        run = f"{ESTIMATES_RUN}/{run_name(model)}"
        with summaries.run_writer(log_dir, run) as w:
            summaries.write_scalars(
                w,
                "estimated_ms",
                {r["granularity"]: r["estimated_ms"] for r in mine},
                description=f"Estimate of {model}; the step is G.",
            )
            shares = [(r["granularity"], _shares(r)) for r in mine]
            for label in dict.fromkeys(k for _, s in shares for k in s):
                summaries.write_scalars(
                    w,
                    f"source_share/{run_name(label)}",
                    {g: s.get(label, 0.0) for g, s in shares},
                    description=f"Share of {model}'s estimate from "
                    f"{label} bricks; the step is G.",
                )
    return sorted(
        str(p.relative_to(log_dir))
        for p in (log_dir / ESTIMATES_RUN).glob("**/events.out.tfevents.*")
    )


def _shares(row: Mapping[str, Any]) -> dict[str, float]:
    """{source label: share} of a row; a row without sources was timed."""
    return dict(row.get("sources") or {"timed": 1.0})
