"""Bias correction: a conv/gemm's bias less the mean shift its weight's rounding causes, (W_q - W) E[x], with E[x]
from calibration. Checked against float64 convolutions written out here (no code shared with the reference's
windows), on the mean shift it must remove, and bit for bit between the lowering and the quantized reference."""

from __future__ import annotations

import numpy as np
import pytest

from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType
from fusion.lower.compiler import compile
from fusion.quant.calibrate import calibrate
from fusion.quant.params import QuantizationError, QuantParams
from fusion.quant.plan import plan_quantization
from fusion.reference.interpreter import evaluate
from fusion.reference.quantized import evaluate_quantized, run_quantized


def _conv_graph(seed: int, groups: int = 1, stride: int = 1, shape=(2, 4, 7, 7)):
    """A Conv over an input with a large positive mean whose weights are one large tap per channel and small ones
    of 0.2-0.45 int8 steps, all of the channel's sign: each rounds to 0, so rounding shifts every output
    channel's mean by a planted amount."""
    rng = np.random.default_rng(seed)
    cout, cin = 8, shape[1]
    sign = rng.choice([-1.0, 1.0], (cout, 1, 1, 1))
    w = (sign * rng.uniform(0.2, 0.45, (cout, cin // groups, 3, 3)) * 2.0 / 127).astype(np.float32)
    w[:, 0, 1, 1] = rng.choice([-1.0, 1.0], cout) * 2.0
    b = GraphBuilder()
    x = b.input("x", shape)
    weight = b.constant(w, name="w")
    bias = b.constant(rng.standard_normal(cout).astype(np.float32) * 0.1, name="bias")
    y = b.op(OpType.Conv, x, weight, bias, pads=(1, 0, 2, 1), strides=(stride, stride), dilations=(1, 1), group=groups)
    b.output(y)
    inputs = {"x": (3.0 + 0.5 * rng.standard_normal(shape)).astype(np.float32)}
    return b.build(), inputs


def _float_conv(node, x: np.ndarray, w: np.ndarray, out: tuple[int, int]) -> np.ndarray:
    """Conv in float64 tap by tap over an explicitly padded input (pads begin..., end...)."""
    top, left, bottom, right = node.attr("pads")
    sh, sw = node.attr("strides")
    groups = node.attr("group")
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (top, bottom), (left, right)))
    cin, cout = x.shape[1] // groups, w.shape[0] // groups
    y = np.zeros((x.shape[0], w.shape[0], *out))
    for g in range(groups):
        for kh in range(w.shape[2]):
            for kw in range(w.shape[3]):
                taps = xp[:, g * cin : (g + 1) * cin, kh : kh + sh * out[0] : sh, kw : kw + sw * out[1] : sw]
                wg = w[g * cout : (g + 1) * cout, :, kh, kw].astype(np.float64)
                y[:, g * cout : (g + 1) * cout] += np.einsum("nchw,oc->nohw", taps, wg)
    return y


@pytest.mark.parametrize(("groups", "stride"), [(1, 1), (2, 2), (4, 1)])
def test_conv_bias_shift_is_the_mean_of_the_weight_error_convolved(groups: int, stride: int) -> None:
    graph, inputs = _conv_graph(groups, groups, stride)
    node = graph.nodes[0]
    q = plan_quantization(graph, calibrate(graph, [inputs])).matrix[node.name]
    w = graph.constants["w"].astype(np.float64)
    scales = np.abs(w).reshape(w.shape[0], -1).max(axis=1) / 127
    error = np.clip(np.rint(w / scales[:, None, None, None]), -127, 127) * scales[:, None, None, None] - w
    out = graph.types[node.outputs[0]].shape[2:]
    want = _float_conv(node, inputs["x"], error, out).mean(axis=(0, 2, 3))
    assert np.abs(want).max() > 1e-3, "the planted weight error must shift the means"
    np.testing.assert_allclose(q.bias_shift, want, rtol=1e-9, atol=1e-12)


def test_gemm_bias_shift_is_the_mean_row_times_the_weight_error() -> None:
    rng = np.random.default_rng(5)
    b = GraphBuilder()
    x = b.input("x", (3, 2, 8))
    w = (rng.standard_normal((8, 5)) * 0.05).astype(np.float32)
    w[0] = 2.0
    y = b.op(OpType.MatMul, x, b.constant(w, name="w"), name="y")
    z = b.op(OpType.Gemm, b.op(OpType.Reshape, y, shape=(6, 5)), b.constant(w[:5], name="w2"),
             b.constant(np.zeros(5, np.float32), name="c"), name="z")  # fmt: skip
    b.output(z)
    graph = b.build()
    inputs = {"x": (2.0 + rng.standard_normal((3, 2, 8))).astype(np.float32)}
    params = calibrate(graph, [inputs])
    plan = plan_quantization(graph, params)
    assert plan.matrix["y"].bias_shift == (), "a MatMul without a bias has nothing to correct"
    w2 = graph.constants["w2"].astype(np.float64)
    sw = params.scale("w2")
    error = np.clip(np.rint(w2 * np.float32(1 / sw)), -128, 127) * sw - w2
    rows = evaluate(graph, inputs)[graph.nodes[1].outputs[0]].astype(np.float64)
    np.testing.assert_allclose(plan.matrix["z"].bias_shift, rows.mean(axis=0) @ error, rtol=1e-9, atol=1e-12)


def _channel_mean_error(graph, inputs, params) -> np.ndarray:
    y = graph.outputs[0]
    got = evaluate_quantized(graph, inputs, params)[y].real().astype(np.float64)
    return (got - evaluate(graph, inputs)[y]).mean(axis=(0, 2, 3))


@pytest.mark.parametrize("seed", range(3))
def test_bias_correction_removes_the_planted_mean_shift(seed: int) -> None:
    graph, inputs = _conv_graph(seed)
    step = calibrate(graph, [inputs]).scale(graph.outputs[0])
    before = _channel_mean_error(graph, inputs, calibrate(graph, [inputs], bias_correction=False))
    after = _channel_mean_error(graph, inputs, calibrate(graph, [inputs]))
    assert np.abs(before).max() > 2 * step, "the planted shift must exceed the output's rounding"
    assert np.abs(after).max() < 0.25 * np.abs(before).max()
    assert np.abs(after).max() < step


def test_correction_is_measured_over_every_sample() -> None:
    graph, first = _conv_graph(0)
    second = {"x": first["x"] - 2.0}
    both = calibrate(graph, [first, second]).window_mean(graph.nodes[0].name)
    one = [calibrate(graph, [s]).window_mean(graph.nodes[0].name) for s in (first, second)]
    np.testing.assert_allclose(both, (one[0] + one[1]) / 2, rtol=1e-12)


def test_without_bias_correction_nothing_is_measured_or_shifted() -> None:
    graph, inputs = _conv_graph(0)
    params = calibrate(graph, [inputs], bias_correction=False)
    assert not params.window_means
    assert plan_quantization(graph, params).matrix[graph.nodes[0].name].bias_shift == ()


def test_params_with_a_window_mean_of_another_shape_are_a_clear_error() -> None:
    graph, inputs = _conv_graph(0)
    params = calibrate(graph, [inputs])
    name = graph.nodes[0].name
    wrong = QuantParams(dict(params.scales), {name: ((1.0, 2.0),)})
    with pytest.raises(QuantizationError, match=f"node {name!r}.*does not fit its weight"):
        plan_quantization(graph, wrong)
    with pytest.raises(QuantizationError, match="finite"):
        QuantParams(dict(params.scales), {name: ((float("nan"),),)})


@pytest.mark.parametrize("groups", [1, 2])
def test_lowering_equals_the_reference_bit_for_bit_with_corrected_biases(groups: int) -> None:
    graph, inputs = _conv_graph(3, groups, shape=(1, 4, 7, 7))
    model = compile(graph, "tiny", "int8", samples=[inputs], cleanup=False)
    assert any(abs(s) > 0 for s in model.plan.matrix[graph.nodes[0].name].bias_shift)
    got, _ = model.run(inputs, checked=True)
    want = run_quantized(graph, inputs, model.params)[graph.outputs[0]]
    np.testing.assert_array_equal(got[graph.outputs[0]], want)
