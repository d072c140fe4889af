"""Plans run their groups in a topological order of the values they pass (`planner.in_execution_order`), not by
each group's last node: a kernel storing a value that a node earlier in graph order reads (side-by-side GEMMs,
a chain storing an intermediate) runs before it. Groups that would read each other's values both ways are never
formed (`legality.no_cycle_through_outside` with the groups already planned), and the plan guard merges regions
that do (`planner._regions`)."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import context, reference_env

from fusion.cost import AnalyticCostModel
from fusion.engine.engine import EngineOptions, FusionEngine
from fusion.engine.errors import EngineError
from fusion.engine.legality import no_cycle_through_outside, structurally_legal
from fusion.engine.plan import Group, GroupChoice, Plan
from fusion.engine.planner import Evaluator, _regions, in_execution_order, plan_dynamic, strongly_connected
from fusion.engine.validation import ValidationPolicy
from fusion.graph.builder import GraphBuilder
from fusion.graph.ir import Graph
from fusion.graph.ops import OpType


def _self_attention(seq: int = 16, dim: int = 32, heads: int = 2, seed: int = 0) -> tuple[Graph, dict]:
    """Q, K, V projections without bias as HF BERT exports them: each MatMul followed at once by its head split,
    so Q's Reshape comes before K's MatMul in graph order."""
    rng = np.random.default_rng(seed)
    dh = dim // heads
    b = GraphBuilder("bert_attention")
    x = b.input("x", (1, seq, dim))

    def proj(name: str) -> str:
        w = b.constant((rng.standard_normal((dim, dim)) / np.sqrt(dim)).astype(np.float32), f"w_{name}")
        return b.op(OpType.MatMul, x, w, name=name)

    def split(v: str, perm: tuple[int, ...], name: str) -> str:
        r = b.op(OpType.Reshape, v, shape=(1, seq, heads, dh), name=f"{name}_reshape")
        return b.op(OpType.Transpose, r, perm=perm, name=f"{name}_transpose")

    q = split(proj("q"), (0, 2, 1, 3), "q")
    k = b.op(OpType.Reshape, proj("k"), shape=(1, seq, heads, dh), name="k_reshape")
    v = split(proj("v"), (0, 2, 1, 3), "v")
    kt = b.op(OpType.Transpose, k, perm=(0, 2, 3, 1), name="k_transpose")
    scores = b.op(OpType.Mul, b.op(OpType.MatMul, q, kt, name="scores"), b.constant(np.float32(dh**-0.5)), name="scale")
    ctx = b.op(OpType.MatMul, b.op(OpType.Softmax, scores, axis=3, name="softmax"), v, name="context")
    merged = b.op(OpType.Transpose, ctx, perm=(0, 2, 1, 3), name="merge")
    b.output(b.op(OpType.Reshape, merged, shape=(1, seq, dim), name="out"))
    return b.build(), {"x": rng.standard_normal((1, seq, dim)).astype(np.float32)}


def _choices(*groups: tuple[str, ...]) -> list[GroupChoice]:
    return [GroupChoice(Group(g, "unfused" if len(g) == 1 else "chain"), 0.0, "") for g in groups]


def _chain_graph() -> Graph:
    """e = Exp(x); early = Neg(e) comes before t = Tanh(e) in graph order; out = t + early."""
    b = GraphBuilder("early")
    x = b.input("x", (4, 8))
    e = b.op(OpType.Exp, x, name="e")
    early = b.op(OpType.Neg, e, name="early")
    b.output(b.op(OpType.Add, b.op(OpType.Tanh, e, name="t"), early, name="out"))
    return b.build()


def test_groups_run_after_every_group_writing_what_they_read() -> None:
    graph = _chain_graph()
    mc = context(graph, {"x": np.ones((4, 8), np.float32)}, "fp32")
    # the chain [e, t] stores e for `early`, which comes before t in graph order: by last node, early would run first
    order = in_execution_order(mc, _choices(("early",), ("out",), ("e", "t")))
    assert [c.group.nodes for c in order] == [("e", "t"), ("early",), ("out",)]
    # among independent groups the order by last node is kept
    order = in_execution_order(mc, _choices(("out",), ("t",), ("early",), ("e",)))
    assert [c.group.nodes for c in order] == [("e",), ("early",), ("t",), ("out",)]


def test_groups_reading_each_other_both_ways_have_no_order() -> None:
    graph = _chain_graph()
    mc = context(graph, {"x": np.ones((4, 8), np.float32)}, "fp32")
    # [e, out] waits for t and early, which wait for e: no order runs it
    with pytest.raises(EngineError, match="both ways"):
        in_execution_order(mc, _choices(("e", "out"), ("early",), ("t",)))


def _crossing_graph() -> Graph:
    """a = Exp(x), b = Neg(a), c = Tanh(x), g = a + c, out = b + g: {a, g} and {b, c} each have no path leaving
    and re-entering them, but as two groups each reads the other's value (a -> b, c -> g)."""
    bld = GraphBuilder("crossing")
    x = bld.input("x", (4, 8))
    a = bld.op(OpType.Exp, x, name="a")
    b = bld.op(OpType.Neg, a, name="b")
    c = bld.op(OpType.Tanh, x, name="c")
    g = bld.op(OpType.Add, a, c, name="g")
    bld.output(bld.op(OpType.Add, b, g, name="out"))
    return bld.build()


