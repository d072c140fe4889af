"""A sweep directory: the journal of finished points (the source of truth) and the Parquet table built from it.

`points.jsonl` gets one fsync'ed line per finished point as it finishes (the calibration sweep's `SampleLog`), so
an interrupted sweep loses at most the point being written and a resumed one skips every key already there.
`points.parquet` is rewritten (atomically) from the journal at the end of every run, interrupted or not: one row
per key, sorted by model, dtype, policy and machine. Directories of several machines merge by key.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from fusion.explore.errors import ExploreError
from fusion.explore.point import TIMING_COLUMNS
from fusion.explore.space import SWEEPABLE
from fusion.hpm.dataset import SampleLog
from fusion.hpm.errors import DatasetError

JOURNAL_NAME = "points.jsonl"
TABLE_NAME = "points.parquet"
FIGURES = (
    ("cycles", pa.int64()),
    ("dram_traffic_bytes", pa.int64()),
    ("energy_pj", pa.float64()),
    ("area_mm2", pa.float64()),
    ("array_mm2", pa.float64()),
    ("vector_mm2", pa.float64()),
    ("sram_mm2", pa.float64()),
    ("roofline_cycles", pa.float64()),
    ("roofline_fraction", pa.float64()),
    ("kernels", pa.int64()),
    ("fused_kernels", pa.int64()),
    ("plan_seconds", pa.float64()),
)
SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("model", pa.string()),
        ("model_sha", pa.string()),
        ("policy", pa.string()),
        ("dtype", pa.string()),
        ("preset", pa.string()),
        *((name, pa.float64() if kind == "float" else pa.int64()) for name, kind in SWEEPABLE.items()),
        ("status", pa.string()),
        ("reason", pa.string()),
        *FIGURES,
    ]
)


def journal(directory: Path) -> SampleLog:
    return SampleLog(Path(directory) / JOURNAL_NAME)


def read_rows(directory: Path) -> list[dict[str, Any]]:
    """The journal's rows, one per key (the first written wins)."""
    if not (Path(directory) / JOURNAL_NAME).exists():
        raise ExploreError(f"{directory}: no {JOURNAL_NAME} (not a sweep directory)")
    try:
        records = journal(directory).records()
    except DatasetError as err:
        raise ExploreError(str(err)) from None
    rows: dict[str, dict[str, Any]] = {}
    for number, record in enumerate(records, 1):
        if not isinstance(record, dict) or not isinstance(record.get("key"), str):
            raise ExploreError(f"{directory / JOURNAL_NAME}:{number}: not a point record")
        rows.setdefault(record["key"], record)
    return list(rows.values())


def _order(row: dict[str, Any]) -> tuple:
    return (row["model"], row["dtype"], row["policy"], *(row[name] for name in SWEEPABLE), row["key"])


def write_table(directory: Path, rows: Iterable[dict[str, Any]]) -> Path:
    """`points.parquet` of these rows, written to a temporary file and renamed (readers never see half)."""
    ordered = sorted(rows, key=_order)
    table = pa.Table.from_pylist([{name: row.get(name) for name in SCHEMA.names} for row in ordered], SCHEMA)
    path = Path(directory) / TABLE_NAME
    tmp = path.with_suffix(".parquet.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)
    return path


def read_table(path: Path) -> pa.Table:
    """A sweep's table (a directory or a .parquet file)."""
    path = Path(path)
    file = path / TABLE_NAME if path.is_dir() else path
    try:
        return pq.read_table(file)
    except (OSError, pa.ArrowInvalid) as err:
        raise ExploreError(f"{file}: not a readable Parquet table ({err})") from None


def merge(sources: Sequence[Path], out: Path) -> tuple[int, int]:
    """Every point of the source directories into `out` (its journal and table), once per key; returns (rows,
    conflicts): keys whose figures differ between sources (another engine version computed them), first kept."""
    rows: dict[str, dict[str, Any]] = {}
    conflicts = 0
    for source in sources:
        for row in read_rows(source):
            held = rows.setdefault(row["key"], row)
            conflicts += held is not row and _figures(held) != _figures(row)
    Path(out).mkdir(parents=True, exist_ok=True)
    log = journal(out)
    done = {r["key"] for r in log.records()}
    for key, row in rows.items():
        if key not in done:
            log.append(row)
    write_table(out, read_rows(out))
    return len(rows), conflicts


def _figures(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in TIMING_COLUMNS}
