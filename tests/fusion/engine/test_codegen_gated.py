"""Two GEMMs of one activation joined by a vector chain (`codegen.gated`: a gated MLP's gate and up projections,
SiLU(gate) * up as exported by LLaMA, GEGLU, a plain product): one kernel reading A once, with neither GEMM's output
stored. Random shapes (hypothesis), simulated in checked (race-detecting) mode: int8 bit-exact against the quantized
reference (each GEMM requantized with its own multiplier), fp32 within 1e-5."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import assert_reference, context, gated_mlp_graph, run_group
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fusion.engine.candidates import enumerate_candidates
from fusion.engine.codegen.gated import find_gated, gated_gemm
from fusion.engine.codegen.gemm import plan_tiles
from fusion.engine.kernel import dram_forms, group_subgraph, try_build
from fusion.engine.plan import Group
from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType
from fusion.lower.compiler import plan_dram
from fusion.lower.context import LowerContext


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lead=st.lists(st.integers(1, 2), max_size=1),
    m=st.integers(1, 40),
    k=st.integers(1, 160),
    panels=st.integers(1, 6),
    act=st.sampled_from(["silu", "gelu", "none"]),
    dtype=st.sampled_from(["fp32", "int8"]),
)
@example(lead=[2], m=31, k=133, panels=2, act="silu", dtype="fp32")  # two row blocks: the weights streamed twice
def test_gated_gemms_read_their_activation_once_and_store_only_the_chain(lead, m, k, panels, act, dtype) -> None:
    n = 16 * panels
    graph = gated_mlp_graph(tuple(lead), m, k, n, act, seed=m * k + n)
    (match,) = find_gated(graph)
    nodes = match.nodes(graph)
    assert len(nodes) == len(graph.nodes)
    assert any(c.family == "gated" and c.nodes == nodes for c in enumerate_candidates(graph))
    inputs = {"x": np.random.default_rng(m + k).standard_normal((*lead, m, k)).astype(np.float32)}
    mc = context(graph, inputs, dtype)
    kernel, run, env = run_group(mc, Group(nodes, "gated"), inputs)
    assert_reference(run.outputs, env, graph.outputs[0], dtype, 1e-5)
    rows = m * int(np.prod(lead or [1]))
    assert run.dram_write_bytes == rows * n * 4  # the chain's result only
    weights = 2 * k * n * (1 if dtype == "int8" else 4)
    assert run.dram_read_bytes == rows * k * 4 + weights * _row_blocks(mc, Group(nodes, "gated"), rows)


def _row_blocks(mc, group: Group, rows: int) -> int:
    """How many output-row blocks the kernel's schedule takes: each streams both weights once, A is read once."""
    sub = group_subgraph(mc.graph, group)
    forms, scratch = dram_forms(mc, sub, group)
    _, addresses, _ = plan_dram(sub, mc.qplan, mc.config, forms, whole_program=True, scratch=scratch)
    cx = LowerContext(sub, mc.config, mc.qplan, mc.params, addresses)
    tile_rows, _ = plan_tiles(mc.config, *gated_gemm(cx, sub.nodes))
    return -(-rows // tile_rows)


def test_what_is_not_a_gated_pair_is_not_matched_and_a_ragged_width_is_refused() -> None:
    rng = np.random.default_rng(0)
    b = GraphBuilder("not_gated")
    x = b.input("x", (8, 32))
    y = b.input("y", (8, 32))
    w = b.constant(rng.standard_normal((32, 16)).astype(np.float32))
    g = b.op(OpType.MatMul, x, w, name="g")
    u = b.op(OpType.MatMul, y, w, name="u")  # another activation
    b.output(b.op(OpType.Mul, g, u, name="gu"))
    assert find_gated(b.build()) == []
    graph = gated_mlp_graph((), 8, 32, 24, "silu", seed=1)  # 24 columns: a pair would straddle array panels
    mc = context(graph, {"x": np.ones((8, 32), np.float32)}, "fp32")
    (match,) = find_gated(graph)
    assert "multiple of the array size" in try_build(mc, Group(match.nodes(graph), "gated"))


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_a_gated_kernel_beats_its_parts_on_a_llama_sized_mlp(dtype) -> None:
    graph = gated_mlp_graph((1,), 16, 128, 256, "silu", seed=2)
    inputs = {"x": np.random.default_rng(3).standard_normal((1, 16, 128)).astype(np.float32)}
    mc = context(graph, inputs, dtype)
    (match,) = find_gated(graph)
    _, fused, _ = run_group(mc, Group(match.nodes(graph), "gated"), inputs)
    parts = [Group(("gate",), "epilogue", panels=2, resident_a=True), Group(("up",), "epilogue", panels=2)]
    parts.append(Group(("sig", "silu", "gated"), "chain"))
    assert fused.cycles < sum(run_group(mc, p, inputs)[1].cycles for p in parts)
