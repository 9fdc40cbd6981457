"""Cover: estimate a model from stored bricks of any granularity.

A store may hold the bricks of one model cut at G=1, 2 and 3 (and of other
models that share some of them). `decompose` at one G needs every brick of
that G; a *cover* takes whatever the store holds instead: disjoint bricks,
each a buildable run of the model's calls, whose signatures are stored for
the settings and machine asked, that together hold every call once.

Candidates. A brick is a contiguous run in the splitter's topological
order (`graph.walk`) that `split.buildable` accepts: the rule the splitter
itself cuts by. At every position the runs of 1..G steps are candidates
(steps are calls, or fusion units with `fuse`, as in `split.split`), and
each candidate's signature is made by `decompose.Cutter`, the code that
signs `decompose`'s bricks, with the model around it (which outputs leave
the run is part of the signature). So a cover's bricks are exactly the
bricks some cut of this model would give, and build and run as they do.

Choice. Dynamic programming over the positions, from the end: the best
cover of calls [i, n) is the best over candidates [i, j) of the candidate
plus the best cover of [j, n). Covers are compared by the `objective`:

* "fewest" (the default): the fewest bricks, ties broken by the smallest
  sum of squared CI half-widths (the estimate's variance). Larger bricks
  keep what TensorFlow fuses across layers inside them (a convolution with
  its normalization and activation), and every brick pays its own harness
  residue (the link cost left after subtraction, a few microseconds), so
  fewer bricks leave less of both. How the objectives compare on measured
  stores is in docs/estimating-beyond.md: against the stores' own
  end-to-end timings "fewest" agrees best; against the model timed in the
  same pass as each brick, "precise" does as well or slightly better.
* "precise": the smallest variance, then the fewest bricks.
* "smallest": the most bricks (single calls wherever stored): the G=1
  estimate where it exists, for comparison.

Bricks with no stored timing are never chosen unless a predictor is given
(`dlbricks_tf.estimating.predict`): then every candidate can be predicted, and
covers are compared first by how many steps they predict (fewest first: only
what the store lacks is predicted).
Without a predictor, a model with no cover raises `MissingResultsError`
naming the bricks of its cut at the largest G that the store lacks and
that hold a call no stored brick holds (what `bench` at that G would time
to fill the gap).

Example:
    results = store.results(settings, fp)
    c = cover(model, results, max_granularity=3)
    est = c.estimate(results)
    est.ms, est.sources  # the share of bricks of 1, 2, 3 steps
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from dlbricks_tf.cutting import split
from dlbricks_tf.cutting.decompose import (
    Cutter,
    Decomposition,
    from_runs,
    model_graph,
)
from dlbricks_tf.cutting.graph import Graph
from dlbricks_tf.estimating import estimate as estimate_lib
from dlbricks_tf.measuring.precision import timing_half_width
from dlbricks_tf.stats import Timing

OBJECTIVES = ("fewest", "precise", "smallest")


class Predicts(Protocol):
    """What a cover asks of a predictor (`predict.Predictor` is one)."""

    def predict_bricks(
        self, bricks: Sequence[Any], specs: Sequence[Any]
    ) -> dict[str, Timing]: ...


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A buildable run that may be one brick of a cover.

    Attributes:
        begin: First call (index in the topological order).
        end: One past the last call.
        size: Steps it holds (calls, or fusion units with `fuse`): its G.
        brick: The brick, signed as `decompose` signs it.
    """

    begin: int
    end: int
    size: int
    brick: Any = dataclasses.field(repr=False, compare=False)

    @property
    def signature(self) -> str:
        return self.brick.signature


