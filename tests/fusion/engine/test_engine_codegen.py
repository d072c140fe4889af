"""Each fused-kernel generator against the numpy reference, simulated in checked (race-detecting) mode."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from engine_helpers import (
    assert_reference,
    context,
    gemm_graph,
    linear_relu_graph,
    model,
    run_group,
    sparse_activations,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from fusion.engine.codegen.transpose import row_runs, scattered_rows
from fusion.engine.errors import CodegenError
from fusion.engine.kernel import build_kernel
from fusion.engine.plan import Group
from fusion.graph.builder import GraphBuilder
from fusion.graph.ir import Graph
from fusion.graph.ops import OpType
from fusion.lower.views import dense
from isa.enums import DType, Unit
from simulator.config import load_config


def _inputs(graph, seed=1):
    rng = np.random.default_rng(seed)
    return {v: rng.standard_normal(graph.types[v].shape).astype(np.float32) for v in graph.inputs}


@pytest.mark.parametrize("panels,resident", [(1, False), (2, False), (0, False), (1, True), (0, True)])
def test_gemm_epilogue_bias_residual_relu_fp32(panels: int, resident: bool) -> None:
    graph = gemm_graph()
    inputs = _inputs(graph)
    mc = context(graph, inputs, "fp32")
    group = Group(("mm", "add_bias", "add_res", "relu"), "epilogue", panels=panels, resident_a=resident)
    kernel, run, env = run_group(mc, group, inputs)
    assert kernel.outputs == ("relu",)
    np.testing.assert_allclose(run.outputs["relu"], env["relu"], rtol=1e-5, atol=1e-5)
    assert {"ep.cfg", "mx.drain"} <= {i.mnemonic for i in kernel.program.instructions()}
    # the intermediates never travel to DRAM: only x, r, w, bias are read and relu written
    assert run.dram_write_bytes == 32 * 40 * 4


def test_gemm_epilogue_int8_is_bit_exact() -> None:
    graph = linear_relu_graph()
    inputs = _inputs(graph)
    mc = context(graph, inputs, "int8")
    _, run, env = run_group(mc, Group(("fc", "relu"), "epilogue", panels=0), inputs)
    assert run.outputs["relu"].dtype == np.int8
    np.testing.assert_array_equal(run.outputs["relu"], env["relu"])


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
@pytest.mark.parametrize("strategy", ["epilogue", "zero_skip"])
@pytest.mark.parametrize("tile_m,panels", [(0, 1), (0, 2), (0, 0), (16, 4)])
def test_row_blocks_load_a_once_and_match_the_reference(dtype: str, strategy: str, tile_m: int, panels: int) -> None:
    """K = 256 leaves room for fewer than 64 rows: several row blocks (the last one short), each with its A
    loaded once into its block's buffer slot and reused by every panel step, race-free (checked mode)."""
    graph = linear_relu_graph(64, 256, 128, seed=3)
    x = {"x": sparse_activations((64, 256), 16, 0.5, seed=2)}
    mc = context(graph, x, dtype)
    group = Group(("fc", "relu"), strategy, tile_m, panels=panels)
    kernel, run, env = run_group(mc, group, x, "sparse" if strategy == "zero_skip" else "any")
    if dtype == "int8":
        np.testing.assert_array_equal(run.outputs["relu"], env["relu"])
    else:
        np.testing.assert_allclose(run.outputs["relu"], env["relu"], rtol=1e-5, atol=1e-5)
    # x is read once in all: per row block one load per k-slice, or (a short block) one load cut on chip
    x_bytes = 64 * 256 * 4
    w_bytes = 256 * 128 * (1 if dtype == "int8" else 4)
    blocks, rest = divmod(run.dram_read_bytes - x_bytes, w_bytes + 128 * 4)  # weight and bias once per block
    assert rest == 0 and 2 <= blocks <= 4


