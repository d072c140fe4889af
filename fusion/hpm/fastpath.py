"""Few-row predictions straight from the fitted trees: the planner asks about one candidate (or one group's
schedules) at a time, and scikit-learn's `predict` costs far more per call than the trees' work on a few rows.

- A forest: the mean of its trees' `tree_.predict` (what the forest's own `predict` computes), ~10x less
  overhead per call.
- Boosted trees (`HistGradientBoostingRegressor`): its `predict` visits its 1000 trees one Python call each
  (~4 ms whatever the rows); here every tree is flattened once into shared node arrays (leaves loop onto
  themselves) and all (row, tree) walks advance together, one numpy step per tree level, dropping those that
  reached a leaf: 0.15 ms for 2 rows, 1.6 ms for 30 (bench: the pair rows of a 6-schedule group).

Anything else, and more rows than `DIRECT_ROWS`, goes through the estimator's `predict` on one thread.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

DIRECT_ROWS = 64


def single_threaded() -> Any:
    """One OpenMP/BLAS thread: the sweep's workers and the engine already use the cores, and HistGradientBoosting's
    OpenMP threads competing with them for 2 cores made a small fit take minutes instead of a second."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1)


@dataclass(frozen=True)
class FlatTrees:
    """Every tree's nodes in one array each, tree t's nodes at [t * width, (t + 1) * width)."""

    feature: np.ndarray
    threshold: np.ndarray  # +inf at leaves: a leaf's walk always goes "left", to itself
    missing_left: np.ndarray
    left: np.ndarray  # global node indices
    right: np.ndarray
    value: np.ndarray
    roots: np.ndarray
    baseline: float

    def predict(self, x: np.ndarray) -> np.ndarray:
        rows, trees = x.shape[0], self.roots.size
        node = np.tile(self.roots, rows)  # walk r * trees + t: row r in tree t
        offset = np.repeat(np.arange(rows) * x.shape[1], trees)
        flat = np.ascontiguousarray(x, dtype=np.float64).ravel()
        active = np.arange(node.size)
        while active.size:
            at = node[active]
            v = flat[offset[active] + self.feature[at]]
            go_left = (v <= self.threshold[at]) | (np.isnan(v) & self.missing_left[at])
            step = np.where(go_left, self.left[at], self.right[at])
            node[active] = step
            active = active[step != at]
        return self.value[node].reshape(rows, trees).sum(axis=1) + self.baseline


def flatten_boosted(estimator: Any) -> FlatTrees:
    """The node arrays of a fitted single-output HistGradientBoostingRegressor (numerical splits only)."""
    nodes = [p[0].nodes for p in estimator._predictors]  # noqa: SLF001 - the fitted trees; no public accessor
    if any(n["is_categorical"].any() for n in nodes):
        raise ValueError("categorical splits are not flattened")
    width = max(len(n) for n in nodes)
    count = len(nodes) * width
    feature = np.zeros(count, dtype=np.intp)
    threshold = np.full(count, np.inf)
    missing_left = np.ones(count, dtype=bool)
    value = np.zeros(count)
    own = np.arange(count)
    left, right = own.copy(), own.copy()  # padding and leaves point at themselves
    for t, n in enumerate(nodes):
        span = slice(t * width, t * width + len(n))
        split = ~n["is_leaf"].astype(bool)
        base = t * width
        feature[span] = n["feature_idx"]
        threshold[span] = np.where(split, n["num_threshold"], np.inf)
        missing_left[span] = n["missing_go_to_left"].astype(bool)
        left[span] = np.where(split, n["left"] + base, own[span])
        right[span] = np.where(split, n["right"] + base, own[span])
        value[span] = np.where(split, 0.0, n["value"])
    baseline = float(np.ravel(estimator._baseline_prediction)[0])  # noqa: SLF001
    return FlatTrees(feature, threshold, missing_left, left, right, value, np.arange(len(nodes)) * width, baseline)


_flat: weakref.WeakKeyDictionary[Any, FlatTrees] = weakref.WeakKeyDictionary()


def predict(estimator: Any, x: np.ndarray) -> np.ndarray:
    """`estimator.predict(x)`, straight from the trees for few rows of a forest or of boosted trees."""
    if len(x) <= DIRECT_ROWS:
        trees = getattr(estimator, "estimators_", None)
        if isinstance(trees, list) and all(hasattr(t, "tree_") for t in trees):
            x32 = np.ascontiguousarray(x, dtype=np.float32)
            return np.mean([t.tree_.predict(x32)[:, 0] for t in trees], axis=0)
        if hasattr(estimator, "_predictors") and getattr(estimator, "is_categorical_", None) is None:
            if estimator not in _flat:
                _flat[estimator] = flatten_boosted(estimator)
            return _flat[estimator].predict(x)
    with single_threaded():
        return estimator.predict(x)
