"""A fitted predictor as plain JSON, so that a store can keep it.

Fitting a predictor means walking the training models and fitting and
cross-validating gradient-boosted trees: seconds to tens of seconds. A
store keeps the fitted predictor of each settings key and fingerprint
(`Store.put_predictor`), under a key that changes whenever what it was
fitted on changes (`fit_key`), so that the next `estimate --predict` on
the same store reads it back instead of fitting again.

The format is data only: the trees' nodes (feature, threshold, children,
leaf values), the roofline's coefficients, the cross-validation. No
pickle: loading a store never runs code it holds. `Forest` evaluates
the trees with numpy as scikit-learn's `HistGradientBoostingRegressor`
does (a missing value goes the side the tree learnt; `x <= threshold`
goes left); a test checks the two agree on every row.

Example:
    text = to_json(predictor)
    same = from_json(text)
    same.predict_ms(rows) == predictor.predict_ms(rows)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from dlbricks_tf import errors
from dlbricks_tf.estimating import features, regressors
from dlbricks_tf.estimating import predict as predict_lib

# Bumped when the saved form, the features or a method's formula changes:
# a predictor saved by another format is fitted again, never misread.
FORMAT = 1


class SavedPredictorError(errors.Error):
    """A saved predictor cannot be read back (another format, damaged)."""


def fit_key(
    method: str,
    max_granularity: int,
    fuse: bool,
    training: Iterable[str],
    results: Mapping[str, Any],
    described: Iterable[str] = (),
) -> str:
    """A digest of what a predictor is fitted from.

    Args:
        method: The predictor's method.
        max_granularity, fuse: How the training models were cut.
        training: The names of the models it learns from.
        results: `Store.results(settings, fp)`: every stored brick of the
            settings and machine, with its median (a brick timed again
            changes the key).
        described: The stored bricks it learns from by their descriptions
            (a description, once kept, never changes); none leaves the key
            of a fit without them as it was.

    Returns:
        A hex digest; equal keys mean the same fit.
    """
    from sklearn import __version__ as sklearn_version

    h = hashlib.sha256()
    head = [
        FORMAT,
        method,
        max_granularity,
        fuse,
        sorted(training),
        features.feature_names(),
        sklearn_version,
    ]
    h.update(json.dumps(head).encode())
    for signature in sorted(results):
        h.update(f"{signature}:{results[signature].median_ms!r};".encode())
    for signature in sorted(described):
        h.update(f"described:{signature};".encode())
    return h.hexdigest()


class Forest:
    """Regression trees added up, as `HistGradientBoostingRegressor` does.

    Attributes:
        baseline: The constant the trees are added to.
        trees: Per tree, the node arrays `feature`, `threshold`, `left`,
            `right`, `leaf` (0/1), `value` and `missing_left` (0/1).
    """

    _FIELDS = (
        "feature",
        "threshold",
        "left",
        "right",
        "leaf",
        "value",
        "missing_left",
    )

    def __init__(self, baseline: float, trees: list[dict[str, list]]) -> None:
        import numpy as np

        self.baseline = float(baseline)
        self.trees = trees
        self._arrays = [
            {k: np.asarray(t[k]) for k in self._FIELDS} for t in trees
        ]

    @classmethod
    def from_sklearn(cls, model: Any) -> Forest:
        """The trees of a fitted `HistGradientBoostingRegressor`."""
        trees = []
        for (predictor,) in model._predictors:  # One tree per iteration.
            nodes = predictor.nodes
            if nodes["is_categorical"].any():
                raise SavedPredictorError(
                    "A tree splits on a categorical feature, which this "
                    "format does not hold."
                )
            trees.append(
                {
                    "feature": nodes["feature_idx"].tolist(),
                    "threshold": nodes["num_threshold"].tolist(),
                    "left": nodes["left"].tolist(),
                    "right": nodes["right"].tolist(),
                    "leaf": nodes["is_leaf"].astype(int).tolist(),
                    "value": nodes["value"].tolist(),
                    "missing_left": nodes["missing_go_to_left"]
                    .astype(int)
                    .tolist(),
                }
            )
        baseline = float(model._baseline_prediction.ravel()[0])
        return cls(baseline, trees)

    def predict(self, x: Any) -> Any:
        """The sum of the trees' leaves, plus the baseline, per row."""
        import numpy as np

        x = np.asarray(x, dtype=float)
        rows = np.arange(len(x))
        out = np.full(len(x), self.baseline)
        for t in self._arrays:
            node = np.zeros(len(x), dtype=int)
            while True:
                inner = t["leaf"][node] == 0
                if not inner.any():
                    break
                n = node[inner]
                v = x[rows[inner], t["feature"][n]]
                left = np.where(
                    np.isnan(v),
                    t["missing_left"][n] == 1,
                    v <= t["threshold"][n],
                )
                node[inner] = np.where(left, t["left"][n], t["right"][n])
            out += t["value"][node]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"baseline": self.baseline, "trees": self.trees}


