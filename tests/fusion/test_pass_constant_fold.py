"""Constant folding computes constant-only nodes once, ahead of time."""

from __future__ import annotations

import numpy as np
from fusion_helpers import check_pass, op_names

from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType
from fusion.passes.constant_fold import fold_constants


def test_constant_subgraphs_become_constants() -> None:
    w = np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32)
    b = GraphBuilder()
    x = b.input("x", (3, 4))
    wt = b.op(OpType.Transpose, b.constant(w), perm=(1, 0))  # weight transposed at run time: foldable
    scaled = b.op(OpType.Mul, wt, b.constant(np.float32(0.5)))
    b.output(b.op(OpType.Gemm, x, scaled))
    g = b.build()
    out = check_pass(g, fold_constants)
    assert op_names(out) == ["Gemm"]
    np.testing.assert_array_equal(out.constants[out.nodes[0].inputs[1]], w.T * np.float32(0.5))
    assert len(out.constants) == 1, "the unused source constants are dropped"


def test_nodes_reading_inputs_are_not_folded() -> None:
    b = GraphBuilder()
    x = b.input("x", (2,))
    b.output(b.op(OpType.Add, x, b.constant(np.ones(2, np.float32))))
    g = b.build()
    assert op_names(check_pass(g, fold_constants)) == ["Add"]
