"""The learned model: gradient-boosted trees (or a regression forest of extremely randomized trees, or a small MLP)
over the schema's features, predicting log(measured / analytic estimate) of cycles and energy, plus a pairwise
estimator that prices the schedules of one group together (`fusion.hpm.pairs`); and its file.

Boosting is the default since the pairwise estimator ranks a group's schedules (the pointwise model only sets
the group's level, so the algorithms rank alike): on held-out data it is within 0.2 points of the forest's
cycle MAPE (2.26% / 2.55% vs 2.15% / 2.72% on held-out kernels / machine) at 4 MB instead of 166 MB, and
trains in less time. Without the pairwise estimator the forest ranked better (tau 0.90 / 0.88 vs 0.82 / 0.83).

Container: magic line, an 8-byte header length, a JSON header (container version, feature schema and its hash,
SHA-256 of the payload, training metadata), then the zlib-compressed pickled estimators. Loading checks the magic,
the version and the checksum before unpickling, and compares the schema with the one this code computes: a mismatch is a
SchemaMismatchError naming the differing features. A checksum guards against corruption, not against a crafted
file: unpickling runs code, so load only model files you produced (docs/hpm.md).
"""

from __future__ import annotations

import hashlib
import json
import pickle
import struct
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fusion.cost.interface import KernelFeatures
from fusion.hpm.dataset import Dataset
from fusion.hpm.errors import HpmError, ModelFileError, SchemaMismatchError
from fusion.hpm.fastpath import predict, single_threaded
from fusion.hpm.pairs import group_pairs, jointly, pair_matrix
from fusion.hpm.schema import FEATURE_NAMES, SCHEMA_VERSION, baselines, matrix_of, schema_hash
from simulator.config import MachineConfig

MAGIC = b"DYNFUSE-HPM\n"
CONTAINER_VERSION = 1
TARGETS = ("cycle", "energy_total_pj")
PAIRS = "cycle_pairs"  # the pairwise estimator's key among the estimators (absent: pointwise predictions only)
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


@dataclass
class HpmModel:
    """Estimators per target (residual over the analytic estimate, in log space) plus what they were trained on."""

    estimators: dict[str, Any]
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
        residuals = predict(self.estimators["cycle"], x)
        if groups is not None and PAIRS in self.estimators:
            first, second = group_pairs(groups)
            if first.size:
                differences = predict(self.estimators[PAIRS], pair_matrix(x, first, second))
                residuals = jointly(residuals, groups, first, second, differences)
        energy = base_energy * np.exp(predict(self.estimators["energy_total_pj"], x))
        return base_cycles * np.exp(residuals), energy


def train(
    features: Sequence[KernelFeatures],
    configs: Sequence[MachineConfig],
    measured: dict[str, np.ndarray],
    algo: str = ALGORITHMS[0],
    seed: int = 0,
    meta: dict[str, Any] | None = None,
    groups: Sequence[object] | None = None,
) -> HpmModel:
    """Fit one estimator per target on log(measured / estimate), and with `groups` (the candidate group of each
    row) the pairwise estimator on the differences of cycle residuals within groups."""
    if len(features) < 2:
        raise HpmError(f"need at least 2 samples to train, got {len(features)}")
    start = time.perf_counter()
    x = matrix_of(features, configs)
    base = dict(zip(TARGETS, baselines(features, configs), strict=True))
    estimators = {}
    first, second = group_pairs(groups) if groups is not None else (np.zeros(0, dtype=np.intp),) * 2
    with single_threaded():
        for target in TARGETS:
            y = np.log(np.maximum(measured[target], 1e-9) / base[target])
            estimators[target] = make_estimator(algo, seed).fit(x, y)
            if target == "cycle" and first.size >= MIN_PAIRS:
                estimators[PAIRS] = make_pair_estimator(seed).fit(pair_matrix(x, first, second), y[first] - y[second])
    info = {
        "algorithm": algo,
        "samples": len(features),
        "pairs": int(first.size) if PAIRS in estimators else 0,
        "train_seconds": round(time.perf_counter() - start, 3),
        "trained_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **(meta or {}),
    }
    return HpmModel(estimators, FEATURE_NAMES, info)


def train_on(ds: Dataset, algo: str = ALGORITHMS[0], seed: int = 0, meta: dict[str, Any] | None = None) -> HpmModel:
    """`train` on a calibration dataset's rows, its candidate groups included."""
    measured = {t: ds.measured(t) for t in TARGETS}
    return train(ds.features(), ds.configs(), measured, algo, seed, meta, list(ds.columns["group"]))


def save_model(model: HpmModel, path: Path) -> Path:
    payload = zlib.compress(pickle.dumps(model.estimators, protocol=pickle.HIGHEST_PROTOCOL), 6)
    header = {
        "container": CONTAINER_VERSION,
        "schema_version": SCHEMA_VERSION,
        "feature_names": list(model.feature_names),
        "schema_hash": schema_hash(model.feature_names),
        "targets": list(TARGETS),
        "sha256": hashlib.sha256(payload).hexdigest(),
        "compression": "zlib",
        "meta": model.meta,
    }
    raw = json.dumps(header, sort_keys=True).encode()
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(MAGIC + struct.pack("<Q", len(raw)) + raw + payload)
    tmp.replace(path)
    return path


def read_header(path: Path) -> tuple[dict[str, Any], bytes]:
    data = Path(path).read_bytes()
    if not data.startswith(MAGIC):
        raise ModelFileError(f"{path}: not an HPM model file (bad magic)")
    offset = len(MAGIC)
    try:
        (size,) = struct.unpack_from("<Q", data, offset)
        header = json.loads(data[offset + 8 : offset + 8 + size])
    except (struct.error, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ModelFileError(f"{path}: corrupted header ({err})") from None
    return header, data[offset + 8 + size :]


def load_model(path: Path) -> HpmModel:
    header, payload = read_header(path)
    if header.get("container") != CONTAINER_VERSION:
        raise ModelFileError(
            f"{path}: container version {header.get('container')}, this code reads {CONTAINER_VERSION}"
        )
    if hashlib.sha256(payload).hexdigest() != header.get("sha256"):
        raise ModelFileError(f"{path}: checksum mismatch: the file is truncated or corrupted")
    names = tuple(header.get("feature_names", ()))
    if header.get("schema_hash") != schema_hash() or names != FEATURE_NAMES:
        missing = [n for n in FEATURE_NAMES if n not in names]
        extra = [n for n in names if n not in FEATURE_NAMES]
        detail = f"missing {missing[:5]}, unknown {extra[:5]}" if missing or extra else "same names, other order"
        raise SchemaMismatchError(
            f"{path}: trained on feature schema {header.get('schema_hash')} (v{header.get('schema_version')}), "
            f"this code computes {schema_hash()} (v{SCHEMA_VERSION}): {detail}; retrain with `dynfuse hpm train`"
        )
    estimators = pickle.loads(zlib.decompress(payload))  # noqa: S301 - checksummed, our format; see the docstring
    return HpmModel(estimators, names, dict(header.get("meta", {})))
