"""Re-specialisation on drifting sparsity: an engine calibrated and planned on dense data must switch a GEMM
group to its zero-skip kernel when the data turns ReLU-sparse (re-planning with the live zero-tile fraction) and
back to dense kernels when it turns dense again, bit-exact in int8 on every call."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import linear_relu_graph, sparse_activations

from fusion.engine.engine import EngineOptions, FusionEngine
from fusion.engine.planner import Evaluator, plan_dynamic
from fusion.engine.profile import profile_tensor
from fusion.reference.quantized import run_quantized

M, K, N = 64, 256, 128


def _engines(dense: dict[str, np.ndarray]) -> tuple[FusionEngine, FusionEngine]:
    graph = linear_relu_graph(M, K, N, seed=3)
    made = (
        FusionEngine(graph, "base", "int8", EngineOptions(policy=policy, checked=True), samples=[dense])
        for policy in ("dynamic", "static")
    )
    return tuple(made)  # type: ignore[return-value]


def _fc(records) -> list:
    return [r for r in records if "fc" in r.nodes]


def test_dense_calibrated_engine_goes_zero_skip_on_sparse_data_and_back() -> None:
    dense = {"x": np.random.default_rng(4).standard_normal((M, K)).astype(np.float32)}
    sparse = {"x": sparse_activations((M, K), 16, 14 / 16, seed=8)}
    assert 0.7 <= np.mean(sparse["x"] == 0) <= 0.95
    engine, static = _engines(dense)
    dense_plan_cycles = None
    for call, inputs in enumerate((dense, sparse, sparse, dense)):
        res, base = engine.run(inputs), static.run(inputs)
        want = run_quantized(engine.graph, inputs, engine.mc.params)["relu"]
        np.testing.assert_array_equal(res.outputs["relu"], want)
        np.testing.assert_array_equal(base.outputs["relu"], want)
        assert not engine.events and all(not r.fallback for r in res.records)
        schedules = [r.schedule for r in _fc(res.records)]
        if inputs is sparse:
            assert [s.split(",")[0] for s in schedules] == ["zero_skip"]
            assert _fc(res.records)[0].data_class == "sparse"
            assert res.cycles < dense_plan_cycles and res.cycles < base.cycles
        else:
            assert not any(s.startswith("zero_skip") for s in schedules)
            dense_plan_cycles = dense_plan_cycles or res.cycles
        if call in (1, 3):  # the class changed: drift, and the groups reading x were planned again
            assert "sparsity class" in res.drifts[0].reason and res.replanned
    assert all(g.strategy != "zero_skip" for g in engine.plan.groups)


def test_the_planner_prices_zero_skip_variants_at_the_live_zero_tile_fraction() -> None:
    """Planned on sparse profiles, the GEMM group is a zero-skip kernel whose features carry the live fraction,
    and its prediction falls as the fraction grows; planned on dense profiles no group is zero-skip but the
    dispatch table still holds a zero-skip kernel for the GEMM."""
    dense = {"x": np.random.default_rng(4).standard_normal((M, K)).astype(np.float32)}
    engine, _ = _engines(dense)
    engine.run(dense)
    predicted = []
    for zero_tiles in (0.5, 0.875):
        x = sparse_activations((M, K), 16, zero_tiles, seed=8)
        profile = profile_tensor(x, engine.config.array_size)
        ev = Evaluator(engine.mc, engine.cost_model, {"x": profile})
        (choice,) = [c for c in plan_dynamic(ev).choices if "fc" in c.group.nodes]
        assert choice.group.strategy == "zero_skip" and choice.dense is not None
        assert choice.dense.strategy != "zero_skip"
        feats = ev.evaluate(choice.group)
        assert feats.features.zero_tile_fraction == pytest.approx(profile.zero_tile_fraction)
        predicted.append(feats.cycles)
    assert predicted[1] < predicted[0]
    dense_ev = Evaluator(engine.mc, engine.cost_model, {"x": profile_tensor(dense["x"], 16)})
    choices = plan_dynamic(dense_ev).choices
    assert all(c.group.strategy != "zero_skip" for c in choices)
    (fc,) = [c for c in choices if "fc" in c.group.nodes]
    assert fc.zero_skip is not None and fc.zero_skip.strategy == "zero_skip"
