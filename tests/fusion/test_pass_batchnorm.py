"""BatchNorm folds into the Conv/Gemm/MatMul before it, or becomes Mul + Add; results do not change."""

from __future__ import annotations

import numpy as np
from fusion_helpers import check_pass, op_names

from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType
from fusion.passes.batchnorm import fold_batchnorm

RNG = np.random.default_rng(7)


def _bn_params(c: int) -> list[np.ndarray]:
    return [
        RNG.uniform(0.5, 1.5, c).astype(np.float32),
        RNG.standard_normal(c).astype(np.float32),
        RNG.standard_normal(c).astype(np.float32),
        RNG.uniform(0.5, 2, c).astype(np.float32),
    ]


def _bn(b: GraphBuilder, x: str, c: int) -> str:
    return b.op(OpType.BatchNorm, x, *(b.constant(p) for p in _bn_params(c)), epsilon=1e-5)


def test_conv_bn_folds_into_conv_with_bias() -> None:
    for with_bias in (False, True):
        b = GraphBuilder()
        x = b.input("x", (2, 3, 8, 8))
        args = [b.constant(RNG.standard_normal((4, 3, 3, 3)).astype(np.float32))]
        if with_bias:
            args.append(b.constant(RNG.standard_normal(4).astype(np.float32)))
        y = b.op(OpType.Conv, x, *args, strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1), group=1)
        b.output(b.op(OpType.Relu, _bn(b, y, 4)))
        out = check_pass(b.build(), fold_batchnorm, atol=1e-4)
        assert op_names(out) == ["Conv", "Relu"] and len(out.nodes[0].inputs) == 3


def test_gemm_and_matmul_bn_fold_into_gemm() -> None:
    b = GraphBuilder()
    x = b.input("x", (5, 6))
    w = b.constant(RNG.standard_normal((6, 4)).astype(np.float32))
    g = b.op(OpType.Gemm, x, w, b.constant(RNG.standard_normal(4).astype(np.float32)))
    m = b.op(OpType.MatMul, x, w)
    b.output(_bn(b, g, 4), _bn(b, m, 4))
    out = check_pass(b.build(), fold_batchnorm, atol=1e-4)
    assert op_names(out) == ["Gemm", "Gemm"]


def test_unfoldable_bn_becomes_mul_add() -> None:
    b = GraphBuilder()
    x = b.input("x", (2, 3, 4, 4))
    y = b.op(
        OpType.Conv,
        x,
        b.constant(np.ones((3, 3, 1, 1), np.float32)),
        strides=(1, 1),
        pads=(0,) * 4,
        dilations=(1, 1),
        group=1,
    )
    b.output(_bn(b, y, 3), b.op(OpType.Relu, y))  # the conv output has a second reader: not foldable
    b2 = _bn(b, x, 3)  # a BN straight on a graph input
    b.output(b2)
    out = check_pass(b.build(), fold_batchnorm, atol=1e-4)
    assert op_names(out) == ["Conv", "Mul", "Add", "Relu", "Mul", "Add"]
