"""Local re-planning: a sparsity drift of one graph input re-plans only the groups reading it. In a graph with
two independent Linear+ReLU branches, drifting one branch's input keeps every other group's `GroupChoice` (the
same objects, with nothing of them priced again) while the drifted branch re-specialises to zero-skip; the
outputs stay bit-exact in int8 (checked simulation), and the local plan equals a full re-plan's groups."""

from __future__ import annotations

import numpy as np
from engine_helpers import sparse_activations

from fusion.engine.engine import EngineOptions, FusionEngine
from fusion.engine.planner import Evaluator, plan_dynamic
from fusion.graph.builder import GraphBuilder
from fusion.graph.ir import Graph
from fusion.graph.ops import OpType
from fusion.reference.quantized import run_quantized

M, K, N = 64, 256, 128


def two_branch_graph(seed: int = 0) -> Graph:
    """x1 -> Gemm -> Relu and x2 -> Gemm -> Relu, added at the end."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("two_branches")
    outs = []
    for i in (1, 2):
        x = b.input(f"x{i}", (M, K))
        w = b.constant((rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32), f"w{i}")
        bias = b.constant((rng.standard_normal(N) * 0.1).astype(np.float32), f"bias{i}")
        outs.append(b.op(OpType.Relu, b.op(OpType.Gemm, x, w, bias, name=f"fc{i}"), name=f"relu{i}"))
    b.output(b.op(OpType.Add, *outs, name="join"))
    return b.build()


def test_drift_of_one_input_replans_only_its_branch() -> None:
    rng = np.random.default_rng(4)
    dense = {f"x{i}": rng.standard_normal((M, K)).astype(np.float32) for i in (1, 2)}
    drifted = {**dense, "x1": sparse_activations((M, K), 16, 14 / 16, seed=8)}
    engine = FusionEngine(
        two_branch_graph(), "base", "int8", EngineOptions(policy="dynamic", checked=True), samples=[dense]
    )
    for inputs in (dense, drifted):
        res = engine.run(inputs)
        want = run_quantized(engine.graph, inputs, engine.mc.params)["join"]
        np.testing.assert_array_equal(res.outputs["join"], want)
        assert not engine.events and all(not r.fallback for r in res.records)
        if inputs is dense:
            before = engine.plan
    assert [d.tensor for d in res.drifts] == ["x1"] and "sparsity class" in res.drifts[0].reason
    region = {n for nodes in res.replanned for n in nodes}
    assert "fc1" in region and not region & {"x2", "fc2", "relu2"}
    kept = [c for c in before.choices if region.isdisjoint(c.group.nodes)]
    assert any("fc2" in c.group.nodes for c in kept)
    for old in kept:  # the very same choice objects, and none of their groups was evaluated again
        assert any(new is old for new in engine.plan.choices)
        assert not any(set(nodes) & set(old.group.nodes) for nodes in engine.plan_evaluations)
    assert engine.plan_evaluations and all(set(nodes) <= region for nodes in engine.plan_evaluations)
    (fc1,) = [c for c in engine.plan.choices if "fc1" in c.group.nodes]
    assert fc1.group.strategy == "zero_skip"
    assert [r.schedule.split(",")[0] for r in res.records if "fc1" in r.nodes] == ["zero_skip"]
    full = plan_dynamic(Evaluator(engine.mc, engine.cost_model, engine.profiles))
    assert set(full.groups) == set(engine.plan.groups)