def test_a_chain_storing_a_value_read_earlier_is_legal() -> None:
    graph = _chain_graph()
    mc = context(graph, {"x": np.ones((4, 8), np.float32)}, "fp32")
    e, t = graph.node("e"), graph.node("t")
    assert structurally_legal(mc, [e, t], "chain")  # stores e; `early` runs after the chain
    assert not structurally_legal(mc, [e, t], "stream")  # other families keep their intermediates private


def test_a_group_closing_a_cycle_through_a_planned_group_is_refused() -> None:
    graph = _crossing_graph()
    a, b, c, g = (graph.node(n) for n in "abcg")
    assert no_cycle_through_outside(graph, [a, g])  # alone: no path leaves {a, g} and comes back
    planned = {"b": (b, c), "c": (b, c)}  # {b, c} as one kernel: it waits for a and g waits for it
    found = no_cycle_through_outside(graph, [a, g], planned)
    assert not found and "re-enters" in found.reason
    assert no_cycle_through_outside(graph, [a, g], {"b": (b, graph.node("out")), "out": (b, graph.node("out"))})


def test_dynamic_runs_the_projections_side_by_side_beside_the_attention() -> None:
    """The three projections as one side-by-side GEMM, whose outputs Q's Reshape reads before K's MatMul in graph
    order, run before the attention kernel (with Q's and V's head splits and K's transposes). The planner now
    takes projections and attention as one kernel (`attention_proj`); the engine's outputs equal the reference."""
    graph, inputs = _self_attention()
    mc = context(graph, inputs, "fp32")
    attention = tuple(n.name for n in graph.nodes if n.name not in {"q", "k", "v"})
    side_by_side = GroupChoice(Group(("q", "k", "v"), "siblings"), 0.0, "")
    order = in_execution_order(mc, [GroupChoice(Group(attention, "attention"), 0.0, ""), side_by_side])
    assert [c.group.strategy for c in order] == ["siblings", "attention"]
    plan = plan_dynamic(Evaluator(mc, AnalyticCostModel(), {}))
    strategies = {c.group.strategy: c.group.nodes for c in plan.choices}
    assert {"q", "k", "v", "scores"} <= set(strategies.get("attention_proj", ())), strategies
    cycles = {}
    for policy in ("none", "dynamic"):
        options = EngineOptions(policy=policy, validation=ValidationPolicy("off"), workers=1, execution="host")
        engine = FusionEngine(graph, "base", "fp32", options)
        result = engine.run(inputs)
        cycles[policy] = result.cycles
        out = graph.outputs[0]
        np.testing.assert_allclose(result.outputs[out], reference_env(mc, inputs)[out], rtol=1e-5, atol=1e-5)
    assert cycles["dynamic"] < cycles["none"]


def test_regions_reading_each_other_both_ways_are_merged() -> None:
    """Two plans, {a, g} + {b} + {c} and {a} + {b, c} + {g}: their groups partition the nodes into {a, g} and
    {b, c}, which read each other's values; taking the first plan's groups in one and the second's in the other
    would leave no order, so the guard's regions merge them."""
    graph = _crossing_graph()
    one = Plan("dynamic", tuple(_choices(("a", "g"), ("b",), ("c",), ("out",))))
    two = Plan("static", tuple(_choices(("a",), ("b", "c"), ("g",), ("out",))))
    parts = _regions(graph, [n.name for n in graph.nodes], [one, two])
    assert sorted(map(sorted, parts)) == [["a", "b", "c", "g"], ["out"]]
    chain = _chain_graph()
    one = Plan("dynamic", tuple(_choices(("e", "t"), ("early",), ("out",))))
    two = Plan("none", tuple(_choices(("e",), ("t",), ("early",), ("out",))))
    parts = _regions(chain, [n.name for n in chain.nodes], [one, two])
    assert sorted(map(sorted, parts)) == [["e", "t"], ["early"], ["out"]]  # one way only: not merged


def test_strongly_connected_components() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}, "f": set()}
    found = sorted(sorted(c) for c in strongly_connected(graph))
    assert found == [["a", "b", "c"], ["d", "e"]]
