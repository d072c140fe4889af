"""Common-subexpression elimination computes identical expressions and constants once."""

from __future__ import annotations

import numpy as np
from fusion_helpers import check_pass, op_names

from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType
from fusion.passes.cse import eliminate_common_subexpressions


def test_duplicates_merge_transitively() -> None:
    b = GraphBuilder()
    x = b.input("x", (4, 4))
    w1, w2 = b.constant(np.eye(4, dtype=np.float32)), b.constant(np.eye(4, dtype=np.float32))  # equal contents
    y1 = b.op(OpType.Relu, b.op(OpType.MatMul, x, w1))
    y2 = b.op(OpType.Relu, b.op(OpType.MatMul, x, w2))
    b.output(b.op(OpType.Add, y1, y2))
    out = check_pass(b.build(), eliminate_common_subexpressions)
    assert op_names(out) == ["MatMul", "Relu", "Add"]
    assert len(out.constants) == 1


def test_different_attributes_or_constants_do_not_merge() -> None:
    b = GraphBuilder()
    x = b.input("x", (2, 3, 4))
    t1, t2 = b.op(OpType.Transpose, x, perm=(0, 2, 1)), b.op(OpType.Transpose, x, perm=(2, 0, 1))
    m1 = b.op(OpType.Mul, x, b.constant(np.float32(2)))
    m2 = b.op(OpType.Mul, x, b.constant(np.float32(3)))
    b.output(t1, t2, m1, m2)
    g = b.build()
    assert op_names(check_pass(g, eliminate_common_subexpressions)) == op_names(g)


def test_duplicate_graph_outputs_keep_their_names() -> None:
    b = GraphBuilder()
    x = b.input("x", (3,))
    s1, s2 = b.op(OpType.Sigmoid, x, name="s1"), b.op(OpType.Sigmoid, x, name="s2")
    t = b.op(OpType.Tanh, x, name="t")
    b.output(s1, s2, b.op(OpType.Relu, t), b.op(OpType.Tanh, x, name="t_out"))
    out = check_pass(b.build(), eliminate_common_subexpressions)
    assert op_names(out) == ["Sigmoid", "Sigmoid", "Tanh", "Relu"], "s1/s2 both outputs: both stay"
    assert out.node("t").outputs == ("t_out",), "the duplicate that is an output hands its name over"
