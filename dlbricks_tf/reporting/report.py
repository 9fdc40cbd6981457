"""Plain-text (Markdown) tables of a job's results, for a terminal or a README.

`format_report` renders report.json (see `dlbricks_tf.running.job`): one row per
model and G (measured, sequential and parallel estimates, normalized
latency), then one row per G (geomean, range, speed-up, wall-clock times).
`format_decompositions` and `format_estimates` render the `decompose` and
`estimate` commands' output. Rows that say how their estimate was
obtained (`sources`: timed, covered by bricks of several G, or with
predicted bricks, see `dlbricks_tf.estimating.beyond`) get a `source` column.

Example:
    print(format_report(json.loads(Path("report.json").read_text())))
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any


def _f(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"


def _g(row: Mapping[str, Any]) -> str:
    """G of a report row, "fused" added for fused decompositions."""
    fused = row.get("split") == "fused"
    return f"{row['granularity']}{' fused' if fused else ''}"


def format_report(report: Mapping[str, Any]) -> str:
    """The per-model and per-G tables of a report, as Markdown.

    An `estimate +-%` column (the relative half-width the bricks' 95%
    intervals leave each estimate) is added when the rows carry
    `estimate_precision`, a `setup s` column when the corpus rows carry
    `campaign_setup_s` (the part of the campaign no sampling cap shortens),
    a `range +-%` column (the range's relative half-width, bricks and
    machine, `dlbricks_tf.estimating.ranges`) and a `flag` column (why a
    range is wider than +-10%) when the rows carry them, a
    `ranges > +-10%` column (how many are) when the corpus rows carry
    `flagged`, a `repeat diff` column when they carry `repeat_median_rel_diff`
    (benchmarks/accuracy.py's recheck), a `model drift` column when they
    carry `model_drift_median_rel_diff` (the whole models' median move
    since the previous G's pass of the same run), a `failed bricks` column
    when a model has no estimate because bricks of it failed
    (`failed_bricks`), a `budget s (spent)`, `bricks timed/predicted` and
    `probes s + first fit s` column (both apart from the budget) when the
    corpus rows carry `budget_s` (`run --budget`,
    `dlbricks_tf.running.budget`);
    rows of fused decompositions (`"split": "fused"`) show G as "1 fused".
    """
    precise = any("estimate_precision" in r for r in report["runs"])
    ranged = any("range_half" in r for r in report["runs"])
    flagged = any(r.get("range_flag") for r in report["runs"])
    failed = any(r.get("failed_bricks") for r in report["runs"])
    sourced = _beyond_timed(report["runs"])
    lines = [
        "| model | G | measured ms | sequential ms | parallel ms "
        "| normalized | normalized (median) | normalized (min) |"
        + (" estimate +-% |" * precise)
        + (" range +-% |" * ranged)
        + (" flag |" * flagged)
        + (" failed bricks |" * failed)
        + (" source |" * sourced),
        "|---|---:|---:|---:|---:|---:|---:|---:|"
        + ("---:|" * precise)
        + ("---:|" * ranged)
        + ("---|" * flagged)
        + ("---|" * failed)
        + ("---|" * sourced),
    ]
    for r in report["runs"]:
        line = (
            f"| {r['model']} | {_g(r)} | {_f(r['measured_ms'])} "
            f"| {_f(r['estimated_ms'])} | {_f(r['estimated_parallel_ms'])} "
            f"| {_f(r['normalized'])} "
            f"| {_f(r.get('normalized_median', math.nan))} "
            f"| {_f(r.get('normalized_min', math.nan))} |"
        )
        if precise:
            width = r.get("estimate_precision")
            line += f" {_f(None if width is None else 100 * width, 1)} |"
        if ranged:
            width = r.get("range_half")
            line += f" {_f(None if width is None else 100 * width, 1)} |"
        if flagged:
            line += f" {r.get('range_flag') or ''} |"
        if failed:
            line += f" {_signatures(r.get('failed_bricks') or ())} |"
        if sourced:
            line += f" {format_source(r)} |"
        lines.append(line)
    repeat = any("repeat_median_rel_diff" in c for c in report["corpus"])
    setup = any("campaign_setup_s" in c for c in report["corpus"])
    header = (
        "| G | geomean | min | max | speed-up | unique bricks "
        "| campaign s | end-to-end s |"
    )
    rule = "|---:|---:|---:|---:|---:|---:|---:|---:|"
    if setup:
        header, rule = (
            header + " setup s | setup ms/brick |",
            rule + "---:|---:|",
        )
    if repeat:
        header, rule = header + " repeat diff |", rule + "---:|"
    drift = any("model_drift_median_rel_diff" in c for c in report["corpus"])
    if drift:
        header, rule = header + " model drift |", rule + "---:|"
    within = any("within_10pct" in c for c in report["corpus"])
    if within:
        header, rule = (
            header + " within +-10% | range holds |",
            rule + ("---:|---:|"),
        )
    wide = any("flagged" in c for c in report["corpus"])
    if wide:
        header, rule = header + " ranges > +-10% |", rule + "---:|"
    steal = any(c.get("steal_share") is not None for c in report["corpus"])
    if steal:
        header, rule = header + " steal % (peak) |", rule + "---:|"
    left_out = any(
        c.get("passes_left_out_share") is not None
        or c.get("model_samples_left_out_share") is not None
        for c in report["corpus"]
    )
    if left_out:
        header, rule = (
            header + " left out % (passes / models) |",
            (rule + "---:|"),
        )
    ref = any(c.get("reference_ratio") is not None for c in report["corpus"])
    if ref:
        header, rule = header + " reference x (spread) |", rule + "---:|"
    budget = any(c.get("budget_s") is not None for c in report["corpus"])
    if budget:
        header, rule = (
            header
            + " budget s (spent) | bricks timed/predicted"
            + " | probes s + first fit s |",
            rule + "---:|---:|---:|",
        )
    lines += ["", header, rule]
    for c in report["corpus"]:
        line = (
            f"| {_g(c)} | {_f(c['geomean_normalized'])} "
            f"| {_f(c['min_normalized'])} | {_f(c['max_normalized'])} "
            f"| {_f(c['speedup'], 2)} "
            f"| {c.get('unique_bricks', '-')}/{c.get('total_bricks', '-')} "
            f"| {_f(c['campaign_wall_s'], 1)} "
            f"| {_f(c['end_to_end_wall_s'], 1)} |"
        )
        if setup:
            timed = c.get("bricks_timed")
            per_brick = (
                1e3 * c["campaign_setup_s"] / timed
                if timed and c.get("campaign_setup_s") is not None
                else None
            )
            line += (
                f" {_f(c.get('campaign_setup_s'), 1)} | {_f(per_brick, 1)} |"
            )
        if repeat:
            line += f" {_f(c.get('repeat_median_rel_diff'))} |"
        if drift:
            line += f" {_f(c.get('model_drift_median_rel_diff'))} |"
        if within:
            models = c.get("models", "-")
            line += (
                f" {c.get('within_10pct', '-')}/{models} "
                f"| {c.get('range_holds', '-')}/{models} |"
            )
        if wide:
            line += f" {c.get('flagged', '-')}/{c.get('models', '-')} |"
        if steal:
            share, peak = c.get("steal_share"), c.get("steal_peak_share")
            line += (
                f" {_f(None if share is None else 100 * share, 1)}"
                f" ({_f(None if peak is None else 100 * peak, 1)}) |"
            )
        if left_out:
            passes = c.get("passes_left_out_share")
            samples = c.get("model_samples_left_out_share")
            line += (
                f" {_f(None if passes is None else 100 * passes, 1)}"
                f" / {_f(None if samples is None else 100 * samples, 1)} |"
            )
        if ref:
            spread = c.get("reference_spread")
            line += (
                f" {_f(c.get('reference_ratio'))}"
                f" ({_f(None if spread is None else 100 * spread, 1)}%) |"
            )
        if budget:
            line += (
                f" {_f(c.get('budget_s'), 1)}"
                f" ({_f(c.get('budget_spent_s'), 1)})"
                f" | {c.get('bricks_timed', '-')}"
                f"/{c.get('bricks_predicted', '-')}"
                f" | {_f(c.get('probes_s'), 1)}"
                f" + {_f(c.get('first_fit_s'), 1)} |"
            )
        lines.append(line)
    return "\n".join(lines)


def format_onednn_note(fingerprints: Sequence[tuple[Any, int]]) -> str:
    """One line on results whose oneDNN label predates TensorFlow's rule.

    Fingerprints written before `SystemFingerprint.onednn_rule` existed
    labelled oneDNN on for every x86 CPU unless `TF_ENABLE_ONEDNN_OPTS` said
    otherwise; TensorFlow turns it on only on CPUs with AVX512_VNNI,
    AVX512_BF16, AVX_VNNI or AMX. Their results keep their label and id,
    and are never mixed with results timed since.

    Args:
        fingerprints: (fingerprint, results count) pairs, as
            `Store.fingerprint_counts` returns them.

    Returns:
        The line, or "" when no result has such a fingerprint.
    """
    return _legacy_note(
        [(fp, n) for fp, n in fingerprints if fp.legacy_onednn],
        "the oneDNN rule",
        "oneDNN label may be the old x86 default, not what TensorFlow did.",
    )


def format_cpu_note(fingerprints: Sequence[tuple[Any, int]]) -> str:
    """One line on results whose fingerprint predates `cpu_kind`.

    Before it, a fingerprint named the CPU by its model name alone, which
    a VM may give two generations alike ("AMD EPYC"). Such results keep
    their id; a machine fingerprinted since never takes it, so they are
    not used for it, and are kept.

    Args:
        fingerprints: As for `format_onednn_note`.

    Returns:
        The line, or "" when no result has such a fingerprint.
    """
    return _legacy_note(
        [(fp, n) for fp, n in fingerprints if fp.legacy_cpu],
        "the CPU's family and model in the fingerprint",
        "machine is known by its CPU's model name alone, which two CPU "
        "generations may share.",
    )


def _legacy_note(old: Sequence[tuple[Any, int]], what: str, says: str) -> str:
    """'Note: N results (fingerprints ...) predate <what>: their <says>'."""
    old = [(fp, n) for fp, n in old if n]
    if not old:
        return ""
    results = sum(n for _, n in old)
    ids = ", ".join(fp.id for fp, _ in old[:3])
    ids += f" and {len(old) - 3} more" if len(old) > 3 else ""
    return (
        f"Note: {results} result{'s' * (results != 1)} (fingerprint"
        f"{'s' * (len(old) != 1)} {ids}) "
        f"{'predates' if results == 1 else 'predate'} {what}: "
        f"{'its' if results == 1 else 'their'} {says}"
    )


def _signatures(signatures, shown: int = 3) -> str:
    """The first `shown` signatures, then how many more ("" for none)."""
    signatures = list(signatures)
    more = len(signatures) - shown
    return ", ".join(signatures[:shown]) + (
        f" (+{more} more)" if more > 0 else ""
    )


def format_failed(rows: Sequence[Mapping[str, Any]]) -> str:
    """One line naming the bricks that failed, and the models left out.

    Args:
        rows: Rows of report.json's `runs` (`model`, `granularity` and
            `failed_bricks`, {signature: reason}).

    Returns:
        The line, or "" when no brick failed.
    """
    reasons: dict[str, str] = {}
    models = []
    for r in rows:
        if r.get("failed_bricks"):
            reasons.update(r["failed_bricks"])
            models.append(f"{r['model']} G={r['granularity']}")
    if not reasons:
        return ""
    items = list(reasons.items())
    shown = "; ".join(f"{s} ({reason})" for s, reason in items[:3])
    more = len(items) - 3
    return (
        f"Failed: {len(items)} brick(s) could not be built or timed: "
        f"{shown}{f' (+{more} more)' if more > 0 else ''}. No estimate for "
        f"{', '.join(models)}. They are recorded as failed in the store; "
        "every other brick and model was timed, and a rerun tries them "
        "again."
    )


def format_decompositions(
    decompositions: Mapping[str, Any], *, bricks: bool = True
) -> str:
    """Each model's bricks (layers, classes, inputs, signature) and counts.

    Args:
        decompositions: {model: Decomposition}, all at the same G.
        bricks: List every brick, or only the counts.

    Returns:
        Markdown: a table of bricks per model, then a summary table.
    """
    seen: set[str] = set()
    unique_per_model = {}
    out = []
    for name, d in decompositions.items():
        sigs = [b.signature for b in d.bricks]
        unique = set(sigs)
        unique_per_model[name] = (len(sigs), len(unique), len(unique - seen))
        seen.update(sigs)
        if not bricks:
            continue
        merged = d.merged
        out += [
            f"## {name} (G={d.granularity}): {d.num_calls} layer calls, "
            f"{len(d.bricks)} bricks"
            + (
                f"; {len(merged)} calls repeat an earlier one and are "
                "merged into it"
                if merged
                else ""
            ),
            "",
            "| # | layers | classes | inputs | signature | reads |",
            "|---:|---|---|---|---|---|",
        ]
        for i, (b, deps) in enumerate(
            zip(d.bricks, d.dependencies, strict=True)
        ):
            out.append(
                f"| {i} | {', '.join(b.layers)} | {', '.join(b.class_names)} "
                f"| {format_inputs(b.inputs)} | {b.signature} "
                f"| {', '.join(map(str, deps))} |"
            )
        if merged:
            out += [
                "",
                "Merged (TensorFlow computes each once): "
                + ", ".join(f"{a} = {b}" for a, b in merged),
            ]
        out.append("")
    out += [
        "| model | bricks | unique in model | new to corpus |",
        "|---|---:|---:|---:|",
    ]
    for name, (total, unique, new) in unique_per_model.items():
        out.append(f"| {name} | {total} | {unique} | {new} |")
    total = sum(t for t, _, _ in unique_per_model.values())
    out.append(f"| (corpus) | {total} | {len(seen)} | {len(seen)} |")
    return "\n".join(out)


def format_inputs(specs: Sequence[Any]) -> str:
    """Input specs as `(224, 224, 3) float32; ...` (batch left out)."""
    return "; ".join(f"{tuple(s.shape)} {s.dtype}" for s in specs)


def format_estimates(rows: Sequence[Mapping[str, Any]]) -> str:
    """The `estimate` command's rows (see `steps.estimate_models`).

    Rows of `beyond.cover_and_predict` (they carry `method`) add a `source`
    column (`format_source`).
    """
    sourced = any("method" in r for r in rows)
    lines = [
        "| model | G | mode | estimated ms | low ms | high ms | measured ms "
        "| normalized | noisy bricks |" + (" source |" * sourced),
        "|---|---:|---|---:|---:|---:|---:|---:|---:|" + ("---|" * sourced),
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['granularity']} | {r['mode']} "
            f"| {_f(r['estimated_ms'])} | {_f(r['low_ms'])} "
            f"| {_f(r['high_ms'])} | {_f(r['measured_ms'])} "
            f"| {_f(r['normalized'])} | {r['noisy_bricks']} |"
            + (f" {format_source(r)} |" * sourced)
        )
    return "\n".join(lines)


def format_source(row: Mapping[str, Any]) -> str:
    """How a row's estimate was obtained, with the share of each source.

    E.g. "timed"; "covered: G=3 85%, G=2 11%, G=1 4%"; "predicted 12%
    (5 bricks)"; "covered: G=3 80%, G=1 8%; predicted 12% (5 bricks)".
    A row without `sources` was timed.
    """
    sources = row.get("sources") or {"timed": 1.0}
    method = row.get("method", "timed")
    parts = []
    if method.startswith("covered"):
        sizes = sorted(
            ((k, v) for k, v in sources.items() if k.startswith("G=")),
            key=lambda kv: -int(kv[0][2:]),
        )
        parts.append(
            "covered: "
            + ", ".join(f"{k} {100 * v:.0f}%" for k, v in sizes if v > 0)
        )
    predicted = sources.get("predicted", 0.0)
    if predicted or "predicted" in method:
        count = row.get("predicted_bricks")
        parts.append(
            f"predicted {100 * predicted:.0f}%"
            + (f" ({count} bricks)" if count is not None else "")
        )
    return "; ".join(parts) or "timed"


def _beyond_timed(rows: Sequence[Mapping[str, Any]]) -> bool:
    """Whether any row's estimate was not simply timed at its G."""
    return any(r.get("method", "timed") != "timed" for r in rows)


def format_noisy(rows: Sequence[Mapping[str, Any]]) -> str:
    """One line naming the rows whose figures rest on noisy timings.

    Args:
        rows: Rows of report.json's `runs` or of the `estimate` command
            (`model`, `granularity`, `noisy_bricks`, and `measured_noisy`
            when the end-to-end timing is known).

    Returns:
        The line, or "" when no row uses a timing flagged noisy.
    """
    flagged = []
    for r in rows:
        parts = []
        if r.get("noisy_bricks"):
            parts.append(f"{r['noisy_bricks']} brick(s)")
        if r.get("measured_noisy"):
            parts.append("end to end")
        if parts:
            flagged.append(
                f"{r['model']} G={r['granularity']} ({', '.join(parts)})"
            )
    if not flagged:
        return ""
    return (
        f"Noisy: {'; '.join(flagged)}: these timings did not reach their "
        "precision within the sampling caps (a chained brick is flagged "
        "when it keeps a model's estimate from --precision; a looped one "
        "was measured twice), so the figures above rest on them. They are "
        "retimed by the next run; a quieter machine or larger "
        "--max_seconds help."
    )