def test_gemm_epilogue_refuses_int8_bias_add_after_requantization() -> None:
    graph = gemm_graph(residual=False)
    inputs = _inputs(graph)
    mc = context(graph, inputs, "int8")
    with pytest.raises(CodegenError, match="requantization"):
        build_kernel(mc, Group(("mm", "add_bias"), "epilogue"))


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_zero_skip_is_exact_and_skips_matrix_work_on_sparse_data(dtype: str) -> None:
    graph = linear_relu_graph()
    x = sparse_activations((64, 128), 16, 0.75)
    assert 0.7 <= float(np.mean(x == 0)) <= 0.9
    mc = context(graph, {"x": x}, dtype)
    dense_k, dense, env = run_group(mc, Group(("fc", "relu"), "epilogue"), {"x": x})
    skip_k, skip, _ = run_group(mc, Group(("fc", "relu"), "zero_skip"), {"x": x}, "sparse")
    np.testing.assert_array_equal(skip.outputs["relu"], dense.outputs["relu"])
    if dtype == "int8":
        np.testing.assert_array_equal(skip.outputs["relu"], env["relu"])
    assert skip_k.guard.sparsity == "sparse" and dense_k.guard.sparsity == "any"
    assert skip.counters.matrix_busy < 0.5 * dense.counters.matrix_busy
    assert skip.cycles < dense.cycles


def test_zero_skip_on_dense_data_computes_everything() -> None:
    graph = linear_relu_graph()
    inputs = _inputs(graph)
    mc = context(graph, inputs, "fp32")
    _, skip, env = run_group(mc, Group(("fc", "relu"), "zero_skip"), inputs, "sparse")
    np.testing.assert_allclose(skip.outputs["relu"], env["relu"], rtol=1e-5, atol=1e-5)


def _chain_graph(kind: str):
    rng = np.random.default_rng(3)
    b = GraphBuilder(kind)
    x = b.input("x", (6, 40))
    if kind == "add_layernorm":
        h = b.op(OpType.Add, x, b.input("y", (6, 40)), name="add")
        scale, bias = (b.constant(rng.standard_normal(40).astype(np.float32)) for _ in range(2))
        out = b.op(OpType.LayerNorm, h, scale, bias, name="ln", axis=1, epsilon=1e-5)
    elif kind == "mul_softmax":
        h = b.op(OpType.Mul, x, b.constant(np.float32(0.25)), name="mul")
        out = b.op(OpType.Softmax, h, name="sm", axis=1)
    else:
        h = b.op(OpType.Add, x, b.constant(rng.standard_normal(40).astype(np.float32)), name="bias")
        out = b.op(OpType.Gelu, h, name="gelu", approximate="none")
    b.output(out)
    return b.build()


@pytest.mark.parametrize("kind", ["add_layernorm", "mul_softmax", "bias_gelu"])
def test_vector_chain_matches_reference_in_one_pass(kind: str) -> None:
    graph = _chain_graph(kind)
    inputs = _inputs(graph)
    mc = context(graph, inputs, "fp32")
    nodes = tuple(n.name for n in graph.nodes)
    kernel, run, env = run_group(mc, Group(nodes, "chain"), inputs)
    out = graph.outputs[0]
    np.testing.assert_allclose(run.outputs[out], env[out], rtol=1e-5, atol=1e-6)
    mnemonics = [i.mnemonic for i in kernel.program.instructions()]
    assert mnemonics.count("dma.st") == 1 and "vc.st" in mnemonics
    assert not any(m.startswith("v.") for m in mnemonics)  # no memory-to-memory vector pass


def test_chain_of_unfused_values_equals_unfused_kernels_bitwise() -> None:
    graph = _chain_graph("bias_gelu")
    inputs = _inputs(graph)
    mc = context(graph, inputs, "fp32")
    _, fused, env = run_group(mc, Group(("bias", "gelu"), "chain"), inputs)
    _, first, _ = run_group(mc, Group(("bias",), "unfused"), inputs)
    env2 = dict(env, **first.outputs)
    from fusion.engine.execute import run_kernel

    second = run_kernel(mc, build_kernel(mc, Group(("gelu",), "unfused")), env2)
    np.testing.assert_array_equal(fused.outputs["gelu"], second.outputs["gelu"])


