"""TensorBoard views of estimates that time nothing: compare, estimate.

`write_comparison` writes `report --compare`'s comparison of each model on
every machine and backend (run "compare"); `write_estimates` writes the
`estimate` command's rows with how each estimate was obtained (run
"estimates"). Both go beside the job's own views (`board.write_board`)
under the same log directory, and replace their earlier runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dlbricks_tf.drawing import bar_charts, summaries
from dlbricks_tf.reporting import compare
from dlbricks_tf.reporting.board import COMPARE_RUN, ESTIMATES_RUN, run_name
from dlbricks_tf.reporting.report import format_source


def write_comparison(log_dir: str | Path, comparison: Any) -> list[str]:
    """Writes a `compare.Comparison` under `log_dir/compare`.

    A text table (per model: the estimate on each configuration, the
    fastest by the estimates and by the stored end-to-end medians, the
    picks' line of `compare.format_picks` as its description), the count
    of wrong picks (`wrong_picks`, when a model has two configurations
    measured), a grouped bar chart of the estimates, and one scalar per
    model and configuration (`estimate_ms/<configuration>`). Replaces an
    earlier comparison.

    Returns:
        The event files written, relative to `log_dir`.
    """
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
            description=f"{comparison.mode} estimates per configuration. "
            + compare.format_picks(comparison),
        )
        picks = comparison.picks()
        if picks:  # How often the estimates pick the wrong configuration.
            summaries.write_scalar(
                w, "wrong_picks", float(sum(p.wrong for p in picks))
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
                bar_charts.grouped_bar_chart(
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
        rows: Rows of `beyond.cover_and_predict` or `steps.estimate_models`.

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
