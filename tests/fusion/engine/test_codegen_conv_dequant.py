"""int8 Convs whose output only Adds read are dequantized in their epilogue (`MatrixQuant.dequantize`: float32
f32(acc + bias) * f32(s_in * s_w[c]), no requantization): each conv schedule (band, packed, patch-stationary)
drains f32(acc + bias) and multiplies each output channel by its scale on the vector unit. Checked bit-exact
against the quantized reference in the simulator's race-checked mode, over conv variants (hypothesis). An absorbed
residual Add is int8 (`fusion.quant.plan.int8_add`): the float32 sum (then the Relu) quantized at its scale in
the kernel, so the block's output leaves the kernel as int8."""

from __future__ import annotations

import math

import numpy as np
import pytest
from engine_helpers import context, run_group
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fusion.engine.engine import EngineOptions, FusionEngine
from fusion.engine.errors import CodegenError
from fusion.engine.legality import numerics_preserved
from fusion.engine.plan import Group
from fusion.graph.builder import GraphBuilder
from fusion.graph.ir import Graph
from fusion.graph.ops import OpType
from fusion.reference.quantized import run_quantized

STRATEGIES = ("implicit_gemm", "implicit_packed", "implicit_stationary")


def residual_graph(
    c: int, cout: int, size: int, kernel: int, stride: int, pad: int, seed: int = 5, int8_shortcut: bool = False
) -> Graph:
    """conv(x) + shortcut -> Relu, the shortcut a strided 1x1 conv of x (also read only by the Add): both convs
    dequantize; `int8_shortcut`: a Relu after the shortcut conv (folded into its requantization: an int8
    shortcut, read dequantized by the float Add)."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("residual")
    x = b.input("x", (1, c, size, size))

    def conv(name: str, k: int, p: int) -> str:
        w = (rng.standard_normal((cout, c, k, k)) / math.sqrt(c * k * k)).astype(np.float32)
        bias = (rng.standard_normal(cout) * 0.1).astype(np.float32)
        attrs = {"pads": (p,) * 4, "strides": (stride, stride), "dilations": (1, 1), "group": 1}
        return b.op(OpType.Conv, x, b.constant(w, f"{name}_w"), b.constant(bias, f"{name}_b"), name=name, **attrs)

    main, short = conv("conv", kernel, pad), conv("short", 1, 0)
    if int8_shortcut:
        short = b.op(OpType.Relu, short, name="short_relu")
    b.output(b.op(OpType.Relu, b.op(OpType.Add, main, short, name="add"), name="relu"))
    return b.build()


def _check(graph: Graph, strategy: str, node: str, *absorbed: str) -> bool:
    """Run `node` (and the `absorbed` Add, Relu) with `strategy`; False when the generator refuses the shape
    (asserted exact otherwise)."""
    rng = np.random.default_rng(1)
    inputs = {"x": rng.standard_normal(graph.types["x"].shape).astype(np.float32)}
    mc = context(graph, inputs, "int8")
    assert mc.qplan.matrix[node].dequantize and mc.scale(graph.node(node).outputs[0]) is None
    try:
        _, run, env = run_group(mc, Group((node, *absorbed), strategy), inputs)
    except CodegenError:
        return False
    out = graph.node((node, *absorbed)[-1]).outputs[0]
    assert run.outputs[out].dtype == (np.int8 if "add" in absorbed else np.float32)
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


@pytest.mark.parametrize("strategy", ["implicit_gemm", "implicit_packed"])
@pytest.mark.parametrize("int8_shortcut", [False, True])
def test_the_residual_add_and_relu_run_in_float_after_the_rescale(strategy: str, int8_shortcut: bool) -> None:
    """Conv + Add + Relu in one kernel: the Add reads the dequantized conv output as the unfused Add does (no
    requantization is skipped), the shortcut float32 or int8 (dequantized in the kernel), and the sum after the
    Relu is quantized at the Add's (folded) scale: an int8 output."""
    graph = residual_graph(c=16, cout=32, size=8, kernel=3, stride=1, pad=1, int8_shortcut=int8_shortcut)
    assert _check(graph, strategy, "conv", "add", "relu")


