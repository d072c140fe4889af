"""GEMMs reading one activation, side by side (`codegen.siblings`: an attention's Q, K and V projections as one
kernel), each output optionally stored through its head split (Reshape + Transpose). Random widths, head dims
and row counts (hypothesis), checked (race-detecting) simulation: int8 bit-exact against the quantized reference
(each GEMM requantized with its own multiplier), fp32 within 1e-5; the candidates offer every choice of head
splits, and legality takes a group only when every outside reader runs after it."""

from __future__ import annotations

import numpy as np
from engine_helpers import assert_reference, context, run_group
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fusion.engine.candidates import enumerate_candidates
from fusion.engine.codegen.siblings import find_siblings
from fusion.engine.kernel import try_build
from fusion.engine.legality import structurally_legal
from fusion.engine.plan import Group
from fusion.graph.builder import GraphBuilder
from fusion.graph.ir import Graph
from fusion.graph.ops import OpType


def projections_graph(m: int, k: int, widths: list[int], head_dims: list[int], seed: int = 0) -> Graph:
    """x (1, m, k) times one weight per width; a head dim d > 0 splits that output into (1, n / d, m, d)."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("projections")
    x = b.input("x", (1, m, k))
    for i, (n, d) in enumerate(zip(widths, head_dims, strict=True)):
        h = b.op(OpType.MatMul, x, b.constant(rng.standard_normal((k, n)).astype(np.float32)), name=f"p{i}")
        if d:
            h = b.op(OpType.Reshape, h, shape=(1, m, n // d, d), name=f"split{i}")
            h = b.op(OpType.Transpose, h, perm=(0, 2, 1, 3), name=f"heads{i}")
        b.output(h)
    return b.build()


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(1, 40),
    k=st.integers(1, 80),
    shapes=st.lists(st.tuples(st.integers(1, 3), st.sampled_from([0, 1, 2])), min_size=2, max_size=3),
    panels=st.sampled_from([1, 2, 0]),
    dtype=st.sampled_from(["fp32", "int8"]),
)
def test_side_by_side_gemms_store_each_output_in_its_layout(m, k, shapes, panels, dtype) -> None:
    widths = [16 * w for w, _ in shapes]
    head_dims = [0 if s == 0 else 16 * w // (1 + (s == 2 and w % 2 == 0)) for w, s in shapes]
    graph = projections_graph(m, k, widths, head_dims, seed=m * k)
    full = max(find_siblings(graph), key=lambda match: len(match.views))
    nodes = full.nodes(graph)
    assert len(nodes) == len(graph.nodes)
    assert any(c.family == "siblings" and c.nodes == nodes for c in enumerate_candidates(graph))
    inputs = {"x": np.random.default_rng(m + k).standard_normal((1, m, k)).astype(np.float32)}
    mc = context(graph, inputs, dtype)
    assert structurally_legal(mc, [graph.node(n) for n in nodes], "siblings")
    kernel, run, env = run_group(mc, Group(nodes, "siblings", panels=panels), inputs)
    for value in graph.outputs:
        assert_reference(run.outputs, env, value, dtype, 1e-5)
    assert run.dram_write_bytes == m * sum(widths) * (1 if dtype == "int8" else 4)  # each output once


def test_ragged_widths_are_refused_and_an_early_reader_runs_after_the_group() -> None:
    graph = projections_graph(4, 8, [16, 24], [0, 0])
    mc = context(graph, {"x": np.ones((1, 4, 8), np.float32)}, "fp32")
    (match,) = find_siblings(graph)
    assert "multiple of the array size" in try_build(mc, Group(match.nodes(graph), "siblings"))
    b = GraphBuilder("early")
    x = b.input("x", (1, 4, 8))
    p0 = b.op(OpType.MatMul, x, b.constant(np.ones((8, 16), np.float32)), name="p0")
    early = b.op(OpType.Relu, p0, name="early")  # reads p0 before p1 in graph order
    p1 = b.op(OpType.MatMul, x, b.constant(np.ones((8, 16), np.float32)), name="p1")
    b.output(b.op(OpType.Add, early, p1, name="out"))
    graph = b.build()
    mc = context(graph, {"x": np.ones((1, 4, 8), np.float32)}, "fp32")
    # legal: plans run groups in a topological order of their values (`planner.in_execution_order`), so the
    # group storing p0 runs before `early`
    assert structurally_legal(mc, [graph.node("p0"), graph.node("p1")], "siblings")


def rotary_projections_graph(m: int, k: int, heads: tuple[int, int], d: int, dv: int, cut: int, seed: int) -> Graph:
    """LLaMA's attention inputs: Q, K, V projections of x, each split into heads of d (V: dv); Q and K rotated,
    x * cos + Concat(-x[..., cut:], x[..., :cut]) * sin with cos and sin (1, 1, m, d) broadcast over heads."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("qkv_rotary")
    x = b.input("x", (1, m, k))
    angle = rng.uniform(0, 6.3, (1, 1, m, d)).astype(np.float32)
    cos, sin = b.constant(np.cos(angle)), b.constant(np.sin(angle))
    for name, h, width in (("q", heads[0], d), ("k", heads[1], d), ("v", heads[1], dv)):
        y = b.op(OpType.MatMul, x, b.constant(rng.standard_normal((k, h * width)).astype(np.float32)), name=name)
        y = b.op(OpType.Reshape, y, shape=(1, m, h, width), name=f"{name}_split")
        y = b.op(OpType.Transpose, y, perm=(0, 2, 1, 3), name=f"{name}_heads")
        if name != "v":
            lo = b.op(OpType.Slice, y, axes=(3,), starts=(0,), ends=(cut,), steps=(1,), name=f"{name}_lo")
            hi = b.op(OpType.Slice, y, axes=(3,), starts=(cut,), ends=(d,), steps=(1,), name=f"{name}_hi")
            rot = b.op(OpType.Concat, b.op(OpType.Neg, hi, name=f"{name}_neg"), lo, axis=3, name=f"{name}_cat")
            xc = b.op(OpType.Mul, y, cos, name=f"{name}_xcos")
            y = b.op(OpType.Add, xc, b.op(OpType.Mul, rot, sin, name=f"{name}_rsin"), name=f"{name}_out")
        b.output(y)
    return b.build()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(1, 24),
    k=st.integers(1, 64),
    heads=st.tuples(st.integers(1, 3), st.integers(1, 2)),
    d=st.sampled_from([16, 32, 64]),
    dv=st.sampled_from([16, 32]),
    cut=st.sampled_from([0.25, 0.5, 0.75]),
    panels=st.sampled_from([1, 2, 0]),
    dtype=st.sampled_from(["fp32", "int8"]),
)
def test_rotary_regions_run_in_the_gemm_store(m, k, heads, d, dv, cut, panels, dtype) -> None:
    """Q and K rotated on their drained tiles (never stored unrotated): int8 bit-exact, fp32 within 1e-5, and
    only the rotated outputs and V leave the chip. A rotary cut off the array's panel boundaries is refused."""
    cut = round(cut * d)
    graph = rotary_projections_graph(m, k, heads, d, dv, cut, seed=m * k + d)
    full = max(find_siblings(graph), key=lambda match: len(match.regions))
    nodes = full.nodes(graph)
    assert len(full.regions) == 14 and len(nodes) == len(graph.nodes) - 2  # V's head split is left to its reader
    assert any(c.family == "siblings" and c.nodes == nodes for c in enumerate_candidates(graph))
    inputs = {"x": np.random.default_rng(m + k).standard_normal((1, m, k)).astype(np.float32)}
    mc = context(graph, inputs, dtype)
    assert structurally_legal(mc, [graph.node(n) for n in nodes], "siblings")
    group = Group(nodes, "siblings", panels=panels)
    if cut % 16:
        assert "panels" in try_build(mc, group)
        return
    kernel, run, env = run_group(mc, group, inputs)
    for value in ("q_out", "k_out", "v"):
        assert_reference(run.outputs, env, value, dtype, 1e-5)
    v_bytes = m * heads[1] * dv * (1 if dtype == "int8" else 4)
    assert run.dram_write_bytes == m * (heads[0] + heads[1]) * d * 4 + v_bytes  # rotated f32, V as drained


def test_rotated_heads_over_several_row_blocks_keep_their_constants_per_block() -> None:
    """150 rows of 64-wide heads: three row blocks of at most 64 rows (a register holds 64 x 64), whose constants
    rotate through the spare banks' regions (race-checked), int8 bit-exact."""
    graph = rotary_projections_graph(150, 16, (1, 1), 64, 16, 32, seed=3)
    full = max(find_siblings(graph), key=lambda match: len(match.regions))
    inputs = {"x": np.random.default_rng(2).standard_normal((1, 150, 16)).astype(np.float32)}
    mc = context(graph, inputs, "int8")
    kernel, run, env = run_group(mc, Group(full.nodes(graph), "siblings", panels=0), inputs)
    for value in ("q_out", "k_out", "v"):
        assert_reference(run.outputs, env, value, "int8", 0)