def test_transposing_load_replaces_element_strided_transpose() -> None:
    graph, inputs = model("encoder_post_d64")
    mc = context(graph, inputs, "fp32")
    node = "node_Transpose_65"
    kernel, run, env = run_group(mc, Group((node,), "transpose_load"), inputs)
    out = graph.node(node).outputs[0]
    np.testing.assert_array_equal(run.outputs[out], env[out])
    mnemonics = [i.mnemonic for i in kernel.program.instructions()]
    assert mnemonics.count("dma.ldt") == 1 and mnemonics.count("dma.st") == 1  # perm (1, 2, 0): one whole load
    _, base, _ = run_group(mc, Group((node,), "unfused"), inputs)
    assert run.cycles < base.cycles / 4


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
@pytest.mark.parametrize("node", ["node_transpose_2", "node_permute", "node_transpose_1"])
def test_row_transpose_is_two_dmas_and_vector_copies(dtype: str, node: str) -> None:
    """A Transpose keeping the last axis (the attention's head split/merge): one contiguous load, `v.copy` per
    run of adjacent rows, one contiguous store; values exact in both dtypes (a copy)."""
    graph, inputs = model("encoder_post_d64")
    mc = context(graph, inputs, dtype)
    kernel, run, env = run_group(mc, Group((node,), "transpose_load"), inputs)
    out = graph.node(node).outputs[0]
    np.testing.assert_array_equal(run.outputs[out], env[out])
    mnemonics = [i.mnemonic for i in kernel.program.instructions()]
    assert mnemonics.count("dma.ld") == 1 and mnemonics.count("dma.st") == 1 and "v.copy" in mnemonics
    _, base, _ = run_group(mc, Group((node,), "unfused"), inputs)
    if node != "node_transpose_1":  # 8 strided DMAs become 2 (transpose_1 has 3 long ones: no gain, not chosen)
        assert run.cycles < 0.75 * base.cycles


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=2, max_size=5), st.randoms(use_true_random=False))
def test_row_runs_reproduce_numpy_transpose(shape: list[int], rnd) -> None:
    lead = list(range(len(shape) - 1))
    rnd.shuffle(lead)
    perm = (*lead, len(shape) - 1)
    x = np.arange(int(np.prod(shape))).reshape(shape)
    rows_in = x.reshape(-1, shape[-1])
    out = np.empty_like(rows_in)
    runs = row_runs(tuple(shape), perm)
    for o, i, count in runs:
        out[o : o + count] = rows_in[i : i + count]
    np.testing.assert_array_equal(out.reshape(x.transpose(perm).shape), x.transpose(perm))
    assert sum(c for _, _, c in runs) == len(rows_in)
    assert all(a[1] + a[2] != b[1] for a, b in zip(runs, runs[1:], strict=False))  # runs are maximal


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(1, 6), min_size=2, max_size=4),
    st.randoms(use_true_random=False),
    st.sampled_from(["fp32", "int8"]),
)
def test_every_transpose_through_transpose_load_equals_numpy(shape: list[int], rnd, dtype: str) -> None:
    """Any permutation: whole-tensor transposing load (+ row copies), per-block loads, or row permutation, as the
    generator picks; checked mode, values exact against the reference (numpy's transpose)."""
    perm = list(range(len(shape)))
    rnd.shuffle(perm)
    if perm == sorted(perm):
        perm = perm[1:] + perm[:1]
    b = GraphBuilder("transpose")
    b.output(b.op(OpType.Transpose, b.input("x", tuple(shape)), perm=tuple(perm), name="t"))
    graph = b.build()
    inputs = _inputs(graph)
    mc = context(graph, inputs, dtype)
    _, run, env = run_group(mc, Group(("t",), "transpose_load"), inputs)
    np.testing.assert_array_equal(run.outputs["t"], env["t"])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=2, max_size=4), st.integers(1, 8), st.randoms(use_true_random=False))
def test_scattered_rows_put_listed_rows_in_place(lead: list[int], width: int, rnd) -> None:
    """A writer's view listing a dense tensor's rows in a Transpose's order: the runs put a tile of listed rows
    into the dense order (numpy oracle); a view already in order needs no runs."""
    perm = list(range(len(lead)))
    rnd.shuffle(perm)
    x = np.arange(int(np.prod(lead)) * width).reshape(*lead, width)
    view = dense(0, x.shape, DType.f32).permute((*perm, len(lead)))
    slow_dram = replace(load_config("base"), dram_latency=10_000)  # the local permutation always pays
    found = scattered_rows(view, slow_dram)
    listed = x.transpose((*perm, len(lead))).reshape(-1, width)
    if np.array_equal(listed, x.reshape(-1, width)):  # the identity, or a permutation of size-1 axes only
        assert found is None
        return
    assert found is not None
    flat, runs = found
    placed = np.empty_like(listed)
    for d, k, count in runs:
        placed[d : d + count] = listed[k : k + count]
    np.testing.assert_array_equal(placed, x.reshape(-1, width))
    assert flat.shape == (x.size,) and flat.address == 0


