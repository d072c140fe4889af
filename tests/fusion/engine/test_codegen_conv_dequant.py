"""int8 Convs whose output only Adds read are dequantized in their epilogue (`MatrixQuant.dequantize`: float32
f32(acc + bias) * f32(s_in * s_w[c]), no requantization): each conv schedule (band, packed, patch-stationary)
drains f32(acc + bias) and multiplies each output channel by its scale on the vector unit. Checked bit-exact
against the quantized reference in the simulator's race-checked mode, over conv variants (hypothesis)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from engine_helpers import context, run_group
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fusion.engine.errors import CodegenError
from fusion.engine.plan import Group
from fusion.graph.builder import GraphBuilder
from fusion.graph.ir import Graph
from fusion.graph.ops import OpType

STRATEGIES = ("implicit_gemm", "implicit_packed", "implicit_stationary")


def residual_graph(c: int, cout: int, size: int, kernel: int, stride: int, pad: int, seed: int = 5) -> Graph:
    """conv(x) + shortcut -> Relu, the shortcut a strided 1x1 conv of x (also read only by the Add): both convs
    dequantize."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("residual")
    x = b.input("x", (1, c, size, size))

    def conv(name: str, k: int, p: int) -> str:
        w = (rng.standard_normal((cout, c, k, k)) / math.sqrt(c * k * k)).astype(np.float32)
        bias = (rng.standard_normal(cout) * 0.1).astype(np.float32)
        attrs = {"pads": (p,) * 4, "strides": (stride, stride), "dilations": (1, 1), "group": 1}
        return b.op(OpType.Conv, x, b.constant(w, f"{name}_w"), b.constant(bias, f"{name}_b"), name=name, **attrs)

    main, short = conv("conv", kernel, pad), conv("short", 1, 0)
    b.output(b.op(OpType.Relu, b.op(OpType.Add, main, short, name="add"), name="relu"))
    return b.build()


def _check(graph: Graph, strategy: str, node: str) -> bool:
    """Run `node` alone with `strategy`; False when the generator refuses the shape (asserted exact otherwise)."""
    rng = np.random.default_rng(1)
    inputs = {"x": rng.standard_normal(graph.types["x"].shape).astype(np.float32)}
    mc = context(graph, inputs, "int8")
    assert mc.qplan.matrix[node].dequantize and mc.scale(graph.node(node).outputs[0]) is None
    try:
        _, run, env = run_group(mc, Group((node,), strategy), inputs)
    except CodegenError:
        return False
    out = graph.node(node).outputs[0]
    assert run.outputs[out].dtype == np.float32
    np.testing.assert_array_equal(run.outputs[out], env[out])
    return True


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_dequantizing_conv_is_bit_exact_in_every_schedule(strategy: str) -> None:
    graph = residual_graph(c=16, cout=32, size=8, kernel=3, stride=1, pad=1)
    assert _check(graph, strategy, "conv")


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_strided_pointwise_shortcut_dequantizes(strategy: str) -> None:
    graph = residual_graph(c=32, cout=32, size=8, kernel=3, stride=2, pad=1)
    assert _check(graph, strategy, "short")


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    c=st.sampled_from([3, 16, 24]),
    cout=st.sampled_from([16, 24, 40]),
    size=st.integers(5, 12),
    kernel=st.sampled_from([1, 3]),
    stride=st.sampled_from([1, 2]),
    strategy=st.sampled_from(STRATEGIES),
)
def test_dequantizing_conv_variants(c: int, cout: int, size: int, kernel: int, stride: int, strategy: str) -> None:
    graph = residual_graph(c, cout, size, kernel, stride, kernel // 2)
    _check(graph, strategy, "conv")
