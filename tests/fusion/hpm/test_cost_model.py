"""The HPM behind the CostModel protocol, `load_cost_model`, and online retraining."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fusion.cost.analytic import AnalyticCostModel
from fusion.cost.interface import CostEstimate
from fusion.engine.engine import EngineOptions, FusionEngine
from fusion.engine.validation import ValidationPolicy
from fusion.hpm.cost_model import MODEL_ENV, HpmCostModel, load_cost_model
from fusion.hpm.errors import HpmError
from fusion.hpm.model import PAIRS, train_on
from fusion.hpm.modelfile import save_model
from fusion.hpm.online import OnlineHpm


@pytest.fixture(scope="module")
def small_model(small_dataset):
    ds = small_dataset
    half = ds.subset(ds.columns["seed"] % 2 == 0)
    return train_on(half, "forest", seed=0)


def test_load_cost_model(tmp_path: Path, small_model, small_dataset, monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(load_cost_model("analytic"), AnalyticCostModel)
    path = save_model(small_model, tmp_path / "m.hpm")
    model = load_cost_model(str(path))
    assert isinstance(model, HpmCostModel) and model.name == "hpm"
    f, c = small_dataset.features()[0], small_dataset.configs()[0]
    est = model.predict(f, c)
    assert isinstance(est, CostEstimate) and est.cycles > 0 and est.energy_pj > 0
    assert est.cycles == pytest.approx(small_model.predict_many([f], [c])[0][0])
    monkeypatch.setenv(MODEL_ENV, str(path))
    assert isinstance(load_cost_model("hpm"), HpmCostModel)
    monkeypatch.setenv(MODEL_ENV, str(tmp_path / "missing.hpm"))
    with pytest.raises(HpmError, match="dynfuse hpm train"):
        load_cost_model("hpm")


def test_online_retrains_in_the_background_and_persists(tmp_path: Path, small_model, small_dataset) -> None:
    ds = small_dataset
    odd = ds.subset(ds.columns["seed"] % 2 == 1)
    log = tmp_path / "online.jsonl"
    online = OnlineHpm(small_model, retrain_every=len(odd), log_path=log)
    assert online.samples() == 0
    cycles, energy = odd.measured("cycle"), odd.measured("energy_total_pj")
    first_model = online.model
    for i, (f, c) in enumerate(zip(odd.features(), odd.configs(), strict=True)):
        online.predict(f, c)  # dispatch keeps predicting while samples arrive
        online.record(f, c, {"cycle": cycles[i], "energy_total_pj": energy[i]})
    assert online.wait(timeout=120)
    assert online.last_error is None and online.retrains == 1
    assert online.model is not first_model and online.model.meta["online_samples"] == len(odd)
    restarted = OnlineHpm(small_model, log_path=log)
    assert restarted.samples() == len(odd)
    with pytest.raises(HpmError, match="lack"):
        online.record(odd.features()[0], odd.configs()[0], {"cycle": 1.0})


def test_engine_plans_with_the_hpm_and_feeds_it_online(small_model) -> None:
    """The fusion engine runs a bundled model with the HPM as its cost model; the dispatched kernels' measured
    counters flow back into the online model and trigger a background retrain."""
    models = Path(__file__).resolve().parents[1] / "models"
    online = OnlineHpm(small_model, retrain_every=2)
    engine = FusionEngine(
        models / "mlp.onnx", "base", "fp32", EngineOptions(validation=ValidationPolicy("off")), cost_model=online
    )
    x = np.load(models / "mlp.npz")["input"]
    result = engine.run({engine.graph.inputs[0]: x})
    assert result.cycles > 0
    assert all(r.predicted_cycles > 0 for r in result.records if r.features is not None)
    recorded = online.observe(result.records, engine.config)
    assert recorded >= 2 and online.samples() == recorded
    assert online.wait(timeout=120) and online.retrains >= 1 and online.last_error is None


def test_fuse_cli_plans_with_the_learned_model(tmp_path: Path, small_model, capsys: pytest.CaptureFixture) -> None:
    import json

    from dynfuse.cli import main

    model = Path(__file__).resolve().parents[1] / "models" / "mlp.onnx"
    path = save_model(small_model, tmp_path / "m.hpm")
    assert main(["fuse", str(model), "--cost-model", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cost_model"] == "hpm"
    assert main(["fuse", str(model), "--cost-model", str(tmp_path / "none.hpm")]) == 1
    assert "no HPM model file" in capsys.readouterr().err


def test_engine_dispatch_feeds_the_online_model_without_waiting_for_retraining(
    tmp_path: Path, small_model, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every kernel the engine simulates is recorded by dispatch itself (with its measured cycles); the retrain
    the samples trigger runs on its own thread: with the trainer held, run() still returns (twice), and once it
    is released the retrained model is swapped in and the engine predicts with it."""
    import threading

    from fusion.hpm import online as online_module
    from fusion.hpm.dataset import SampleLog

    started, release = threading.Event(), threading.Event()
    real_train = online_module.train

    def held_train(*args, **kwargs):
        started.set()
        assert release.wait(60)
        return real_train(*args, **kwargs)

    monkeypatch.setattr(online_module, "train", held_train)
    models = Path(__file__).resolve().parents[1] / "models"
    log = tmp_path / "online.jsonl"
    online = OnlineHpm(small_model, retrain_every=3, log_path=log)
    engine = FusionEngine(
        models / "mlp.onnx", "base", "fp32", EngineOptions(validation=ValidationPolicy("off")), cost_model=online
    )
    inputs = {engine.graph.inputs[0]: np.load(models / "mlp.npz")["input"]}
    first = engine.run(inputs)
    simulated = [r for r in first.records if r.features is not None and r.measured_cycles > 0]
    assert len(simulated) >= 3 and all(r.learned == (r in simulated) for r in first.records)
    assert online.samples() == len(simulated)
    logged = [rec["measured"]["cycle"] for rec in SampleLog(log).records()]
    assert logged == [float(r.measured_cycles) for r in simulated]
    assert started.wait(30) and online.retrains == 0  # training began and is held: run() did not wait for it
    engine.run(inputs)
    assert online.samples() == 2 * len(simulated) and online.retrains == 0
    assert online.observe(first.records, engine.config) == len(simulated)  # already recorded: not appended again
    assert online.samples() == 2 * len(simulated)
    release.set()
    assert online.wait(timeout=120) and online.retrains >= 1 and online.last_error is None
    assert online.model is not small_model
    online.retrain_every = 10**6  # no further swap while the third call predicts
    third = engine.run(inputs)
    for r in third.records:
        if r.features is not None:
            assert r.predicted_cycles == pytest.approx(online.predict(r.features, engine.config).cycles)
    assert online.wait(timeout=120)


