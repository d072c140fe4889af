"""Random transformer-like graphs through the dynamic planner: whatever fusions, layouts and schedules it picks,
the outputs equal the reference interpreter's (int8 bit-exact vs the quantized reference), with shadow
validation off (a wrong kernel must not be rescued by the fallback) and the race checker on."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fusion.engine.engine import EngineOptions, FusionEngine
from fusion.engine.validation import ValidationPolicy
from fusion.graph.builder import GraphBuilder
from fusion.graph.ir import Graph
from fusion.graph.ops import OpType
from fusion.reference.interpreter import run
from fusion.reference.quantized import run_quantized


@st.composite
def layers(draw) -> tuple[Graph, dict[str, np.ndarray]]:
    """[Transpose ->] Linear [-> bias] [-> Relu | Gelu] [-> + residual] [-> LayerNorm | Softmax] [-> head split]."""
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    b, s, d = draw(st.sampled_from([1, 2])), draw(st.sampled_from([4, 8])), draw(st.sampled_from([16, 32, 48]))
    n = draw(st.sampled_from([d, 2 * d, 24]))
    g = GraphBuilder("random_layer")
    x = g.input("x", (s, b, d) if draw(st.booleans()) else (b, s, d))
    h = x
    if g.type_of(x).shape[0] == s and b > 1:  # sequence-first input: a Transpose to batch-first, as exporters write
        h = g.op(OpType.Transpose, h, perm=(1, 0, 2))
    w = g.constant((rng.standard_normal((d, n)) / np.sqrt(d)).astype(np.float32))
    h = g.op(OpType.MatMul, h, w)
    if draw(st.booleans()):
        h = g.op(OpType.Add, h, g.constant((rng.standard_normal(n) * 0.1).astype(np.float32)))
    act = draw(st.sampled_from(["none", "relu", "gelu"]))
    if act == "relu":
        h = g.op(OpType.Relu, h)
    elif act == "gelu":
        h = g.op(OpType.Gelu, h, approximate="none")
    if n == d and draw(st.booleans()):
        h = g.op(OpType.Add, h, g.input("r", g.type_of(h).shape))
    tail = draw(st.sampled_from(["none", "layernorm", "softmax", "heads"]))
    if tail == "layernorm":
        gamma = g.constant((1 + 0.1 * rng.standard_normal(n)).astype(np.float32))
        h = g.op(OpType.LayerNorm, h, gamma, g.constant(np.zeros(n, np.float32)), axis=2, epsilon=1e-5)
    elif tail == "softmax":
        h = g.op(OpType.Softmax, h, axis=2)
    elif tail == "heads" and n % 8 == 0:
        h = g.op(OpType.Reshape, h, shape=(b, s, 2, n // 2))
        h = g.op(OpType.Transpose, h, perm=(0, 2, 1, 3))
    g.output(h)
    graph = g.build()
    inputs = {v: rng.standard_normal(graph.types[v].shape).astype(np.float32) for v in graph.inputs}
    return graph, inputs


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layers(), st.sampled_from(["fp32", "int8"]))
def test_dynamic_plans_of_random_layers_equal_the_reference(layer, dtype: str) -> None:
    graph, inputs = layer
    options = EngineOptions(validation=ValidationPolicy("off"), checked=True, workers=1)
    engine = FusionEngine(graph, "base", dtype, options, samples=[inputs])
    result = engine.run(inputs)
    out = graph.outputs[0]
    if dtype == "int8":
        assert engine.mc is not None and engine.mc.params is not None
        np.testing.assert_array_equal(result.outputs[out], run_quantized(graph, inputs, engine.mc.params)[out])
    else:
        np.testing.assert_allclose(result.outputs[out], run(graph, inputs)[out], rtol=1e-4, atol=1e-4)
