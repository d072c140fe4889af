"""The learned model: a regression forest (extremely randomized trees; or gradient-boosted trees, or a small MLP)
over the schema's features, predicting log(measured / analytic estimate) of cycles and energy; and its file.

The forest is the default: on held-out data it matches boosting's MAPE within a point and ranks the schedules
of a group better (Kendall tau ~0.90 / 0.88 vs ~0.82 / 0.83 on held-out kernels / machine), boosting's finer
steps flipping near-tied candidates.

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
from fusion.hpm.errors import HpmError, ModelFileError, SchemaMismatchError
from fusion.hpm.schema import FEATURE_NAMES, SCHEMA_VERSION, baselines, matrix_of, schema_hash
from simulator.config import MachineConfig

MAGIC = b"DYNFUSE-HPM\n"
CONTAINER_VERSION = 1
TARGETS = ("cycle", "energy_total_pj")
ALGORITHMS = ("forest", "gbt", "mlp")  # the first is the default
DIRECT_ROWS = 64


def single_threaded() -> Any:
    """One OpenMP/BLAS thread: the sweep's workers and the engine already use the cores, and HistGradientBoosting's
    OpenMP threads competing with them for 2 cores made a small fit take minutes instead of a second."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1)


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


@dataclass
class HpmModel:
    """Estimators per target (residual over the analytic estimate, in log space) plus what they were trained on."""

    estimators: dict[str, Any]
    feature_names: tuple[str, ...] = FEATURE_NAMES
    meta: dict[str, Any] = field(default_factory=dict)

    def predict_many(
        self, features: Sequence[KernelFeatures], configs: Sequence[MachineConfig]
    ) -> tuple[np.ndarray, np.ndarray]:
        """(cycles, energy pJ) for each (features, config) pair."""
        x = matrix_of(features, configs)
        base_cycles, base_energy = baselines(features, configs)
        cycles = base_cycles * np.exp(_predict(self.estimators["cycle"], x))
        energy = base_energy * np.exp(_predict(self.estimators["energy_total_pj"], x))
        return cycles, energy


def _predict(estimator: Any, x: np.ndarray) -> np.ndarray:
    """A forest's few-row predictions straight from its trees (the mean of `tree_.predict`, what the forest's
    own `predict` computes): ~10x less overhead per call, and the planner asks about one candidate at a time."""
    trees = getattr(estimator, "estimators_", None)
    if isinstance(trees, list) and len(x) <= DIRECT_ROWS and all(hasattr(t, "tree_") for t in trees):
        x32 = np.ascontiguousarray(x, dtype=np.float32)
        return np.mean([t.tree_.predict(x32)[:, 0] for t in trees], axis=0)
    with single_threaded():
        return estimator.predict(x)


def train(
    features: Sequence[KernelFeatures],
    configs: Sequence[MachineConfig],
    measured: dict[str, np.ndarray],
    algo: str = ALGORITHMS[0],
    seed: int = 0,
    meta: dict[str, Any] | None = None,
) -> HpmModel:
    """Fit one estimator per target on log(measured / estimate)."""
    if len(features) < 2:
        raise HpmError(f"need at least 2 samples to train, got {len(features)}")
    start = time.perf_counter()
    x = matrix_of(features, configs)
    base = dict(zip(TARGETS, baselines(features, configs), strict=True))
    estimators = {}
    with single_threaded():
        for target in TARGETS:
            y = np.log(np.maximum(measured[target], 1e-9) / base[target])
            estimators[target] = make_estimator(algo, seed).fit(x, y)
    info = {
        "algorithm": algo,
        "samples": len(features),
        "train_seconds": round(time.perf_counter() - start, 3),
        "trained_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **(meta or {}),
    }
    return HpmModel(estimators, FEATURE_NAMES, info)


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
