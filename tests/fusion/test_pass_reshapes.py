"""Chains of reshapes collapse into one."""

from __future__ import annotations

from fusion_helpers import check_pass, op_names

from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType
from fusion.passes.reshapes import merge_reshapes


def test_reshape_chain_becomes_one_reshape_of_the_source() -> None:
    b = GraphBuilder()
    x = b.input("x", (2, 3, 4))
    r1 = b.op(OpType.Reshape, x, shape=(6, 4))
    r2 = b.op(OpType.Reshape, r1, shape=(24,))
    r3 = b.op(OpType.Reshape, b.op(OpType.Relu, r2), shape=(4, 6))
    b.output(b.op(OpType.Reshape, r3, shape=(2, 12)), r1)
    out = check_pass(b.build(), merge_reshapes)
    assert op_names(out) == ["Reshape", "Reshape", "Relu", "Reshape"]
    assert [n.inputs[0] for n in out.nodes if n.op == OpType.Reshape] == ["x", "x", out.nodes[2].outputs[0]]
