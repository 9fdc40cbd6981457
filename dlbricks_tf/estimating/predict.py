"""Predicted bricks: a per-machine latency model of the store's bricks.

A store holds the timings of many bricks for one settings and machine.
`Predictor.fit` learns from them the latency of a brick from what it
computes (`dlbricks_tf.estimating.features`: layer kinds, FLOPs, weights and
activations moved, shapes, activation functions), so that a model whose
bricks are not all stored can still be estimated: the bricks the store
lacks are predicted, and the estimate says how many and what share of it
they hold (`Estimate.sources`, label "predicted").

Methods (`METHODS`):

* "efficiency": a physical first guess of each brick's
  latency (`dlbricks_tf.estimating.cost`: FLOPs of each kind at round
  rates, or the bytes at one bandwidth, plus a cost per call), times
  scikit-learn's `HistGradientBoostingRegressor` fitted to the log ratio
  median / guess, the brick's efficiency. The ratio is bounded, so a
  brick larger than any learnt from is priced at the efficiency of the
  largest ones, not at their latency.
* "kinds" (the default): "efficiency" fitted once per kind of brick
  (the kind of its costliest call, grouped convolutions a kind of their
  own) that has at least `regressors.MIN_KIND_BRICKS` bricks, and once over all
  bricks for the others. One model over all kinds is fitted mostly to
  the kinds that are common (elementwise, normalization and activation
  bricks are most bricks of most models), and prices a kind of few
  bricks (the probes' grouped convolutions) as its neighbours in feature
  space.
* "trees": the same trees on the log of the bricks' medians: latencies
  span five orders of magnitude, and errors are relative; trees do not
  extrapolate beyond the largest brick they saw.
* "roofline": a closed form, ms = a FLOPs_matrix + b FLOPs_stencil +
  c FLOPs_vector + d bytes + e calls + f, fitted by non-negative least
  squares on relative errors. Linear, it extrapolates to bricks larger
  than any it learnt from, which trees cannot.
* "hybrid": the roofline, times trees fitted to its log residual.

"kinds" is the default because, predicting every brick of a family that
none of the training bricks came from (leave one family out on the
40-model store, with the probe corpus), it put the most models within 10%
of their end-to-end latency (28/40 against 25/40 for "efficiency") with a
geometric mean of 0.996 (0.955); "efficiency" before it read VGG's dense
layers, larger than any other family's, about right where "trees" read
them half as long (docs/estimating-beyond.md).

Uncertainty. The predictor is cross-validated when fitted (k folds;
grouped by the model, or the family, a brick came from when there are two
or more, so that a group's bricks are predicted by a predictor that saw
none of them). What an estimate needs is the error of a *sum* of predicted
bricks, and a predictor's errors within one model go the same way (a
kind of layer it prices wrong is wrong in every brick that holds it). So
with grouped folds, the 2.5% and 97.5% quantiles of each held-out model's
log ratio sum measured / sum predicted give every predicted brick its
interval; with plain folds, those of the bricks' log ratios do. The
interval enters the estimate's bounds as a timed brick's CI does, and
summed bounds give the predicted part of an estimate exactly that
interval.

Only timings of one settings key and one fingerprint may train one
predictor: the caller passes `Store.results(settings, fp)`.

Example:
    data = examples({"m": model_graph(m)}, store.results(settings, fp))
    predictor = Predictor.fit(data)
    predictor.cv.within_10pct, predictor.predict_bricks(bricks, graph.specs)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dlbricks_tf import errors
from dlbricks_tf.cutting import description
from dlbricks_tf.cutting.decompose import Cutter
from dlbricks_tf.estimating import cover as cover_lib
from dlbricks_tf.estimating import features, regressors
from dlbricks_tf.estimating.regressors import MIN_MS
from dlbricks_tf.stats import Timing

METHODS = ("kinds", "efficiency", "trees", "hybrid", "roofline")
# The interval of a predicted brick: these quantiles of the out-of-fold
# log ratios.
QUANTILES = (0.025, 0.975)


class PredictorError(errors.Error):
    """A predictor cannot be fitted (too few timed bricks)."""


@dataclasses.dataclass(frozen=True)
class Example:
    """A timed brick to learn from.

    Attributes:
        signature: The brick's signature.
        features: `features.brick_features` of the brick.
        median_ms: Its stored median.
        group: The model (or family) it was first found in, for grouped
            folds.
    """

    signature: str
    features: Mapping[str, float]
    median_ms: float
    group: str


def examples(
    graphs: Mapping[str, tuple[Any, Any]],
    results: Mapping[str, Timing],
    *,
    max_granularity: int = 3,
    fuse: bool = False,
    exclude: frozenset[str] = frozenset(),
    group_of: Callable[[str], str] | None = None,
) -> list[Example]:
    """The stored bricks of some models, with their features.

    Every run a cover could use (`cover.candidates`, 1..G steps) whose
    signature `results` holds is an example, once per signature.

    Args:
        graphs: {model name: (graph, factory)} (`decompose.model_graph`).
        results: {signature: timing} of one settings and fingerprint.
        max_granularity: The largest run considered.
        fuse: Steps are fusion units.
        exclude: Signatures not to learn from.
        group_of: The group of a model's bricks for the cross-validation
            (e.g. `corpus.family`); by default each model is its own.

    Returns:
        The examples, in the models' order.
    """
    out: dict[str, Example] = {}
    for name, (graph, factory) in graphs.items():
        cutter = Cutter(graph, factory)
        for here in cover_lib.candidates(
            graph, max_granularity, fuse=fuse, cutter=cutter
        ):
            for c in here:
                s = c.signature
                if s in out or s in exclude or s not in results:
                    continue
                out[s] = Example(
                    s,
                    features.brick_features(c.brick, graph.specs),
                    results[s].median_ms,
                    group_of(name) if group_of else name,
                )
    return list(out.values())


def described_examples(
    descriptions: Mapping[str, str],
    results: Mapping[str, Timing],
    *,
    exclude: frozenset[str] = frozenset(),
) -> tuple[list[Example], dict[str, str]]:
    """The stored bricks a store keeps a description of, with their features.

    No model is needed: the features are read from each brick's
    description (`dlbricks_tf.cutting.description`), which holds what
    `features.brick_features` reads of a brick cut from its model. The
    store keeps no model names, so each brick is a group of its own for
    the cross-validation.

    Args:
        descriptions: {signature: description} (`Store.descriptions`).
        results: {signature: timing} of one settings and fingerprint.
        exclude: Signatures not to learn from.

    Returns:
        (the examples in signature order, {signature: why} of the
        descriptions that do not read back and were left out).
    """
    out = []
    unread = {}
    for s in sorted(descriptions):
        if s in exclude or s not in results:
            continue
        try:
            brick = description.parse(descriptions[s], s)
        except description.DescriptionError as e:
            unread[s] = str(e)
            continue
        out.append(
            Example(
                s,
                features.brick_features(brick, brick.specs),
                results[s].median_ms,
                s,
            )
        )
    return out, unread


@dataclasses.dataclass(frozen=True)
class CrossValidation:
    """How well the predictor predicts bricks it did not learn from.

    Attributes:
        folds: Folds of the cross-validation.
        grouped: Whether folds held out whole groups (models, families).
        bricks: Bricks predicted out of fold.
        median_error: Median of |predicted / measured - 1|.
        within_10pct: Share of bricks predicted within 10%.
        low: 2.5% quantile of log(measured / predicted), per brick.
        high: 97.5% quantile of log(measured / predicted), per brick.
        models: Groups held out whole (0 unless `grouped`).
        model_low: 2.5% quantile of log(sum measured / sum predicted)
            over the held-out groups (`low` unless `grouped`).
        model_high: The 97.5% quantile of the same.
    """

    folds: int
    grouped: bool
    bricks: int
    median_error: float
    within_10pct: float
    low: float
    high: float
    models: int = 0
    model_low: float = 0.0
    model_high: float = 0.0

    @property
    def interval(self) -> tuple[float, float]:
        """(low, high) log ratios a predicted brick's interval spans."""
        if self.grouped:
            return self.model_low, self.model_high
        return self.low, self.high


