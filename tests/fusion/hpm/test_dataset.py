"""The sample log survives torn writes; the npz dataset round-trips and refuses other versions."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fusion.hpm.dataset import SampleLog, feature_row, features_from_row, load_dataset, write_dataset
from fusion.hpm.errors import DatasetError


def test_torn_tail_is_dropped(tmp_path: Path) -> None:
    log = SampleLog(tmp_path / "samples.jsonl")
    log.append({"seed": 1, "rows": []})
    log.append({"seed": 2, "rows": []})
    with (tmp_path / "samples.jsonl").open("ab") as f:
        f.write(b'{"seed": 3, "ro')  # killed mid-write
    reopened = SampleLog(tmp_path / "samples.jsonl")
    assert reopened.seeds() == {1, 2}
    reopened.append({"seed": 3, "rows": []})
    assert [r["seed"] for r in SampleLog(tmp_path / "samples.jsonl").records()] == [1, 2, 3]


def test_dataset_round_trip(small_sweep: Path, small_dataset) -> None:
    records = SampleLog(small_sweep / "samples.jsonl").records()
    rows = sorted((r for rec in records for r in rec.get("rows", [])), key=lambda r: (r["seed"], r["candidate"]))
    assert len(small_dataset) == len(rows) > 0
    for name in ("seed", "group", "macs", "measured.cycle", "measured.energy_total_pj"):
        assert list(small_dataset.columns[name]) == [r[name] for r in rows]
    for features, row in zip(small_dataset.features(), rows, strict=True):
        assert feature_row(features) == {k: row[k] for k in feature_row(features)}
        assert features_from_row(feature_row(features)) == features


def test_version_mismatch_is_an_error(tmp_path: Path, small_dataset) -> None:
    path = tmp_path / "d.npz"
    meta = json.loads(json.dumps(small_dataset.meta))
    row = {k: (v[0].item() if hasattr(v[0], "item") else v[0]) for k, v in small_dataset.columns.items()}
    write_dataset(path, [row], meta)
    assert len(load_dataset(path)) == 1
    with np.load(path, allow_pickle=False) as data:
        columns = {k: data[k] for k in data.files}
    header = json.loads(str(columns.pop("meta")))
    np.savez(path, meta=np.array(json.dumps({**header, "version": 99})), **columns)
    with pytest.raises(DatasetError, match="version 99"):
        load_dataset(path)


def test_missing_dataset_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no dataset"):
        load_dataset(tmp_path)