def test_the_stationary_schedule_refuses_a_residual() -> None:
    graph = residual_graph(c=16, cout=32, size=8, kernel=3, stride=1, pad=1)
    assert not _check(graph, "implicit_stationary", "conv", "add", "relu")


def test_fusing_the_add_of_a_dequantizing_conv_changes_no_rounding() -> None:
    """Legality: Conv + Add + Relu is legal in int8 when the conv dequantizes (the Add was refused as skipping a
    requantization before the dequantizing epilogue existed); a requantizing Conv + Relu stays legal (exact)."""
    graph = residual_graph(c=16, cout=32, size=8, kernel=3, stride=1, pad=1, int8_shortcut=True)
    inputs = {"x": np.random.default_rng(0).standard_normal((1, 16, 8, 8)).astype(np.float32)}
    mc = context(graph, inputs, "int8")
    nodes = [graph.node(n) for n in ("conv", "add", "relu")]
    assert numerics_preserved(mc, nodes, "conv").ok
    assert not mc.qplan.matrix["short"].dequantize
    assert numerics_preserved(mc, [graph.node(n) for n in ("short", "short_relu")], "conv").ok  # Relu: exact


def test_the_dynamic_plan_runs_the_block_bit_exact() -> None:
    """The engine's dynamic plan of the block (whatever it fuses) equals the quantized reference."""
    graph = residual_graph(c=16, cout=32, size=8, kernel=3, stride=1, pad=1, int8_shortcut=True)
    inputs = {"x": np.random.default_rng(2).standard_normal((1, 16, 8, 8)).astype(np.float32)}
    engine = FusionEngine(graph, "base", "int8", EngineOptions(policy="dynamic"))
    result = engine.run(inputs)
    out = graph.outputs[0]
    np.testing.assert_array_equal(result.outputs[out], run_quantized(graph, inputs, engine.mc.params)[out])
    assert any(set(c.group.nodes) >= {"conv", "add"} for c in engine.plan.choices)


def test_an_int8_block_output_moves_one_byte_an_element() -> None:
    """DRAM bytes of the band kernel of Conv + int8 Add + Relu: it writes its output twice (the int8 DRAM scratch,
    then NCHW), one byte an element each (a float32 block output wrote 8), and an int8 shortcut reads 3 bytes an
    element fewer than a float32 one."""
    runs = {}
    for int8_shortcut in (False, True):
        graph = residual_graph(c=16, cout=32, size=8, kernel=3, stride=1, pad=1, int8_shortcut=int8_shortcut)
        inputs = {"x": np.random.default_rng(1).standard_normal((1, 16, 8, 8)).astype(np.float32)}
        mc = context(graph, inputs, "int8")
        _, runs[int8_shortcut], _ = run_group(mc, Group(("conv", "add", "relu"), "implicit_gemm"), inputs)
    elements = 32 * 8 * 8
    assert runs[False].dram_write_bytes == runs[True].dram_write_bytes == 2 * elements
    assert runs[False].dram_read_bytes - runs[True].dram_read_bytes == 3 * elements


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    c=st.sampled_from([3, 16, 24]),
    cout=st.sampled_from([16, 24, 40]),
    size=st.integers(5, 12),
    kernel=st.sampled_from([1, 3]),
    strategy=st.sampled_from(["implicit_gemm", "implicit_packed"]),
    int8_shortcut=st.booleans(),
)
def test_int8_residual_add_variants(
    c: int, cout: int, size: int, kernel: int, strategy: str, int8_shortcut: bool
) -> None:
    """Conv + int8 Add + Relu in one kernel over conv shapes, the shortcut float32 or int8: bit-exact (int8 out)
    wherever the generator takes the shape."""
    graph = residual_graph(c, cout, size, kernel, 1, kernel // 2, int8_shortcut=int8_shortcut)
    _check(graph, strategy, "conv", "add", "relu")
