"""A whole transformer MLP as one kernel (`codegen.mlp`): [residual Add + LayerNorm] -> GEMM1 + bias -> activation
-> GEMM2 + bias [+ residual Add [+ the following LayerNorm]], the hidden activation kept on chip. Random token
counts (not multiples of the array size), widths, hidden sizes, activations and prologue/epilogue variants
(hypothesis), simulated in checked (race-detecting) mode: int8 bit-exact against the quantized reference, fp32
within 1e-5; DRAM traffic is the compulsory (activations in once, weights once per row block, outputs out)."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import assert_reference, context, run_group
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fusion.engine.candidates import enumerate_candidates
from fusion.engine.codegen.mlp import _Kernel
from fusion.engine.kernel import dram_forms, group_subgraph, try_build
from fusion.engine.mlp_match import find_mlps
from fusion.engine.plan import Group
from fusion.graph.builder import GraphBuilder
from fusion.graph.ir import Graph
from fusion.graph.ops import OpType
from fusion.lower.compiler import plan_dram
from fusion.lower.context import LowerContext
from isa.enums import Unit


def mlp_graph(m: int, d: int, h: int, act: str, post_ln: bool, seed: int = 0, views: bool = False) -> Graph:
    """s = x + r; LN(s) @ W1 + b1 -> act -> @ W2 + b2 + s [-> LN, whose input is also read after it]. `views`: the
    GEMMs on 2-D tokens x features between Reshapes keeping the last axis, as GPT-2 exports them."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("mlp")

    def const(*shape: int, scale: float = 1.0) -> str:
        return b.constant((rng.standard_normal(shape) * scale).astype(np.float32))

    def view(value: str, *shape: int) -> str:
        return b.op(OpType.Reshape, value, shape=shape) if views else value

    s = b.op(OpType.Add, b.input("x", (1, m, d)), b.input("r", (1, m, d)), name="res1")
    ln = view(b.op(OpType.LayerNorm, s, const(d), const(d), name="ln1", axis=2, epsilon=1e-5), m, d)
    hid = view(b.op(OpType.MatMul, ln, const(d, h, scale=d**-0.5), name="fc1"), 1, m, h)
    hid = b.op(OpType.Add, hid, const(h), name="b1")
    if act == "gelu":
        hid = b.op(OpType.Gelu, hid, name="gelu", approximate="none")
    elif act == "silu":
        hid = b.op(OpType.Mul, hid, b.op(OpType.Sigmoid, hid, name="sig"), name="silu")
    else:
        hid = b.op(OpType.Relu, hid, name="relu")
    out = view(b.op(OpType.MatMul, view(hid, m, h), const(h, d, scale=h**-0.5), name="fc2"), 1, m, d)
    out = b.op(OpType.Add, s, b.op(OpType.Add, out, const(d, scale=0.1), name="b2"), name="res2")
    if post_ln:
        normed = b.op(OpType.LayerNorm, out, const(d), const(d), name="ln2", axis=2, epsilon=1e-5)
        out = b.op(OpType.Add, out, normed, name="after")
    b.output(out)
    return b.build()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(2, 40),  # one token: its residual is a row vector to `chain.operands`: refused (not a constant)
    d=st.sampled_from([8, 16, 24, 64]),
    h=st.sampled_from([16, 40, 64, 128]),
    act=st.sampled_from(["gelu", "silu", "relu"]),
    post_ln=st.booleans(),
    pre=st.booleans(),
    post=st.integers(0, 4),
    panels=st.sampled_from([1, 2, 0]),
    dtype=st.sampled_from(["fp32", "int8"]),
    views=st.booleans(),
)
@example(m=17, d=64, h=128, act="gelu", post_ln=True, pre=True, post=3, panels=0, dtype="int8", views=False)  # ViT
@example(m=16, d=16, h=64, act="gelu", post_ln=True, pre=True, post=3, panels=0, dtype="int8", views=True)  # GPT-2
def test_an_mlp_kernel_matches_the_reference_and_moves_only_compulsory_bytes(
    m, d, h, act, post_ln, pre, post, panels, dtype, views
) -> None:
    graph = mlp_graph(m, d, h, act, post_ln, seed=m * d + h, views=views)
    (match,) = find_mlps(graph)
    variants = match.variants(graph)
    posts = sum(n.op != OpType.Reshape for n in match.post)
    assert len(variants) == 2 * (1 + posts)
    nodes = variants[(not pre) * (1 + posts) + min(post, posts)]
    assert all(n.op != OpType.Reshape for n in graph.nodes if n.name in (nodes[0], nodes[-1]))
    assert any(c.family == "mlp" and c.nodes == nodes for c in enumerate_candidates(graph))
    _check(graph, nodes, m, d, h, dtype, Group(nodes, "mlp", panels=panels))


