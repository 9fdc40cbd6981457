"""`run_analysis`: a corpus in, its analysis figures out as files.

Decomposes every model (at G=1, and at the chosen G), computes the figures
of `analysis.py` and writes them under one folder:

    repeatability.csv  per model (and a "(corpus)" row): calls, unique, %
    types.csv          per model and Keras class: calls, unique, repeated
    similarity.csv     the Jaccard matrix at G, model names on both axes
    reuse.csv          per model: bricks (and latency) other models cover
    tradeoff.csv       per system, G and model: estimate, measured, ratio
    tradeoff_summary.csv  per system and G: geomean ratio, speed-up
    analysis.json      all of the above
    *.png              repeatability, types, similarity (heatmap), reuse;
                       with a store, tradeoff.png (geomean and speed-up
                       per G) and tradeoff_models.png (ratio per model)
    tensorboard/       run "analysis": the charts and Markdown tables; one
                       run per system: geomean and speed-up scalars over G

Latency figures (trade-off, latency reuse) come from a store written by the
benchmark; without one they are skipped with a message. A rerun into the
same folder replaces the files and the TensorBoard runs it writes.

Example:
    from dlbricks_tf.models import corpus
    result = run_analysis(
        {n: functools.partial(corpus.application, n) for n in names},
        "dlbricks_out/analysis",
    )
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import keras

from dlbricks_tf import errors
from dlbricks_tf.analyzing import analysis, analysis_files
from dlbricks_tf.analyzing.analysis import AnalysisResult
from dlbricks_tf.cutting.decompose import Decomposition, decompose
from dlbricks_tf.machine.fingerprint import SystemFingerprint
from dlbricks_tf.machine.settings import RunSettings
from dlbricks_tf.stats import Timing
from dlbricks_tf.storing.store import Store

DEFAULT_TRADEOFF_GRANULARITIES = (1, 2, 3, 4, 5, 6)
# The paper's corpus (50 MXNet models, Section 2.2): 10,815 layers, of which
# 1,529 (14%) are unique.
PAPER_CORPUS = analysis.Repeatability("paper: 50 MXNet models", 10815, 1529)

_print = functools.partial(print, flush=True)


class AnalysisError(errors.Error):
    """The analysis cannot run: no models, a bad model, a missing store."""


@dataclasses.dataclass(frozen=True)
class _System:
    """The timings of one (run settings, machine) pair in a store."""

    label: str
    measured: Mapping[str, Timing]
    results: Mapping[str, Timing]


def run_analysis(
    models: Mapping[str, Any],
    out_dir: str | os.PathLike,
    granularity: int = 1,
    store_path: str | os.PathLike | None = None,
    *,
    tradeoff_granularities: Sequence[int] = DEFAULT_TRADEOFF_GRANULARITIES,
    log: Callable[[str], None] | None = _print,
) -> AnalysisResult:
    """Analyses a corpus and writes CSV, JSON, PNG and TensorBoard files.

    Args:
        models: {name: model}; a model is a `keras.Model`, the path of a
            model file, or a function of no argument that returns either
            (built when its turn comes, so a large corpus is never all in
            memory).
        out_dir: The output folder (created if absent).
        granularity: G of the similarity and reuse figures.
        store_path: A results store written by the benchmark, for the
            trade-off and latency-reuse figures; None skips them.
        tradeoff_granularities: The values of G the trade-off tries; a G
            counts where the store has every brick of a measured model.
        log: Called with one progress line per model (and one per
            skipped figure); None is silent.

    Returns:
        The figures and the list of files written.

    Raises:
        AnalysisError: No models, a missing store file, or a model that
            cannot be loaded or decomposed (the message names it).
        ValueError: `granularity` is not an integer of 1 or more.

    Example:
        >>> r = run_analysis({"a": model_a, "b": "b.keras"}, "out")
        >>> r.corpus.percent_unique, r.similarity.get("a", "b")
    """
    log = log or (lambda line: None)
    if isinstance(granularity, bool) or not isinstance(granularity, int):
        raise ValueError(
            f"granularity must be an int. Received: {granularity!r}"
        )
    if granularity < 1:
        raise ValueError(
            f"granularity must be 1 or more. Received: {granularity}"
        )
    if not models:
        raise AnalysisError("No models to analyse: give at least one.")
    systems: list[_System] = []
    note = "no store given: run the benchmark and pass its store"
    if store_path is not None:
        systems, note = _read_store(store_path, list(models))
    timed = {m for s in systems for m in s.measured}
    extra_gs = sorted(set(tradeoff_granularities)) if timed else []

    by_g: dict[int, dict[str, Decomposition]] = collections.defaultdict(dict)
    for i, (name, source) in enumerate(models.items(), 1):
        start = time.perf_counter()
        gs = {1, granularity} | (set(extra_gs) if name in timed else set())
        for g, d in _decompose(name, source, sorted(gs)).items():
            by_g[g][name] = d
        rep = analysis.repeatability(by_g[1][name], name)
        log(
            f"[{i}/{len(models)}] {name}: {rep.calls} calls, {rep.unique} "
            f"unique ({rep.percent_unique:.1f}%), "
            f"{len(by_g[granularity][name].bricks)} bricks at "
            f"G={granularity} ({time.perf_counter() - start:.1f} s)"
        )

    rows, summary = _tradeoff(systems, by_g, extra_gs)
    if systems and not summary:
        note = (
            "no measured model has all its bricks timed at any G in "
            f"{list(tradeoff_granularities)}"
        )
    if note and not summary:
        log(f"Trade-off skipped: {note}.")
    else:
        note = ""

    at_g = by_g[granularity]
    latencies = None
    if systems:
        latencies = {s: t.median_ms for s, t in systems[0].results.items()}
    result = AnalysisResult(
        out_dir=os.fspath(out_dir),
        granularity=granularity,
        repeatability=tuple(
            analysis.repeatability(d, m) for m, d in by_g[1].items()
        ),
        corpus=analysis.corpus_repeatability(by_g[1]),
        types=tuple(analysis.layer_types(d, m) for m, d in by_g[1].items()),
        similarity=analysis.similarity(
            {m: analysis.signatures(d) for m, d in at_g.items()}
        ),
        reuse=analysis.reuse(
            {m: analysis.signatures(d) for m, d in at_g.items()}, latencies
        ),
        tradeoff_rows=rows,
        tradeoff=summary,
        tradeoff_note=note,
    )
    files = analysis_files.write_all(result, Path(out_dir))
    return dataclasses.replace(result, files=tuple(files))


def _decompose(
    name: str, source: Any, granularities: Sequence[int]
) -> dict[int, Decomposition]:
    built = not isinstance(source, keras.Model | str | os.PathLike)
    try:
        model = source() if built else source
        return {g: decompose(model, granularity=g) for g in granularities}
    except errors.Error as e:
        raise AnalysisError(f"Model {name!r}: {e}") from e
    finally:
        if built:  # Keep the memory of a long corpus flat.
            model = None
            keras.backend.clear_session()


def _tradeoff(
    systems: Sequence[_System],
    by_g: Mapping[int, Mapping[str, Decomposition]],
    granularities: Sequence[int],
) -> tuple[
    tuple[analysis.TradeoffRow, ...], tuple[analysis.TradeoffSummary, ...]
]:
    """The trade-off of every system at every G where a model is complete."""
    rows, summary = [], []
    for system in systems:
        for g in granularities:
            ds = {m: d for m, d in by_g[g].items() if m in system.measured}
            r, s = analysis.tradeoff(
                ds, system.measured, system.results, system.label
            )
            if r:
                rows.extend(r)
                summary.append(s)
    return tuple(rows), tuple(summary)


def _read_store(
    store_path: str | os.PathLike, models: Sequence[str]
) -> tuple[list[_System], str]:
    """The systems with end-to-end timings of `models`, most complete first."""

    if not os.path.isfile(store_path):
        raise AnalysisError(
            f"Store file {os.fspath(store_path)!r} does not exist: pass the "
            "store a benchmark run wrote, or no store."
        )
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    wanted = set(models)
    with Store(store_path) as store:
        for row in store.rows("model"):
            if row["model"] not in wanted:
                continue
            settings = RunSettings.from_dict(row["settings"])
            fp = SystemFingerprint.from_dict(row["fingerprint"])
            group = groups.setdefault(
                (settings.key(), fp.id),
                {"settings": settings, "fp": fp, "measured": {}},
            )
            group["measured"][row["model"]] = Timing.from_dict(row)
        systems = [
            _System(
                label=f"{key} @ {fp_id}",
                measured=g["measured"],
                results=store.results(g["settings"], g["fp"]),
            )
            for (key, fp_id), g in groups.items()
        ]
    if not systems:
        return [], (
            f"the store {os.fspath(store_path)!r} has no end-to-end timing "
            "of these models"
        )
    systems.sort(key=lambda s: (-len(s.measured), s.label))
    return systems, ""
