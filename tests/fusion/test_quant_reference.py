"""The quantized reference: integer GEMM/conv pipelines computed by hand, scale-preserving ops, calibration."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType
from fusion.quant.calibrate import METHODS, calibrate
from fusion.quant.params import QuantizationError, QuantParams, quantization_mse
from fusion.reference.interpreter import evaluate, run
from fusion.reference.quantized import evaluate_quantized, run_quantized


def _gemm_graph():
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    x = b.input("x", (3, 5))
    w = b.constant(rng.standard_normal((5, 4)).astype(np.float32), name="w")
    bias = b.constant(rng.standard_normal(4).astype(np.float32), name="bias")
    y = b.op(OpType.Gemm, x, w, bias, name="y")
    r = b.op(OpType.Relu, y, name="r")
    s = b.op(OpType.Sigmoid, r, name="s")
    b.output(r, s)
    return b.build(), rng.standard_normal((3, 5)).astype(np.float32)


def test_gemm_is_integer_exact() -> None:
    """Recompute the int8 pipeline independently with numpy integers and Python's integer shifts."""
    graph, x = _gemm_graph()
    params = QuantParams({"x": 0.02, "w": 0.015, "bias": 0.01, "y": 0.05, "r": 0.05, "s": 0.01})
    env = evaluate_quantized(graph, {"x": x}, params)
    xq = np.clip(np.rint(x * np.float32(1 / 0.02)), -128, 127).astype(int)
    wq = np.clip(np.rint(graph.constants["w"] * np.float32(1 / 0.015)), -128, 127).astype(int)
    bq = np.rint(graph.constants["bias"].astype(np.float64) / (0.02 * 0.015)).astype(int)
    real = 0.02 * 0.015 / 0.05
    frac, exp = math.frexp(real)
    mult, shift = round(frac * 2**31), 31 - exp
    want = [
        [max(-128, min(127, (int(acc) * mult + (1 << (shift - 1))) >> shift)) for acc in row]
        for row in (xq @ wq + bq).tolist()
    ]
    assert env["y"].data.tolist() == want and env["y"].scale == 0.05
    assert env["r"].data.tolist() == np.maximum(np.array(want), 0).tolist() and env["r"].scale == 0.05
    assert env["s"].scale is None  # non-linear ops run in float32


def test_conv_maxpool_stay_int8_and_match_float_closely() -> None:
    rng = np.random.default_rng(1)
    b = GraphBuilder()
    x = b.input("x", (1, 3, 8, 8))
    c = b.op(
        OpType.Conv,
        x,
        b.constant(rng.standard_normal((4, 3, 3, 3)).astype(np.float32)),
        strides=(1, 1),
        pads=(1,) * 4,
        dilations=(1, 1),
        group=1,
    )
    p = b.op(OpType.MaxPool, c, kernel=(2, 2), strides=(2, 2), pads=(0,) * 4, dilations=(1, 1), ceil_mode=0)
    b.output(p)
    graph = b.build()
    samples = [{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(4)]
    params = calibrate(graph, samples)
    env = evaluate_quantized(graph, samples[0], params)
    assert env[p].data.dtype == np.int8 and env[p].scale == params.scale(c)
    want = run(graph, samples[0])[p]
    assert np.max(np.abs(env[p].real() - want)) <= 0.05 * np.max(np.abs(want))


def test_missing_scale_is_a_clear_error() -> None:
    graph, x = _gemm_graph()
    with pytest.raises(QuantizationError, match="'x'"):
        run_quantized(graph, {"x": x}, QuantParams({}))


def test_calibration_scales_cover_the_observed_range() -> None:
    graph, x = _gemm_graph()
    params = calibrate(graph, [{"x": x}, {"x": 2 * x}], method="max")
    assert params.scale("x") == pytest.approx(np.max(np.abs(2 * x)) / 127)
    assert params.scale("w") == pytest.approx(np.max(np.abs(graph.constants["w"])) / 127)
    with pytest.raises(QuantizationError, match="at least one"):
        calibrate(graph, [])


@pytest.mark.parametrize("method", METHODS)
def test_every_calibration_method_refuses_non_finite_data(method) -> None:
    graph, x = _gemm_graph()
    bad = x.copy()
    bad.flat[0] = np.nan
    with pytest.raises(QuantizationError, match="'x'.*non-finite"):
        calibrate(graph, [{"x": x}, {"x": bad}], method=method)
    with pytest.raises(QuantizationError, match="method"):
        calibrate(graph, [{"x": x}], method="entropy")


def test_mse_calibration_has_no_more_round_trip_error_than_max_abs() -> None:
    """Per value over all samples (constants once): the MSE method's scale never adds squared error."""
    graph, x = _gemm_graph()
    samples = [{"x": x}, {"x": 3 * x}]
    by_max, by_mse = calibrate(graph, samples), calibrate(graph, samples, method="mse")
    envs = [evaluate(graph, s) for s in samples]
    for value, scale in by_mse.scales.items():
        data = graph.constants[value] if value in graph.constants else np.concatenate([e[value].ravel() for e in envs])
        assert scale <= by_max.scale(value)
        assert quantization_mse(data, scale) <= quantization_mse(data, by_max.scale(value))
    y = graph.outputs[0]
    want = evaluate(graph, samples[0])[y]
    assert np.max(np.abs(run_quantized(graph, samples[0], by_mse)[y] - want)) <= 0.05 * np.max(np.abs(want))
