"""The regressors a predictor fits: brick features in, log latency out.

Each has scikit-learn's `fit(x, y)` and `predict(x)`, on rows of
`dlbricks_tf.estimating.features.vector` and the log of the bricks'
medians: `Roofline` (a closed form fitted by non-negative least squares),
`trees` (gradient-boosted trees), `Efficiency` (`cost.cost_ms` times trees
fitted to the log ratio), `Kinds` (one `Efficiency` per kind of brick,
`brick_kinds`) and `Hybrid` (the roofline times trees). `make` makes the
one a method names; `dlbricks_tf.estimating.predict` fits and
cross-validates it, and `saved_predictor` writes and reads it as JSON.
numpy, scipy and scikit-learn are imported on first use.
"""

from __future__ import annotations

from typing import Any

from dlbricks_tf.estimating import cost as cost_lib
from dlbricks_tf.estimating import features

# "kinds": a kind with fewer bricks than this is priced by the model of
# all kinds.
MIN_KIND_BRICKS = 20
# Medians below this (a weightless brick after the link cost is taken
# away) are learnt as this: the harness resolves no less.
MIN_MS = 1e-3

# The roofline's terms: matrix, stencil and vector FLOPs, the bytes moved,
# the calls, and a constant per brick. (One coefficient per layer kind
# over-fits: a kind seen in one family only, small, is priced by it.)
_ROOFLINE = ("matrix_flops", "stencil_flops", "vector_flops", "bytes", "calls")


class Roofline:
    """ms = a FLOPs_matrix + b FLOPs_stencil + c FLOPs_vector + d bytes
    + e calls + f, all coefficients >= 0.

    Fitted by non-negative least squares on relative errors (each row
    divided by its latency), so small bricks weigh as much as large ones.
    Linear in FLOPs and bytes, it extrapolates to bricks larger than any
    it learnt from, which trees cannot.
    """

    def fit(self, x: Any, y: Any) -> Roofline:
        import numpy as np
        from scipy.optimize import nnls

        ms = np.exp(y)
        a = self._terms(x) / ms[:, None]
        scale = np.maximum(a.max(axis=0), 1e-30)
        coef, _ = nnls(a / scale, np.ones(len(ms)), maxiter=50 * a.shape[1])
        self.coef_ = coef / scale
        return self

    def predict(self, x: Any) -> Any:
        import numpy as np

        ms = self._terms(x) @ self.coef_
        return np.log(np.maximum(ms, MIN_MS))

    @staticmethod
    def _terms(x: Any) -> Any:
        import numpy as np

        names = features.feature_names()
        columns = [names.index(n) for n in _ROOFLINE]
        return np.hstack([x[:, columns], np.ones((len(x), 1))])


class Hybrid:
    """The roofline, times trees fitted to its log residual."""

    def __init__(self, seed: int) -> None:
        self._roofline = Roofline()
        self._trees = trees(seed)

    def fit(self, x: Any, y: Any) -> Hybrid:
        self._roofline.fit(x, y)
        self._trees.fit(x, y - self._roofline.predict(x))
        return self

    def predict(self, x: Any) -> Any:
        return self._roofline.predict(x) + self._trees.predict(x)


class Efficiency:
    """`cost.cost_ms`, times trees fitted to the log ratio median / cost."""

    def __init__(self, seed: int) -> None:
        self._trees = trees(seed)

    def fit(self, x: Any, y: Any) -> Efficiency:
        self._trees.fit(x, y - self._log_cost(x))
        return self

    def predict(self, x: Any) -> Any:
        return self._log_cost(x) + self._trees.predict(x)

    @staticmethod
    def _log_cost(x: Any) -> Any:
        import numpy as np

        names = features.feature_names()
        terms = [x[:, names.index(n)] for n in _COST]
        cost = [cost_lib.cost_ms(*row) for row in zip(*terms, strict=True)]
        return np.log(np.maximum(cost, MIN_MS))


# The terms of `cost.cost_ms`, in its order.
_COST = ("calls", "matrix_flops", "stencil_flops", "vector_flops", "bytes")


def trees(seed: int) -> Any:
    """Gradient-boosted trees, seeded: the learner the other methods use."""
    from sklearn.ensemble import HistGradientBoostingRegressor

    return HistGradientBoostingRegressor(
        max_iter=400,
        learning_rate=0.05,
        min_samples_leaf=5,
        l2_regularization=1.0,
        random_state=seed,
    )


class Kinds:
    """One `Efficiency` per kind of brick (`brick_kinds`) with enough
    bricks, and one over all bricks for the kinds with fewer."""

    def __init__(self, seed: int) -> None:
        self._seed = seed
        self.all = Efficiency(seed)
        self.kinds: dict[str, Any] = {}

    def fit(self, x: Any, y: Any) -> Kinds:
        import numpy as np

        self.all.fit(x, y)
        kinds = np.array(brick_kinds(x))
        for k in sorted(set(kinds)):
            rows = kinds == k
            if rows.sum() >= MIN_KIND_BRICKS:
                self.kinds[k] = Efficiency(self._seed).fit(x[rows], y[rows])
        return self

    def predict(self, x: Any) -> Any:
        import numpy as np

        out = self.all.predict(x)
        kinds = np.array(brick_kinds(x))
        for k, model in self.kinds.items():
            rows = kinds == k
            if rows.any():
                out[rows] = model.predict(x[rows])
        return out


def brick_kinds(x: Any) -> list[str]:
    """The kind of each brick (rows of `features.vector`): "grouped" if it
    holds a grouped convolution, else the kind of layer (`features.KINDS`)
    with the most FLOPs among its calls, the first listed on a tie."""
    names = features.feature_names()
    grouped = names.index("grouped_calls")
    columns = [
        (k, names.index(f"{k}_calls"), names.index(f"{k}_flops"))
        for k in features.KIND_NAMES
    ]
    out = []
    for row in x:
        if row[grouped] > 0:
            out.append("grouped")
            continue
        present = [
            (row[f], -i, k) for i, (k, c, f) in enumerate(columns) if row[c] > 0
        ]
        out.append(max(present)[2] if present else "other")
    return out


def make(method: str, seed: int) -> Any:
    """A fresh, unfitted regressor of `method` (one of `predict.METHODS`)."""
    if method == "kinds":
        return Kinds(seed)
    if method == "roofline":
        return Roofline()
    if method == "trees":
        return trees(seed)
    if method == "efficiency":
        return Efficiency(seed)
    return Hybrid(seed)