def test_row_transpose_refuses_what_does_not_fit_a_slot() -> None:
    b = GraphBuilder("big")
    b.output(b.op(OpType.Transpose, b.input("x", (64, 64, 32)), perm=(1, 0, 2), name="t"))
    graph = b.build()
    mc = context(graph, _inputs(graph), "fp32")
    with pytest.raises(CodegenError, match="do not fit a buffer slot"):
        build_kernel(mc, Group(("t",), "transpose_load"))


def test_kernel_metadata_is_the_guard() -> None:
    graph = linear_relu_graph()
    inputs = _inputs(graph)
    mc = context(graph, inputs, "int8")
    kernel = build_kernel(mc, Group(("fc", "relu"), "zero_skip"), "sparse")
    (meta,) = kernel.program.kernels
    attrs = dict(meta.attrs)
    assert attrs["sparsity"] == "sparse" and attrs["config"] == mc.config.config_hash()
    assert attrs["strategy"] == "zero_skip" and attrs["dtype"] == "int8"
    assert [t.shape for t in meta.inputs] == [(64, 128)]


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_matmul_streams_into_softmax_without_a_scratchpad_round_trip(dtype: str) -> None:
    graph, inputs = model("encoder_post_d64")
    mc = context(graph, inputs, dtype)
    group = Group(("node_MatMul_73", "node_Softmax_74"), "stream")
    kernel, run, env = run_group(mc, group, inputs)
    out = graph.node("node_Softmax_74").outputs[0]
    if dtype == "int8":  # requantized in the chain exactly as the unfused MatMul's drain: bit-exact
        np.testing.assert_array_equal(run.outputs[out], env[out])
    else:
        np.testing.assert_allclose(run.outputs[out], env[out], rtol=1e-5, atol=1e-6)
    mnemonics = [i.mnemonic for i in kernel.program.instructions()]
    assert "mx.mms" in mnemonics and "vc.lds" in mnemonics and "mx.mm" not in mnemonics
    # the chain does not wait for the whole stream: no matrix -> vector hand-over, the store waits for both units
    pops = {str(i) for i in kernel.program.instructions() if i.mnemonic == "sync.pop"}
    mx, vx, st = (int(u) for u in (Unit.matrix, Unit.vector, Unit.store))
    assert f"Instruction(sync.pop {mx}, {vx})" not in pops and f"Instruction(sync.pop {mx}, {st})" in pops
    _, mm, _ = run_group(mc, Group(("node_MatMul_73",), "unfused"), inputs)
    _, sm, _ = run_group(mc, Group(("node_Softmax_74",), "unfused"), inputs)
    assert run.cycles < mm.cycles + sm.cycles
    assert run.dram_write_bytes < mm.dram_write_bytes + sm.dram_write_bytes


def _whole_graph_swapped(graph: Graph, dtype: str, tol: float):
    """The whole graph as one swapped group, simulated in checked mode; its output equals the reference (int8
    bit-exact, fp32 within `tol`). Returns (context, kernel, run)."""
    inputs = _inputs(graph)
    mc = context(graph, inputs, dtype)
    kernel, run, env = run_group(mc, Group(tuple(node.name for node in graph.nodes), "swapped"), inputs)
    assert_reference(run.outputs, env, graph.outputs[0], dtype, tol)
    return mc, kernel, run


