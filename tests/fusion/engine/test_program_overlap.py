"""The predicted overlap at a kernel boundary in one program (`fusion.engine.overlap`) and the planner's use of it:
bounded by the next kernel's independent loads and the previous kernel's compute tail, zero where the link fences
or the next kernel reads only what the previous one writes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fusion.cost.analytic import AnalyticCostModel
from fusion.engine.engine import EngineOptions, FusionEngine
from fusion.engine.overlap import boundary_overlap, chain_overlap, independent_fraction
from fusion.engine.plan import Group, baseline_group
from fusion.engine.planner import Evaluator, plan_dynamic
from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType


def _relu_gemm_relu(m: int = 64, k: int = 256, n: int = 64):
    """x -> Relu -> MatMul(W) -> Relu: the GEMM's weight does not depend on the first kernel, its activation does."""
    rng = np.random.default_rng(0)
    b = GraphBuilder("relu_gemm_relu")
    h = b.op(OpType.Relu, b.input("x", (m, k)), name="pre")
    w = b.constant((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), "w")
    b.output(b.op(OpType.Relu, b.op(OpType.MatMul, h, w, name="mm"), name="post"))
    graph = b.build()
    engine = FusionEngine(graph, "base", "int8", EngineOptions(execution="host", workers=1))
    engine.run({"x": rng.standard_normal((m, k)).astype(np.float32)})
    return graph, engine


@pytest.fixture(scope="module")
def priced():
    graph, engine = _relu_gemm_relu()
    ev = Evaluator(engine.mc, AnalyticCostModel(), engine.profiles)
    return engine.mc, ev, {n.name: ev.evaluate(baseline_group(n)) for n in graph.nodes}


def test_overlap_is_bounded_by_the_independent_loads_and_the_compute_tail(priced) -> None:
    mc, _, k = priced
    cfg = mc.config
    pre, mm, post = k["pre"], k["mm"], k["post"]
    x_bytes, w_bytes = 64 * 256, 256 * 64  # int8 storage
    assert independent_fraction(mc, pre.group, mm.group) == pytest.approx(w_bytes / (x_bytes + w_bytes))
    into_gemm = boundary_overlap(mc, pre, mm)
    first_step = mm.features.dram_read_bytes / max(1, mm.features.steps) * w_bytes / (x_bytes + w_bytes)
    expected = min(cfg.dram_latency + first_step / cfg.dram_bytes_per_cycle, pre.cycles / max(1, pre.features.steps))
    assert into_gemm == pytest.approx(expected) and into_gemm > 0
    assert boundary_overlap(mc, mm, post) == 0.0  # the Relu reads only the GEMM's output: it waits for all of it
    assert chain_overlap(mc, [pre, mm, post]) == pytest.approx(into_gemm)


def test_no_overlap_where_the_link_keeps_a_fence(priced) -> None:
    mc, ev, k = priced
    zero_skip = ev.evaluate(Group(("mm",), "zero_skip"), 0.5)  # tests tiles at issue: never token-ordered
    assert boundary_overlap(mc, k["pre"], zero_skip) == 0.0
    assert boundary_overlap(mc, zero_skip, k["post"]) == 0.0


def test_the_planner_weighs_a_fusion_against_the_overlap_of_its_separate_kernels(priced) -> None:
    mc, ev, _ = priced
    assert any(c.group.fused for c in plan_dynamic(ev, guard=False).choices)
    # separate kernels whose boundaries would hide more than any fusion saves: nothing is fused
    hidden = Evaluator(mc, AnalyticCostModel(), ev.profiles, overlap=lambda parts: math.inf)
    assert not any(c.group.fused for c in plan_dynamic(hidden, guard=False).choices)
