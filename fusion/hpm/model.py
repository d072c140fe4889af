"""The learned model: gradient-boosted trees (or a regression forest of extremely randomized trees, or a small MLP)
over the schema's features, predicting log(measured / analytic estimate) of cycles and energy, plus a pairwise
estimator that prices the schedules of one group together (`fusion.hpm.pairs`); and its file.

Boosting is the default since the pairwise estimator ranks a group's schedules (the pointwise model only sets
the group's level, so the algorithms rank alike): on held-out data it is within 0.2 points of the forest's
cycle MAPE (2.26% / 2.55% vs 2.15% / 2.72% on held-out kernels / machine) at 4 MB instead of 166 MB, and
trains in less time. Without the pairwise estimator the forest ranked better (tau 0.90 / 0.88 vs 0.82 / 0.83).

Fitting uses scikit-learn; the fitted estimators are converted to arrays at once (`fusion.hpm.predictors`), so
a model, in memory or in its file (`fusion.hpm.modelfile`), predicts with numpy alone.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fusion.cost.interface import KernelFeatures
from fusion.hpm.dataset import TARGET_COUNTERS, Dataset
from fusion.hpm.errors import DatasetError, HpmError
from fusion.hpm.pairs import group_pairs, jointly, pair_matrix
from fusion.hpm.predictors import Predictor, from_sklearn
from fusion.hpm.schema import FEATURE_NAMES, baselines, matrix_of
from fusion.hpm.stamp import generator_hash
from simulator.config import MachineConfig

TARGETS = TARGET_COUNTERS
PAIRS = "cycle_pairs"  # the pairwise estimator's key among the predictors (absent: pointwise predictions only)
ALGORITHMS = ("gbt", "forest", "mlp")  # the first is the default
PAIR_ITERATIONS = 1000
MIN_PAIRS = 20  # fewer ordered pairs than this teach nothing: the model stays pointwise


def make_estimator(algo: str, seed: int) -> Any:
    from sklearn.ensemble import ExtraTreesRegressor, HistGradientBoostingRegressor
    from sklearn.neural_network import MLPRegressor
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if algo == "gbt":
        return HistGradientBoostingRegressor(max_iter=300, learning_rate=0.1, min_samples_leaf=5, random_state=seed)
    if algo == "forest":
        return ExtraTreesRegressor(n_estimators=80, min_samples_leaf=3, max_features=0.7, n_jobs=1, random_state=seed)
    if algo == "mlp":
        mlp = MLPRegressor(hidden_layer_sizes=(64, 64), max_iter=800, early_stopping=True, random_state=seed)
        return make_pipeline(StandardScaler(), mlp)
    raise HpmError(f"unknown algorithm {algo!r}: use one of {', '.join(ALGORITHMS)}")


def make_pair_estimator(seed: int) -> Any:
    """Boosted trees on the absolute error of pairwise differences, whatever the pointwise algorithm. Measured on
    the 20,000-group sweep (bench/bench_hpm.py; Kendall tau held-out kernels / machine): pointwise forest alone
    0.903 / 0.875; squared-error boosting 0.898 / 0.906; absolute error 0.919 / 0.913, ranking like a forest of
    pairs (0.925 / 0.913) at a twentieth of its size (7 MB against 150 MB) since near-ties, not outliers, decide."""
    from sklearn.ensemble import HistGradientBoostingRegressor

    return HistGradientBoostingRegressor(
        loss="absolute_error",
        max_iter=PAIR_ITERATIONS,
        learning_rate=0.1,
        min_samples_leaf=10,
        max_leaf_nodes=63,
        random_state=seed,
    )


@dataclass(frozen=True)
class HpmModel:
    """Predictors per target (residual over the analytic estimate, in log space), the feature schema, the generator
    stamp of the calibration they learned from (`fusion.hpm.stamp`), and training metadata."""

    predictors: dict[str, Predictor]
    generators: str
    feature_names: tuple[str, ...] = FEATURE_NAMES
    meta: dict[str, Any] = field(default_factory=dict)

    def predict_many(
        self,
        features: Sequence[KernelFeatures],
        configs: Sequence[MachineConfig],
        groups: Sequence[object] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(cycles, energy pJ) for each (features, config) pair; rows with the same `groups` key are schedules of
        one set of nodes on one machine, and their cycles are priced together (`fusion.hpm.pairs`)."""
        x = matrix_of(features, configs)
        base_cycles, base_energy = baselines(features, configs)
        residuals = self.predictors["cycle"].predict(x)
        if groups is not None and PAIRS in self.predictors:
            first, second = group_pairs(groups)
            if first.size:
                differences = self.predictors[PAIRS].predict(pair_matrix(x, first, second))
                residuals = jointly(residuals, groups, first, second, differences)
        energy = base_energy * np.exp(self.predictors["energy_total_pj"].predict(x))
        return base_cycles * np.exp(residuals), energy


