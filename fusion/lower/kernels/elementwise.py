"""Elementwise unary and broadcasting binary nodes: dma.ld -> v.* -> dma.st over tiles of the output.

Broadcasting happens in the DMA: each input is read through a view broadcast to the output shape (stride 0 on
broadcast dims), so the vector unit always sees dense, equally long tiles. A one-element constant second
operand becomes a scalar register operand (`.vs`) instead. On the int8 path Relu of int8 data stays int8;
everything else dequantizes its int8 inputs and computes in float32, as the quantized reference does.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from fusion.graph.ir import Node
from fusion.graph.ops import OpType
from fusion.lower.context import LowerContext, const_scalar
from fusion.lower.emitter import Emitter, Step, f32_bits
from fusion.lower.errors import UnsupportedOpError
from fusion.lower.kernels.vector_ops import dequantize
from fusion.lower.local_alloc import TileArena, largest_fitting
from fusion.lower.views import View, blocks
from isa.enums import DType, Unit

F32_UNARY = {
    OpType.Relu: "v_relu",
    OpType.Sigmoid: "v_sigmoid",
    OpType.Tanh: "v_tanh",
    OpType.Erf: "v_erf",
    OpType.Exp: "v_exp",
    OpType.Sqrt: "v_sqrt",
}
BINARY = {OpType.Add: "add", OpType.Sub: "sub", OpType.Mul: "mul", OpType.Div: "div"}
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)

# A tile computation: (emitter, output tile, input tiles or scalar bits, element count, scratch tile)
Body = Callable[[Emitter, int, list[int | None], int, int], None]


def _gelu(approximate: str) -> Body:
    """0.5 * x * (1 + erf(x / sqrt 2)) or the tanh form, op by op in the reference's order."""

    def body(em: Emitter, out: int, ins: list[int | None], n: int, tmp: int) -> None:
        x = ins[0]
        b = em.b
        if approximate == "tanh":
            b.v_mul_vs(*em.regs(tmp, x, f32_bits(0.044715)), n, "f32")
            b.v_mul(*em.regs(tmp, tmp, x), n, "f32")
            b.v_mul(*em.regs(tmp, tmp, x), n, "f32")
            b.v_add(*em.regs(tmp, x, tmp), n, "f32")
            b.v_mul_vs(*em.regs(tmp, tmp, f32_bits(SQRT_2_OVER_PI)), n, "f32")
            b.v_tanh(*em.regs(tmp, tmp), n, "f32")
        else:
            b.v_div_vs(*em.regs(tmp, x, f32_bits(math.sqrt(2.0))), n, "f32")
            b.v_erf(*em.regs(tmp, tmp), n, "f32")
        b.v_add_vs(*em.regs(tmp, tmp, f32_bits(1.0)), n, "f32")
        b.v_mul_vs(*em.regs(out, x, f32_bits(0.5)), n, "f32")
        b.v_mul(*em.regs(out, out, tmp), n, "f32")

    return body


def _unary(method: str) -> Body:
    def body(em: Emitter, out: int, ins: list[int | None], n: int, tmp: int) -> None:
        getattr(em.b, method)(*em.regs(out, ins[0]), n, "f32")

    return body


def _binary(name: str, scalar_bits: int | None) -> Body:
    def body(em: Emitter, out: int, ins: list[int | None], n: int, tmp: int) -> None:
        if scalar_bits is not None:
            getattr(em.b, f"v_{name}_vs")(*em.regs(out, ins[0], scalar_bits), n, "f32")
        else:
            getattr(em.b, f"v_{name}")(*em.regs(out, ins[0], ins[1]), n, "f32")

    return body


def _pow(node: Node, exponent: float | None) -> Body:
    if exponent == 2.0:
        return lambda em, out, ins, n, tmp: em.b.v_mul(*em.regs(out, ins[0], ins[0]), n, "f32")
    if exponent == 0.5:
        return _unary("v_sqrt")
    if exponent == 1.0:
        return _unary("v_copy")
    raise UnsupportedOpError(node.name, node.op.value, "Pow needs a constant exponent of 0.5, 1 or 2")


