"""A vector chain that also stores an intermediate read outside it (`codegen.chain.stored_intermediates`): a
pre-LN block's residual sum feeds its LayerNorm (in the chain) and the next residual Add (outside). Random shapes
(hypothesis), simulated in checked (race-detecting) mode: both stored values equal the reference, int8 bit-exact
(the chain reads int8 MatMul outputs), fp32 within 1e-5; candidates and legality offer it only when every outside
reader runs after the chain."""

from __future__ import annotations

import numpy as np
from engine_helpers import assert_reference, context, run_group
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fusion.engine.candidates import enumerate_candidates
from fusion.engine.legality import structurally_legal
from fusion.engine.plan import Group
from fusion.graph.builder import GraphBuilder
from fusion.graph.ir import Graph
from fusion.graph.ops import OpType


def residual_graph(lead: tuple[int, ...], m: int, d: int, seed: int = 0) -> Graph:
    """s = x @ W1 + y @ W2 (both MatMul outputs: int8 on the int8 path); h = LayerNorm(s) @ W3; out = h + s."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("residual")
    x, y = b.input("x", (*lead, m, 8)), b.input("y", (*lead, m, 8))
    w = [b.constant(rng.standard_normal(shape).astype(np.float32)) for shape in ((8, d), (8, d), (d, d))]
    s = b.op(OpType.Add, b.op(OpType.MatMul, x, w[0], name="p"), b.op(OpType.MatMul, y, w[1], name="q"), name="sum")
    gamma = b.constant((1 + 0.1 * rng.standard_normal(d)).astype(np.float32))
    beta = b.constant((0.1 * rng.standard_normal(d)).astype(np.float32))
    ln = b.op(OpType.LayerNorm, s, gamma, beta, axis=len(lead) + 1, epsilon=1e-5, name="ln")
    b.output(b.op(OpType.Add, b.op(OpType.MatMul, ln, w[2], name="h"), s, name="out"))
    return b.build()


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lead=st.lists(st.integers(1, 3), max_size=1),
    m=st.integers(1, 40),
    d=st.integers(1, 200),
    dtype=st.sampled_from(["fp32", "int8"]),
)
@example(lead=[], m=1, d=2, dtype="fp32")  # one row: the second operand (1, d) was read as a stride-0 row
def test_a_chain_stores_the_residual_sum_it_normalises(lead, m, d, dtype) -> None:
    graph = residual_graph(tuple(lead), m, d, seed=m * d)
    assert any(c.family == "chain" and c.nodes == ("sum", "ln") for c in enumerate_candidates(graph))
    inputs = {
        v: np.random.default_rng(m + d + i).standard_normal((*lead, m, 8)).astype(np.float32)
        for i, v in enumerate("xy")
    }
    mc = context(graph, inputs, dtype)
    assert structurally_legal(mc, [graph.node("sum"), graph.node("ln")], "chain")
    kernel, run, env = run_group(mc, Group(("sum", "ln"), "chain"), inputs)
    assert set(kernel.outputs) == {"sum", "ln"}
    for value in kernel.outputs:
        assert_reference(run.outputs, env, value, dtype, 1e-5)
    assert run.dram_write_bytes == 2 * m * d * 4 * int(np.prod(lead or [1]))  # each value once, float32
