"""The reference interpreter's int8 mode: the accelerator's exact integer arithmetic, node by node.

Which values are int8 (and at which scale) comes from `fusion.quant.plan`; the arithmetic is implemented here:
- int8 x int8 products accumulate in int32 (wrapping); the bias is added in accumulator units
  (`quantize_bias`); the result is requantized: sat8((acc * mult + 2^(shift-1)) >> shift) computed in int64.
  A Conv with a constant weight is per output channel: weight, bias and (mult, shift) each channel's own. A
  dequantizing node (`MatrixQuant.dequantize`: a Conv only Adds read) is not requantized: float32
  f32(acc) * f32(s_in * s_w[c]).
- An int8 Add (the plan's `int8_add`: a dequantized Conv's float32 output and an int8 value or another such
  output) adds its operands' float32 values (an int8 one as f32(q) * f32(scale)) in float32 and quantizes the
  sum at its output scale, sat8(round_half_even(sum * f32(1 / scale))); a Relu reading it (int8-preserving)
  then clamps at 0.
- A float32 operand of a matrix op is quantized as `v.qnt` does: sat8(round_half_even(x * f32(1 / scale))).
- int8-preserving ops move or compare the int8 data; everything else (softmax, layernorm, gelu, sigmoid, tanh,
  erf, exp, arithmetic, averaging) runs in float32 on dequantized inputs, f32(q) * f32(scale), as the
  accelerator's f32 vector path does. Graph outputs are returned dequantized to float32.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from fusion.graph.ir import Graph, Node
from fusion.graph.ops import MATRIX_OPS, OpType
from fusion.quant.params import QuantParams, quantize_tensor
from fusion.quant.plan import MatrixQuant, QuantPlan, plan_quantization
from fusion.reference.interpreter import check_inputs
from fusion.reference.kernels import evaluate_node, im2col_gemm


@dataclass(frozen=True)
class QValue:
    """A value in the quantized interpreter: int8 data with a scale, or float32 data (scale None)."""

    data: np.ndarray
    scale: float | None = None

    def real(self) -> np.ndarray:
        if self.scale is None:
            return self.data
        return self.data.astype(np.float32) * np.float32(self.scale)


def requantize(acc: np.ndarray, mult: np.ndarray | int, shift: np.ndarray | int) -> np.ndarray:
    """int32 -> int8: sat8((acc * mult + (1 << (shift - 1))) >> shift) in int64, arithmetic shift; mult and
    shift broadcast against acc (per channel: one of each per output channel)."""
    mult, shift = np.asarray(mult, np.int64), np.asarray(shift, np.int64)
    rounding = np.where(shift > 0, np.int64(1) << np.maximum(shift - 1, 0), 0)
    wide = (acc.astype(np.int64) * mult + rounding) >> shift
    return np.clip(wide, -128, 127).astype(np.int8)


def _wrap32(x: np.ndarray) -> np.ndarray:
    """Exact integer-valued float64 sums to int32 with two's-complement wrap."""
    return np.rint(x).astype(np.int64).astype(np.int32)


def _as_int8(value: QValue, scale: float) -> np.ndarray:
    return value.data if value.scale is not None else quantize_tensor(value.data, scale)


def _matrix(graph: Graph, node: Node, args: list[QValue], q: MatrixQuant) -> QValue:
    a = _as_int8(args[0], q.input_scale).astype(np.float64)  # int8 products summed exactly (|sum| < 2^53)
    per_channel = args[1].scale is None and q.per_channel
    w = (q.quantize_weight(args[1].data) if per_channel else _as_int8(args[1], q.weight_scale)).astype(np.float64)
    if node.op == OpType.Conv:
        acc = _wrap32(im2col_gemm(node, a, w, graph.types[node.outputs[0]].shape[2:]))
    else:
        acc = _wrap32(np.matmul(a, w))
    channel_axis = (-1,) + (1,) * (acc.ndim - 2)  # a Conv's output channels (per-channel nodes are Convs)
    if len(node.inputs) > 2:
        bias = q.quantize_bias(args[2].real())
        bias = bias.reshape(channel_axis) if node.op == OpType.Conv else bias
        acc = (acc.astype(np.int64) + bias).astype(np.int32)
    if q.dequantize:
        return QValue(acc.astype(np.float32) * q.dequant_scales().reshape(channel_axis))
    if not q.per_channel:
        return QValue(requantize(acc, q.mult, q.shift), q.output_scale)
    table = q.requant_table()
    return QValue(requantize(acc, table[:, 0].reshape(channel_axis), table[:, 1].reshape(channel_axis)), q.output_scale)


def _node(graph: Graph, node: Node, args: list[QValue], plan: QuantPlan) -> tuple[QValue, ...]:
    shapes = tuple(graph.types[v].shape for v in node.outputs)
    if node.op in MATRIX_OPS:
        return (_matrix(graph, node, args, plan.matrix[node.name]),)
    scale = plan.scales[node.outputs[0]]
    if scale is not None and node.op == OpType.Add:  # an int8 Add: the float32 sum of its operands, quantized
        total = np.add(*(a.real() for a in args), dtype=np.float32)
        return (QValue(quantize_tensor(total, scale), scale),)
    if scale is not None:  # int8 in, int8 out: exact on float32 copies of the int8 data
        raw = tuple(a.data.astype(np.float32) if a.scale is not None else a.data for a in args)
        return tuple(QValue(np.asarray(o).astype(np.int8), scale) for o in evaluate_node(node, raw, shapes))
    outs = evaluate_node(node, tuple(a.real() for a in args), shapes)
    return tuple(
        QValue(np.asarray(o, dtype=graph.types[v].dtype.numpy)) for o, v in zip(outs, node.outputs, strict=True)
    )


def evaluate_quantized(graph: Graph, inputs: Mapping[str, np.ndarray], params: QuantParams) -> dict[str, QValue]:
    """Every value of the graph in int8 mode."""
    plan = plan_quantization(graph, params)
    env: dict[str, QValue] = {k: QValue(v) for k, v in {**graph.constants, **check_inputs(graph, inputs)}.items()}
    for node in graph.nodes:
        outs = _node(graph, node, [env[v] for v in node.inputs], plan)
        env.update(zip(node.outputs, outs, strict=True))
    return env


def run_quantized(graph: Graph, inputs: Mapping[str, np.ndarray], params: QuantParams) -> dict[str, np.ndarray]:
    """The graph's outputs in int8 mode, dequantized to float32."""
    env = evaluate_quantized(graph, inputs, params)
    return {name: env[name].real() for name in graph.outputs}