def _batchnorm(epsilon: float) -> Body:
    """(x - mean) * (scale / sqrt(var + eps)) + bias with every parameter broadcast along the channel axis."""

    def body(em: Emitter, out: int, ins: list[int | None], n: int, tmp: int) -> None:
        x, scale, bias, mean, var = ins
        b = em.b
        b.v_add_vs(*em.regs(tmp, var, f32_bits(epsilon)), n, "f32")
        b.v_sqrt(*em.regs(tmp, tmp), n, "f32")
        b.v_div(*em.regs(tmp, scale, tmp), n, "f32")
        b.v_sub(*em.regs(out, x, mean), n, "f32")
        b.v_mul(*em.regs(out, out, tmp), n, "f32")
        b.v_add(*em.regs(out, out, bias), n, "f32")

    return body


def _channel_views(cx: LowerContext, node: Node) -> list[View]:
    """BatchNorm's per-channel parameters seen as [1, C, 1, ...] so they broadcast like the reference."""
    rank = len(cx.graph.types[node.inputs[0]].shape)
    views = []
    for value in node.inputs[1:]:
        v = cx.view(value)
        views.append(replace(v, shape=(1, *v.shape, *(1,) * (rank - 2)), strides=(0, *v.strides, *(0,) * (rank - 2))))
    return views


def f32_body(cx: LowerContext, node: Node) -> tuple[Body, list[str]]:
    """The float32 computation of a node and the inputs it reads as tiles (a scalar operand is not a tile)."""
    op = node.op
    if op == OpType.BatchNorm:
        return _batchnorm(node.attr("epsilon")), list(node.inputs)
    if op == OpType.Gelu:
        return _gelu(node.attr("approximate")), [node.inputs[0]]
    if op in F32_UNARY:
        return _unary(F32_UNARY[op]), [node.inputs[0]]
    scalar = const_scalar(cx.graph, node.inputs[1]) if len(node.inputs) == 2 else None
    if op == OpType.Pow:
        return _pow(node, scalar), [node.inputs[0]]
    if op in BINARY:
        if scalar is not None:
            return _binary(BINARY[op], f32_bits(scalar)), [node.inputs[0]]
        return _binary(BINARY[op], None), list(node.inputs)
    raise UnsupportedOpError(node.name, op.value, "no elementwise kernel")


def lower_elementwise(cx: LowerContext, node: Node) -> list[list[Step]]:
    out_value = node.outputs[0]
    out_view = cx.view(out_value)
    shape = out_view.shape
    int8_relu = node.op == OpType.Relu and cx.dtype(node.inputs[0]) is DType.i8
    body, tiles_in = (None, [node.inputs[0]]) if int8_relu else f32_body(cx, node)
    in_views = [cx.view(v) for v in tiles_in]
    if node.op == OpType.BatchNorm:
        in_views[1:] = _channel_views(cx, node)
    in_views = [v.broadcast_to(shape) for v in in_views]
    deq = [cx.dtype(v) is DType.i8 and not int8_relu for v in tiles_in]
    out_dt = out_view.dtype
    # bytes per output element: raw inputs, their float copies, the output, one scratch tile
    per_elem = sum(v.dtype.size for v in in_views) + 4 * sum(deq) + out_dt.size + 4
    probe = TileArena(cx.config, 0)
    budget = largest_fitting(1 << 15, lambda e: probe.fits([e * per_elem + 64 * 8]))
    steps = []
    for block in blocks(shape, budget):
        arena = TileArena(cx.config, len(steps))
        parts = [block.of(v) for v in in_views]
        n = parts[0].size if parts else block.of(out_view).size
        raw = [arena.tile(p.size * p.dtype.size) for p in parts]
        f32_tiles = [arena.tile(n * 4) if d else r for r, d in zip(raw, deq, strict=True)]
        out = arena.tile(n * out_dt.size)
        tmp = arena.tile(n * 4)
        scales = [cx.scale(v) for v in tiles_in]

        def compute(em: Emitter, raw=raw, f32_tiles=f32_tiles, out=out, tmp=tmp, n=n, scales=scales) -> None:
            if int8_relu:
                em.b.v_relu(*em.regs(out, raw[0]), n, "i8")
                return
            for r, f, d, s in zip(raw, f32_tiles, deq, scales, strict=True):
                if d:
                    dequantize(em, f, r, n, s)
            body(em, out, list(f32_tiles), n, tmp)

        loads = list(zip(parts, raw, strict=True))
        steps.append(Step(loads, [(Unit.vector, compute)], [(out, block.of(out_view))]))
    return [steps]


LOWERINGS = {op: lower_elementwise for op in (*F32_UNARY, *BINARY, OpType.Gelu, OpType.Pow, OpType.BatchNorm)}
