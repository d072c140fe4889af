"""Vector chains through last-axis Slice and Concat (`codegen.rotary`, strategy `segment_chain`): rotary embeddings
as exported (x * cos + Concat(-x2, x1) * sin) and other lane moves at random cut points, as one kernel. Random
shapes (hypothesis), simulated in checked (race-detecting) mode: int8 bit-exact against the quantized reference
(the region reads a requantized MatMul's int8 output), fp32 within 1e-5."""

from __future__ import annotations

import numpy as np
from engine_helpers import assert_reference, context, rotary_graph, run_group
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fusion.engine.candidates import enumerate_candidates
from fusion.engine.codegen.rotary import find_segment_chains
from fusion.engine.kernel import try_build
from fusion.engine.plan import Group
from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType


@settings(max_examples=14, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lead=st.lists(st.integers(1, 4), max_size=2),
    s=st.integers(1, 40),
    d=st.integers(2, 80),
    split=st.floats(0, 1),
    swap=st.booleans(),
    dtype=st.sampled_from(["fp32", "int8"]),
)
def test_rotary_regions_are_one_kernel_equal_to_the_reference(lead, s, d, split, swap, dtype) -> None:
    cut = min(d - 1, max(1, round(split * d)))
    graph = rotary_graph(tuple(lead), s, d, cut, swap, seed=s * d + cut)
    regions = find_segment_chains(graph)
    region = max(regions, key=len)
    assert len(region) == 7 and region[-1] == "out"
    assert any(c.family == "segment_chain" and c.nodes == region for c in enumerate_candidates(graph))
    inputs = {"a": np.random.default_rng(s + d).standard_normal((*lead, s, 8)).astype(np.float32)}
    mc = context(graph, inputs, dtype)
    kernel, run, env = run_group(mc, Group(region, "segment_chain"), inputs)
    assert_reference(run.outputs, env, graph.outputs[0], dtype, 1e-5)
    rows = s * int(np.prod(lead or [1]))
    assert run.dram_write_bytes == rows * d * 4  # the output only: no intermediate leaves the chip


def test_a_row_reduction_is_no_member_and_an_int8_output_is_refused() -> None:
    b = GraphBuilder("not_segments")
    x = b.input("x", (4, 8))
    lo = b.op(OpType.Slice, x, axes=(1,), starts=(0,), ends=(4,), steps=(1,), name="lo")
    hi = b.op(OpType.Slice, x, axes=(1,), starts=(4,), ends=(8,), steps=(1,), name="hi")
    cat = b.op(OpType.Concat, hi, lo, axis=1, name="cat")
    b.output(b.op(OpType.Softmax, b.op(OpType.Exp, cat, name="e"), axis=1, name="sm"))
    graph = b.build()
    regions = find_segment_chains(graph)
    assert ("lo", "hi", "cat", "e") in regions and not any("sm" in r for r in regions)  # Softmax reduces rows
    mc = context(graph, {"x": np.ones((4, 8), np.float32)}, "fp32")
    assert not isinstance(try_build(mc, Group(("lo", "hi", "cat", "e"), "segment_chain")), str)
    graph8 = rotary_graph((), 4, 8, 4, False)
    mc8 = context(graph8, {"a": np.ones((4, 8), np.float32)}, "int8")
    refusal = try_build(mc8, Group(("lo",), "segment_chain"))  # the Slice keeps the MatMul's int8
    assert isinstance(refusal, str) and "int8" in refusal