class Predictor:
    """A brick latency model for one settings and machine.

    Use `Predictor.fit`; `predict_bricks` fills in the bricks a store
    lacks, `cv` says how far to trust it.
    """

    def __init__(self, model: Any, method: str, cv: CrossValidation) -> None:
        self._model = model
        self.method = method
        self.cv = cv

    @classmethod
    def fit(
        cls,
        data: Sequence[Example],
        *,
        method: str = "kinds",
        folds: int = 5,
        seed: int = 0,
    ) -> Predictor:
        """Fits a predictor and cross-validates it.

        Args:
            data: Timed bricks (`examples`).
            method: One of `METHODS` (see the module docstring).
            folds: Folds of the cross-validation (at least 2). With two or
                more groups among `data`, each fold holds out whole groups
                (as many folds as groups, at most this many).
            seed: Seeds the folds and the trees.

        Returns:
            The predictor, fitted on all of `data`.

        Raises:
            PredictorError: Fewer timed bricks than 2 * folds.
        """
        import numpy as np

        if method not in METHODS:
            raise ValueError(
                f"method must be one of {METHODS}. Received: {method!r}"
            )
        if folds < 2:
            raise ValueError(f"folds must be 2 or more. Received: {folds}")
        if len(data) < 2 * folds:
            raise PredictorError(
                f"Only {len(data)} timed brick(s) to learn from; a predictor "
                f"needs {2 * folds} or more. Time more bricks (`dlbricks "
                "bench`) for these settings and this machine."
            )
        x = np.array([features.vector(e.features) for e in data])
        y = np.log(np.array([max(e.median_ms, MIN_MS) for e in data]))
        groups = [e.group for e in data]
        grouped = len(set(groups)) >= 2
        if grouped:  # Each fold holds out whole groups.
            folds = min(folds, len(set(groups)))
        out_of_fold = np.empty_like(y)
        for train, test in _folds(len(data), groups, folds, grouped, seed):
            model = regressors.make(method, seed)
            model.fit(x[train], y[train])
            out_of_fold[test] = model.predict(x[test])
        residual = y - out_of_fold
        ratio = np.abs(np.exp(out_of_fold - y) - 1)
        low, high = np.quantile(residual, QUANTILES)
        sums = {}
        for i, group in enumerate(groups):
            part = sums.setdefault(group, [0.0, 0.0])
            part[0] += math.exp(y[i])
            part[1] += math.exp(out_of_fold[i])
        per_model = [math.log(m / p) for m, p in sums.values()]
        model_low, model_high = np.quantile(per_model, QUANTILES)
        cv = CrossValidation(
            folds=folds,
            grouped=grouped,
            bricks=len(data),
            median_error=float(np.median(ratio)),
            within_10pct=float(np.mean(ratio <= 0.10)),
            low=float(low),
            high=float(high),
            models=len(sums) if grouped else 0,
            model_low=float(model_low) if grouped else float(low),
            model_high=float(model_high) if grouped else float(high),
        )
        model = regressors.make(method, seed)
        model.fit(x, y)
        return cls(model, method, cv)

    def predict_ms(self, rows: Sequence[Mapping[str, float]]) -> list[float]:
        """Predicted medians (ms) of bricks given by their features."""
        import numpy as np

        if not rows:
            return []
        x = np.array([features.vector(r) for r in rows])
        return [float(v) for v in np.exp(self._model.predict(x))]

    def timing(self, ms: float) -> Timing:
        """A predicted median as a timing, its interval from the CV."""
        lo, hi = self.cv.interval
        return predicted_timing(ms, ms * math.exp(lo), ms * math.exp(hi))

    def predict_bricks(
        self, bricks: Sequence[Any], specs: Sequence[Any]
    ) -> dict[str, Timing]:
        """{signature: predicted timing} of bricks of one graph.

        Args:
            bricks: `Brick`s of a graph.
            specs: That graph's `specs`.

        Returns:
            A timing per signature (samples 0: nothing was run).
        """
        unique = {b.signature: b for b in bricks}
        rows = [features.brick_features(b, specs) for b in unique.values()]
        return {
            s: self.timing(ms)
            for s, ms in zip(unique, self.predict_ms(rows), strict=True)
        }


def _folds(
    n: int, groups: Sequence[str], folds: int, grouped: bool, seed: int
) -> list[tuple[Any, Any]]:
    import numpy as np
    from sklearn.model_selection import GroupKFold, KFold

    index = np.arange(n)
    if grouped:
        splitter = GroupKFold(n_splits=folds, shuffle=True, random_state=seed)
        return list(splitter.split(index, groups=groups))
    splitter = KFold(n_splits=folds, shuffle=True, random_state=seed)
    return list(splitter.split(index))


def predicted_timing(ms: float, low: float, high: float) -> Timing:
    """A predicted latency of `ms` as a timing whose interval is
    [low, high] (nothing sampled: 0 samples)."""
    return Timing(
        min_ms=low,
        median_ms=ms,
        trimmed_mean_ms=ms,
        max_ms=high,
        samples=0,
        ci_low_ms=min(low, ms),
        ci_high_ms=max(high, ms),
        noisy=False,
    )
