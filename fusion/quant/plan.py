"""Where a quantized graph is int8 and with which parameters: decided once, as data, for the lowering and the
reference interpreter alike (each then does the arithmetic its own way).

Rules (symmetric int8 as deployed by TFLite / ONNX QOperator; see fusion.reference.quantized for the arithmetic):
- Graph inputs and constants are float32.
- MatMul, Gemm, Conv consume int8 operands (a float32 operand is quantized at its calibrated scale), accumulate
  in int32, add the bias in accumulator units, and requantize to int8 at their output's scale.
- A Conv's constant weight is quantized per output channel (max |w| of each channel / 127), so its bias and
  requantizer are per channel too: one (mult, shift) per output channel (`MatrixQuant.channels`).
- A matrix node with a constant weight and a per-channel constant bias has that bias corrected for the weight's
  rounding, (W_q - W) E[x] subtracted, E[x] from calibration (`fusion.quant.bias_correction`).
- A matrix node read only by a Relu takes the Relu's calibrated scale as its output scale: the activation is
  folded into the requantization clamp, as a fused Conv+Relu is deployed, so the int8 steps cover the
  activation's range, not the pre-activation one. (A ReLU6 Clip is not folded: measured on the zoo,
  mobilenet_v2's max error rose from 2.1% to 3.6% of max |y|; docs/zoo.md.)
- A per-channel Conv read only by Adds (a residual block's last conv, a downsample conv; not a graph output)
  is dequantized in its epilogue instead of requantized: float32 out = f32(acc + bias) * f32(s_in * s_w[c])
  (`MatrixQuant.dequantize`, `dequant_scales`), which the Add reads as it is. Measured on the zoo: resnet18
  3.05% -> 2.68% of max |y|, resnet50 2.73% -> 2.06% (docs/zoo.md).
- A residual Add of a dequantized Conv is int8 (`int8_add`: two non-constant operands, each int8 or a dequantized
  Conv's output, at least one the latter): its float32 sum (an int8 operand dequantized at its own scale,
  f32(q) * f32(s)) is quantized at the Add's output scale as `v.qnt` quantizes, or at the scale of the Relu that
  alone reads it (the activation folded into the clamp, as for a matrix node). This is TensorRT's int8 conv +
  residual fusion with an int8 output: a residual block's output is int8 (1 byte an element in DRAM, not 4),
  rounded once. An Add of int8 values alone (two GEMM outputs) stays float32, as before. (Requantizing the Conv
  operand at its own scale first, as TFLite's ADD does, measured 3.34% of max |y| on resnet18's zoo input
  against this scheme's 2.90%, over tests/fusion/zoo's 3% bound.)
- Relu, MaxPool, ReduceMax, Identity, Cast, Reshape, Transpose, Slice, Split, Gather (data operand), Expand,
  Pad (zero pad value) and Concat (all inputs at one scale) on int8 data stay int8 at the same scale.
- Every other operator computes in float32 on dequantized inputs and produces float32.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

import numpy as np

from fusion.graph.ir import Graph, Node
from fusion.graph.ops import MATRIX_OPS, OpType
from fusion.quant.bias_correction import bias_shift, corrects
from fusion.quant.params import QuantParams, quantize_bias, quantize_tensor, requant_params, scale_for

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
class ChannelQuant:
    """One output channel of a per-channel matrix node: its weight scale and requantizer."""

    weight_scale: float
    mult: int
    shift: int


@dataclass(frozen=True)
class MatrixQuant:
    """Integer parameters of one MatMul/Gemm/Conv: operand scales, output scale and the requantizer.

    `channels` empty: per tensor (`weight_scale`, `mult`, `shift`). Otherwise one `ChannelQuant` per output
    channel (a Conv weight's axis 0); `weight_scale`, `mult` and `shift` are then the largest channel's."""

    input_scale: float
    weight_scale: float
    output_scale: float
    mult: int
    shift: int
    channels: tuple[ChannelQuant, ...] = ()
    bias_shift: tuple[float, ...] = ()  # per output channel, real units: subtracted from the bias (bias correction)
    dequantize: bool = False  # float32 out, f32(acc) * `dequant_scales()`: no requantization (mult/shift unused)

    @property
    def per_channel(self) -> bool:
        return bool(self.channels)

    @property
    def accumulator_scale(self) -> float:
        """Real value of one accumulator unit (the bias is quantized at this scale); per tensor only."""
        if self.channels:
            raise ValueError("a per-channel matrix node has one accumulator scale per channel")
        return self.input_scale * self.weight_scale

    def weight_scales(self) -> np.ndarray:
        """The weight scale of every output channel (one element: per tensor), float64."""
        return np.array([c.weight_scale for c in self.channels] or [self.weight_scale], np.float64)

    def quantize_weight(self, weight: np.ndarray) -> np.ndarray:
        """A constant weight to int8 at its scale(s): per channel along axis 0 (`v.qnt`'s rule per channel)."""
        if not self.channels:
            return quantize_tensor(weight, self.weight_scale)
        data = np.asarray(weight, np.float32)
        inv = (1.0 / self.weight_scales()).astype(np.float32).reshape((-1,) + (1,) * (data.ndim - 1))
        return np.clip(np.rint(data * inv), -128, 127).astype(np.int8)

    def quantize_bias(self, bias: np.ndarray) -> np.ndarray:
        """The bias, less its correction (if any), in accumulator units (per channel: each at input_scale * that
        channel's weight scale)."""
        real = np.asarray(bias, np.float64) - np.array(self.bias_shift or 0.0, np.float64)
        return quantize_bias(real, self.input_scale, self.weight_scales() if self.channels else self.weight_scale)

    def dequantize_weight(self, weight: np.ndarray) -> np.ndarray:
        """The real value of the int8 weight `quantize_weight` makes (float64): what the integers compute with."""
        scales = self.weight_scales().reshape((-1,) + (1,) * (np.ndim(weight) - 1))
        return self.quantize_weight(weight).astype(np.float64) * scales

    def dequant_scales(self) -> np.ndarray:
        """float32, one per output channel: the real value of one accumulator unit, f32(s_in * s_w[c]), by which a
        dequantizing epilogue multiplies f32(acc)."""
        return (self.input_scale * self.weight_scales()).astype(np.float32)

    def requant_table(self) -> np.ndarray:
        """int32 (channels x 2): each output channel's (mult, shift), as the per-channel requantizer reads it."""
        rows = [(c.mult, c.shift) for c in self.channels] or [(self.mult, self.shift)]
        return np.array(rows, np.int32)


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


def folded_activation(graph: Graph, node: Node) -> Node | None:
    """The Relu that alone reads a node's output (a matrix node or an int8 Add), whose clamp the quantization
    absorbs; None if none."""
    value = node.outputs[0]
    readers = graph.consumers.get(value, ())
    if value in graph.outputs or len(readers) != 1:
        return None
    return readers[0] if readers[0].op == OpType.Relu else None


def int8_add(graph: Graph, node: Node, scales: Mapping[str, float | None], matrix: Mapping[str, MatrixQuant]) -> bool:
    """An Add whose two operands are int8 values or dequantized Convs' outputs, at least one the latter (none a
    constant): its float32 sum is quantized to int8 (`scales`, `matrix`: the plan so far, which covers the Add's
    inputs)."""
    if node.op != OpType.Add or len(node.inputs) != 2 or any(graph.is_constant(v) for v in node.inputs):
        return False

    def dequantized(value: str) -> bool:
        producer = graph.producers.get(value)
        return producer is not None and producer.name in matrix and matrix[producer.name].dequantize

    convs = [dequantized(v) for v in node.inputs]
    return any(convs) and all(conv or scales[v] is not None for v, conv in zip(node.inputs, convs, strict=True))


def dequantized_output(graph: Graph, node: Node) -> bool:
    """A Conv with a constant (per-channel) weight whose output only Adds read: its epilogue dequantizes."""
    value = node.outputs[0]
    readers = graph.consumers.get(value, ())
    if node.op != OpType.Conv or not graph.is_constant(node.inputs[1]) or value in graph.outputs or not readers:
        return False
    return all(r.op == OpType.Add for r in readers)


def channel_scales(weight: np.ndarray) -> np.ndarray:
    """Symmetric int8 scales of a constant weight, one per output channel (axis 0): max |w| / 127 each."""
    flat = np.abs(np.asarray(weight, np.float64).reshape(weight.shape[0], -1))
    return np.array([scale_for(m) for m in flat.max(axis=1, initial=0.0)], np.float64)


def _matrix_quant(graph: Graph, node: Node, sa: float, sw: float, out: float) -> MatrixQuant:
    weight = node.inputs[1]
    if node.op != OpType.Conv or not graph.is_constant(weight):
        return MatrixQuant(sa, sw, out, *requant_params(sa * sw / out))
    channels = tuple(
        ChannelQuant(float(s), *requant_params(sa * float(s) / out)) for s in channel_scales(graph.constants[weight])
    )
    top = max(channels, key=lambda c: c.weight_scale)
    return MatrixQuant(sa, top.weight_scale, out, top.mult, top.shift, channels)


def _corrected(graph: Graph, node: Node, q: MatrixQuant, params: QuantParams) -> MatrixQuant:
    """q with the node's bias correction, when calibration measured its input windows."""
    mean = params.window_mean(node.name)
    if mean is None or not corrects(graph, node):
        return q
    weight = graph.constants[node.inputs[1]]
    shift = bias_shift(node, weight, q.dequantize_weight(weight), mean)
    return replace(q, bias_shift=tuple(float(v) for v in shift))


def plan_quantization(graph: Graph, params: QuantParams) -> QuantPlan:
    scales: dict[str, float | None] = dict.fromkeys((*graph.inputs, *graph.constants))
    matrix: dict[str, MatrixQuant] = {}
    for node in graph.nodes:
        if node.op in MATRIX_OPS:
            sa, sw = (scales[v] or params.scale(v) for v in node.inputs[:2])
            act = folded_activation(graph, node)
            out = params.scale((act or node).outputs[0])
            q = _corrected(graph, node, _matrix_quant(graph, node, sa, sw, out), params)
            dequantize = dequantized_output(graph, node)
            matrix[node.name] = replace(q, dequantize=True) if dequantize else q
            scales[node.outputs[0]] = None if dequantize else out
            continue
        if int8_add(graph, node, scales, matrix):
            scales[node.outputs[0]] = params.scale((folded_activation(graph, node) or node).outputs[0])
            continue
        ins = {scales[v] for v in _data_inputs(node)}
        keep = _preserves_int8(node) and len(ins) == 1 and None not in ins
        scales.update(dict.fromkeys(node.outputs, ins.pop() if keep else None))
    return QuantPlan(MappingProxyType(scales), MappingProxyType(matrix))
