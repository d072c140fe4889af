"""int8 as deployed: per-output-channel Conv weights and a Relu folded into the requantization, in the plan and
the quantized reference, against an independent float emulation (numpy float64 convolution, real rescale factors)."""

from __future__ import annotations

import numpy as np
import pytest
from fusion_helpers import MODELS_DIR

from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType
from fusion.onnx_import.importer import import_model
from fusion.passes.pipeline import cleanup
from fusion.quant.calibrate import calibrate
from fusion.quant.params import QuantParams
from fusion.quant.plan import plan_quantization
from fusion.reference.quantized import evaluate_quantized


def _conv_graph(seed: int, relu: bool):
    """A Conv whose output channels have very different weight ranges (BN folding gives such weights)."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", (1, 3, 6, 6))
    spread = np.geomspace(0.01, 4.0, 5).astype(np.float32).reshape(5, 1, 1, 1)
    w = b.constant((rng.standard_normal((5, 3, 3, 3)) * spread).astype(np.float32), name="w")
    bias = b.constant(rng.standard_normal(5).astype(np.float32), name="bias")
    y = b.op(OpType.Conv, x, w, bias, pads=(1, 1, 1, 1), strides=(1, 1), dilations=(1, 1), group=1, name="y")
    out = b.op(OpType.Relu, y, name="r") if relu else y
    b.output(out)
    return b.build(), rng.standard_normal((1, 3, 6, 6)).astype(np.float32)


def _float_conv(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Zero-padded 3x3 stride-1 convolution in float64, written out (no code shared with the reference)."""
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    h, wd = x.shape[2:]
    out = np.zeros((x.shape[0], w.shape[0], h, wd))
    for kh in range(3):
        for kw in range(3):
            out += np.einsum("nchw,oc->nohw", xp[:, :, kh : kh + h, kw : kw + wd], w[:, :, kh, kw].astype(np.float64))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_per_channel_conv_matches_a_float_emulation_within_one_step(seed: int) -> None:
    graph, x = _conv_graph(seed, relu=True)
    params = calibrate(graph, [{"x": x}])
    q = plan_quantization(graph, params).matrix["y"]
    assert q.per_channel and len(q.channels) == 5
    w = graph.constants["w"]
    scales = np.abs(w).reshape(5, -1).max(axis=1).astype(np.float64) / 127
    np.testing.assert_allclose(q.weight_scales(), scales, rtol=1e-6)
    wq = np.clip(np.rint(w / scales.reshape(5, 1, 1, 1)), -127, 127)
    assert (np.abs(wq).reshape(5, -1).max(axis=1) == 127).all(), "every channel uses its whole int8 range"
    xq = np.clip(np.rint(x / params.scale("x")), -128, 127)
    acc = _float_conv(xq, wq) + np.rint(graph.constants["bias"] / (params.scale("x") * scales)).reshape(1, 5, 1, 1)
    real = acc * (params.scale("x") * scales / q.output_scale).reshape(1, 5, 1, 1)
    emulated = np.clip(np.rint(np.maximum(real, 0)), -128, 127)
    got = evaluate_quantized(graph, {"x": x}, params)["r"]
    assert got.scale == q.output_scale == params.scale("r"), "the Relu's scale: its clamp is folded"
    assert np.abs(got.data.astype(np.int64) - emulated).max() <= 1  # (mult, shift) approximates the real factor


def test_folded_relu_only_for_a_lone_relu_reader() -> None:
    b = GraphBuilder()
    x = b.input("x", (2, 4))
    y = b.op(OpType.MatMul, x, b.constant(np.ones((4, 4), np.float32), name="w"), name="y")
    r = b.op(OpType.Relu, y, name="r")
    s = b.op(OpType.Sigmoid, y, name="s")  # a second reader sees negative values: no folding
    b.output(r, s)
    plan = plan_quantization(b.build(), QuantParams({"x": 0.1, "w": 0.01, "y": 0.5, "r": 0.25, "s": 0.01}))
    assert plan.matrix["y"].output_scale == 0.5 and not plan.matrix["y"].per_channel


def test_bundled_resnet_block_convs_are_per_channel() -> None:
    graph = cleanup(import_model(MODELS_DIR / "resnet_block.onnx"))
    rng = np.random.default_rng(3)
    inputs = {v: rng.standard_normal(graph.types[v].shape).astype(np.float32) for v in graph.inputs}
    plan = plan_quantization(graph, calibrate(graph, [inputs]))
    convs = [n for n in graph.nodes if n.op == OpType.Conv]
    assert convs and all(plan.matrix[n.name].per_channel for n in convs)
    for node in convs:
        table = plan.matrix[node.name].requant_table()
        assert table.shape == (graph.types[node.inputs[1]].shape[0], 2) and (table[:, 1] >= 1).all()
