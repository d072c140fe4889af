"""A Gemm (own bias) whose output is reshaped back to (batch, tokens, features) and read by a vector chain, as
GPT-2 exports its MLP (Reshape -> Gemm -> Reshape -> Gelu): one `stream` kernel, the drained tiles fed to the
chain with the Gemm's bias added in the accumulator and the Reshape a view. Random shapes (hypothesis), checked
(race-detecting) simulation: int8 bit-exact against the quantized reference, fp32 within 1e-5."""

from __future__ import annotations

import numpy as np
from engine_helpers import assert_reference, context, run_group
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fusion.engine.candidates import enumerate_candidates
from fusion.engine.kernel import try_build
from fusion.engine.plan import Group
from fusion.graph.builder import GraphBuilder
from fusion.graph.ir import Graph
from fusion.graph.ops import OpType


def gemm_reshape_graph(lead: int, m: int, k: int, n: int, tail: str, seed: int = 0) -> Graph:
    """x (lead, m, k) -> Reshape (lead * m, k) -> Gemm(W, bias) -> Reshape (lead, m, n) -> tail."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("gemm_reshape")
    x = b.input("x", (lead, m, k))
    flat = b.op(OpType.Reshape, x, shape=(lead * m, k), name="flat")
    w = b.constant((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32))
    bias = b.constant(rng.standard_normal(n).astype(np.float32))
    h = b.op(OpType.Gemm, flat, w, bias, name="gemm")
    h = b.op(OpType.Reshape, h, shape=(lead, m, n), name="back")
    if tail == "gelu":
        h = b.op(OpType.Gelu, h, approximate="tanh", name="act")
    elif tail == "tanh_mul":
        h = b.op(OpType.Mul, b.op(OpType.Tanh, h, name="act"), b.constant(np.float32(0.5)), name="scale")
    b.output(h)
    return b.build()


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lead=st.integers(1, 2),
    m=st.integers(1, 24),
    k=st.integers(1, 70),
    n=st.integers(1, 70),
    tail=st.sampled_from(["gelu", "tanh_mul"]),
    dtype=st.sampled_from(["fp32", "int8"]),
)
def test_a_gemm_streams_through_its_reshape_into_the_chain(lead, m, k, n, tail, dtype) -> None:
    graph = gemm_reshape_graph(lead, m, k, n, tail, seed=m * k + n)
    nodes = tuple(node.name for node in graph.nodes[1:])
    assert any(c.family == "stream" and c.nodes == nodes for c in enumerate_candidates(graph))
    inputs = {"x": np.random.default_rng(m + n).standard_normal((lead, m, k)).astype(np.float32)}
    mc = context(graph, inputs, dtype)
    kernel, run, env = run_group(mc, Group(nodes, "stream"), inputs)
    assert_reference(run.outputs, env, graph.outputs[0], dtype, 1e-5)
    assert run.dram_write_bytes == lead * m * n * 4  # the chain's result only


def test_a_reshape_moving_the_last_axis_or_no_chain_is_refused() -> None:
    graph = gemm_reshape_graph(1, 4, 8, 6, "none")
    mc = context(graph, {"x": np.ones((1, 4, 8), np.float32)}, "fp32")
    assert "vector chain" in try_build(mc, Group(("gemm", "back"), "stream"))
    b = GraphBuilder("moves")
    x = b.input("x", (4, 8))
    w = b.constant(np.ones((8, 6), np.float32))
    h = b.op(OpType.Gemm, x, w, b.constant(np.zeros(6, np.float32)), name="gemm")
    h = b.op(OpType.Reshape, h, shape=(6, 4), name="back")
    b.output(b.op(OpType.Tanh, h, name="act"))
    moved = b.build()
    mc = context(moved, {"x": np.ones((4, 8), np.float32)}, "fp32")
    assert "keep the last axis" in try_build(mc, Group(("gemm", "back", "act"), "stream"))
