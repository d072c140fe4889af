"""Vector chains through the zoo's elementwise ops (ReLU6, HardSwish, SiLU, GPT-2's masked softmax, a GQA-style
Expand): one `vc.*` pass, bit-identical to the same nodes run as unfused kernels one after the other (both emit
the one recipe of each op), and to the (quantized) reference. Simulated in checked (race-detecting) mode."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import context, run_group

from fusion.engine.candidates import enumerate_candidates
from fusion.engine.errors import CodegenError
from fusion.engine.execute import run_kernel
from fusion.engine.kernel import build_kernel
from fusion.engine.plan import Group
from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType


def _graph(kind: str):
    rng = np.random.default_rng(8)
    b = GraphBuilder(kind)
    x = b.input("x", (2, 12, 12))
    h = b.op(OpType.MatMul, x, b.constant(rng.standard_normal((12, 12)).astype(np.float32)), name="mm")
    if kind == "mobilenet":
        h = b.op(OpType.Clip, h, name="relu6", min=0.0, max=6.0)
        h = b.op(OpType.HardSwish, h, name="hswish")
        h = b.op(OpType.HardSigmoid, h, name="hsig", alpha=0.2, beta=0.5)
        chain = ("relu6", "hswish", "hsig")
    elif kind == "silu":
        s = b.op(OpType.Sigmoid, h, name="sig")
        h = b.op(OpType.Mul, h, s, name="silu")
        h = b.op(OpType.Neg, h, name="neg")
        chain = ("sig", "silu", "neg")
    elif kind == "masked_softmax":
        h = b.op(OpType.Mul, h, b.constant(np.array(0.125, np.float32)), name="scale")
        mask = b.constant(np.tril(np.ones((12, 12), bool))[None])
        h = b.op(OpType.Where, mask, h, b.constant(np.array(np.finfo(np.float32).min, np.float32)), name="mask")
        h = b.op(OpType.Softmax, h, name="softmax", axis=2)
        chain = ("scale", "mask", "softmax")
    elif kind == "trilu":
        h = b.op(OpType.Mul, h, b.constant(np.array(0.5, np.float32)), name="half")
        h = b.op(OpType.Trilu, h, name="tril", upper=0, k=0)
        h = b.op(OpType.Abs, h, name="abs")
        chain = ("half", "tril", "abs")
    else:  # expand: a [2, 1, 12] row broadcast over 12 rows, then arithmetic
        r = b.op(OpType.ReduceMean, h, name="mean", axes=(1,), keepdims=1)
        e = b.op(OpType.Expand, r, name="expand", shape=(2, 12, 12))
        h = b.op(OpType.Sub, h, e, name="centre")
        h = b.op(OpType.Pow, h, b.constant(np.array(3.0, np.float32)), name="cube")
        chain = ("expand", "centre", "cube")
    b.output(h)
    return b.build(), chain


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
@pytest.mark.parametrize("kind", ["mobilenet", "silu", "masked_softmax", "trilu", "expand"])
def test_chain_equals_unfused_kernels(kind: str, dtype: str) -> None:
    graph, chain = _graph(kind)
    inputs = {"x": np.random.default_rng(1).standard_normal((2, 12, 12)).astype(np.float32)}
    mc = context(graph, inputs, dtype)
    assert any(c.family == "chain" and c.nodes == chain for c in enumerate_candidates(graph))
    kernel, fused, env = run_group(mc, Group(chain, "chain"), inputs)
    mnemonics = [i.mnemonic for i in kernel.program.instructions()]
    assert "vc.st" in mnemonics and not any(m.startswith("v.") for m in mnemonics)
    step = dict(env)
    for name in chain:
        unfused = run_kernel(mc, build_kernel(mc, Group((name,), "unfused")), step, checked=True)
        step.update(unfused.outputs)
    out = graph.node(chain[-1]).outputs[0]
    np.testing.assert_array_equal(fused.outputs[out], step[out])
    if kind == "expand":  # x^3 as multiplies; the reference's numpy power rounds once
        np.testing.assert_allclose(fused.outputs[out], env[out], rtol=1e-6, atol=1e-6)
    else:
        np.testing.assert_array_equal(fused.outputs[out], env[out])


def test_a_value_seeded_in_a_register_is_never_broadcast() -> None:
    """GQA's Transpose -> Reshape -> Expand as a layout chain: the transposed KV heads sit in a register with
    fewer elements than the chain's output, so the chain refuses (the unfused Expand broadcasts in the DMA)."""
    b = GraphBuilder("gqa")
    h = b.op(OpType.Transpose, b.input("x", (1, 6, 2, 8)), name="t", perm=(0, 2, 1, 3))
    h = b.op(OpType.Reshape, h, name="r", shape=(1, 2, 1, 6, 8))
    b.output(b.op(OpType.Expand, h, name="e", shape=(1, 2, 3, 6, 8)))
    graph = b.build()
    inputs = {"x": np.random.default_rng(0).standard_normal((1, 6, 2, 8)).astype(np.float32)}
    with pytest.raises(CodegenError, match="broadcast inside a vector register"):
        build_kernel(context(graph, inputs, "fp32"), Group(("t", "r", "e"), "chain"))
