"""int8 as deployed: per-output-channel Conv weights, a Relu folded into the requantization and a Conv read only by
Adds dequantized in its epilogue, in the plan and the quantized reference, against an independent float emulation
(numpy float64 convolution, real rescale factors), and the dequantizing epilogue lowered bit-exact."""

from __future__ import annotations

import numpy as np
import pytest
from fusion_helpers import MODELS_DIR

from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType
from fusion.lower.compiler import compile
from fusion.onnx_import.importer import import_model
from fusion.passes.pipeline import cleanup
from fusion.quant.calibrate import calibrate
from fusion.quant.params import QuantParams
from fusion.quant.plan import plan_quantization
from fusion.reference.quantized import evaluate_quantized, run_quantized


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


def _residual_graph(seed: int):
    """x -> Conv "a" (read by the Add and a Relu) and Conv "b" (read only by the Add): y = Relu(a + b); c, a
    third Conv read only by an Add, is also a graph output."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", (1, 3, 6, 6))
    attrs = {"pads": (1, 1, 1, 1), "strides": (1, 1), "dilations": (1, 1), "group": 1}
    spread = np.geomspace(0.02, 3.0, 4).astype(np.float32).reshape(4, 1, 1, 1)
    convs = {}
    for name in ("a", "b", "c"):
        w = b.constant((rng.standard_normal((4, 3, 3, 3)) * spread).astype(np.float32), name=f"w{name}")
        bias = b.constant(rng.standard_normal(4).astype(np.float32), name=f"bias{name}")
        convs[name] = b.op(OpType.Conv, x, w, bias, name=name, **attrs)
    s = b.op(OpType.Add, convs["a"], convs["b"], name="s")
    y = b.op(OpType.Relu, s, name="y")
    side = b.op(OpType.Relu, convs["a"], name="side")
    t = b.op(OpType.Add, convs["c"], side, name="t")
    b.output(y, t, convs["c"])
    return b.build(), rng.standard_normal((1, 3, 6, 6)).astype(np.float32)


def test_only_a_conv_read_only_by_adds_dequantizes() -> None:
    graph, x = _residual_graph(0)
    plan = plan_quantization(graph, calibrate(graph, [{"x": x}]))
    assert plan.matrix["b"].dequantize and plan.scales["b"] is None, "read only by an Add: float32 out"
    assert not plan.matrix["a"].dequantize and plan.scales["a"] is not None, "a Relu reads it too"
    assert not plan.matrix["c"].dequantize and plan.scales["c"] is not None, "a graph output"


@pytest.mark.parametrize("seed", range(3))
def test_dequantized_conv_is_f32_accumulator_times_channel_scale(seed: int) -> None:
    """f32(acc + bias) * f32(s_x * s_w[c]) exactly, acc from an independent integer emulation (bias correction
    off, so the int32 bias is the plain rounded one)."""
    graph, x = _residual_graph(seed)
    params = calibrate(graph, [{"x": x}], bias_correction=False)
    q = plan_quantization(graph, params).matrix["b"]
    w = graph.constants["wb"]
    scales = np.abs(w).reshape(4, -1).max(axis=1).astype(np.float64) / 127
    np.testing.assert_allclose(q.weight_scales(), scales, rtol=1e-6)
    wq = np.clip(np.rint(w.astype(np.float64) / scales.reshape(4, 1, 1, 1)), -127, 127)
    sx = params.scale("x")
    xq = np.clip(np.rint(x.astype(np.float64) / sx), -128, 127)
    bias = np.rint(graph.constants["biasb"].astype(np.float64) / (sx * scales))
    acc = _float_conv(xq, wq) + bias.reshape(1, 4, 1, 1)  # integers, exact in float64
    want = acc.astype(np.float32) * (sx * scales).astype(np.float32).reshape(1, 4, 1, 1)
    got = evaluate_quantized(graph, {"x": x}, params)["b"]
    assert got.scale is None and got.data.dtype == np.float32
    np.testing.assert_array_equal(got.data, want)


def test_dequantizing_conv_lowers_bit_exact() -> None:
    """The baseline's GEMM epilogue (v.cvt + per-row v.mul.vc) against the quantized reference, checked mode."""
    graph, x = _residual_graph(1)
    model = compile(graph, "tiny", "int8", samples=[{"x": x}], cleanup=False)
    assert model.plan is not None and model.plan.matrix["b"].dequantize
    got, _ = model.run({"x": x}, checked=True)
    want = run_quantized(graph, {"x": x}, model.params)
    for name in graph.outputs:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