def _check(graph: Graph, nodes: tuple[str, ...], m: int, d: int, h: int, dtype: str, group: Group) -> _Kernel:
    """Run the group race-checked on random inputs: its outputs against the reference, its DRAM traffic the
    compulsory; returns the kernel's decisions."""
    rng = np.random.default_rng(m + d)
    inputs = {v: rng.standard_normal((1, m, d)).astype(np.float32) for v in ("x", "r")}
    mc = context(graph, inputs, dtype)
    kernel, run, env = run_group(mc, group, inputs)
    for value in kernel.outputs:
        assert_reference(run.outputs, env, value, dtype, 1e-5)
    sub = group_subgraph(graph, group)
    forms, scratch = dram_forms(mc, sub, group)
    _, addresses, _ = plan_dram(sub, mc.qplan, mc.config, forms, whole_program=True, scratch=scratch)
    cx = LowerContext(sub, mc.config, mc.qplan, mc.params, addresses)
    k = _Kernel(cx, sub.nodes, group.panels, group.tile_m)
    blocks = -(-m // k.tile)
    stored = sum(run.outputs[v].nbytes for v in kernel.outputs)
    assert run.dram_write_bytes == stored
    activations = sum(env[v].nbytes for v in kernel.inputs)
    n = mc.config.array_size  # both weights once per row block, hidden and output columns padded to the array,
    hp = -(-h // n) * n  # with b1 (the activation chain's row operand, float32) beside each hidden panel's weights
    weights = hp * (d + -(-d // n) * n) * (1 if dtype == "int8" else 4) + hp * 4
    assert run.dram_read_bytes == activations + weights * blocks + k.params_bytes
    return k


@pytest.mark.parametrize(
    ("m", "d", "h", "dtype", "panels", "tile_m", "pipelined"),
    [
        (40, 64, 128, "int8", 2, 16, True),  # 3 row blocks, 4 hidden groups each
        (40, 64, 128, "fp32", 2, 0, True),  # fp32 with rows enough for the matrix to outlast the weight DMA
        (40, 64, 48, "int8", 2, 0, True),  # a last group of one panel: the first group's chain in its step
        (37, 16, 128, "int8", 1, 8, False),  # a panel's matrix work is shorter than its weight DMA: in series
        (40, 64, 128, "fp32", 1, 13, False),
    ],
)
def test_the_hidden_groups_overlap_where_the_matrix_outlasts_the_weight_dma(m, d, h, dtype, panels, tile_m, pipelined):
    """GEMM2 of a hidden group lags behind the next group's GEMM1 (its activation chain on the vector unit
    meanwhile) only where a step's matrix work outlasts its weight DMA; over several row blocks, race-checked."""
    graph = mlp_graph(m, d, h, "gelu", True, seed=m + h)
    (match,) = find_mlps(graph)
    nodes = max(match.variants(graph), key=len)
    k = _check(graph, nodes, m, d, h, dtype, Group(nodes, "mlp", panels=panels, tile_m=tile_m))
    assert k._matrix_bound(k.panels, k.tile) == pipelined
    assert k.all_panels > k.panels and (tile_m == 0 or k.tile == tile_m)


def test_what_is_not_an_mlp_is_refused_with_a_reason() -> None:
    graph = mlp_graph(8, 16, 32, "gelu", False)
    mc = context(graph, {v: np.ones((1, 8, 16), np.float32) for v in ("x", "r")}, "fp32")
    assert "two matrix nodes" in try_build(mc, Group(("fc1", "b1", "gelu"), "mlp"))
    b = GraphBuilder("ln_inside")  # a row reduction of the hidden activation cannot run on hidden panels
    x = b.input("x", (4, 16))
    hid = b.op(OpType.MatMul, x, b.constant(np.ones((16, 32), np.float32)), name="fc1")
    hid = b.op(OpType.Softmax, hid, name="soft", axis=1)
    b.output(b.op(OpType.MatMul, hid, b.constant(np.ones((32, 16), np.float32)), name="fc2"))
    graph = b.build()
    assert find_mlps(graph) == []
    mc = context(graph, {"x": np.ones((4, 16), np.float32)}, "fp32")
    assert "cannot reduce whole hidden rows" in try_build(mc, Group(("fc1", "soft", "fc2"), "mlp"))


@pytest.mark.parametrize("dtype", ["int8", "fp32"])
@pytest.mark.parametrize(("d", "partial"), [(64, 0), (40, 8)])
def test_the_output_panels_are_drained_into_their_columns_in_place(dtype: str, d: int, partial: int) -> None:
    """GEMM2's whole N-column panels are drained straight into their columns of the output rows (`mx.drain.s`,
    row stride D), not stitched by a copy per row and panel; only a partial last panel is copied, a row at a time."""
    m = 17
    graph = mlp_graph(m, d, 64, "gelu", False, seed=d)
    (match,) = find_mlps(graph)
    program, n = _one_block(graph, min(match.variants(graph), key=len), m, d, dtype)
    assert sum(op == "mx.drain.s" for op, _ in program) == d // n
    stitched = [f for op, f in program if op == "v.copy" and f["n"] <= n]  # a copy of at most a panel's row
    assert len(stitched) == (m if partial else 0)


@pytest.mark.parametrize("dtype", ["int8", "fp32"])
@pytest.mark.parametrize("post_ln", [False, True])
def test_the_epilogue_starts_on_the_drained_rows_alone(dtype: str, post_ln: bool) -> None:
    """The epilogue chain's operands already on chip (the kept residual sum, the parameter rows) are loaded into
    vector registers after the last activation chain, while the matrix unit runs the last GEMM2: after the drains'
    token the vector unit loads the drained rows alone before its first result."""
    m, d = 17, 64
    graph = mlp_graph(m, d, 128, "gelu", post_ln, seed=m)
    (match,) = find_mlps(graph)
    program, _ = _one_block(graph, max(match.variants(graph), key=len), m, d, dtype)
    drained = max(
        i
        for i, (op, f) in enumerate(program)
        if op == "sync.pop" and (f["src"], f["dst"]) == (Unit.matrix, Unit.vector)
    )
    first = next(i for i in range(drained, len(program)) if program[i][0] == "vc.st")
    assert [op for op, _ in program[drained:first]].count("vc.ld") == 1


def _one_block(graph: Graph, nodes: tuple[str, ...], m: int, d: int, dtype: str) -> tuple[list, int]:
    """The group as one row block, run race-checked against the reference: its instructions (mnemonic, fields)
    and the array size."""
    rng = np.random.default_rng(d)
    inputs = {v: rng.standard_normal((1, m, d)).astype(np.float32) for v in ("x", "r")}
    mc = context(graph, inputs, dtype)
    kernel, run, env = run_group(mc, Group(nodes, "mlp", tile_m=m), inputs)
    for value in kernel.outputs:
        assert_reference(run.outputs, env, value, dtype, 1e-5)
    return [(i.mnemonic, i.by_name()) for i in kernel.program.instructions()], mc.config.array_size
