"""Corpus analysis: the figures that motivate DLBricks, for any corpus.

Pure computations on decompositions and timings, no I/O:

* repeatability (paper Fig. 5): layer calls, unique calls and % unique per
  model at G=1, and across the corpus;
* layer types (Fig. 6): how a model's repeated calls split by Keras class;
* similarity (Fig. 7): the Jaccard similarity of every pair of models'
  unique-brick signature sets at one G;
* reuse: the share of a model's bricks, and of its estimated latency, that
  the other models of the corpus already cover;
* trade-off (Figs. 10-12): normalized latency per model, its geometric mean
  and the speed-up, at one G on one system.

A call is "unique" by its G=1 brick signature: same class,
performance-relevant config and input specs (see `signature.py`).

Example:
    ds = {n: dlbricks_tf.decompose(m) for n, m in models.items()}
    [repeatability(d) for d in ds.values()], corpus_repeatability(ds)
    similarity({n: signatures(d) for n, d in ds.items()})
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from dlbricks_tf.estimating import estimate as estimate_lib
from dlbricks_tf.stats import Timing, geomean


class _Brick(Protocol):
    signature: str
    class_names: tuple[str, ...]


class _Decomposition(Protocol):
    name: str
    granularity: int
    bricks: list[Any]
    num_calls: int


@dataclasses.dataclass(frozen=True)
class Repeatability:
    """How often a model (or a corpus) repeats its layer calls.

    Attributes:
        model: Model name ("" for a corpus).
        calls: Layer calls.
        unique: Distinct call signatures among them.
    """

    model: str
    calls: int
    unique: int

    @property
    def percent_unique(self) -> float:
        """Unique calls as a percentage of all calls (0 for no calls)."""
        return 100.0 * self.unique / self.calls if self.calls else 0.0


@dataclasses.dataclass(frozen=True)
class TypeCount:
    """The calls of one Keras class in one model.

    Attributes:
        class_name: The Keras class, e.g. "Conv2D".
        calls: Calls of this class.
        unique: Distinct signatures among them.
    """

    class_name: str
    calls: int
    unique: int

    @property
    def repeated(self) -> int:
        """Calls that repeat an earlier call of the model exactly."""
        return self.calls - self.unique


@dataclasses.dataclass(frozen=True)
class LayerTypes:
    """A model's calls by Keras class, most repeated first.

    Attributes:
        model: Model name.
        types: One entry per class, by repeated calls (descending), then
            name.
    """

    model: str
    types: tuple[TypeCount, ...]

    @property
    def repeated(self) -> int:
        """Repeated calls of the model, all classes."""
        return sum(t.repeated for t in self.types)

    def shares(self) -> dict[str, float]:
        """{class: share of the model's repeated calls}, in [0, 1]."""
        total = self.repeated
        return {
            t.class_name: t.repeated / total if total else 0.0
            for t in self.types
        }


@dataclasses.dataclass(frozen=True)
class Similarity:
    """Pairwise Jaccard similarity of models' unique-brick sets.

    Attributes:
        models: Model names, the order of rows and columns.
        matrix: `matrix[i][j]` is the similarity of models i and j.
    """

    models: tuple[str, ...]
    matrix: tuple[tuple[float, ...], ...]

    def get(self, a: str, b: str) -> float:
        """The similarity of models `a` and `b`."""
        i, j = self.models.index(a), self.models.index(b)
        return self.matrix[i][j]


@dataclasses.dataclass(frozen=True)
class Reuse:
    """What the rest of a corpus already covers of one model.

    Attributes:
        model: Model name.
        bricks: The model's bricks, each occurrence counted.
        covered: Of those, the bricks whose signature another model has.
        unique: The model's distinct signatures.
        new_unique: Distinct signatures no other model has: the bricks to
            time when this model joins an already benchmarked corpus.
        latency_ms: Sequential estimate of the model (None without
            latencies for all its bricks).
        covered_ms: The part of `latency_ms` from covered bricks.
    """

    model: str
    bricks: int
    covered: int
    unique: int
    new_unique: int
    latency_ms: float | None = None
    covered_ms: float | None = None

    @property
    def brick_share(self) -> float:
        """Covered bricks over bricks, in [0, 1]."""
        return self.covered / self.bricks if self.bricks else 0.0

    @property
    def latency_share(self) -> float | None:
        """Covered latency over latency, or None without latencies."""
        if self.latency_ms is None or self.covered_ms is None:
            return None
        return self.covered_ms / self.latency_ms if self.latency_ms else 0.0


@dataclasses.dataclass(frozen=True)
class TradeoffRow:
    """One model's estimate against its measurement at one G.

    Attributes:
        system: Label of the machine and run settings.
        granularity: G.
        model: Model name.
        estimate_ms: Sequential estimate from the bricks' medians.
        measured_ms: Median end-to-end latency.
    """

    system: str
    granularity: int
    model: str
    estimate_ms: float
    measured_ms: float

    @property
    def normalized(self) -> float:
        """Estimate over measurement (1 is exact)."""
        return self.estimate_ms / self.measured_ms


@dataclasses.dataclass(frozen=True)
class TradeoffSummary:
    """Accuracy and speed-up of DLBricks at one G on one system.

    Attributes:
        system: Label of the machine and run settings.
        granularity: G.
        models: The models with a measurement and every brick timed.
        geomean: Geometric mean of their normalized latencies.
        speedup: Their summed end-to-end latency over the summed latency of
            their unique bricks (the paper's benchmarking speed-up).
        bricks: Their bricks, each occurrence counted.
        unique_bricks: Their distinct brick signatures.
        skipped: Models left out, with the reason.
    """

    system: str
    granularity: int
    models: tuple[str, ...]
    geomean: float
    speedup: float
    bricks: int
    unique_bricks: int
    skipped: tuple[tuple[str, str], ...] = ()


def signatures(decomposition: _Decomposition) -> tuple[str, ...]:
    """A decomposition's brick signatures, one per brick, in order."""
    return tuple(b.signature for b in decomposition.bricks)


def _check_g1(decomposition: _Decomposition) -> None:
    if decomposition.granularity != 1:
        raise ValueError(
            "Layer-call figures need a G=1 decomposition. Received: "
            f"{decomposition.name!r} at G={decomposition.granularity}"
        )


def repeatability(
    decomposition: _Decomposition, name: str | None = None
) -> Repeatability:
    """Layer calls and unique calls of one model (paper Fig. 5).

    Args:
        decomposition: The model at G=1.
        name: The model's name in the corpus (default: the Keras name).

    Raises:
        ValueError: If the decomposition is not at G=1.
    """
    _check_g1(decomposition)
    return Repeatability(
        decomposition.name if name is None else name,
        decomposition.num_calls,
        len(set(signatures(decomposition))),
    )


def corpus_repeatability(
    decompositions: Mapping[str, _Decomposition],
) -> Repeatability:
    """Layer calls of all models against distinct calls across them.

    Raises:
        ValueError: If a decomposition is not at G=1.
    """
    unique: set[str] = set()
    calls = 0
    for d in decompositions.values():
        _check_g1(d)
        calls += d.num_calls
        unique.update(signatures(d))
    return Repeatability("", calls, len(unique))


def layer_types(
    decomposition: _Decomposition, name: str | None = None
) -> LayerTypes:
    """A model's calls and repeated calls by Keras class (paper Fig. 6).

    Args:
        decomposition: The model at G=1.
        name: The model's name in the corpus (default: the Keras name).

    Raises:
        ValueError: If the decomposition is not at G=1.
    """
    _check_g1(decomposition)
    calls: collections.Counter[str] = collections.Counter()
    unique: dict[str, set[str]] = collections.defaultdict(set)
    for b in decomposition.bricks:
        (class_name,) = b.class_names
        calls[class_name] += 1
        unique[class_name].add(b.signature)
    types = [TypeCount(c, n, len(unique[c])) for c, n in calls.items()]
    types.sort(key=lambda t: (-t.repeated, -t.calls, t.class_name))
    model = decomposition.name if name is None else name
    return LayerTypes(model, tuple(types))


def jaccard(a: Iterable[str], b: Iterable[str]) -> float:
    """|A ∩ B| / |A ∪ B| of two sets; 1.0 when both are empty."""
    a, b = set(a), set(b)
    union = len(a | b)
    return len(a & b) / union if union else 1.0


def similarity(signature_sets: Mapping[str, Iterable[str]]) -> Similarity:
    """The Jaccard similarity of every pair of models (paper Fig. 7).

    Args:
        signature_sets: {model: its brick signatures}; repeats are ignored.

    Returns:
        A symmetric matrix with a unit diagonal, models in mapping order.
    """
    names = tuple(signature_sets)
    sets = [set(signature_sets[n]) for n in names]
    rows = [[1.0] * len(names) for _ in names]
    for i in range(len(names)):
        for j in range(i + 1, len(names)):
            rows[i][j] = rows[j][i] = jaccard(sets[i], sets[j])
    return Similarity(names, tuple(tuple(r) for r in rows))


def reuse(
    brick_signatures: Mapping[str, Sequence[str]],
    latencies_ms: Mapping[str, float] | None = None,
) -> tuple[Reuse, ...]:
    """What the other models of a corpus cover of each model.

    Args:
        brick_signatures: {model: its bricks' signatures, one per brick}.
        latencies_ms: {signature: latency}; a model gets latency figures if
            every one of its signatures has one.

    Returns:
        One `Reuse` per model, in mapping order.
    """
    users: dict[str, set[str]] = collections.defaultdict(set)
    for model, sigs in brick_signatures.items():
        for s in sigs:
            users[s].add(model)
    out = []
    for model, sigs in brick_signatures.items():
        shared = [len(users[s]) > 1 for s in sigs]
        distinct = set(sigs)
        latency = covered_ms = None
        if latencies_ms is not None and distinct <= latencies_ms.keys():
            times = [float(latencies_ms[s]) for s in sigs]
            latency = sum(times)
            covered_ms = sum(t for t, c in zip(times, shared, strict=True) if c)
        out.append(
            Reuse(
                model=model,
                bricks=len(sigs),
                covered=sum(shared),
                unique=len(distinct),
                new_unique=sum(len(users[s]) == 1 for s in distinct),
                latency_ms=latency,
                covered_ms=covered_ms,
            )
        )
    return tuple(out)


def tradeoff(
    decompositions: Mapping[str, _Decomposition],
    measured: Mapping[str, Timing],
    results: Mapping[str, Timing],
    system: str,
) -> tuple[tuple[TradeoffRow, ...], TradeoffSummary]:
    """Normalized latencies and speed-up at one G (paper Figs. 10-12).

    A model counts if it has a measurement and a timing for every brick;
    the others are listed in `TradeoffSummary.skipped`.

    Args:
        decompositions: {model: decomposition}, all at the same G.
        measured: {model: end-to-end timing}.
        results: {signature: brick timing}, same settings and machine.
        system: A label for the machine and settings, copied to the rows.

    Returns:
        (rows, summary); the summary's geomean and speed-up are nan when no
        model counts.

    Raises:
        ValueError: If the decompositions are at different G.
    """
    gs = {d.granularity for d in decompositions.values()}
    if len(gs) > 1:
        raise ValueError(f"Decompositions at several G: {sorted(gs)}")
    g = gs.pop() if gs else 0
    rows, skipped, used = [], [], {}
    for model, d in decompositions.items():
        if model not in measured:
            skipped.append((model, "no end-to-end timing"))
            continue
        try:
            est = estimate_lib.estimate(d, results, "sequential")
        except estimate_lib.MissingResultsError as e:
            skipped.append((model, f"{len(e.signatures)} bricks untimed"))
            continue
        rows.append(
            TradeoffRow(system, g, model, est.ms, measured[model].median_ms)
        )
        used[model] = d
    unique = {s for d in used.values() for s in signatures(d)}
    speedup = math.nan
    if rows:
        speedup = estimate_lib.speedup(
            {r.model: r.measured_ms for r in rows},
            {s: results[s].median_ms for s in unique},
        )
    summary = TradeoffSummary(
        system=system,
        granularity=g,
        models=tuple(r.model for r in rows),
        geomean=geomean(r.normalized for r in rows),
        speedup=speedup,
        bricks=sum(len(d.bricks) for d in used.values()),
        unique_bricks=len(unique),
        skipped=tuple(skipped),
    )
    return tuple(rows), summary


@dataclasses.dataclass(frozen=True)
class AnalysisResult:
    """Everything `run_analysis` computed, and where it wrote it.

    Attributes:
        out_dir: The output folder.
        granularity: G of the similarity and reuse figures.
        repeatability: One entry per model, in input order (G=1).
        corpus: Calls and unique calls across all models (G=1).
        types: Calls by Keras class, one entry per model (G=1).
        similarity: Jaccard matrix of unique-brick sets at G.
        reuse: One entry per model at G.
        tradeoff_rows: Per system, G and model: estimate vs measured.
        tradeoff: Per system and G: geomean and speed-up.
        tradeoff_note: Why the trade-off is missing or partial; "" if not.
        files: The files written, relative to `out_dir`.
    """

    out_dir: str
    granularity: int
    repeatability: tuple[Repeatability, ...]
    corpus: Repeatability
    types: tuple[LayerTypes, ...]
    similarity: Similarity
    reuse: tuple[Reuse, ...]
    tradeoff_rows: tuple[TradeoffRow, ...] = ()
    tradeoff: tuple[TradeoffSummary, ...] = ()
    tradeoff_note: str = ""
    files: tuple[str, ...] = ()
