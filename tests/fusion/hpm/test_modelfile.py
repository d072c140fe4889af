"""The model file: arrays and JSON only. A planted pickle never runs on any load path; stale, damaged and foreign
files are told apart (warning + analytic model for the first two, an error for the last)."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import struct
import zlib
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pytest

from dynfuse.cli import main
from fusion.cost.analytic import AnalyticCostModel
from fusion.hpm.cost_model import MODEL_ENV, SHIPPED_MODEL, HpmCostModel, default_model_path, load_cost_model
from fusion.hpm.errors import CorruptModelError, ModelFileError, SchemaMismatchError, StaleModelError
from fusion.hpm.model import TARGETS, HpmModel, train
from fusion.hpm.modelfile import HEADER, LEGACY_MAGIC, load_model, read_model_file, save_model
from fusion.hpm.online import OnlineHpm
from fusion.hpm.schema import FEATURE_NAMES, schema_hash
from fusion.hpm.stamp import generator_hash

MODELS = Path(__file__).resolve().parents[1] / "models"


class Planted:
    """Unpickling this creates `marker`: proof that a loader ran code from the file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.mkdir, (str(self.marker),))


@pytest.fixture(scope="module")
def model(small_dataset) -> HpmModel:
    ds = small_dataset
    return train(ds.features(), ds.configs(), {t: ds.measured(t) for t in TARGETS}, "forest", seed=0)


def _resave(path: Path, header_change: dict | None = None, arrays_change: dict | None = None) -> None:
    """Rewrite a model file with some header fields or arrays replaced (the header stays the first member)."""
    header, arrays = read_model_file(path)
    header = {**header, **(header_change or {})}
    arrays = {**arrays, **(arrays_change or {})}
    with path.open("wb") as f:
        np.savez(f, **{HEADER: np.array(json.dumps(header))}, **arrays)


def _payloads(tmp_path: Path, marker: Path, model: HpmModel) -> dict[str, Path]:
    """Files planting a pickle: a bare pickle, the pickled container of dynfuse's format 1 with a valid checksum,
    and a model archive whose predictor array is a pickled object array."""
    bomb = pickle.dumps(Planted(marker))
    bare = tmp_path / "bare.model"
    bare.write_bytes(bomb)
    payload = zlib.compress(bomb)
    header = {
        "container": 1,
        "schema_hash": schema_hash(),
        "feature_names": list(FEATURE_NAMES),
        "sha256": hashlib.sha256(payload).hexdigest(),
    }
    raw = json.dumps(header).encode()
    legacy = tmp_path / "legacy.model"
    legacy.write_bytes(LEGACY_MAGIC + struct.pack("<Q", len(raw)) + raw + payload)
    archive = save_model(model, tmp_path / "archive.npz")
    _resave(archive, arrays_change={"cycle.value": np.array([Planted(marker)], dtype=object)})
    return {"bare": bare, "legacy": legacy, "archive": archive}


