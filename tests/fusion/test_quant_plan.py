"""The quantization plan says which values are int8 at which scale; the int8 reference follows it exactly."""

from __future__ import annotations

import numpy as np
import pytest
from fusion_helpers import MODEL_NAMES, MODELS_DIR, random_inputs

from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import MATRIX_OPS, OpType
from fusion.onnx_import.importer import import_model
from fusion.passes.pipeline import cleanup
from fusion.quant.calibrate import calibrate
from fusion.quant.params import QuantParams, requant_params
from fusion.quant.plan import plan_quantization
from fusion.reference.quantized import evaluate_quantized


def test_plan_rules_on_a_small_graph() -> None:
    b = GraphBuilder()
    x = b.input("x", (4, 8))
    y = b.op(OpType.MatMul, x, b.constant(np.ones((8, 8), np.float32), name="w"), name="y")
    r = b.op(OpType.Relu, y, name="r")
    t = b.op(OpType.Reshape, r, shape=(32,), name="t")
    s = b.op(OpType.Softmax, r, axis=1, name="s")
    z = b.op(OpType.MatMul, s, b.constant(np.ones((8, 8), np.float32), name="w2"), name="z")
    c = b.op(OpType.Concat, r, z, axis=0, name="c")  # int8 inputs at two scales: float32
    b.output(t, c)
    g = b.build()
    params = QuantParams({"x": 0.1, "w": 0.01, "y": 0.5, "r": 0.4, "s": 0.004, "w2": 0.02, "z": 0.25})
    plan = plan_quantization(g, params)
    assert plan.scales["x"] is None and plan.scales["w"] is None
    # y's only reader is a Relu: its clamp folds into y's requantization, at the Relu's calibrated scale
    assert plan.scales["y"] == plan.scales["r"] == plan.scales["t"] == 0.4
    assert plan.scales["s"] is None and plan.scales["z"] == 0.25 and plan.scales["c"] is None
    q = plan.matrix["y"]
    assert (q.input_scale, q.weight_scale, q.output_scale) == (0.1, 0.01, 0.4)
    assert (q.mult, q.shift) == requant_params(0.1 * 0.01 / 0.4) and not q.per_channel
    assert plan.matrix["z"].input_scale == 0.004, "a float32 operand is quantized at its calibrated scale"


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_reference_follows_the_plan(name) -> None:
    graph = cleanup(import_model(MODELS_DIR / f"{name}.onnx"))
    inputs = random_inputs(graph)
    params = calibrate(graph, [inputs])
    plan = plan_quantization(graph, params)
    env = evaluate_quantized(graph, inputs, params)
    for value, scale in plan.scales.items():
        assert env[value].scale == scale, value
        assert env[value].data.dtype == (np.int8 if scale is not None else graph.types[value].dtype.numpy)
    assert set(plan.matrix) == {n.name for n in graph.nodes if n.op in MATRIX_OPS}
