"""MatMul and Gemm nodes as GEMM pipelines (batched MatMul: one GEMM per broadcast batch index)."""

from __future__ import annotations

from dataclasses import replace
from itertools import product

import numpy as np

from fusion.graph.ir import Node
from fusion.graph.ops import OpType
from fusion.lower.context import CONST_I8, LowerContext, bias_form, const_key
from fusion.lower.emitter import Step
from fusion.lower.errors import LoweringError
from fusion.lower.kernels.gemm import Gemm, Operand, gemm_steps
from fusion.lower.views import View, dense
from isa.enums import DType


def matrix_operand(cx: LowerContext, node: Node, value: str, scale: float | None) -> Operand:
    """An operand of a matrix node: constants come pre-quantized (int8 path); float activations are quantized
    on the device at `scale`."""
    if cx.int8 and cx.graph.is_constant(value):
        return Operand(cx.const_view(value, CONST_I8))
    view = cx.view(value)
    if cx.int8 and cx.scale(value) is None:
        return Operand(view, scale)
    return Operand(view)


CONST_RQNT = "rqnt"  # constant-form key (on a per-channel node's weight) of its (mult, shift) table
CONST_DQNT = "dqnt"  # constant form (per node, on its weight) of a dequantizing node's f32 channel scales


def dequant_form(node: str) -> str:
    """The form of matrix node `node`'s dequantization scales (`MatrixQuant.dequant_scales`), per node."""
    return f"{CONST_DQNT}@{node}"


def requant(cx: LowerContext, node: Node) -> tuple[int, int] | None:
    """The drain's (mult, shift) on the int8 path (None: fp32). A per-channel node (`requant_table`) has no single
    pair: a LoweringError, so a generator that applies one multiplier refuses it instead of mis-scaling."""
    if not cx.int8:
        return None
    q = cx.matrix(node)
    if q.per_channel or q.dequantize:
        raise LoweringError(
            f"node {node.name!r}: int8 per-channel requantization (one (mult, shift) per output channel) needs a "
            "per-channel epilogue"
        )
    return q.mult, q.shift


def requant_table(cx: LowerContext, node: Node) -> View | None:
    """A per-channel node's requantizer: [Cout, 2] int32 (mult, shift) pairs in DRAM (None: per tensor or fp32).
    A dequantizing node has none: a LoweringError, so a generator that would requantize refuses it."""
    if not cx.int8 or not cx.matrix(node).per_channel:
        return None
    if cx.matrix(node).dequantize:
        raise LoweringError(
            f"node {node.name!r}: int8 output dequantized per channel (read only by Adds) needs a dequantizing epilogue"
        )
    channels = len(cx.matrix(node).channels)
    return dense(cx.addresses[const_key(node.inputs[1], CONST_RQNT)], (channels, 2), DType.i32)


def dequant_scales(cx: LowerContext, node: Node) -> View | None:
    """A dequantizing node's [Cout] float32 channel scales in DRAM (None: the node requantizes, or fp32)."""
    if not cx.int8 or not cx.matrix(node).dequantize:
        return None
    channels = len(cx.matrix(node).channels)
    return dense(cx.addresses[const_key(node.inputs[1], dequant_form(node.name))], (channels,), DType.f32)


def bias_view(cx: LowerContext, node: Node) -> View | None:
    if len(node.inputs) < 3:
        return None
    value = node.inputs[2]
    return cx.const_view(value, bias_form(node.name)) if cx.int8 else cx.view(value)


def _scales(cx: LowerContext, node: Node) -> tuple[float | None, float | None]:
    if not cx.int8:
        return None, None
    q = cx.matrix(node)
    return q.input_scale, q.weight_scale


def lower_matmul(cx: LowerContext, node: Node) -> list[list[Step]]:
    sa, sw = _scales(cx, node)
    a = matrix_operand(cx, node, node.inputs[0], sa)
    b = matrix_operand(cx, node, node.inputs[1], sw)
    out = cx.view(node.outputs[0])
    av, bv = a.view, b.view
    if len(av.shape) == 1:
        av = replace(av, shape=(1, *av.shape), strides=(0, *av.strides))
    if len(bv.shape) == 1:
        bv = replace(bv, shape=(*bv.shape, 1), strides=(*bv.strides, 0))
    m, n = av.shape[-2], bv.shape[-1]
    batch = tuple(int(d) for d in np.broadcast_shapes(av.shape[:-2], bv.shape[:-2]))
    out = cx.view(node.outputs[0]).reshape_dense((*batch, m, n))
    bias = bias_view(cx, node)
    if bias is not None:
        bias = bias.broadcast_to((m, n))
    a_full = av.broadcast_to((*batch, m, av.shape[-1]))
    b_full = bv.broadcast_to((*batch, bv.shape[-2], n))
    row_stride = _row_stride(a_full)
    if batch and all(st == 0 for st in b_full.strides[: len(batch)]) and row_stride is not None:
        # one weight matrix for every batch index: fold the batch into the rows of a single GEMM
        rows = int(np.prod(batch)) * m
        a_full = replace(a_full, shape=(rows, a_full.shape[-1]), strides=(row_stride, a_full.strides[-1]))
        b_full = b_full.index((0,) * len(batch))
        out = out.reshape_dense((rows, n))
        batch = ()
    gemms = [
        Gemm(
            Operand(a_full.index(index), a.quantize_scale),
            Operand(b_full.index(index), b.quantize_scale),
            out.index(index),
            bias,
            requant(cx, node),
        )
        for index in product(*(range(d) for d in batch))
    ]
    return [gemm_steps(cx.config, gemms, cx.rotation)]


def _row_stride(view: View) -> int | None:
    """The row stride if every dim but the last forms one evenly strided run of rows (size-1 dims ignored),
    else None."""
    dims = [(d, st) for d, st in zip(view.shape[:-1], view.strides[:-1], strict=True) if d != 1]
    if any(dims[i][1] != dims[i + 1][1] * dims[i + 1][0] for i in range(len(dims) - 1)):
        return None
    return dims[-1][1] if dims else view.shape[-1] * view.dtype.size


LOWERINGS = {OpType.MatMul: lower_matmul, OpType.Gemm: lower_matmul}
