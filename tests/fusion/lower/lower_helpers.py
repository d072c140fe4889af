"""Shared checks for the lowering tests: compile -> simulate (checked mode) against the numpy reference.

fp32: |compiled - reference| <= FP32_TOL * max(1, max|reference|) elementwise (the matrix unit sums k-slices
in another order than numpy). int8: bit-exact against `run_quantized` with the same calibrated parameters.
"""

from __future__ import annotations

import numpy as np

from fusion.graph.ir import Graph
from fusion.lower.compiler import CompiledModel, compile
from fusion.reference.interpreter import run
from fusion.reference.quantized import run_quantized

FP32_TOL = 1e-5


def random_inputs(graph: Graph, seed: int = 0, positive: bool = False) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for v in graph.inputs:
        x = rng.standard_normal(graph.types[v].shape).astype(np.float32)
        out[v] = np.abs(x) + np.float32(0.1) if positive else x
    return out


def check_fp32(graph: Graph, inputs: dict[str, np.ndarray], config: str = "tiny") -> tuple[CompiledModel, object]:
    model = compile(graph, config, "fp32", cleanup=False)
    got, counters = model.run(inputs, checked=True)
    want = run(graph, inputs)
    for name in graph.outputs:
        scale = max(1.0, float(np.max(np.abs(want[name]), initial=0.0)))
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=FP32_TOL * scale, err_msg=name)
    return model, counters


def check_int8(graph: Graph, inputs: dict[str, np.ndarray], config: str = "tiny") -> CompiledModel:
    model = compile(graph, config, "int8", samples=[inputs], cleanup=False)
    got, _ = model.run(inputs, checked=True)
    want = run_quantized(graph, inputs, model.params)
    for name in graph.outputs:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    return model


def check_both(graph: Graph, seed: int = 0, config: str = "tiny", positive: bool = False) -> None:
    inputs = random_inputs(graph, seed, positive)
    check_fp32(graph, inputs, config)
    check_int8(graph, inputs, config)