def _short_wide(m: int, k: int, n: int, relu: bool, batch: int = 0) -> GraphBuilder:
    rng = np.random.default_rng(3)
    b = GraphBuilder("short_wide")
    x = b.input("x", (batch, m, k) if batch else (m, k))
    h = b.op(OpType.MatMul, x, b.constant((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), "w"))
    b.output(b.op(OpType.Relu, h, name="relu") if relu else h)
    return b.build()


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
@pytest.mark.parametrize("shape", [(16, 64, 192, False, 0), (5, 40, 70, True, 0), (8, 128, 64, False, 2)])
def test_swapped_gemm_matches_reference_with_a_preload_per_k_slice(dtype: str, shape: tuple) -> None:
    m, k, n, relu, batch = shape
    graph = _short_wide(m, k, n, relu, batch)
    _, kernel, run = _whole_graph_swapped(graph, dtype, 1e-5)
    if dtype == "int8":
        assert run.outputs[graph.outputs[0]].dtype == np.int8
    mnemonics = [i.mnemonic for i in kernel.program.instructions()]
    # a preload per k-slice of A^T (and per chunk of output columns), not per weight tile
    assert mnemonics.count("mx.preload") < -(-k // 16) * -(-n // 16)
    # (fewer matrix cycles than the plain GEMM no longer follows: the pipelined matrix unit overlaps its preloads
    # and skews too, so which orientation is faster is the planner's measured choice)


def test_swapped_gemm_refuses_what_neither_drain_nor_chain_can_apply() -> None:
    b = GraphBuilder("bad_epilogues")
    x = b.input("x", (8, 32))
    w = b.constant(np.ones((32, 24), np.float32), "w")
    b.output(b.op(OpType.Softmax, b.op(OpType.MatMul, x, w, name="mm"), axis=0, name="sm"))
    graph = b.build()
    mc = context(graph, _inputs(graph), "fp32")
    with pytest.raises(CodegenError, match="as a vector chain: .*last axis"):
        build_kernel(mc, Group(("mm", "sm"), "swapped"))


def _linear_block(m: int, k: int, n: int, tail: str, batch: int = 0, lead_transpose: bool = False) -> Graph:
    """[Transpose ->] x @ W -> + bias -> (+ residual -> LayerNorm | Relu -> Gelu): a Linear layer's epilogues."""
    rng = np.random.default_rng(7)
    b = GraphBuilder("linear_block")
    rows = (batch, m) if batch else (m,)
    x = b.input("x", (*rows[::-1], k) if lead_transpose else (*rows, k))
    if lead_transpose:
        x = b.op(OpType.Transpose, x, perm=(1, 0, 2), name="t")
    w = b.constant((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), "w")
    h = b.op(OpType.MatMul, x, w, name="mm")
    h = b.op(OpType.Add, h, b.constant(rng.standard_normal(n).astype(np.float32), "bias"), name="add_bias")
    if tail == "layernorm":
        h = b.op(OpType.Add, b.input("r", (*rows, n)), h, name="add_res")
        gamma = b.constant((1 + 0.1 * rng.standard_normal(n)).astype(np.float32), "gamma")
        h = b.op(OpType.LayerNorm, h, gamma, b.constant(np.zeros(n, np.float32), "beta"), axis=len(rows), epsilon=1e-5)
    else:
        h = b.op(OpType.Gelu, b.op(OpType.Relu, h, name="relu"), approximate="none", name="gelu")
    b.output(h)
    return b.build()


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
@pytest.mark.parametrize(
    "shape",
    [
        (16, 64, 64, "layernorm", 0, False),  # whole rows: one block
        (8, 64, 512, "layernorm", 2, False),  # 16 rows x 512 exceed a vector register: blocks of whole rows
        (16, 96, 512, "gelu", 0, False),  # elementwise: blocks of all rows and some columns
        (8, 64, 48, "layernorm", 2, True),  # a leading-axis Transpose absorbed: rows and residual reordered
    ],
)
def test_swapped_gemm_runs_a_chain_epilogue_after_the_transposing_load(dtype: str, shape: tuple) -> None:
    """Bias, residual, LayerNorm, ReLU, GELU: what the drain cannot apply per row of C^T runs as a vector chain on
    the C tiles phase 2 loads back; the numerics are the unfused nodes' (int8 bit-exact), and the intermediates
    never reach DRAM."""
    m, k, n, tail, batch, lead = shape
    graph = _linear_block(m, k, n, tail, batch, lead)
    mc, kernel, run = _whole_graph_swapped(graph, dtype, 1e-4)
    nodes = tuple(node.name for node in graph.nodes)
    inputs = _inputs(graph)
    mnemonics = {i.mnemonic for i in kernel.program.instructions()}
    assert {"dma.ldt", "vc.ld", "vc.st"} <= mnemonics
    rows = m * max(batch, 1)
    out_bytes = rows * n * 4
    c_bytes = rows * n * (1 if dtype == "int8" else 4)
    assert run.dram_write_bytes == c_bytes + out_bytes  # C^T once, the result once: no intermediate
    separate = [Group((node,), "unfused") for node in nodes]
    written = sum(run_group(mc, g, inputs)[1].dram_write_bytes for g in separate)
    assert run.dram_write_bytes < written


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_swapped_gemm_absorbs_a_leading_axis_transpose(dtype: str) -> None:
    rng = np.random.default_rng(4)
    b = GraphBuilder("transpose_linear")
    x = b.input("x", (2, 8, 64))
    t = b.op(OpType.Transpose, x, perm=(1, 0, 2), name="t")
    w = b.constant((rng.standard_normal((64, 48)) / 8).astype(np.float32), "w")
    b.output(b.op(OpType.Relu, b.op(OpType.MatMul, t, w, name="mm"), name="relu"))
    graph = b.build()
    inputs = _inputs(graph)
    mc = context(graph, inputs, dtype)
    kernel, run, env = run_group(mc, Group(("t", "mm", "relu"), "swapped"), inputs)
    if dtype == "int8":
        np.testing.assert_array_equal(run.outputs["relu"], env["relu"])
    else:
        np.testing.assert_allclose(run.outputs["relu"], env["relu"], rtol=1e-5, atol=1e-5)
    assert kernel.inputs == ("x",)  # the transposed copy of x never exists in DRAM
    _, alone, _ = run_group(mc, Group(("t",), "unfused"), inputs)
    _, mm, _ = run_group(mc, Group(("mm", "relu"), "swapped"), inputs)
    assert run.dram_read_bytes + run.dram_write_bytes < sum(r.dram_read_bytes + r.dram_write_bytes for r in (alone, mm))
    with pytest.raises(CodegenError, match="leading axes"):
        c = GraphBuilder("bad")
        y = c.op(OpType.Transpose, c.input("x", (64, 16)), perm=(1, 0), name="t")
        c.output(c.op(OpType.MatMul, y, c.constant(np.ones((64, 8), np.float32), "w"), name="mm"))
        bad = c.build()
        build_kernel(context(bad, _inputs(bad), "fp32"), Group(("t", "mm"), "swapped"))


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_swapped_gemm_stores_rows_where_a_following_transpose_puts_them(dtype: str) -> None:
    rng = np.random.default_rng(5)
    b = GraphBuilder("linear_transpose")
    x = b.input("x", (16, 32))
    h = b.op(OpType.Gemm, x, b.constant((rng.standard_normal((32, 40)) / 6).astype(np.float32), "w"), name="fc")
    h = b.op(OpType.Reshape, h, shape=(8, 2, 40), name="view")
    b.output(b.op(OpType.Transpose, h, perm=(1, 0, 2), name="t"))
    graph = b.build()
    inputs = _inputs(graph)
    mc = context(graph, inputs, dtype)
    kernel, run, env = run_group(mc, Group(("fc", "view", "t"), "swapped"), inputs)
    assert kernel.outputs == ("t",)
    if dtype == "int8":
        np.testing.assert_array_equal(run.outputs["t"], env["t"])
    else:
        np.testing.assert_allclose(run.outputs["t"], env["t"], rtol=1e-5, atol=1e-5)


def _conv_graph(c: int, cout: int, hw: int, pads: int, residual: bool, relu: bool, bias: bool = True):
    rng = np.random.default_rng(6)
    b = GraphBuilder("conv_block")
    x = b.input("x", (1, c, hw, hw))
    w = b.constant((rng.standard_normal((cout, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32), "w")
    args = [x, w] + ([b.constant((rng.standard_normal(cout) * 0.1).astype(np.float32), "b")] if bias else [])
    attrs = {"dilations": (1, 1), "group": 1, "pads": (pads,) * 4, "strides": (1, 1)}
    h = b.op(OpType.Conv, *args, name="conv", **attrs)
    names = ["conv"]
    if residual:
        h = b.op(OpType.Add, h, b.input("r", (1, cout, hw - 2 + 2 * pads, hw - 2 + 2 * pads)), name="add")
        names.append("add")
    if relu:
        h = b.op(OpType.Relu, h, name="relu")
        names.append("relu")
    b.output(h)
    return b.build(), tuple(names)


@pytest.mark.parametrize(
    "dtype,case",
    [
        ("int8", (8, 8, 16, 1, False, True)),
        ("fp32", (8, 8, 16, 1, True, True)),
        ("fp32", (20, 12, 9, 0, False, False)),
        ("int8", (20, 12, 9, 0, False, True)),
    ],
)
def test_implicit_gemm_conv_fuses_bias_residual_relu_into_the_drain(dtype: str, case: tuple) -> None:
    graph, names = _conv_graph(*case)
    inputs = _inputs(graph)
    mc = context(graph, inputs, dtype)
    kernel, run, env = run_group(mc, Group(names, "implicit_gemm"), inputs)
    out = graph.outputs[0]
    if dtype == "int8":
        np.testing.assert_array_equal(run.outputs[out], env[out])
    else:
        np.testing.assert_allclose(run.outputs[out], env[out], rtol=1e-4, atol=1e-5)
    _, alone, _ = run_group(mc, Group(("conv",), "unfused"), inputs)
    assert run.cycles < alone.cycles  # no im2col matrix in DRAM, channels streamed as columns


def test_implicit_gemm_runs_an_int8_residual_and_a_strided_conv() -> None:
    """int8: a Conv read only by its residual Add is dequantized (#12), so the kernel adds the residual in
    float32 after the per-channel rescale, as the unfused Add does: bit-exact, no requantization skipped."""
    graph, names = _conv_graph(8, 8, 8, 1, True, True)
    inputs = _inputs(graph)
    _, run, env = run_group(context(graph, inputs, "int8"), Group(names, "implicit_gemm"), inputs)
    np.testing.assert_array_equal(run.outputs[graph.outputs[0]], env[graph.outputs[0]])
    rng = np.random.default_rng(0)
    b = GraphBuilder("strided")
    w = b.constant(rng.standard_normal((4, 4, 3, 3)).astype(np.float32), "w")
    attrs = {"dilations": (1, 1), "group": 1, "pads": (1, 1, 1, 1), "strides": (2, 2)}
    b.output(b.op(OpType.Conv, b.input("x", (1, 4, 8, 8)), w, name="conv", **attrs))
    strided = b.build()
    inputs = _inputs(strided)
    _, run, env = run_group(context(strided, inputs, "fp32"), Group(("conv",), "implicit_gemm"), inputs)
    np.testing.assert_allclose(run.outputs[strided.outputs[0]], env[strided.outputs[0]], rtol=1e-4, atol=1e-5)


def _encoder_group(nodes: tuple, strategy: str, dtype: str, tol: float):
    """A group of the d64 encoder (Transpose, a view, its consumer) run as one kernel in checked mode, its output
    equal to the reference (int8 bit-exact, fp32 within `tol`), and the same nodes run apart (Transpose and
    consumer unfused, the view on the host). Returns (graph, kernel, run, runs apart)."""
    graph, inputs = model("encoder_post_d64")
    mc = context(graph, inputs, dtype)
    kernel, run, env = run_group(mc, Group(nodes, strategy), inputs)
    out = graph.node(nodes[-1]).outputs[0]
    if dtype == "int8":
        np.testing.assert_array_equal(run.outputs[out], env[out])
    else:
        np.testing.assert_allclose(run.outputs[out], env[out], rtol=tol, atol=tol)
    apart = [run_group(mc, Group((n,), "alias" if n == nodes[1] else "unfused"), inputs)[1] for n in nodes]
    return graph, kernel, run, apart


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
@pytest.mark.parametrize(
    "nodes",
    [
        ("node_transpose_2", "node_view_4", "node_Mul_69"),  # head split, a view, the query scaling
        ("node_Transpose_65", "node_Reshape_67", "node_Mul_72"),  # K^T (a whole-tensor transposing load), scaling
    ],
)
def test_layout_chain_reads_the_transposed_tensor_from_local_memory(dtype: str, nodes: tuple) -> None:
    """Transpose -> Reshape -> Mul as one kernel: the transposed tensor never reaches DRAM (one load, one store),
    values as the three unfused kernels give them (int8 bit-exact), in fewer cycles."""
    graph, kernel, run, apart = _encoder_group(nodes, "chain", dtype, 1e-6)
    mnemonics = [i.mnemonic for i in kernel.program.instructions()]
    assert mnemonics.count("dma.ld") + mnemonics.count("dma.ldt") == 1 and mnemonics.count("dma.st") == 1
    assert kernel.inputs == (graph.node(nodes[0]).inputs[0],)
    assert run.cycles < sum(r.cycles for r in apart)
    assert run.dram_read_bytes + run.dram_write_bytes < sum(r.dram_read_bytes + r.dram_write_bytes for r in apart)


def test_layout_chain_refuses_a_reshape_that_moves_the_last_axis() -> None:
    b = GraphBuilder("bad_layout")
    t = b.op(OpType.Transpose, b.input("x", (4, 8, 16)), perm=(1, 0, 2), name="t")
    r = b.op(OpType.Reshape, t, shape=(8, 64), name="r")
    b.output(b.op(OpType.Relu, r, name="relu"))
    graph = b.build()
    mc = context(graph, _inputs(graph), "fp32")
    with pytest.raises(CodegenError, match="keeping the last axis"):
        build_kernel(mc, Group(("t", "r", "relu"), "chain"))


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
@pytest.mark.parametrize("perm", [(1, 0, 2), (2, 0, 1), (0, 2, 1)])
def test_layout_chain_with_row_tile_and_reduction_operands(dtype: str, perm: tuple) -> None:
    """Row transposes and element transposes feeding bias (a row), residual (a tile) and Softmax (a row
    reduction): the chain runs on the locally assembled tensor in output order."""
    rng = np.random.default_rng(9)
    b = GraphBuilder("layout_chain")
    x = b.input("x", (4, 6, 8))
    t = b.op(OpType.Transpose, x, perm=perm, name="t")
    shape = tuple((4, 6, 8)[p] for p in perm)
    h = b.op(OpType.Add, t, b.constant(rng.standard_normal(shape[-1]).astype(np.float32), "bias"), name="add")
    h = b.op(OpType.Add, h, b.input("r", shape), name="res")
    b.output(b.op(OpType.Softmax, h, axis=2, name="sm"))
    graph = b.build()
    inputs = _inputs(graph)
    mc = context(graph, inputs, dtype)
    kernel, run, env = run_group(mc, Group(("t", "add", "res", "sm"), "chain"), inputs)
    np.testing.assert_allclose(run.outputs["sm"], env["sm"], rtol=1e-5, atol=1e-6)
    if dtype == "int8":
        np.testing.assert_array_equal(run.outputs["sm"], env["sm"])


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_layout_load_reads_the_transposed_operand_in_place(dtype: str) -> None:
    """Head split -> view -> attention MatMul (V): the MatMul reads V through the permuted, reshaped view of the
    Transpose's input; no transposed copy is written, values equal the reference, fewer cycles than apart."""
    nodes = ("node_transpose_4", "node_view_6", "node_scaled_dot_product_attention")
    graph, kernel, run, apart = _encoder_group(nodes, "transpose_load", dtype, 1e-5)
    transposed = graph.node(nodes[0]).inputs[0]
    assert transposed in kernel.inputs and graph.node(nodes[0]).outputs[0] not in kernel.outputs
    assert run.cycles < sum(r.cycles for r in apart)
    assert run.dram_write_bytes < sum(r.dram_write_bytes for r in apart)


def test_layout_load_leaves_constant_weight_gemms_to_the_swapped_orientation() -> None:
    graph, inputs = model("encoder_post_d64")
    mc = context(graph, inputs, "fp32")
    with pytest.raises(CodegenError, match="constant weight"):
        build_kernel(mc, Group(("node_transpose", "node_MatMul_1"), "transpose_load"))
