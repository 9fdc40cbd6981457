"""Compare machines and backends: which configuration runs a model fastest.

A store may hold brick timings from several machines (fingerprints) and
backends or thread settings (run settings), e.g. after `merge` of a fleet's
stores. Each (run settings, fingerprint) pair with brick results is a
*configuration*; every model (a decomposition, or a recipe from `export`)
is estimated on each configuration that holds all its bricks, and the
fastest is named: the paper's "which system for my model" question,
answered without running the model anywhere.

Example:
    with Store("all.sqlite") as store:
        table = compare(recipes, store)
    print(format_comparison(table))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from dlbricks_tf.drawing import summaries
from dlbricks_tf.estimating import estimate as estimate_lib
from dlbricks_tf.machine.fingerprint import SystemFingerprint
from dlbricks_tf.machine.settings import RunSettings
from dlbricks_tf.stats import Timing
from dlbricks_tf.storing.store import LAYOUT_PREFIX

_STAT_FIELDS = tuple(f.name for f in dataclasses.fields(Timing))
# A pick is wrong when the configuration the estimates pick measured more
# than this much slower than the measured fastest: the accuracy the
# estimates promise, below which two configurations are a tie to them.
PICK_GAP = 0.10


@dataclasses.dataclass(frozen=True)
class Pick:
    """Which configuration the estimates pick for a model, and which the
    measurements do, among the configurations holding both.

    Attributes:
        model: The model.
        estimated: Column of the lowest estimate.
        measured: Column of the lowest stored end-to-end median.
        gap: How much slower the estimates' pick measured than the
            measured fastest (0 when they agree).
    """

    model: str
    estimated: int
    measured: int
    gap: float

    @property
    def wrong(self) -> bool:
        """The estimates pick a configuration measured > 10% slower."""
        return self.estimated != self.measured and self.gap > PICK_GAP


@dataclasses.dataclass(frozen=True)
class Configuration:
    """Where and how bricks were timed.

    Attributes:
        settings: The run settings (backend, threads, batch size, ...).
        fingerprint: The machine and software stack.
        bricks: How many brick results the store holds for it.
    """

    settings: RunSettings
    fingerprint: SystemFingerprint
    bricks: int

    @property
    def label(self) -> str:
        """A short readable name, e.g. 'tf t2x1 b1 @ Xeon E5 [3f9a0c]'."""
        s = self.settings
        cpu = " ".join(
            w
            for w in self.fingerprint.cpu_model.replace("(R)", "")
            .replace("(TM)", "")
            .split()
            if w.lower() not in ("cpu", "processor", "@")
        )
        return (
            f"{s.backend} t{s.intra_op_threads}x{s.inter_op_threads} "
            f"b{s.batch_size} @ {cpu[:24]} [{self.fingerprint.id[:6]}]"
        )


@dataclasses.dataclass(frozen=True)
class Comparison:
    """Estimates of every model on every configuration.

    Attributes:
        configurations: The columns, in a stable order.
        models: The rows, in the order given.
        estimates: {(model, column index): estimate}; absent where the
            configuration lacks some of the model's bricks.
        missing: {(model, column index): how many unique bricks lack a
            timing there}.
        measured: {(model, column index): stored end-to-end median ms}.
        mode: "sequential" or "parallel".
    """

    configurations: tuple[Configuration, ...]
    models: tuple[str, ...]
    estimates: Mapping[tuple[str, int], estimate_lib.Estimate]
    missing: Mapping[tuple[str, int], int]
    measured: Mapping[tuple[str, int], float]
    mode: str

    def fastest(self, model: str) -> int | None:
        """The column of the lowest estimate for `model`, None if none."""
        known = [
            (e.ms, i)
            for (m, i), e in self.estimates.items()
            if m == model
        ]  # fmt: skip
        return min(known)[1] if known else None

    def speedup(self, model: str) -> float | None:
        """Slowest over fastest estimate, when two or more are known."""
        known = [e.ms for (m, _), e in self.estimates.items() if m == model]
        if len(known) < 2 or min(known) <= 0:
            return None
        return max(known) / min(known)

    def pick(self, model: str) -> Pick | None:
        """The estimates' and the measurements' pick for `model`, among
        the configurations with an estimate and a stored end-to-end
        median; None with fewer than two such."""
        both = [
            i
            for i in range(len(self.configurations))
            if (model, i) in self.estimates and (model, i) in self.measured
        ]
        if len(both) < 2:
            return None
        by_estimate = min(both, key=lambda i: self.estimates[(model, i)].ms)
        by_measurement = min(both, key=lambda i: self.measured[(model, i)])
        fastest = self.measured[(model, by_measurement)]
        picked = self.measured[(model, by_estimate)]
        gap = picked / fastest - 1 if fastest else 0.0
        return Pick(model, by_estimate, by_measurement, gap)

    def picks(self) -> list[Pick]:
        """`pick` of every model that has one, in the models' order."""
        found = (self.pick(m) for m in self.models)
        return [p for p in found if p is not None]


