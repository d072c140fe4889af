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


def test_one_element_constants_of_any_rank_fuse() -> None:
    """Scalars exported as shape (1,) constants (as ONNX exporters often write them) are scalars too: the matcher
    read them with float(), which numpy refuses for rank > 0 (a TypeError the pass property test drew)."""
    b = GraphBuilder()
    x = b.input("x", (3, 7))
    scaled = b.op(OpType.Div, x, b.constant(np.array([SQRT2], np.float32)))
    erf_part = b.op(OpType.Add, b.op(OpType.Erf, scaled), b.constant(np.ones(1, np.float32)))
    b.output(b.op(OpType.Mul, x, b.op(OpType.Mul, b.constant(np.array([0.5], np.float32)), erf_part)))
    assert op_names(check_pass(b.build(), fuse_gelu)) == ["Gelu"]


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


def _gelu_new(b: GraphBuilder, x: str, cubic: float = 0.044715, cube_by_pow: bool = True) -> str:
    """GPT-2's gelu_new as its export writes it: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))."""
    cube = (
        b.op(OpType.Pow, x, b.constant(np.float32(3))) if cube_by_pow else b.op(OpType.Mul, x, b.op(OpType.Mul, x, x))
    )
    inner = b.op(OpType.Add, x, b.op(OpType.Mul, cube, b.constant(np.float32(cubic))))
    t = b.op(OpType.Tanh, b.op(OpType.Mul, inner, b.constant(np.float32(math.sqrt(2 / math.pi)))))
    return b.op(OpType.Mul, b.op(OpType.Mul, x, _half(b)), b.op(OpType.Add, t, b.constant(np.float32(1))))


@pytest.mark.parametrize("cube_by_pow", [True, False])
def test_tanh_gelu_fuses_to_approximate_gelu(cube_by_pow) -> None:
    b = GraphBuilder()
    x = b.op(OpType.Relu, b.input("x", (3, 7)))  # x is read by the pattern and by the final multiplication
    b.output(_gelu_new(b, x, cube_by_pow=cube_by_pow))
    fused = check_pass(b.build(), fuse_gelu)
    gelus = [n for n in fused.nodes if n.op == OpType.Gelu]
    assert op_names(fused) == ["Relu", "Gelu"] and gelus[0].attr("approximate") == "tanh"


def test_tanh_near_miss_stays() -> None:
    b = GraphBuilder()
    b.output(_gelu_new(b, b.input("x", (3, 7)), cubic=0.05))
    assert OpType.Gelu not in {n.op for n in fuse_gelu(b.build()).nodes}
