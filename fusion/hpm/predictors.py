"""The fitted estimators as plain arrays, predicted with numpy alone: what a model file holds and what the planner
runs, so loading a model never unpickles (never runs code) and `--cost-model hpm` needs no scikit-learn.

- `Trees`: boosted trees (`HistGradientBoostingRegressor`: baseline + sum of leaves) or a forest (extra trees:
  mean of leaves, inputs compared as float32 like scikit-learn's trees). Every tree's nodes lie in one row of
  `(trees, width)` arrays, a leaf's children pointing at itself; all (row, tree) walks advance together, one numpy
  step per tree level, dropping those that reached a leaf (0.15 ms for 2 rows through 1000 trees, where
  scikit-learn's `predict` costs ~4 ms whatever the rows: the planner asks about a few rows at a time).
- `Mlp`: standardisation, then ReLU layers and a linear output (scikit-learn's `MLPRegressor` in a pipeline).

`from_arrays` checks what a file could get wrong before anything is indexed: dtypes, shapes, feature indices,
and that each split's children lie after it in its own tree, so every walk ends within `width` steps.
`from_sklearn` converts a fitted estimator (reading its attributes; scikit-learn is not imported here).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from fusion.hpm.errors import CorruptModelError

MAX_WALKS = 1 << 21  # (row, tree) walks per numpy step: bounds the working memory of large predictions


@dataclass(frozen=True)
class Trees:
    """A tree ensemble: prediction = baseline + scale * sum over trees of the leaf each row reaches."""

    feature: np.ndarray  # (trees, width) int: the split's feature (0 at leaves)
    threshold: np.ndarray  # (trees, width) float64: go left when x <= threshold (+inf at leaves)
    missing_left: np.ndarray  # (trees, width) bool: where a NaN goes
    left: np.ndarray  # (trees, width) int: child index within the tree; a leaf's children are itself
    right: np.ndarray
    value: np.ndarray  # (trees, width) float64: leaf values (0 at splits)
    baseline: float
    scale: float
    float32_inputs: bool  # compare inputs rounded to float32 (scikit-learn's decision trees do)

    kind = "trees"

    def predict(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        if self.float32_inputs:
            x = x.astype(np.float32).astype(np.float64)
        chunk = max(1, MAX_WALKS // self.feature.shape[0])
        parts = [self._predict(x[i : i + chunk]) for i in range(0, len(x), chunk)]
        return np.concatenate(parts) if parts else np.zeros(0)

    @cached_property
    def _flat(self) -> tuple[np.ndarray, ...]:
        """Roots, features, thresholds, NaN directions, children (global node indices) and values, flattened."""
        trees, width = self.feature.shape
        base = np.arange(trees) * width
        left, right = (self.left + base[:, None]).ravel(), (self.right + base[:, None]).ravel()
        flat = (self.feature.ravel(), self.threshold.ravel(), self.missing_left.ravel(), left, right)
        return (base, *flat, self.value.ravel())

    def _predict(self, x: np.ndarray) -> np.ndarray:
        trees, width = self.feature.shape
        rows = x.shape[0]
        base, feature, threshold, missing, left, right, value = self._flat
        node = np.tile(base, rows)  # walk r * trees + t: row r in tree t
        offset = np.repeat(np.arange(rows) * x.shape[1], trees)
        flat = np.ascontiguousarray(x).ravel()
        active = np.arange(node.size)
        for _ in range(width):  # a walk only moves to a later node of its tree: at most `width` steps
            if not active.size:
                break
            at = node[active]
            v = flat[offset[active] + feature[at]]
            go_left = (v <= threshold[at]) | (np.isnan(v) & missing[at])
            step = np.where(go_left, left[at], right[at])
            node[active] = step
            active = active[step != at]
        return self.baseline + self.scale * value[node].reshape(rows, trees).sum(axis=1)

    def arrays(self) -> dict[str, np.ndarray]:
        small = np.int16 if self.feature.shape[1] < 2**15 else np.int32
        return {
            "feature": self.feature.astype(np.int32),
            "threshold": self.threshold,
            "missing_left": self.missing_left,
            "left": self.left.astype(small),
            "right": self.right.astype(small),
            "value": self.value,
            "constants": np.array([self.baseline, self.scale, float(self.float32_inputs)]),
        }

    @classmethod
    def from_arrays(cls, a: dict[str, np.ndarray], n_features: int) -> Trees:
        shape = a["feature"].shape
        if len(shape) != 2 or 0 in shape:
            raise CorruptModelError(f"tree arrays of shape {shape}, expected (trees, width)")
        ints = {k: _typed(a, k, "iu", shape).astype(np.intp) for k in ("feature", "left", "right")}
        floats = {k: _typed(a, k, "f", shape).astype(np.float64) for k in ("threshold", "value")}
        missing = _typed(a, "missing_left", "b", shape)
        constants = _typed(a, "constants", "f", (3,)).astype(np.float64)
        if not np.all(np.isfinite(constants)) or constants[2] not in (0.0, 1.0):
            raise CorruptModelError("tree constants are not finite or the float32 flag is not 0/1")
        own = np.broadcast_to(np.arange(shape[1]), shape)
        leaf = (ints["left"] == own) & (ints["right"] == own)
        split = (ints["left"] > own) & (ints["right"] > own) & (ints["left"] < shape[1]) & (ints["right"] < shape[1])
        if not np.all(leaf | split):
            raise CorruptModelError("a tree node's children do not lie after it in its tree")
        if np.any((ints["feature"] < 0) | (ints["feature"] >= n_features)):
            raise CorruptModelError(f"a tree splits on a feature outside 0..{n_features - 1}")
        if np.any(np.isnan(floats["threshold"])) or not np.all(np.isfinite(floats["value"])):
            raise CorruptModelError("tree thresholds or leaf values are not numbers")
        return cls(ints["feature"], floats["threshold"], missing, ints["left"], ints["right"], floats["value"],
                   float(constants[0]), float(constants[1]), bool(constants[2]))  # fmt: skip


@dataclass(frozen=True)
class Mlp:
    """Standardised inputs through ReLU layers and a linear output."""

    mean: np.ndarray
    scale: np.ndarray
    weights: tuple[np.ndarray, ...]
    biases: tuple[np.ndarray, ...]

    kind = "mlp"

    def predict(self, x: np.ndarray) -> np.ndarray:
        h = (np.asarray(x, dtype=np.float64) - self.mean) / self.scale
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            h = h @ w + b
            if i < len(self.weights) - 1:
                h = np.maximum(h, 0.0)
        return h[:, 0]

    def arrays(self) -> dict[str, np.ndarray]:
        layers = {f"w{i}": w for i, w in enumerate(self.weights)} | {f"b{i}": b for i, b in enumerate(self.biases)}
        return {"mean": self.mean, "scale": self.scale, **layers}

    @classmethod
    def from_arrays(cls, a: dict[str, np.ndarray], n_features: int) -> Mlp:
        mean, scale = (_typed(a, k, "f", (n_features,)).astype(np.float64) for k in ("mean", "scale"))
        layers = sum(1 for k in a if k.startswith("w"))
        if layers < 1 or any(k not in a for i in range(layers) for k in (f"w{i}", f"b{i}")):
            raise CorruptModelError("MLP layers are missing")
        weights, biases, width = [], [], n_features
        for i in range(layers):
            w = _typed(a, f"w{i}", "f", None).astype(np.float64)
            if w.ndim != 2 or w.shape[0] != width or (i == layers - 1 and w.shape[1] != 1):
                raise CorruptModelError(f"MLP layer {i} has shape {w.shape}, its input is {width} wide")
            weights.append(w)
            biases.append(_typed(a, f"b{i}", "f", (w.shape[1],)).astype(np.float64))
            width = w.shape[1]
        if not all(np.all(np.isfinite(v)) for v in (mean, scale, *weights, *biases)) or np.any(scale == 0):
            raise CorruptModelError("MLP parameters are not finite numbers")
        return cls(mean, scale, tuple(weights), tuple(biases))


Predictor = Trees | Mlp
KINDS: dict[str, Any] = {"trees": Trees, "mlp": Mlp}


def _typed(a: dict[str, np.ndarray], key: str, kinds: str, shape: tuple[int, ...] | None) -> np.ndarray:
    if key not in a:
        raise CorruptModelError(f"array {key!r} is missing")
    arr = a[key]
    if arr.dtype.kind not in kinds or (shape is not None and arr.shape != shape):
        raise CorruptModelError(f"array {key!r} is {arr.dtype} {arr.shape}, expected kind {kinds!r} {shape or ''}")
    return arr


def from_arrays(kind: str, arrays: dict[str, np.ndarray], n_features: int) -> Predictor:
    if kind not in KINDS:
        raise CorruptModelError(f"unknown predictor kind {kind!r}")
    return KINDS[kind].from_arrays(arrays, n_features)


def from_sklearn(estimator: Any) -> Predictor:
    """The arrays of a fitted HistGradientBoostingRegressor, ExtraTrees/RandomForest regressor, or
    StandardScaler + MLPRegressor pipeline (the estimators `fusion.hpm.model` fits)."""
    if hasattr(estimator, "_predictors"):
        return _boosted(estimator)
    if hasattr(estimator, "estimators_") and all(hasattr(t, "tree_") for t in estimator.estimators_):
        return _forest(estimator)
    if hasattr(estimator, "steps"):
        scaler, mlp = (step for _, step in estimator.steps)
        if mlp.activation != "relu" or mlp.out_activation_ != "identity":
            raise ValueError(f"an MLP with {mlp.activation}/{mlp.out_activation_} activations is not converted")
        return Mlp(scaler.mean_, scaler.scale_, tuple(mlp.coefs_), tuple(mlp.intercepts_))
    raise ValueError(f"no array form for {type(estimator).__name__}")


def _stack(trees: list[dict[str, np.ndarray]], baseline: float, scale: float, float32: bool) -> Trees:
    """Trees given as per-tree node arrays (children -1 at leaves) padded into one (trees, width) block."""
    width = max(len(t["feature"]) for t in trees)
    shape = (len(trees), width)
    own = np.broadcast_to(np.arange(width), shape)
    feature, left, right = np.zeros(shape, np.intp), own.copy(), own.copy()
    threshold, value, missing = np.full(shape, np.inf), np.zeros(shape), np.ones(shape, bool)
    for i, t in enumerate(trees):
        n = len(t["feature"])
        split = t["left"] >= 0
        feature[i, :n] = np.where(split, t["feature"], 0)
        threshold[i, :n] = np.where(split, t["threshold"], np.inf)
        left[i, :n] = np.where(split, t["left"], own[i, :n])
        right[i, :n] = np.where(split, t["right"], own[i, :n])
        value[i, :n] = np.where(split, 0.0, t["value"])
        missing[i, :n] = t["missing_left"]
    return Trees(feature, threshold, missing, left, right, value, baseline, scale, float32)


def _boosted(estimator: Any) -> Trees:
    nodes = [p[0].nodes for p in estimator._predictors]  # noqa: SLF001 - the fitted trees; no public accessor
    if any(n["is_categorical"].any() for n in nodes):
        raise ValueError("categorical splits are not converted")
    trees = [
        {
            "feature": n["feature_idx"],
            "threshold": n["num_threshold"],
            "left": np.where(n["is_leaf"].astype(bool), -1, n["left"].astype(np.intp)),
            "right": np.where(n["is_leaf"].astype(bool), -1, n["right"].astype(np.intp)),
            "value": n["value"],
            "missing_left": n["missing_go_to_left"].astype(bool),
        }
        for n in nodes
    ]
    baseline = float(np.ravel(estimator._baseline_prediction)[0])  # noqa: SLF001
    return _stack(trees, baseline, 1.0, False)


def _forest(estimator: Any) -> Trees:
    trees = []
    for t in estimator.estimators_:
        tree = t.tree_
        missing = getattr(tree, "missing_go_to_left", np.ones(tree.node_count, dtype=bool))
        trees.append(
            {
                "feature": tree.feature,
                "threshold": tree.threshold,
                "left": tree.children_left,
                "right": tree.children_right,
                "value": tree.value[:, 0, 0],
                "missing_left": np.asarray(missing, dtype=bool),
            }
        )
    return _stack(trees, 0.0, 1.0 / len(trees), True)
