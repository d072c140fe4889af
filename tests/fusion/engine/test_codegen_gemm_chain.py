"""A MatMul with K or N beyond the array streamed into a vector chain (`codegen.stream` -> the fused GEMM with a
`ChainEpilogue`): the drained tiles feed the chain in the scratchpad, only the chain's result is stored. Random
shapes (hypothesis) and chains (bias + GELU, bias + residual, SiLU, a LayerNorm over at most N columns), simulated
in checked (race-detecting) mode: int8 bit-exact against the quantized reference, fp32 within 1e-5."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import assert_reference, context, run_group
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fusion.engine.candidates import enumerate_candidates
from fusion.engine.kernel import try_build
from fusion.engine.plan import Group
from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType


def _linear(lead: tuple[int, ...], m: int, k: int, n: int, tail: str, seed: int):
    rng = np.random.default_rng(seed)
    b = GraphBuilder("gemm_chain")
    x = b.input("x", (*lead, m, k))
    w = b.constant((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), "w")
    h = b.op(OpType.MatMul, x, w, name="mm")
    names = ["mm"]
    if tail in ("gelu", "residual", "layernorm"):
        h = b.op(OpType.Add, h, b.constant(rng.standard_normal(n).astype(np.float32), "b"), name="bias")
        names.append("bias")
    if tail == "gelu":
        h = b.op(OpType.Gelu, h, approximate="none", name="gelu")
        names.append("gelu")
    elif tail in ("residual", "layernorm"):
        h = b.op(OpType.Add, b.input("r", (*lead, m, n)), h, name="residual")
        names.append("residual")
    if tail == "layernorm":
        gamma = b.constant((1 + 0.1 * rng.standard_normal(n)).astype(np.float32), "gamma")
        beta = b.constant(np.zeros(n, np.float32), "beta")
        h = b.op(OpType.LayerNorm, h, gamma, beta, axis=len(lead) + 1, epsilon=1e-5, name="ln")
        names.append("ln")
    elif tail == "silu":
        s = b.op(OpType.Sigmoid, h, name="sig")
        h = b.op(OpType.Mul, h, s, name="silu")
        names += ["sig", "silu"]
    b.output(h)
    return b.build(), tuple(names)


def _inputs(graph, seed):
    rng = np.random.default_rng(seed)
    return {v: rng.standard_normal(graph.types[v].shape).astype(np.float32) for v in graph.inputs}


@settings(max_examples=14, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lead=st.lists(st.integers(1, 2), max_size=1),
    m=st.integers(1, 40),
    k=st.integers(1, 200),
    n=st.integers(1, 100),
    tail=st.sampled_from(["gelu", "residual", "silu", "layernorm"]),
    dtype=st.sampled_from(["fp32", "int8"]),
)
def test_a_gemm_of_any_shape_feeds_its_chain_without_storing(lead, m, k, n, tail, dtype) -> None:
    if tail == "layernorm":
        n = min(n, 16)  # a row-reducing chain needs its rows in one tile
    if k <= 16 and n <= 16:
        k += 16  # beyond the array: the drained path (the streamed one is tested in test_engine_codegen)
    graph, chain = _linear(tuple(lead), m, k, n, tail, seed=m * k + n)
    inputs = _inputs(graph, m + k)
    mc = context(graph, inputs, dtype)
    assert any(c.family == "stream" and c.nodes == chain for c in enumerate_candidates(graph))  # SiLU: 2 reads
    kernel, run, env = run_group(mc, Group(chain, "stream"), inputs)
    assert_reference(run.outputs, env, graph.outputs[0], dtype, 1e-5)
    rows = m * int(np.prod(lead or [1]))
    assert run.dram_write_bytes == rows * n * 4  # the chain's result only: the MatMul's output never leaves
    mnemonics = [i.mnemonic for i in kernel.program.instructions()]
    assert "mx.drain" in mnemonics and "vc.st" in mnemonics


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_a_row_reducing_chain_wider_than_the_array_is_refused(dtype) -> None:
    graph, chain = _linear((), 8, 32, 40, "layernorm", seed=1)
    mc = context(graph, _inputs(graph, 2), dtype)
    assert "in one tile" in try_build(mc, Group(chain, "stream"))
