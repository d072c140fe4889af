"""The swapped GEMM (`codegen.swapped`) over random shapes: any number of activation rows (stationary blocks of at
most N), any K and output width (chunks of columns per step), a Gemm's own bias (a broadcast tile the drain adds
before requantizing), with a ReLU or a phase-2 chain after it, or an attention head split (Reshape + Transpose).
Simulated in checked (race-detecting) mode; int8 bit-exact against the quantized reference, fp32 within 1e-5."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from engine_helpers import assert_reference, context, run_group
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fusion.engine.plan import Group
from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType
from fusion.lower.local_alloc import DEPTH
from simulator.config import load_config


def _gemm(m: int, k: int, n: int, bias: bool, tail: str, seed: int):
    rng = np.random.default_rng(seed)
    b = GraphBuilder("swapped")
    x = b.input("x", (m, k))
    w = b.constant((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), "w")
    c = [b.constant(rng.standard_normal(n).astype(np.float32), "c")] if bias else []
    h = b.op(OpType.Gemm if bias else OpType.MatMul, x, w, *c, name="gemm")
    if tail == "relu":
        h = b.op(OpType.Relu, h, name="relu")
    elif tail == "gelu":
        h = b.op(OpType.Gelu, h, approximate="none", name="gelu")
    b.output(h)
    return b.build()


@settings(max_examples=14, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(1, 40),
    k=st.integers(1, 300),
    n=st.integers(1, 200),
    bias=st.booleans(),
    tail=st.sampled_from(["", "relu", "gelu"]),
    dtype=st.sampled_from(["fp32", "int8"]),
)
def test_swapped_gemm_of_any_shape_matches_the_reference(m, k, n, bias, tail, dtype) -> None:
    graph = _gemm(m, k, n, bias, tail, seed=m * k + n)
    inputs = {"x": np.random.default_rng(m + n).standard_normal((m, k)).astype(np.float32)}
    mc = context(graph, inputs, dtype)
    kernel, run, env = run_group(mc, Group(tuple(node.name for node in graph.nodes), "swapped"), inputs)
    assert_reference(run.outputs, env, graph.outputs[0], dtype, 1e-5)
    mnemonics = [i.mnemonic for i in kernel.program.instructions()]
    blocks, slices = -(-m // 16), -(-k // 16)
    assert mnemonics.count("mx.drain") % blocks == 0  # one drain per stationary row block and chunk
    assert mnemonics.count("mx.preload") == mnemonics.count("mx.drain") * slices
    if bias:
        assert "v.add.vc" in mnemonics


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(1, 24),
    k=st.integers(1, 80),
    heads=st.integers(1, 5),
    d=st.integers(1, 40),
    dtype=st.sampled_from(["fp32", "int8"]),
)
def test_a_head_split_after_the_gemm_is_stored_head_by_head(m, k, heads, d, dtype) -> None:
    """x @ W -> Reshape (rows, heads, D) -> Transpose (heads before rows): each head's D columns of C are stored as
    that head's rows, with no separate Transpose kernel."""
    rng = np.random.default_rng(m * k + d)
    b = GraphBuilder("head_split")
    x = b.input("x", (1, m, k))
    h = b.op(OpType.MatMul, x, b.constant(rng.standard_normal((k, heads * d)).astype(np.float32), "w"), name="mm")
    h = b.op(OpType.Reshape, h, shape=(1, m, heads, d), name="split")
    b.output(b.op(OpType.Transpose, h, perm=(0, 2, 1, 3), name="heads"))
    graph = b.build()
    inputs = {"x": rng.standard_normal((1, m, k)).astype(np.float32)}
    mc = context(graph, inputs, dtype)
    kernel, run, env = run_group(mc, Group(("mm", "split", "heads"), "swapped"), inputs)
    assert_reference(run.outputs, env, graph.outputs[0], dtype, 1e-5)


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
@pytest.mark.parametrize("banks", [4, 2])
def test_a_is_read_once_into_the_spare_banks_or_copied_to_each_slot(dtype: str, banks: int) -> None:
    """Several chunks of output columns share A^T, loaded by one transposing DMA: in the spare scratchpad banks every
    step reads (4 banks, 3 slots: no copy), or, on a machine whose slots take every bank, copied from the first
    step's slot into the next DEPTH - 1 slots. Checked mode: no step reads A^T before it is there."""
    m, k, n = 16, 256, 256
    graph = _gemm(m, k, n, bias=False, tail="", seed=7)
    inputs = {"x": np.random.default_rng(7).standard_normal((m, k)).astype(np.float32)}
    mc = context(graph, inputs, dtype, replace(load_config("base"), spad_banks=banks))
    kernel, run, env = run_group(mc, Group(("gemm",), "swapped"), inputs)
    assert_reference(run.outputs, env, graph.outputs[0], dtype, 1e-5)
    instructions = list(kernel.program.instructions())
    a_copies = [i for i in instructions if i.mnemonic == "v.copy" and i.field("n") == m * k]
    chunks = sum(i.mnemonic == "mx.drain" for i in instructions)  # one row block: a drain per chunk
    assert chunks > 1
    assert len(a_copies) == (0 if banks == 4 else min(chunks, DEPTH) - 1)


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_the_chain_operands_are_loaded_before_phase_two(dtype: str) -> None:
    """x @ W + r -> LayerNorm: the residual and LayerNorm's rows are loaded by phase 1 (in the slot phase 2's first
    block uses) while the matrix unit finishes, so after the fence between the phases the first transfer is C^T
    coming back; checked mode: nothing reads them before they are there or overwrites them before phase 2."""
    m, k, n = 16, 128, 128
    rng = np.random.default_rng(3)
    b = GraphBuilder("residual_norm")
    x, r = b.input("x", (m, k)), b.input("r", (m, n))
    h = b.op(OpType.MatMul, x, b.constant((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)), name="mm")
    h = b.op(OpType.Add, h, r, name="res")
    gamma, beta = (b.constant(rng.standard_normal(n).astype(np.float32)) for _ in range(2))
    b.output(b.op(OpType.LayerNorm, h, gamma, beta, axis=1, epsilon=1e-5, name="norm"))
    graph = b.build()
    inputs = {v: rng.standard_normal((m, w)).astype(np.float32) for v, w in (("x", k), ("r", n))}
    mc = context(graph, inputs, dtype)
    kernel, run, env = run_group(mc, Group(("mm", "res", "norm"), "swapped"), inputs)
    assert_reference(run.outputs, env, graph.outputs[0], dtype, 1e-4)
    mnemonics = [i.mnemonic for i in kernel.program.instructions()]
    fence = mnemonics.index("fence")
    assert next(x for x in mnemonics[fence:] if x.startswith("dma.ld")) == "dma.ldt"
    assert mnemonics[:fence].count("dma.ld") >= 3  # the weight chunks, then the residual and the two rows
