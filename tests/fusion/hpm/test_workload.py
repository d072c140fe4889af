"""`dynfuse hpm calibrate --model`: a user's model's candidate kernels measured and added to the dataset."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dynfuse.cli import main
from fusion.engine.engine import EngineOptions, FusionEngine
from fusion.engine.validation import ValidationPolicy
from fusion.hpm.dataset import load_dataset
from fusion.hpm.model import TARGETS, train
from fusion.hpm.sweep import run_sweep
from fusion.lower.compiler import load_graph

MLP = Path(__file__).resolve().parents[1] / "models" / "mlp.onnx"


def test_a_users_model_is_measured_into_the_dataset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    x = np.load(MLP.with_suffix(".npz"))["input"]
    np.save(tmp_path / "x.npy", x)
    name = load_graph(MLP).inputs[0]
    data = tmp_path / "data"
    args = ["hpm", "calibrate", "--model", str(MLP), "--input", f"{name}={tmp_path / 'x.npy'}", "--configs", "base"]
    assert main([*args, "-o", str(data)]) == 0
    assert "kernels of mlp.onnx measured now" in capsys.readouterr().out
    ds = load_dataset(data)
    groups = [str(g) for g in ds.columns["group"]]
    assert set(ds.columns["recipe"]) == {"workload:mlp"} and np.all(ds.columns["seed"] < 0)
    assert max(groups.count(g) for g in groups) >= 2, "several schedules of one candidate"
    assert all(g.startswith(f"{s}/") for g, s in zip(groups, ds.columns["seed"], strict=True))
    # an independent path to the same numbers: the engine dispatching its plan on the same input
    options = EngineOptions(validation=ValidationPolicy("off"), workers=1, execution="host")  # kernels run alone
    engine = FusionEngine(MLP, "base", "fp32", options)
    records = [r for r in engine.run({name: x}).records if r.features is not None]
    by_key = {
        (g.split("/", 1)[1], str(s)): i for i, (g, s) in enumerate(zip(groups, ds.columns["schedule"], strict=True))
    }
    matched = [
        (by_key[("+".join(r.nodes), r.schedule)], r) for r in records if ("+".join(r.nodes), r.schedule) in by_key
    ]
    assert matched, "the engine's planned kernels are among the measured candidates"
    for i, r in matched:
        assert ds.columns["measured.cycle"][i] == r.measured_cycles
        assert ds.features()[i] == r.features
    rows = len(ds)
    assert main([*args, "-o", str(data)]) == 0  # measured before: nothing new
    assert "0 kernels of mlp.onnx measured now" in capsys.readouterr().out and len(load_dataset(data)) == rows
    run_sweep(data, ["base", "tiny"], 6, seed=300, jobs=1, progress=False)  # the sweep's rows join them
    both = load_dataset(data)
    assert len(both) > rows and {"workload:mlp"} < set(both.columns["recipe"])
    measured = {t: both.measured(t) for t in TARGETS}
    assert train(both.features(), both.configs(), measured, "forest").meta["samples"] == len(both)


def test_workload_mistakes_are_clear_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    name = load_graph(MLP).inputs[0]
    x = np.load(MLP.with_suffix(".npz"))["input"].copy()
    x[0, 0] = np.nan
    np.save(tmp_path / "nan.npy", x)
    base = ["hpm", "calibrate", "-o", str(tmp_path / "d")]
    cases = {
        ("--model", str(MLP)): "missing",
        ("--model", str(MLP), "--input", f"{name}={tmp_path / 'nan.npy'}"): "not finite",
        ("--model", str(tmp_path / "none.onnx")): "no such model file",
        ("--input", f"{name}={tmp_path / 'nan.npy'}"): "--input gives the inputs of --model",
    }
    for extra, message in cases.items():
        assert main([*base, *extra]) == 1
        assert message in capsys.readouterr().err