def single_threaded() -> Any:
    """One OpenMP/BLAS thread while fitting: the sweep's workers and the engine already use the cores, and
    HistGradientBoosting's OpenMP threads competing with them for 2 cores made a small fit take minutes."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1)


def check_targets(measured: dict[str, np.ndarray], rows: int) -> None:
    """Measured targets a model can learn from: one positive, finite number per row (a kernel takes cycles and
    energy; a zero would teach the model to predict nothing, a NaN would poison every tree)."""
    for target in TARGETS:
        values = np.asarray(measured.get(target, ()), dtype=np.float64)
        if values.shape != (rows,):
            raise HpmError(f"measured {target}: {values.size} values for {rows} samples")
        bad = np.flatnonzero(~np.isfinite(values) | (values <= 0))
        if bad.size:
            raise HpmError(
                f"measured {target} is not a positive number in {bad.size} of {rows} samples "
                f"(first: sample {bad[0]}, {values[bad[0]]}); the dataset cannot train a model"
            )


def train(
    features: Sequence[KernelFeatures],
    configs: Sequence[MachineConfig],
    measured: dict[str, np.ndarray],
    algo: str = ALGORITHMS[0],
    seed: int = 0,
    meta: dict[str, Any] | None = None,
    groups: Sequence[object] | None = None,
    generators: str | None = None,
) -> HpmModel:
    """Fit one estimator per target on log(measured / estimate), and with `groups` (the candidate group of each
    row) the pairwise estimator on the differences of cycle residuals within groups. `generators` is the stamp of
    the code that measured the samples (default: this code's, for samples measured live)."""
    if len(features) < 2:
        raise HpmError(f"need at least 2 samples to train, got {len(features)}")
    check_targets(measured, len(features))
    start = time.perf_counter()
    x = matrix_of(features, configs)
    base = dict(zip(TARGETS, baselines(features, configs), strict=True))
    predictors: dict[str, Predictor] = {}
    first, second = group_pairs(groups) if groups is not None else (np.zeros(0, dtype=np.intp),) * 2
    with single_threaded():
        for target in TARGETS:
            y = np.log(np.asarray(measured[target], dtype=np.float64) / base[target])
            predictors[target] = from_sklearn(make_estimator(algo, seed).fit(x, y))
            if target == "cycle" and first.size >= MIN_PAIRS:
                pairs = make_pair_estimator(seed).fit(pair_matrix(x, first, second), y[first] - y[second])
                predictors[PAIRS] = from_sklearn(pairs)
    info = {
        "algorithm": algo,
        "samples": len(features),
        "pairs": int(first.size) if PAIRS in predictors else 0,
        "train_seconds": round(time.perf_counter() - start, 3),
        "trained_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **(meta or {}),
    }
    return HpmModel(predictors, generators or generator_hash(), FEATURE_NAMES, info)


def train_on(ds: Dataset, algo: str = ALGORITHMS[0], seed: int = 0, meta: dict[str, Any] | None = None) -> HpmModel:
    """`train` on a calibration dataset's rows, its candidate groups included; the model carries the dataset's
    generator stamp."""
    stamp = ds.meta.get("generators")
    if not isinstance(stamp, str):
        raise DatasetError("the dataset records no generator stamp (calibrated by an older dynfuse): recalibrate")
    measured = {t: ds.measured(t) for t in TARGETS}
    return train(ds.features(), ds.configs(), measured, algo, seed, meta, list(ds.columns["group"]), stamp)
