"""Dead-node elimination keeps exactly the nodes that reach an output."""

from __future__ import annotations

from fusion_helpers import check_pass, op_names

from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType
from fusion.passes.dce import eliminate_dead_nodes


def test_unreachable_nodes_go_and_reachable_ones_stay() -> None:
    b = GraphBuilder()
    x = b.input("x", (3, 4))
    live = b.op(OpType.Relu, x)
    dead = b.op(OpType.Exp, live)
    b.op(OpType.Tanh, dead)  # dead chain of two
    a, _ = b.op_multi(OpType.Split, live, n_outputs=2, axis=1, sizes=(2, 2))  # one output used: node stays
    b.output(b.op(OpType.Sigmoid, a))
    out = check_pass(b.build(), eliminate_dead_nodes)
    assert op_names(out) == ["Relu", "Split", "Sigmoid"]
    assert eliminate_dead_nodes(out).nodes == out.nodes
