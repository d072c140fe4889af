"""Transpose pairs cancel or merge into one."""

from __future__ import annotations

from fusion_helpers import check_pass, op_names
from hypothesis import given
from hypothesis import strategies as st

from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType
from fusion.passes.transposes import cancel_transposes

SHAPE = (2, 3, 4, 5)


@given(st.permutations(range(4)), st.permutations(range(4)))
def test_any_pair_becomes_at_most_one_transpose(p1, p2) -> None:
    b = GraphBuilder()
    x = b.input("x", SHAPE)
    t = b.op(OpType.Transpose, b.op(OpType.Transpose, x, perm=p1), perm=p2)
    b.output(b.op(OpType.Relu, t))
    out = check_pass(b.build(), cancel_transposes)
    composed_identity = [p1[i] for i in p2] == list(range(4))
    assert op_names(out) == (["Relu"] if composed_identity else ["Transpose", "Relu"])


def test_inner_transpose_with_other_readers_stays() -> None:
    b = GraphBuilder()
    x = b.input("x", (2, 3))
    inner = b.op(OpType.Transpose, x, perm=(1, 0))
    back = b.op(OpType.Transpose, inner, perm=(1, 0))
    b.output(b.op(OpType.Add, back, x), b.op(OpType.Relu, inner))
    out = check_pass(b.build(), cancel_transposes)
    assert op_names(out) == ["Transpose", "Add", "Relu"]
    assert out.nodes[1].inputs == ("x", "x")
