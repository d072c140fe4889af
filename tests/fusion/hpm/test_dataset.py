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


def _columns(ds) -> tuple[dict, dict]:
    return json.loads(json.dumps(ds.meta)), {k: v.copy() for k, v in ds.columns.items()}


def _save(path: Path, meta: object, columns: dict) -> Path:
    np.savez(path, meta=np.array(json.dumps(meta)), **columns)
    return path


def test_damaged_datasets_are_clear_errors(tmp_path: Path, small_dataset) -> None:
    """Truncated, ragged, NaN or zero cycles, a meta that is not an object, a column of the wrong type, rows whose
    features or machine do not decode: each a DatasetError naming what is wrong (never a model trained on it)."""
    meta, columns = _columns(small_dataset)
    good = _save(tmp_path / "good.npz", meta, columns)
    assert len(load_dataset(good)) == len(small_dataset)
    (tmp_path / "truncated.npz").write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    nan, zero, ragged, typed = (dict(columns) for _ in range(4))
    nan["measured.cycle"] = np.where(np.arange(len(small_dataset)) == 5, np.nan, columns["measured.cycle"])
    zero["measured.cycle"] = np.zeros(len(small_dataset), dtype=np.int64)
    ragged["macs"] = columns["macs"][:-1]
    typed["macs"] = columns["macs"].astype(str)
    cases = {
        "truncated.npz": "damaged",
        _save(tmp_path / "nan.npz", meta, nan).name: "'measured.cycle' is not finite in row 5",
        _save(tmp_path / "zero.npz", meta, zero).name: "measured.cycle is not positive in",
        _save(tmp_path / "ragged.npz", meta, ragged).name: "column 'macs' has shape",
        _save(tmp_path / "typed.npz", meta, typed).name: "column 'macs' holds",
        _save(tmp_path / "list.npz", [meta], columns).name: "meta is list, not a JSON object",
        _save(tmp_path / "rows.npz", {**meta, "rows": "many"}, columns).name: "'rows' is 'many'",
    }
    for name, message in cases.items():
        with pytest.raises(DatasetError, match=message):
            load_dataset(tmp_path / name)
    shapes = dict(columns)
    shapes["shapes"] = np.array(["[[1, 2]"] * len(small_dataset))
    with pytest.raises(DatasetError, match="row 0 .*bad kernel features"):
        load_dataset(_save(tmp_path / "shapes.npz", meta, shapes)).features()
    machine = dict(columns)
    machine["config_json"] = np.array(['{"array_size": -3}'] * len(small_dataset))
    with pytest.raises(DatasetError, match="row 0 .*bad machine"):
        load_dataset(_save(tmp_path / "machine.npz", meta, machine)).configs()