def test_a_planted_pickle_never_runs_on_any_load_path(
    tmp_path: Path, model: HpmModel, small_sweep: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    marker = tmp_path / "code-ran"
    pickle.loads(pickle.dumps(Planted(tmp_path / "probe")))  # the payload does run when unpickled
    assert (tmp_path / "probe").exists()
    files = _payloads(tmp_path, marker, model)
    warnings: list[str] = []
    kinds = {"bare": ModelFileError, "legacy": StaleModelError, "archive": CorruptModelError}
    for name, path in files.items():
        with pytest.raises(kinds[name]):
            load_model(path)
        if name == "bare":
            with pytest.raises(ModelFileError, match="not an HPM model file"):
                load_cost_model(path, warnings.append)
        else:  # a model file this code cannot use: one warning, the analytic model
            assert isinstance(load_cost_model(path, warnings.append), AnalyticCostModel)
        monkeypatch.setenv(MODEL_ENV, str(path))
        with pytest.raises(ModelFileError) if name == "bare" else nullcontext():
            assert isinstance(load_cost_model("hpm", warnings.append), AnalyticCostModel)
        with pytest.raises(ModelFileError) if name == "bare" else nullcontext():
            assert OnlineHpm.load("hpm", warnings.append).model is None
        assert main(["hpm", "eval", str(small_sweep), "--model", str(path)]) == 1
        assert main(["hpm", "eval", str(small_sweep)]) == 1  # from $DYNFUSE_HPM_MODEL
        monkeypatch.delenv(MODEL_ENV)
    assert main(["fuse", str(MODELS / "mlp.onnx"), "--cost-model", str(files["legacy"]), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["cost_model"] == "analytic" and err.count("warning:") == 1 and "legacy.model" in err
    assert len(warnings) == 6 and all("\n" not in w for w in warnings)
    assert not marker.exists()


def test_the_default_model_is_never_taken_from_the_current_directory(
    tmp_path: Path, model: HpmModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "code-ran"
    files = _payloads(tmp_path, marker, model)
    for planted, payload in (("hpm.model", "legacy"), ("hpm.npz", "archive"), ("hpm", "bare")):
        (tmp_path / planted).write_bytes(files[payload].read_bytes())
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(MODEL_ENV, raising=False)
    assert default_model_path() == SHIPPED_MODEL and SHIPPED_MODEL.is_absolute()
    monkeypatch.setenv(MODEL_ENV, "")  # set but empty: the shipped model
    assert default_model_path() == SHIPPED_MODEL
    warnings: list[str] = []
    chosen = load_cost_model("hpm", warnings.append)  # the shipped model: planned with, or warned about if stale
    assert isinstance(chosen, HpmCostModel) if not warnings else str(SHIPPED_MODEL) in warnings[0]
    assert not marker.exists()


def test_stale_stamps_warn_once_and_plan_analytically(tmp_path: Path, model: HpmModel) -> None:
    path = save_model(model, tmp_path / "m.npz")
    assert isinstance(load_cost_model(path), HpmCostModel)
    cases = {
        "generators": ({"generators": "0" * 16}, StaleModelError, "kernel generators"),
        "schema": (
            {"feature_names": [*FEATURE_NAMES[:-1], "feature_from_the_future"], "schema_hash": "f" * 16},
            SchemaMismatchError,
            "feature_from_the_future",
        ),
        "version": ({"version": 99}, StaleModelError, "version 99"),
    }
    for name, (change, error, text) in cases.items():
        stale = save_model(model, tmp_path / f"{name}.npz")
        _resave(stale, header_change=change)
        with pytest.raises(error, match=text):
            load_model(stale)
        warnings: list[str] = []
        assert isinstance(load_cost_model(stale, warnings.append), AnalyticCostModel)
        assert len(warnings) == 1 and text in warnings[0] and "analytic" in warnings[0]
    stale = tmp_path / "generators.npz"
    assert load_model(stale, check_generators=False).generators == "0" * 16  # `hpm eval` reads it


def test_damaged_model_files_warn_and_foreign_files_are_errors(tmp_path: Path, model: HpmModel) -> None:
    path = save_model(model, tmp_path / "m.npz")
    data = path.read_bytes()
    damaged = {
        "truncated": data[: len(data) // 2],
        "flipped": data[:-200] + bytes(b ^ 0xFF for b in data[-200:-190]) + data[-190:],
        "body": data[:4000] + bytes(b ^ 0x5A for b in data[4000:4100]) + data[4100:],
    }
    for name, content in damaged.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(CorruptModelError):
            load_model(tmp_path / name)
    tree = read_model_file(path)[1]
    shape = tree["cycle.left"].shape
    loop = tree["cycle.left"].copy()
    loop[0, 0] = 0  # a split whose left child is itself: a walk that never ends
    far = tree["cycle.feature"].copy()
    far[0, 0] = len(FEATURE_NAMES) + 5
    for change in ({"cycle.left": loop}, {"cycle.feature": far}, {"cycle.value": np.zeros(shape, np.int8)}):
        bad = save_model(model, tmp_path / "bad.npz")
        _resave(bad, arrays_change=change)
        with pytest.raises(CorruptModelError):
            load_model(bad)
    (tmp_path / "text").write_text("not a model")
    (tmp_path / "dir").mkdir()
    np.save(tmp_path / "array.npy", np.zeros(3))
    for foreign in ("text", "dir", "array.npy", "missing"):
        with pytest.raises(ModelFileError) as err:
            load_cost_model(tmp_path / foreign)
        assert not isinstance(err.value, StaleModelError | CorruptModelError)


def test_save_refuses_a_directory_and_leaves_no_temporary_file(
    tmp_path: Path, model: HpmModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ModelFileError, match="is a directory"):
        save_model(model, tmp_path)

    def disk_full(file, **arrays) -> None:
        file.write(b"PK\x03\x04partial")
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(np, "savez_compressed", disk_full)
        with pytest.raises(OSError, match="No space"):
            save_model(model, tmp_path / "m.npz")
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    save_model(model, tmp_path / "m.npz")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.npz"]
    assert load_model(tmp_path / "m.npz").generators == generator_hash()


def test_the_shipped_model_was_calibrated_on_these_kernel_generators() -> None:
    """A change to the kernel generators, features or timing rules makes the shipped model stale (it would load
    with a warning and plan analytically): this fails until `make hpm` recalibrates and retrains it."""
    from fusion.hpm.cost_model import SHIPPED_MODEL
    from fusion.hpm.stamp import generator_hash

    header, _ = read_model_file(SHIPPED_MODEL)
    assert header["generators"] == generator_hash(), "the shipped HPM is stale: run `make hpm` and commit it"
    load_model(SHIPPED_MODEL)  # and it loads as a current model
