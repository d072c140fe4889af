"""int8 as deployed, in the generated kernels: a Conv's per-output-channel requantizer runs in the fused drain
(`ep.cfg` epflags pc) and in the baseline GEMM's vector epilogue (`v.rqnt.vc`), bit-exact against the quantized
reference; the bundled ResNet block and a zoo CNN's first layers in every policy."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import context, model, run_group

from fusion.engine.engine import EngineOptions, FusionEngine
from fusion.engine.plan import Group
from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType
from fusion.reference.quantized import run_quantized
from isa.enums import EpilogueFlags


def _conv_relu(cout: int, seed: int = 4):
    """Conv(bias) + Relu with output channels of very different weight ranges (as BN folding leaves them)."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("conv_relu")
    x = b.input("x", (1, 8, 10, 10))
    spread = np.geomspace(0.02, 3.0, cout).astype(np.float32).reshape(cout, 1, 1, 1)
    w = b.constant((rng.standard_normal((cout, 8, 3, 3)) * spread / 8).astype(np.float32), "w")
    bias = b.constant((rng.standard_normal(cout) * 0.1).astype(np.float32), "b")
    attrs = {"dilations": (1, 1), "group": 1, "pads": (1, 1, 1, 1), "strides": (1, 1)}
    h = b.op(OpType.Conv, x, w, bias, name="conv", **attrs)
    b.output(b.op(OpType.Relu, h, name="relu"))
    graph = b.build()
    return graph, {"x": rng.standard_normal((1, 8, 10, 10)).astype(np.float32)}


def _drain_flags(kernel) -> set[EpilogueFlags]:
    return {EpilogueFlags(i.by_name()["epflags"]) for i in kernel.program.instructions() if i.mnemonic == "ep.cfg"}


@pytest.mark.parametrize("cout", [16, 24])
def test_fused_conv_bias_relu_drains_per_channel_bit_exact(cout: int) -> None:
    graph, inputs = _conv_relu(cout)
    mc = context(graph, inputs, "int8")
    assert mc.qplan.matrix["conv"].per_channel
    kernel, run, env = run_group(mc, Group(("conv", "relu"), "implicit_gemm"), inputs)
    np.testing.assert_array_equal(run.outputs["relu"], env["relu"])
    assert _drain_flags(kernel) == {EpilogueFlags.bias_pc}, "bias and the per-channel requantizer in the drain"


def test_unfused_conv_requantizes_each_output_row() -> None:
    graph, inputs = _conv_relu(16)
    mc = context(graph, inputs, "int8")
    kernel, run, env = run_group(mc, Group(("conv",), "unfused"), inputs)
    np.testing.assert_array_equal(run.outputs["conv"], env["conv"])
    mnemonics = {i.mnemonic for i in kernel.program.instructions()}
    assert "v.rqnt.vc" in mnemonics and "v.rqnt" not in mnemonics


@pytest.mark.parametrize("policy", ["none", "static", "dynamic"])
def test_resnet_block_is_bit_exact_in_every_policy(policy: str) -> None:
    graph, inputs = model("resnet_block")
    engine = FusionEngine(graph, "base", "int8", EngineOptions(policy=policy))
    result = engine.run(inputs)
    assert any(q.per_channel for q in engine.mc.qplan.matrix.values())
    want = run_quantized(graph, inputs, engine.mc.params)
    for out in graph.outputs:
        np.testing.assert_array_equal(result.outputs[out], want[out])
    assert not engine.events


def _two_convs_one_bias(seed: int = 7):
    """Two Convs reading one bias constant (as CSE leaves equal biases) at very different input scales."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("shared_bias")
    x = b.input("x", (1, 8, 6, 6))
    bias = b.constant((rng.standard_normal(16) * 0.5).astype(np.float32), "b")
    attrs = {"dilations": (1, 1), "group": 1, "pads": (1, 1, 1, 1), "strides": (1, 1)}
    w1 = b.constant((rng.standard_normal((16, 8, 3, 3)) * 0.1).astype(np.float32), "w1")
    w2 = b.constant((rng.standard_normal((16, 16, 3, 3)) * 0.01).astype(np.float32), "w2")
    h = b.op(OpType.Relu, b.op(OpType.Conv, x, w1, bias, name="conv1", **attrs), name="relu1")
    b.output(b.op(OpType.Conv, b.op(OpType.Mul, h, h, name="square"), w2, bias, name="conv2", **attrs))
    return b.build(), {"x": (rng.standard_normal((1, 8, 6, 6)) * 4).astype(np.float32)}


@pytest.mark.parametrize("policy", ["none", "dynamic"])
@pytest.mark.parametrize("execution", ["host", "program"])
def test_a_bias_shared_by_two_convs_is_quantized_per_conv(policy: str, execution: str) -> None:
    graph, inputs = _two_convs_one_bias()
    engine = FusionEngine(graph, "base", "int8", EngineOptions(policy=policy, execution=execution))
    result = engine.run(inputs)
    q = engine.mc.qplan.matrix
    assert not np.array_equal(
        q["conv1"].quantize_bias(graph.constants["b"]), q["conv2"].quantize_bias(graph.constants["b"])
    )
    want = run_quantized(graph, inputs, engine.mc.params)
    np.testing.assert_array_equal(result.outputs[graph.outputs[0]], want[graph.outputs[0]])
