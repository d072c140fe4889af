"""The calibration dataset: an append-only sample log (resumable) and the columnar, versioned npz built from it.

`samples.jsonl` holds one line per finished group (its seed and measured candidates, or the reason it could not
be measured), written in one `write` and fsync'ed, so an interrupted sweep loses at most the line being written;
`SampleLog` drops such a torn last line when it opens. `dataset.npz` stores one array per column (no pickled
objects: load with `allow_pickle=False`) and a `meta` JSON string with the format version and the column
schema; `load_dataset` refuses another version with a clear error.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from fusion.cost.interface import KernelFeatures
from fusion.hpm.errors import DatasetError
from fusion.hpm.machines import config_from_json
from simulator.config import MachineConfig

DATASET_VERSION = 1
LOG_NAME = "samples.jsonl"
DATASET_NAME = "dataset.npz"
MEASURED_PREFIX = "measured."
# columns that identify a row; every other column is a KernelFeatures field or a measured counter
ID_COLUMNS = ("seed", "candidate", "group", "schedule", "recipe", "config", "config_json", "heldout_config")


class SampleLog:
    """Append-only JSON-lines log of finished groups; the source of truth a resumed sweep reads."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._drop_torn_tail()

    def _drop_torn_tail(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        end = data.rfind(b"\n") + 1
        if end != len(data):
            with self.path.open("r+b") as f:
                f.truncate(end)

    def records(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        out = []
        for number, line in enumerate(self.path.read_text().splitlines(), 1):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise DatasetError(f"{self.path}:{number}: not a JSON record ({err})") from None
        return out

    def seeds(self) -> set[int]:
        return {int(r["seed"]) for r in self.records()}

    def append(self, record: dict[str, Any]) -> None:
        line = (json.dumps(record, sort_keys=True) + "\n").encode()
        with self.path.open("ab") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())


def rows_of(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Measured rows of every group, in seed then candidate order (failed groups have none)."""
    rows = [row for r in records for row in r.get("rows", [])]
    return sorted(rows, key=lambda row: (row["seed"], row["candidate"]))


def _column(values: Sequence[Any], name: str) -> np.ndarray:
    if all(isinstance(v, bool) for v in values):
        return np.array(values, dtype=bool)
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return np.array(values, dtype=np.int64)
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return np.array(values, dtype=np.float64)
    if all(isinstance(v, str) for v in values):
        return np.array(values, dtype=str)
    raise DatasetError(f"column {name!r} mixes value types")


def write_dataset(path: Path, rows: Sequence[dict[str, Any]], meta: dict[str, Any]) -> Path:
    """Columnar npz written atomically (temporary file, then rename)."""
    if not rows:
        raise DatasetError("no measured samples to write")
    names = sorted(rows[0])
    for row in rows:
        if sorted(row) != names:
            raise DatasetError(f"sample seed={row.get('seed')} has columns {sorted(row)}, expected {names}")
    columns = {name: _column([row[name] for row in rows], name) for name in names}
    schema = {name: str(col.dtype.kind) for name, col in columns.items()}
    header = {**meta, "version": DATASET_VERSION, "schema": schema, "rows": len(rows)}
    tmp = path.with_suffix(".tmp.npz")
    np.savez_compressed(tmp, meta=np.array(json.dumps(header, sort_keys=True)), **columns)
    os.replace(tmp, path)
    return path


@dataclass(frozen=True)
class Dataset:
    """Loaded columns plus the decoded features and machine of every row."""

    meta: dict[str, Any]
    columns: dict[str, np.ndarray]

    def __len__(self) -> int:
        return int(self.meta["rows"])

    def features(self) -> list[KernelFeatures]:
        names = [f.name for f in fields(KernelFeatures) if f.name in self.columns]
        return [features_from_row({n: self.columns[n][i] for n in names}) for i in range(len(self))]

    def configs(self) -> list[MachineConfig]:
        cache: dict[str, MachineConfig] = {}
        for text in map(str, self.columns["config_json"]):
            if text not in cache:
                cache[text] = config_from_json(text)
        return [cache[str(t)] for t in self.columns["config_json"]]

    def measured(self, counter: str) -> np.ndarray:
        return self.columns[MEASURED_PREFIX + counter].astype(np.float64)

    def subset(self, mask: np.ndarray) -> Dataset:
        return Dataset({**self.meta, "rows": int(mask.sum())}, {k: v[mask] for k, v in self.columns.items()})


def feature_row(features: KernelFeatures) -> dict[str, Any]:
    """A KernelFeatures as dataset columns (tuples become text)."""
    d = features.as_dict()
    d["ops"] = ",".join(features.ops)
    d["shapes"] = json.dumps([list(s) for s in features.shapes])
    return d


def features_from_row(row: dict[str, Any]) -> KernelFeatures:
    """Inverse of `feature_row` (absent appended fields take their defaults)."""
    cast = {"int": int, "float": float, "str": str}
    values: dict[str, Any] = {
        f.name: cast[str(f.type)](row[f.name]) for f in fields(KernelFeatures) if f.name in row and str(f.type) in cast
    }
    values["ops"] = tuple(str(row["ops"]).split(","))
    values["shapes"] = tuple(tuple(int(d) for d in s) for s in json.loads(str(row["shapes"])))
    return KernelFeatures(**values)


def resolve(path: Path) -> Path:
    """A dataset file, or a sweep directory holding one."""
    return path / DATASET_NAME if path.is_dir() else path


def load_dataset(path: Path) -> Dataset:
    file = resolve(Path(path))
    if not file.exists():
        raise DatasetError(f"no dataset at {file} (run `dynfuse hpm calibrate -o DIR` first)")
    try:
        with np.load(file, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            columns = {k: data[k] for k in data.files if k != "meta"}
    except (ValueError, KeyError, OSError) as err:
        raise DatasetError(f"{file}: not an HPM dataset ({err})") from None
    if meta.get("version") != DATASET_VERSION:
        raise DatasetError(f"{file}: dataset format version {meta.get('version')}, this code reads {DATASET_VERSION}")
    required = [f.name for f in fields(KernelFeatures) if f.default is MISSING]
    missing = [c for c in (*ID_COLUMNS, *required) if c not in columns]
    if missing:
        raise DatasetError(f"{file}: missing columns {missing}")
    return Dataset(meta, columns)
