"""GELU written with Erf becomes one Gelu node, whatever the order of its multiplications; near misses stay."""

from __future__ import annotations

import math

import numpy as np
import pytest
from fusion_helpers import MODELS_DIR, check_pass, op_names

from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType
from fusion.onnx_import.importer import import_model
from fusion.passes.gelu import fuse_gelu

SQRT2 = np.float32(math.sqrt(2.0))


def _erf_part(b: GraphBuilder, x: str, divide: bool = True, root: float = SQRT2) -> str:
    scaled = (
        b.op(OpType.Div, x, b.constant(np.float32(root)))
        if divide
        else b.op(OpType.Mul, x, b.constant(np.float32(1 / root)))
    )
    return b.op(OpType.Add, b.op(OpType.Erf, scaled), b.constant(np.float32(1)))


def _half(b: GraphBuilder) -> str:
    return b.constant(np.float32(0.5))


@pytest.mark.parametrize("form", ["torch", "x_first", "half_x", "mul_by_reciprocal"])
def test_gelu_forms_fuse(form) -> None:
    b = GraphBuilder()
    x = b.input("x", (3, 7))
    if form == "torch":  # x * (0.5 * (1 + erf(x / sqrt2)))
        y = b.op(OpType.Mul, x, b.op(OpType.Mul, _half(b), _erf_part(b, x)))
    elif form == "x_first":  # (x * (1 + erf)) * 0.5
        y = b.op(OpType.Mul, b.op(OpType.Mul, x, _erf_part(b, x)), _half(b))
    elif form == "half_x":  # (0.5 * x) * (1 + erf)
        y = b.op(OpType.Mul, b.op(OpType.Mul, x, _half(b)), _erf_part(b, x))
    else:
        y = b.op(OpType.Mul, x, b.op(OpType.Mul, _erf_part(b, x, divide=False), _half(b)))
    b.output(b.op(OpType.Relu, y))
    out = check_pass(b.build(), fuse_gelu)
    assert op_names(out) == ["Gelu", "Relu"]


def test_near_misses_do_not_fuse() -> None:
    b = GraphBuilder()
    x = b.input("x", (3, 7))
    wrong_root = b.op(OpType.Mul, x, b.op(OpType.Mul, _half(b), _erf_part(b, x, root=1.5)))
    wrong_half = b.op(OpType.Mul, x, b.op(OpType.Mul, b.constant(np.float32(0.6)), _erf_part(b, x)))
    b.output(wrong_root, wrong_half)
    g = b.build()
    assert op_names(check_pass(g, fuse_gelu)) == op_names(g)


def test_exported_mlp_gelu_fuses() -> None:
    out = check_pass(import_model(MODELS_DIR / "mlp.onnx"), fuse_gelu)
    assert "Gelu" in op_names(out) and "Erf" not in op_names(out)
