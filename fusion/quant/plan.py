"""Where a quantized graph is int8 and with which parameters: decided once, as data, for the lowering and the
reference interpreter alike (each then does the arithmetic its own way).

Rules (symmetric per-tensor int8; see fusion.reference.quantized for the arithmetic):
- Graph inputs and constants are float32.
- MatMul, Gemm, Conv consume int8 operands (a float32 operand is quantized at its calibrated scale), accumulate
  in int32, add the bias in accumulator units, and requantize to int8 at their output's calibrated scale.
- Relu, MaxPool, ReduceMax, Identity, Cast, Reshape, Transpose, Slice, Split, Gather (data operand), Expand,
  Pad (zero pad value) and Concat (all inputs at one scale) on int8 data stay int8 at the same scale.
- Every other operator computes in float32 on dequantized inputs and produces float32.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from fusion.graph.ir import Graph, Node
from fusion.graph.ops import MATRIX_OPS, OpType
from fusion.quant.params import QuantParams, requant_params

INT8_PRESERVING = frozenset(
    {
        OpType.Relu,
        OpType.MaxPool,
        OpType.Identity,
        OpType.Reshape,
        OpType.Transpose,
        OpType.Slice,
        OpType.Split,
        OpType.Gather,
        OpType.Concat,
        OpType.ReduceMax,
        OpType.Cast,
        OpType.Expand,
        OpType.Pad,
    }
)


@dataclass(frozen=True)
class MatrixQuant:
    """Integer parameters of one MatMul/Gemm/Conv: operand scales, output scale and the requantizer."""

    input_scale: float
    weight_scale: float
    output_scale: float
    mult: int
    shift: int

    @property
    def accumulator_scale(self) -> float:
        """Real value of one accumulator unit (the bias is quantized at this scale)."""
        return self.input_scale * self.weight_scale


@dataclass(frozen=True)
class QuantPlan:
    """value -> int8 scale (None: the value is float32); matrix node name -> its MatrixQuant."""

    scales: Mapping[str, float | None]
    matrix: Mapping[str, MatrixQuant]


def _data_inputs(node: Node) -> tuple[str, ...]:
    return node.inputs[:1] if node.op == OpType.Gather else node.inputs


def _preserves_int8(node: Node) -> bool:
    """A constant-mode Pad moves int8 data unchanged only with a zero pad value (0 quantizes to 0 at any scale)."""
    if node.op == OpType.Pad and node.attr("mode") == "constant":
        return float(node.attr("value")) == 0.0
    return node.op in INT8_PRESERVING


def plan_quantization(graph: Graph, params: QuantParams) -> QuantPlan:
    scales: dict[str, float | None] = dict.fromkeys((*graph.inputs, *graph.constants))
    matrix: dict[str, MatrixQuant] = {}
    for node in graph.nodes:
        if node.op in MATRIX_OPS:
            sa, sw = (scales[v] or params.scale(v) for v in node.inputs[:2])
            out = params.scale(node.outputs[0])
            matrix[node.name] = MatrixQuant(sa, sw, out, *requant_params(sa * sw / out))
            scales[node.outputs[0]] = out
            continue
        ins = {scales[v] for v in _data_inputs(node)}
        keep = _preserves_int8(node) and len(ins) == 1 and None not in ins
        scales.update(dict.fromkeys(node.outputs, ins.pop() if keep else None))
    return QuantPlan(MappingProxyType(scales), MappingProxyType(matrix))
