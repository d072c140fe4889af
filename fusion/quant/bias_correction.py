"""Empirical bias correction (Nagel et al. 2019, "Data-Free Quantization Through Weight Equalization and Bias
Correction"; Nagel et al. 2021, the quantization white paper, section 4.2): rounding a weight to int8 shifts the
mean of every output channel by (W_q - W) E[x]; subtracting that shift from the channel's bias removes it.

E[x] is what calibration measures (`fusion.quant.calibrate.window_sum`): the mean, over calibration samples and
output positions, of each input window a matrix node multiplies by its weight (a Conv's im2col column, per group:
padding zeros included, so border positions weigh what they really see; a MatMul/Gemm's input row). The plan
turns it into a real shift per output channel (`bias_shift`) once the weight's int8 scales are known; both the
lowering and the quantized reference then quantize the corrected bias through `MatrixQuant.quantize_bias`, so the
correction is only a different int32 bias and exactness between them is untouched.

Only the weight's rounding error is corrected (its mean does not depend on the sample): correcting the
activations' rounding as well, or the shift measured on the int8 network layer by layer, fits the calibration
sample and was worse on other inputs (docs/zoo.md, "int8 accuracy").
"""

from __future__ import annotations

import numpy as np

from fusion.graph.ir import Graph, Node
from fusion.graph.ops import OpType
from fusion.quant.params import QuantizationError


def corrects(graph: Graph, node: Node) -> bool:
    """A matrix node whose bias can absorb the correction: constant weight (a Conv's, or a 2-D MatMul/Gemm
    weight) and a constant bias with one element per output channel."""
    if len(node.inputs) < 3 or not (graph.is_constant(node.inputs[1]) and graph.is_constant(node.inputs[2])):
        return False
    weight = graph.types[node.inputs[1]].shape
    if node.op == OpType.Conv:
        channels = weight[0]
    elif node.op in (OpType.MatMul, OpType.Gemm) and len(weight) == 2:
        channels = weight[1]
    else:
        return False
    return graph.types[node.inputs[2]].shape == (channels,)


def bias_shift(node: Node, weight: np.ndarray, dequantized: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """(W_q - W) E[x] per output channel, float64: what rounding the weight adds to each channel's mean. `mean`
    is `window_sum`'s shape (one row per group)."""
    error = np.asarray(dequantized, np.float64) - np.asarray(weight, np.float64)
    if node.op == OpType.Conv:
        groups = mean.shape[0]
        per_group = error.reshape(groups, error.shape[0] // groups, -1)
        if per_group.shape[2] != mean.shape[1]:
            raise QuantizationError(_mismatch(node, mean.shape, weight.shape))
        return np.einsum("gok,gk->go", per_group, mean).reshape(-1)
    if mean.shape != (1, error.shape[0]):
        raise QuantizationError(_mismatch(node, mean.shape, weight.shape))
    return mean[0] @ error


def _mismatch(node: Node, mean: tuple[int, ...], weight: tuple[int, ...]) -> str:
    return (
        f"node {node.name!r}: calibrated input-window mean of shape {mean} does not fit its weight {weight}; "
        "calibrate the graph it belongs to"
    )