def candidates(
    graph: Graph,
    max_granularity: int,
    *,
    fuse: bool = False,
    cutter: Cutter | None = None,
) -> list[list[Candidate]]:
    """Every run of 1..G steps the splitter could make, by starting step.

    Args:
        graph: The model's calls in topological order.
        max_granularity: G, the most steps a candidate holds.
        fuse: Steps are fusion units (`split.fusion_units`), else calls.
        cutter: A `decompose.Cutter` of this graph to reuse.

    Returns:
        For each step i, the candidates starting there, shortest first.
    """
    if max_granularity < 1:
        raise ValueError(
            f"max_granularity must be 1 or more. Received: {max_granularity}"
        )
    cutter = cutter or Cutter(graph, None)
    units = (
        split.fusion_units(graph)
        if fuse
        else [(i, i + 1) for i in range(len(graph.calls))]
    )
    out = []
    for first in range(len(units)):
        here = []
        for size in range(1, max_granularity + 1):
            last = first + size
            if last > len(units):
                break
            begin, end = units[first][0], units[last - 1][1]
            # A run that cannot be built stays so when extended.
            if size > 1 and not split.buildable(graph, begin, end):
                break
            here.append(Candidate(begin, end, size, cutter.brick(begin, end)))
        out.append(here)
    return out


@dataclasses.dataclass(frozen=True)
class Cover:
    """A model cut into stored bricks of several sizes.

    It has a decomposition's `name`, `bricks` and `dependencies`, so it can
    be estimated like one (`estimate` below adds its sources).

    Attributes:
        decomposition: The bricks of the cover, as `decompose` makes them.
        sizes: For each brick, how many steps (its G) it holds.
        predicted: {signature: timing} of the bricks chosen without a stored
            timing (empty without a predictor).
        objective: How the cover was chosen (`OBJECTIVES`).
        max_granularity: The largest G considered.
    """

    decomposition: Decomposition
    sizes: tuple[int, ...]
    predicted: Mapping[str, Timing]
    objective: str
    max_granularity: int

    @property
    def name(self) -> str:
        return self.decomposition.name

    @property
    def bricks(self) -> list[Any]:
        return self.decomposition.bricks

    @property
    def dependencies(self) -> list[tuple[int, ...]]:
        return self.decomposition.dependencies

    def labels(self) -> dict[str, str]:
        """{signature: source label}: "G=<size>", or "predicted"."""
        labels = {
            b.signature: f"G={size}"
            for b, size in zip(self.bricks, self.sizes, strict=True)
        }
        labels.update(dict.fromkeys(self.predicted, estimate_lib.PREDICTED))
        return labels

    def estimate(
        self,
        results: Mapping[str, Timing],
        mode: str = "sequential",
        **kwargs: Any,
    ) -> estimate_lib.Estimate:
        """The estimate from the stored timings and the predicted ones.

        Args:
            results: {signature: timing} of the settings and machine the
                cover was made for.
            mode: "sequential" or "parallel".
            **kwargs: Passed on to `estimate.estimate`.

        Returns:
            The estimate, its `sources` the share of each brick size (and
            of predicted bricks).
        """
        return estimate_lib.estimate(
            self,
            {**results, **self.predicted},
            mode,
            sources=self.labels(),
            **kwargs,
        )


def cover(
    model_or_path: Any,
    results: Mapping[str, Timing],
    *,
    max_granularity: int = 3,
    fuse: bool = False,
    objective: str = "fewest",
    predictor: Predicts | None = None,
    custom_objects: Mapping[str, Any] | None = None,
    safe_mode: bool = True,
    input_shapes: Mapping[str, Sequence[int | None]] | None = None,
) -> Cover:
    """The best cover of a model by the bricks `results` holds.

    Args:
        model_or_path: What `decompose` takes.
        results: {signature: timing} for one settings and fingerprint
            (`Store.results(settings, fp)`): only these bricks are used.
        max_granularity: The largest G of a brick.
        fuse: Count steps in fusion units, as `decompose(fuse=True)`.
        objective: One of `OBJECTIVES` (see the module docstring).
        predictor: Fills in bricks the store lacks; None (the default)
            makes a missing brick an error.
        custom_objects, safe_mode, input_shapes: As `decompose`.

    Returns:
        The `Cover`.

    Raises:
        MissingResultsError: No cover by stored bricks exists (and no
            predictor was given).
        DecompositionError: The model cannot be decomposed.
    """
    graph, factory = model_graph(
        model_or_path, custom_objects, safe_mode, input_shapes=input_shapes
    )
    return cover_graph(
        graph,
        factory,
        results,
        max_granularity=max_granularity,
        fuse=fuse,
        objective=objective,
        predictor=predictor,
    )