def _forest(trees: Any) -> Forest:
    """The forest of fitted trees (already one if read back)."""
    return trees if isinstance(trees, Forest) else Forest.from_sklearn(trees)


def _parts(
    method: str, model: Any
) -> tuple[list | None, Forest | None, dict[str, Forest]]:
    """(roofline coefficients, forest, forest per kind) of a fitted model
    of `predict`, or of one `_model` rebuilt."""
    import numpy as np

    if method == "roofline":
        return np.asarray(model.coef_).tolist(), None, {}
    if method == "trees":
        return None, _forest(model), {}
    if method == "efficiency":
        return None, _forest(model._trees), {}
    if method == "kinds":
        kinds = {k: _forest(m._trees) for k, m in model.kinds.items()}
        return None, _forest(model.all._trees), kinds
    # hybrid
    coef = np.asarray(model._roofline.coef_).tolist()
    return coef, _forest(model._trees), {}


def _model(
    method: str,
    coef: list | None,
    forest: Forest | None,
    kinds: dict[str, Forest],
) -> Any:
    """The model of `predict` for `method`, its trees replaced by the
    saved forests: each method's formula stays written once, there."""
    import numpy as np

    def efficiency(trees: Forest) -> Any:
        model = regressors.Efficiency(0)
        model._trees = trees
        return model

    if method == "roofline":
        model = regressors.Roofline()
        model.coef_ = np.asarray(coef)
        return model
    if method == "trees":
        return forest
    if method == "efficiency":
        return efficiency(forest)
    if method == "kinds":
        model = regressors.Kinds(0)
        model.all = efficiency(forest)
        model.kinds = {k: efficiency(f) for k, f in kinds.items()}
        return model
    model = regressors.Hybrid(0)
    model._roofline.coef_ = np.asarray(coef)
    model._trees = forest
    return model


def to_json(predictor: predict_lib.Predictor) -> str:
    """The predictor as JSON text (data only)."""
    coef, forest, kinds = _parts(predictor.method, predictor._model)
    return json.dumps(
        {
            "format": FORMAT,
            "method": predictor.method,
            "features": features.feature_names(),
            "cv": dataclasses.asdict(predictor.cv),
            "roofline": coef,
            "forest": forest.to_dict() if forest is not None else None,
            "kinds": {k: f.to_dict() for k, f in sorted(kinds.items())},
        }
    )


def from_json(text: str) -> predict_lib.Predictor:
    """The predictor `to_json` wrote.

    Raises:
        SavedPredictorError: Another format, other features, or damaged.
    """
    try:
        data = json.loads(text)
        if data.get("format") != FORMAT:
            raise SavedPredictorError(
                f"Saved predictor of format {data.get('format')!r}, not "
                f"{FORMAT}: it is fitted again."
            )
        if data["features"] != list(features.feature_names()):
            raise SavedPredictorError(
                "Saved predictor of other features: it is fitted again."
            )
        method = data["method"]
        if method not in predict_lib.METHODS:
            raise SavedPredictorError(f"Unknown method {method!r}.")
        forest = None
        if data["forest"] is not None:
            forest = Forest(data["forest"]["baseline"], data["forest"]["trees"])
        kinds = {
            k: Forest(f["baseline"], f["trees"])
            for k, f in data["kinds"].items()
        }
        model = _model(method, data["roofline"], forest, kinds)
        cv = predict_lib.CrossValidation(**data["cv"])
    except (KeyError, TypeError, ValueError) as e:
        raise SavedPredictorError(
            f"Saved predictor cannot be read ({type(e).__name__}: {e}); it "
            "is fitted again."
        ) from e
    return predict_lib.Predictor(model, method, cv)