def configurations(
    store: Any, *, batch_size: int | None = None
) -> list[tuple[Configuration, dict[str, Timing]]]:
    """Lists the store's configurations with their brick results.

    Args:
        store: A `dlbricks_tf.storing.store.Store`.
        batch_size: Keep only this batch size (None: all).

    Returns:
        (configuration, {signature: timing}) pairs, ordered by backend,
        fingerprint and settings key.
    """
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for row in store.rows("brick"):
        if row["signature"].startswith(LAYOUT_PREFIX):  # No brick's.
            continue
        settings = RunSettings.from_dict(row["settings"])
        if batch_size is not None and settings.batch_size != batch_size:
            continue
        key = (settings.key(), row["fingerprint_id"])
        group = groups.setdefault(
            key,
            {
                "settings": settings,
                "fingerprint": SystemFingerprint.from_dict(row["fingerprint"]),
                "results": {},
            },
        )
        stats = {k: row[k] for k in _STAT_FIELDS if k in row}
        group["results"][row["signature"]] = Timing.from_dict(stats)
    ordered = sorted(
        groups.values(),
        key=lambda g: (
            g["settings"].backend,
            g["fingerprint"].id,
            g["settings"].key(),
        ),
    )
    return [
        (
            Configuration(g["settings"], g["fingerprint"], len(g["results"])),
            g["results"],
        )
        for g in ordered
    ]


def compare(
    plans: Mapping[str, Any],
    store: Any,
    *,
    mode: str = "sequential",
    statistic: str = "mean",
    batch_size: int | None = None,
) -> Comparison:
    """Estimates every model on every configuration in the store.

    Args:
        plans: {model name: decomposition or recipe}; each has `bricks`
            (with `signature`) and `dependencies`.
        store: A `dlbricks_tf.storing.store.Store`.
        mode: "sequential" or "parallel" (see
            `dlbricks_tf.estimating.estimate`).
        statistic: The brick statistic summed (see `estimate.estimate`).
        batch_size: Keep only configurations of this batch size.

    Returns:
        The comparison table.
    """
    configs = configurations(store, batch_size=batch_size)
    estimates = {}
    missing = {}
    measured = {}
    for i, (config, results) in enumerate(configs):
        for name, plan in plans.items():
            try:
                estimates[(name, i)] = estimate_lib.estimate(
                    plan, results, mode, statistic=statistic
                )
            except estimate_lib.MissingResultsError as e:
                missing[(name, i)] = len(e.signatures)
            timing = store.get_model(name, config.settings, config.fingerprint)
            if timing is not None:
                measured[(name, i)] = timing.median_ms
    return Comparison(
        configurations=tuple(c for c, _ in configs),
        models=tuple(plans),
        estimates=estimates,
        missing=missing,
        measured=measured,
        mode=mode,
    )


def table(comparison: Comparison) -> tuple[list[str], list[list[Any]]]:
    """The comparison as a header and rows (one per model).

    A cell is the estimate in ms (with the stored end-to-end median in
    parentheses when there is one), "n missing" when bricks lack timings;
    the last columns name the fastest configuration by the estimates, the
    fastest by the stored end-to-end medians (with how much slower the
    estimates' pick measured, and "wrong" past `PICK_GAP`; "-" without
    two configurations holding both), and the slowest over fastest
    estimate.
    """
    labels = [c.label for c in comparison.configurations]
    header = ["model", *(f"{label} ms" for label in labels)]
    header += ["fastest", "measured fastest", "slowest/fastest"]
    rows = []
    for model in comparison.models:
        row: list[Any] = [model]
        for i in range(len(labels)):
            est = comparison.estimates.get((model, i))
            if est is None:
                row.append(f"{comparison.missing.get((model, i), 0)} missing")
                continue
            cell = f"{est.ms:.3f}"
            if (model, i) in comparison.measured:
                cell += f" ({comparison.measured[(model, i)]:.3f})"
            if est.noisy:
                cell += " noisy"
            row.append(cell)
        best = comparison.fastest(model)
        row.append(labels[best] if best is not None else "-")
        pick = comparison.pick(model)
        if pick is None:
            row.append("-")
        elif pick.estimated == pick.measured:
            row.append(f"{labels[pick.measured]} (agree)")
        else:
            row.append(
                f"{labels[pick.measured]} (estimates' pick +"
                f"{100 * pick.gap:.0f}%{', wrong' if pick.wrong else ''})"
            )
        ratio = comparison.speedup(model)
        row.append(f"{ratio:.2f}x" if ratio is not None else "-")
        rows.append(row)
    return header, rows


def format_comparison(comparison: Comparison) -> str:
    """A Markdown table of `table(comparison)` with a legend line."""

    header, rows = table(comparison)
    legend = (
        f"{comparison.mode} estimates in ms per configuration (stored "
        "end-to-end median in parentheses); 'noisy': built on bricks "
        "flagged noisy."
    )
    text = legend + "\n\n" + summaries.markdown_table(header, rows)
    line = format_picks(comparison)
    return text + ("\n\n" + line if line else "")


def format_picks(comparison: Comparison) -> str:
    """One line: how often the estimates pick what the measurements pick.

    Empty when no model has two configurations with an estimate and a
    stored end-to-end median.
    """
    picks = comparison.picks()
    if not picks:
        return ""
    agree = sum(p.estimated == p.measured for p in picks)
    wrong = [p for p in picks if p.wrong]
    line = (
        f"Picks: the estimates pick the measured fastest configuration for "
        f"{agree} of {len(picks)} model(s) with two or more measured; "
        f"wrong (the estimates' pick measured more than "
        f"{100 * PICK_GAP:.0f}% slower): {len(wrong)} of {len(picks)}"
    )
    if wrong:
        line += (
            " ("
            + ", ".join(f"{p.model} +{100 * p.gap:.0f}%" for p in wrong)
            + ")"
        )
    return line + "."
