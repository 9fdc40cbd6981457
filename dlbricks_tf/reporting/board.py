"""TensorBoard views of a job's results (`tensorboard --logdir LOG_DIR`).

Runs written under the log directory:

    models/<model>   scalars over G (the step): latency/measured_ms,
                     latency/estimated_ms, latency/estimated_parallel_ms,
                     latency/normalized; one run per model, so charts overlay
    hparams          the HParams experiment (granularity, batch size,
                     threads; metrics: geomean normalized latency, speed-up,
                     and the hypervisor steal of the run when the report
                     has it)
    hparams/G=<g>    one session per G with its metric scalars, among them
                     corpus/steal_share and corpus/steal_peak_share,
                     corpus/passes_left_out_share and
                     corpus/model_samples_left_out_share,
                     corpus/reference_ratio and corpus/reference_spread,
                     and corpus/flagged (ranges wider than +-10%)
    tables           Markdown tables (text dashboard): results, corpus,
                     bricks/<model> at step G
    charts           images at step G: normalized latency per model (with
                     the estimate's range over the measurement and the
                     +-10% band), measured vs estimated (the estimate's
                     range and the measurement's confidence interval as
                     error bars), the models' similarity heatmap
    graphs/<brick>   the layer-level op graph of a few bricks (the largest
                     of the last G), one run each
    compare          `estimates_board.write_comparison`: estimates of each
                     model on each machine and backend (table and chart),
                     the fastest
    estimates        `estimates_board.write_estimates`: the `estimate`
                     command's rows, with how each estimate was obtained
                     (timed, covered, predicted) and each source's share

A rewrite replaces these runs (their old event files are deleted), so the
views always show one job.

Example:
    report, details = job.run_job(sources, [1], settings, store)
    write_board("dlbricks_out/tensorboard", report, details)
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dlbricks_tf.analyzing import analysis
from dlbricks_tf.drawing import bar_charts, charts, scatter_charts, summaries
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
# Metrics of the run's conditions, written when the corpus rows have them:
# the share of CPU time the hypervisor gave to other guests over the run,
# and its peak over intervals of about a second (measuring.steal).
STEAL_METRICS = {
    "corpus/steal_share": "hypervisor steal share",
    "corpus/steal_peak_share": "peak hypervisor steal share",
}
# And the share of the chains' passes and of the whole models' samples
# left out as disturbed (`dlbricks_tf.measuring.disturbed`).
LEFT_OUT_METRICS = {
    "corpus/passes_left_out_share": "chain passes left out as disturbed",
    "corpus/model_samples_left_out_share": "model samples left out as "
    "disturbed",
}
# And the reference (`dlbricks_tf.measuring.reference`), when the run read
# it: its median reading over the machine's reference state, and its spread.
REFERENCE_METRICS = {
    "corpus/reference_ratio": "reference reading / reference state",
    "corpus/reference_spread": "reference spread",
}
# And the estimates' ranges (`dlbricks_tf.estimating.ranges`): models
# within +-10%, whose range holds the measurement, whose range is wider
# than +-10%, and the RMS log miss of the run's models.
RANGE_METRICS = {
    "corpus/within_10pct": "models within +-10%",
    "corpus/range_holds": "models whose range holds the measurement",
    "corpus/flagged": "models whose range is wider than +-10%",
    "corpus/machine_variation": "RMS log miss of the models",
}
# Board images are shown scaled down to a card's width (about 500 px):
# about 1200 px wide, with type large enough to read at that scale.
CHART_DPI = 150
CHART_FONT = 12


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
    metrics = {**METRICS, **_present_metrics(corpus)}
    with summaries.run_writer(log_dir, HPARAMS_RUN) as w:
        summaries.write_hparams_config(
            w,
            {
                "granularity": [c["granularity"] for c in corpus],
                **{k: [v] for k, v in values.items()},
            },
            metrics,
        )
    for c in corpus:
        g = c["granularity"]
        with summaries.run_writer(log_dir, f"{HPARAMS_RUN}/G={g}") as w:
            summaries.write_hparams(
                w, {"granularity": g, **values}, trial_id=f"G={g}"
            )
            for tag in metrics:
                value = c.get(tag.removeprefix("corpus/"))
                if value is not None:
                    summaries.write_scalars(w, tag, {g: value})


def _present_metrics(corpus: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """The steal, left-out, reference and range metrics some corpus row
    has."""
    present = {
        **STEAL_METRICS,
        **LEFT_OUT_METRICS,
        **REFERENCE_METRICS,
        **RANGE_METRICS,
    }
    return {
        tag: name
        for tag, name in present.items()
        if any(c.get(tag.removeprefix("corpus/")) is not None for c in corpus)
    }


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
            ] + [
                t.removeprefix("corpus/")
                for t in _present_metrics(report["corpus"])
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
            for tag, figure in result_figures(mine, g).items():
                summaries.write_image(w, tag, charts.to_png(figure), step=g)
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


def result_figures(runs: Sequence[Mapping[str, Any]], g: int) -> dict:
    """The figures of the models' results at G, by image tag.

    `normalized_latency`: estimate / measured per model, its error bar the
    estimate's range over the measurement (`estimated_low_ms` and
    `estimated_high_ms` over `measured_ms`), between lines at +-10%.
    `measured_vs_estimated`: each estimate against its measurement, the
    estimate's range a vertical error bar, the measured median's interval
    (`measured_ci_low_ms`, `measured_ci_high_ms`) a horizontal one. A row
    without those figures draws without its error bar.

    Args:
        runs: The report's rows of the models at G.
        g: G, for the titles.

    Returns:
        {tag: matplotlib figure}; `charts.to_png` draws one.
    """
    labels = [r["model"] for r in runs]
    normalized = [_number(r.get("normalized")) for r in runs]
    bars = bar_charts.Bars(
        tuple(labels),
        (("normalized latency", tuple(normalized)),),
        title=f"Estimate / measured, G={g}",
        value_label="normalized latency",
        reference=1.0,
        reference_label="estimate = measured",
        band=(0.9, 1.1),
        band_label="\u00b110%",
        annotations=tuple(
            f"{v:.3f}" if math.isfinite(v) else "no estimate"
            for v in normalized
        ),
        errors=tuple(normalized_range(r) for r in runs),
        error_label="estimate's range / measured",
    )
    return {
        "normalized_latency": bar_charts.bar_figure(
            [bars], dpi=CHART_DPI, font=CHART_FONT
        ),
        "measured_vs_estimated": scatter_charts.measured_vs_estimated_figure(
            labels,
            [_number(r.get("measured_ms")) for r in runs],
            [_number(r.get("estimated_ms")) for r in runs],
            estimated_ranges=[
                _range(r, "estimated_low_ms", "estimated_high_ms") for r in runs
            ],
            measured_ranges=[
                _range(r, "measured_ci_low_ms", "measured_ci_high_ms")
                for r in runs
            ],
            parallel=[_number(r.get("estimated_parallel_ms")) for r in runs],
            title=f"Measured vs estimated latency, G={g}",
            dpi=CHART_DPI,
            font=CHART_FONT,
        ),
    }


def normalized_range(row: Mapping[str, Any]) -> tuple[float, float] | None:
    """(low, high) of a row's estimate over its measurement, or None."""
    bounds = _range(row, "estimated_low_ms", "estimated_high_ms")
    measured = _number(row.get("measured_ms"))
    if bounds is None or not measured > 0:
        return None
    return bounds[0] / measured, bounds[1] / measured


def _range(
    row: Mapping[str, Any], low: str, high: str
) -> tuple[float, float] | None:
    """The row's finite (low, high) under those keys, or None."""
    bounds = (_number(row.get(low)), _number(row.get(high)))
    return bounds if all(map(math.isfinite, bounds)) else None


def _number(value: Any) -> float:
    """A report figure as a float: None (JSON's non-finite) is nan."""
    return math.nan if value is None else float(value)


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
