"""The dynamic planner weighs fusion candidates lazily (`plan_dynamic`: branch and bound on the gain): a candidate's
`gain_bound` is at least the gain the planner would predict for it, a candidate is weighed while its bound reaches
the largest gain still to be decided or while it might contest the one about to be taken (`may_rival`), and the
plans equal those of weighing every candidate (the bound replaced by +inf, which weighs all before any decision)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from engine_helpers import context, gemm_graph, linear_relu_graph
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fusion.cost.analytic import AnalyticCostModel
from fusion.engine import planner
from fusion.engine.candidates import Candidate, enumerate_candidates, schedules
from fusion.engine.plan import Group
from fusion.engine.planner import Evaluated, Evaluator, Scored, gain_bound, may_rival, plan_dynamic
from fusion.graph.builder import GraphBuilder
from fusion.graph.ir import Graph
from fusion.graph.ops import OpType


def basic_block(c: int, size: int, stride: int, seed: int) -> Graph:
    """A resnet basic block after a stem (conv -> relu, so the block reads an int8 activation in int8): conv ->
    relu -> conv -> + shortcut -> relu (a strided block: a 1x1 strided conv on the shortcut)."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("block")
    x = b.input("x", (1, 3, size, size))

    def conv(h, cin: int, cout: int, kernel: int, s: int, name: str):
        w = (rng.standard_normal((cout, cin, kernel, kernel)) / np.sqrt(cin * kernel * kernel)).astype(np.float32)
        bias = b.constant(rng.standard_normal(cout).astype(np.float32) * 0.1)
        geometry = {"pads": (kernel // 2,) * 4, "strides": (s, s), "dilations": (1, 1), "group": 1}
        return b.op(OpType.Conv, h, b.constant(w), bias, name=name, **geometry)

    x = b.op(OpType.Relu, conv(x, 3, c, 3, 1, "stem"), name="stem_relu")
    cout = c * stride
    h = b.op(OpType.Relu, conv(x, c, cout, 3, stride, "conv1"), name="relu1")
    h = conv(h, cout, cout, 3, 1, "conv2")
    shortcut = conv(x, c, cout, 1, stride, "down") if stride > 1 else x
    b.output(b.op(OpType.Relu, b.op(OpType.Add, h, shortcut, name="add"), name="relu2"))
    return b.build()


def _evaluator(c: int, size: int, stride: int, dtype: str, seed: int) -> Evaluator:
    graph = basic_block(c, size, stride, seed)
    x = np.random.default_rng(seed + 1).standard_normal((1, 3, size, size)).astype(np.float32)
    mc = context(graph, {graph.inputs[0]: x}, dtype)
    return Evaluator(mc, AnalyticCostModel(), {})


BLOCKS = st.tuples(
    st.sampled_from([8, 16, 24]), st.sampled_from([8, 12]), st.sampled_from([1, 2]), st.sampled_from(["int8", "fp32"])
)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(BLOCKS, st.integers(0, 3))
def test_the_gain_bound_is_at_least_every_schedules_predicted_gain(block, seed) -> None:
    c, size, stride, dtype = block
    ev = _evaluator(c, size, stride, dtype, seed)
    mc = ev.mc
    alone = {n.name: ev.best(ev.with_twins(schedules(mc, Candidate((n.name,), "single"))))[0] for n in mc.graph.nodes}
    checked = 0
    for cand in enumerate_candidates(mc.graph):
        if cand.family == "single":
            continue
        parts = [alone[n] for n in cand.nodes]
        bound, floor = gain_bound(ev, cand, parts)
        groups = ev.with_twins(schedules(mc, cand))
        done, _ = ev.ranked(groups, keep=len(groups))
        if not done or not math.isfinite(bound):
            continue
        least = min(e.score for e in done)
        assert floor <= least * (1 + 1e-9), (cand.nodes, floor, least)
        assert bound >= sum(p.score for p in parts) - least - 1e-6 * least, (cand.nodes, bound)
        checked += 1
    assert checked


@pytest.mark.parametrize("block", [(64, 14, 1, "int8"), (32, 16, 1, "int8"), (32, 14, 2, "int8"), (32, 16, 1, "fp32")])
def test_a_head_floor_is_at_most_its_groups_prediction(block) -> None:
    """`Evaluator.head_floor` bounds every built group absorbing consumers from below, dequantizing int8 heads too
    (conv2 read only by the Add: alone it stores float32; a bound from its prediction without the stores fails
    here, its group predicted below it)."""
    c, size, stride, dtype = block
    ev = _evaluator(c, size, stride, dtype, 0)
    mc = ev.mc
    groups = [g for cand in enumerate_candidates(mc.graph) for g in schedules(mc, cand)]
    built = [e for g in groups if isinstance(e := ev.evaluate(g), Evaluated)]
    floors = [(e, floor) for e in built if (floor := ev.head_floor(e.group)) is not None]
    assert floors
    for e, (floor, _) in floors:
        assert floor <= e.score * (1 + 1e-9), (e.group, floor, e.score)
    if dtype == "int8":
        assert any(mc.qplan.matrix[e.group.nodes[0]].dequantize for e, _ in floors), "a dequantizing head is checked"


GRAPHS = [
    lambda: basic_block(16, 8, 1, 0),
    lambda: basic_block(16, 8, 2, 1),
    lambda: gemm_graph(48, 64, 80),
    lambda: linear_relu_graph(48, 64, 80),
]


@pytest.mark.parametrize("dtype", ["int8", "fp32"])
@pytest.mark.parametrize("make", GRAPHS)
def test_the_score_bound_holds_for_every_built_schedule(make, dtype) -> None:
    """`Evaluator.bound` (the shape bound plus the priced traffic every schedule has, weights included) is at most
    every built schedule's predicted score and its simulated cycles plus its priced traffic."""
    graph = make()
    rng = np.random.default_rng(2)
    mc = context(graph, {v: rng.standard_normal(graph.types[v].shape).astype(np.float32) for v in graph.inputs}, dtype)
    ev = Evaluator(mc, AnalyticCostModel(), {}, repeats=False)
    checked = 0
    for cand in enumerate_candidates(graph):
        for group in schedules(mc, cand):
            bound = ev.bound(group)
            if bound <= 0.0:
                continue
            e = ev.evaluate(group)
            if not isinstance(e, Evaluated):
                continue
            assert bound <= e.score * (1 + 1e-9), (group, bound, e.score)
            assert bound <= ev.measured_score(e) * (1 + 1e-9), (group, bound)
            checked += 1
    assert checked


def _chosen(ev: Evaluator) -> list[Group]:
    return [c.group for c in plan_dynamic(ev, guard=False).choices]


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(BLOCKS, st.integers(0, 3))
def test_lazy_plans_equal_weighing_every_candidate(block, seed) -> None:
    c, size, stride, dtype = block
    lazy = _chosen(_evaluator(c, size, stride, dtype, seed))
    with pytest.MonkeyPatch.context() as patch:  # every bound +inf: every candidate weighed before any decision
        patch.setattr(planner, "gain_bound", lambda ev, cand, parts: (math.inf, 0.0))
        eager = _chosen(_evaluator(c, size, stride, dtype, seed))
    assert lazy == eager


def test_a_conv_add_is_not_weighed_once_its_conv_add_relu_is_taken() -> None:
    plan = plan_dynamic(_evaluator(64, 14, 1, "fp32", 0), guard=False)
    taken = {c.group.nodes for c in plan.choices}
    assert ("conv2", "add", "relu2") in taken
    reasons = dict(plan.rejected)
    assert reasons[("conv2", "add")].startswith("not weighed"), reasons.get(("conv2", "add"))


def _priced(nodes: tuple[str, ...], cycles: float, sd: float) -> Evaluated:
    return Evaluated(Group(nodes, "implicit_gemm"), lambda: None, None, cycles, 0.0, cycles, sd)


def _alone(relu_sd: float) -> dict:
    return {
        "conv": (_priced(("conv",), 600_000.0, 60_000.0), [], ""),
        "add": (_priced(("add",), 20_000.0, 3_000.0), [], ""),
        "relu": (_priced(("relu",), 10_000.0, relu_sd), [], ""),
        "other": (_priced(("other",), 50_000.0, 20_000.0), [], ""),
    }


def test_may_rival_weighs_the_uncertainty_the_two_do_not_share() -> None:
    nodes = ("conv", "add", "relu")
    top = Scored(130_000.0, 630_000.0, _priced(nodes, 500_000.0, 50_000.0), [], Candidate(nodes, "conv"), 0.02)
    inner = Candidate(("conv", "add"), "conv")
    # conv + add inside conv + add + relu, 5k short of it: only the relu and the fused scores' difference are
    # uncertain (the fused kernels' 50k spread cancels), and the regret must reach 0.5% of 630k
    assert not may_rival(top, inner, (125_000.0, 500_000.0), _alone(1_000.0))
    assert may_rival(top, inner, (125_000.0, 500_000.0), _alone(20_000.0))
    assert may_rival(top, inner, (125_000.0, 300_000.0), _alone(1_000.0))  # fused 200k apart: 20k uncertain
    # a candidate of another head: the top's fused spread (50k) and the other node's (20k) are uncertain
    across = Candidate(("other", "add"), "chain")
    assert may_rival(top, across, (100_000.0, 0.0), _alone(1_000.0))
    assert not may_rival(top, across, (-200_000.0, 0.0), _alone(1_000.0))
    assert not may_rival(top, Candidate(("other",), "chain"), (1e9, 0.0), _alone(1_000.0))  # no node shared
