"""Kernels of repeated layers share one encoded text (`ModelContext.texts`), and each still computes its own
layer: the constants differ, equal words are one object, the outputs match the reference."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import assert_reference, context, reference_env

from fusion.engine.execute import run_kernel
from fusion.engine.kernel import build_kernel
from fusion.engine.plan import Group
from fusion.graph.builder import GraphBuilder
from fusion.graph.ir import Graph
from fusion.graph.ops import OpType


def layers(count: int = 3, m: int = 32, d: int = 48, seed: int = 0) -> Graph:
    """x -> (Gemm with bias -> Relu) `count` times: the same shapes, other weights."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("layers")
    h = b.input("x", (m, d))
    for layer in range(count):
        w = b.constant((rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32), f"w{layer}")
        bias = b.constant((rng.standard_normal(d) * 0.1).astype(np.float32), f"b{layer}")
        h = b.op(OpType.Relu, b.op(OpType.Gemm, h, w, bias, name=f"fc{layer}"), name=f"relu{layer}")
    b.output(h)
    return b.build()


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_repeated_layers_share_their_text_and_compute_their_own(dtype: str) -> None:
    x = np.random.default_rng(1).standard_normal((32, 48)).astype(np.float32)
    mc = context(layers(), {"x": x}, dtype)
    env = reference_env(mc, {"x": x})
    kernels = [build_kernel(mc, Group((f"fc{i}", f"relu{i}"), "epilogue")) for i in range(3)]
    first, second = kernels[1].program, kernels[2].program  # (layer 0 reads the graph input: another layout)
    assert first.data != second.data
    assert (second.text is first.text) == (second.text == first.text)  # an equal text is the same object
    if dtype == "fp32":  # (int8: a layer's requantization may be an immediate of its own)
        assert second.text is first.text and mc.texts.hits >= 1
    for kernel in kernels:
        out = run_kernel(mc, kernel, env, checked=True).outputs
        assert_reference(out, env, kernel.outputs[0], dtype, 1e-4)
