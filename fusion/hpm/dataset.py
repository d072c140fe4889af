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
import zipfile
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from fusion.cost.interface import KernelFeatures
from fusion.hpm.errors import DatasetError
from fusion.hpm.machines import config_from_json
from isa.errors import DynfuseError
from simulator.config import MachineConfig

DATASET_VERSION = 1
LOG_NAME = "samples.jsonl"
DATASET_NAME = "dataset.npz"
WORKLOAD_NAME = "workload.npz"  # kernels of user models (`dynfuse hpm calibrate --model`), next to the sweep's
MAX_DATASET_BYTES = 4 << 30  # uncompressed: an archive that would unpack to more is refused before inflating
TARGET_COUNTERS = ("cycle", "energy_total_pj")  # what a model learns: positive in every row
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
    try:
        np.savez_compressed(tmp, meta=np.array(json.dumps(header, sort_keys=True)), **columns)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
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
        out = []
        for i in range(len(self)):
            try:
                out.append(features_from_row({n: self.columns[n][i] for n in names}))
            except (ValueError, TypeError, RecursionError) as err:  # json.JSONDecodeError is a ValueError
                raise DatasetError(f"row {i} (group {self.columns['group'][i]}): bad kernel features ({err})") from None
        return out

    def configs(self) -> list[MachineConfig]:
        cache: dict[str, MachineConfig] = {}
        for i, text in enumerate(map(str, self.columns["config_json"])):
            if text not in cache:
                try:
                    cache[text] = config_from_json(text)
                except (ValueError, TypeError, AttributeError, RecursionError, DynfuseError) as err:
                    raise DatasetError(f"row {i} (group {self.columns['group'][i]}): bad machine ({err})") from None
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


def resolve(path: Path) -> list[Path]:
    """The dataset files of `path`: the file itself, or a sweep directory's sweep and workload datasets."""
    if not path.is_dir():
        return [path]
    return [f for f in (path / DATASET_NAME, path / WORKLOAD_NAME) if f.exists()] or [path / DATASET_NAME]


def load_dataset(path: Path) -> Dataset:
    """A dataset file, or every dataset of a sweep directory (the seeded sweep's and the user workloads') as one."""
    parts = [_load_file(file) for file in resolve(Path(path))]
    return parts[0] if len(parts) == 1 else concat(parts, Path(path))


def concat(parts: Sequence[Dataset], where: Path) -> Dataset:
    """Datasets of one code's measurements (same columns, same generator stamp) as one."""
    names = sorted(parts[0].columns)
    for part in parts[1:]:
        if sorted(part.columns) != names:
            raise DatasetError(f"{where}: its datasets have different columns; recalibrate them with one dynfuse")
        if part.meta.get("generators") != parts[0].meta.get("generators"):
            raise DatasetError(
                f"{where}: its datasets were measured on different kernel generators "
                f"({part.meta.get('generators')} and {parts[0].meta.get('generators')}): recalibrate into a new one"
            )
    columns = {name: np.concatenate([p.columns[name] for p in parts]) for name in names}
    return Dataset({**parts[0].meta, "rows": sum(len(p) for p in parts)}, columns)


def _load_file(file: Path) -> Dataset:
    if not file.exists():
        raise DatasetError(f"no dataset at {file} (run `dynfuse hpm calibrate -o DIR` first)")
    if not file.is_file():
        raise DatasetError(f"{file} is not a regular file")
    try:
        with np.load(file, allow_pickle=False) as data:
            if not hasattr(data, "files"):
                raise ValueError("a single array, not an npz archive")
            if sum(info.file_size for info in data.zip.infolist()) > MAX_DATASET_BYTES:
                raise ValueError(f"its arrays unpack to more than {MAX_DATASET_BYTES} bytes")
            meta = json.loads(str(data["meta"]))
            columns = {k: data[k] for k in data.files if k != "meta"}
    except (ValueError, KeyError, OSError, EOFError, zipfile.BadZipFile, zlib.error, RecursionError) as err:
        raise DatasetError(f"{file}: not an HPM dataset or damaged ({type(err).__name__}: {err})") from None
    if not isinstance(meta, dict):
        raise DatasetError(f"{file}: its meta is {type(meta).__name__}, not a JSON object")
    if meta.get("version") != DATASET_VERSION:
        raise DatasetError(f"{file}: dataset format version {meta.get('version')}, this code reads {DATASET_VERSION}")
    required = [f.name for f in fields(KernelFeatures) if f.default is MISSING]
    missing = [c for c in (*ID_COLUMNS, *required, *(MEASURED_PREFIX + t for t in TARGET_COUNTERS)) if c not in columns]
    if missing:
        raise DatasetError(f"{file}: missing columns {missing}")
    check_columns(file, meta, columns)
    return Dataset(meta, columns)


def check_columns(file: Path, meta: dict[str, Any], columns: dict[str, np.ndarray]) -> None:
    """One value per row in every column, of the type its field needs; measured counters finite, the targets a
    model learns (cycles, energy) positive: a truncated, ragged or poisoned dataset is refused here, by name."""
    rows = meta.get("rows")
    if not isinstance(rows, int) or isinstance(rows, bool) or rows < 0:
        raise DatasetError(f"{file}: meta 'rows' is {rows!r}, not a row count")
    for name, col in columns.items():
        if col.ndim != 1 or len(col) != rows:
            raise DatasetError(f"{file}: column {name!r} has shape {col.shape}, the dataset has {rows} rows")
    kinds = {f.name: ("U" if str(f.type) == "str" else "biuf") for f in fields(KernelFeatures)}
    kinds.update({"ops": "U", "shapes": "U", "config_json": "U", "group": "U", "seed": "iu"})
    for name, col in columns.items():
        want = "iuf" if name.startswith(MEASURED_PREFIX) else kinds.get(name)
        if want is not None and col.dtype.kind not in want:
            raise DatasetError(f"{file}: column {name!r} holds {col.dtype} values")
        if name.startswith(MEASURED_PREFIX) and not np.all(np.isfinite(col)):
            bad = int(np.flatnonzero(~np.isfinite(col))[0])
            raise DatasetError(f"{file}: column {name!r} is not finite in row {bad} (seed {columns['seed'][bad]})")
    for target in TARGET_COUNTERS:
        col = columns[MEASURED_PREFIX + target]
        bad = np.flatnonzero(col <= 0)
        if bad.size:
            raise DatasetError(
                f"{file}: {MEASURED_PREFIX + target} is not positive in {bad.size} of {rows} rows (first: row "
                f"{bad[0]}, seed {columns['seed'][bad[0]]}); no kernel runs in 0 cycles: the dataset is damaged"
            )