def cover_graph(
    graph: Graph,
    factory: Any,
    results: Mapping[str, Timing],
    *,
    max_granularity: int = 3,
    fuse: bool = False,
    objective: str = "fewest",
    predictor: Predicts | None = None,
    cutter: Cutter | None = None,
) -> Cover:
    """`cover` of a graph already walked (`decompose.model_graph`)."""
    if objective not in OBJECTIVES:
        raise ValueError(
            f"objective must be one of {OBJECTIVES}. Received: {objective!r}"
        )
    cutter = cutter or Cutter(graph, factory)
    options = candidates(graph, max_granularity, fuse=fuse, cutter=cutter)
    predicted: dict[str, Timing] = {}
    if predictor is not None:
        unknown = {
            c.signature: c.brick
            for here in options
            for c in here
            if c.signature not in results
        }
        if unknown:
            predicted = predictor.predict_bricks(
                list(unknown.values()), graph.specs
            )
    n = len(options)
    # best[i]: (cost, candidate) of the best cover of steps [i, n).
    best: list[tuple[tuple, Candidate | None] | None] = [None] * (n + 1)
    best[n] = ((0, 0, 0.0), None)
    for i in reversed(range(n)):
        choice = None
        for c in reversed(options[i]):  # Longest first: kept on a tie.
            rest = best[i + c.size]
            timing = results.get(c.signature) or predicted.get(c.signature)
            if rest is None or timing is None:
                continue
            missing = c.size if c.signature not in results else 0
            cost = _add(rest[0], missing, timing_half_width(timing) ** 2)
            if choice is None or _key(cost, objective) < _key(
                choice[0], objective
            ):
                choice = (cost, c)
        best[i] = choice
    if best[0] is None:
        raise _missing(graph, factory, results, options, max_granularity, fuse)
    chosen = []
    i = 0
    while i < n:
        step = best[i]
        assert step is not None and step[1] is not None
        chosen.append(step[1])
        i += step[1].size
    decomposition = from_runs(
        graph,
        factory,
        [(c.begin, c.end) for c in chosen],
        granularity=max_granularity,
        fuse=fuse,
        cutter=cutter,
    )
    used = {c.signature for c in chosen if c.signature not in results}
    return Cover(
        decomposition=decomposition,
        sizes=tuple(c.size for c in chosen),
        predicted={s: predicted[s] for s in used},
        objective=objective,
        max_granularity=max_granularity,
    )


def _missing(
    graph: Graph,
    factory: Any,
    results: Mapping[str, Timing],
    options: Sequence[Sequence[Candidate]],
    max_granularity: int,
    fuse: bool,
) -> estimate_lib.MissingResultsError:
    """The error of a model without a cover: what `bench` should time.

    Named: the bricks of the model's cut at the largest G that the store
    lacks and that hold a call no stored brick holds (all the lacking ones
    if every call is in some stored brick, but no stored bricks tile the
    model).
    """
    held = {
        i
        for here in options
        for c in here
        if c.signature in results
        for i in range(c.begin, c.end)
    }
    cut = from_runs(
        graph,
        factory,
        split.split(graph, max_granularity, fuse),
        granularity=max_granularity,
    )
    lacking = [b for b in cut.bricks if b.signature not in results]
    needed = [
        b for b in lacking if any(c.index not in held for c in b.calls)
    ] or lacking
    return estimate_lib.MissingResultsError(
        graph.name, list(dict.fromkeys(b.signature for b in needed))
    )


def _add(rest: tuple, missing: int, variance: float) -> tuple:
    """(predicted steps, bricks, variance) of a brick plus a cover."""
    return (rest[0] + missing, rest[1] + 1, rest[2] + variance)


def _key(cost: tuple, objective: str) -> tuple:
    missing, bricks, variance = cost
    if objective == "precise":
        return (missing, variance, bricks)
    if objective == "smallest":
        return (missing, -bricks, variance)
    return (missing, bricks, variance)