def test_group_prices_come_from_the_pairwise_model_and_survive_online_retraining(small_model, small_dataset) -> None:
    """`predict_group` prices a group's schedules through the pairwise estimator (not one at a time), memoised;
    an online retrain on calibration data keeps the pairwise estimator."""
    ds = small_dataset
    half = ds.subset(ds.columns["seed"] % 2 == 0)
    groups = [str(g) for g in half.columns["group"]]
    largest = max(set(groups), key=groups.count)
    idx = [i for i, g in enumerate(groups) if g == largest]
    feats, cfg = [half.features()[i] for i in idx], half.configs()[idx[0]]
    assert len(feats) >= 3 and PAIRS in small_model.predictors
    cost_model = HpmCostModel(small_model)
    joint = cost_model.predict_group(feats, cfg)
    want, _ = small_model.predict_many(feats, [cfg] * len(feats), ["one"] * len(feats))
    assert [e.cycles for e in joint] == pytest.approx(want.tolist())
    alone = [cost_model.predict(f, cfg).cycles for f in feats]
    assert max(abs(a / j.cycles - 1) for a, j in zip(alone, joint, strict=True)) > 1e-6
    assert cost_model.predict_group(feats, cfg) is joint
    online = OnlineHpm(small_model, calibration=half, retrain_every=1)
    assert online.predict_group(feats, cfg) == joint
    online.record(feats[0], cfg, {"cycle": 1000.0, "energy_total_pj": 1e5})
    assert online.wait(timeout=120) and online.last_error is None
    assert online.retrains == 1 and PAIRS in online.model.predictors
