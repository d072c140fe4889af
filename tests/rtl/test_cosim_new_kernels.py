"""The engine's newer kernel families on the RTL, on `tiny`: the conv schedules `implicit_packed` and
`implicit_stationary`, layer fusion (`conv_chain`: a basic block with its residual, a bottleneck, a MobileNetV2
inverted residual with its ReLU6 Clips and depthwise middle), the dequantizing int8 conv epilogue (per-channel f32
rescale + residual add), the `gated` MLP, the `segment_chain` (rotary) kernel, a vector chain through a row
reduction (RMSNorm), fused attention (grouped-query, causal and padding masks), a patch embedding (patchify
Conv + class token + position Add + LayerNorm, `patch_embed`), a whole transformer MLP (`mlp`), an attention with its
projections (`attention_proj`) and a conv with its MaxPool (`conv_pool`: from the DRAM scratch, and on chip with
four banks), plus the baseline's frame
kernels in geometries the window-kernel regression (`test_cosim_lower.py`) does not take (strided depthwise, a
stride-1 max pool with asymmetric padding: their integer masks).

Each kernel is built by the engine's generator for its group (the group the candidate enumeration offers where
there is one), checked against the (quantized) reference, simulated on the reference's values with transaction
recording and replayed on the Verilog units: values and cycles exact. Float arithmetic has no RTL datapath; a
float kernel's loads, stores and copies replay as 32-bit patterns (`rtl.cosim.BIT_MOVES`), so the fp32 run checks
their lane placement and timing (the rotary halves moved at lane offsets, the chains' loads and stores)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.bench_layer_fusion import inverted_residual
from fusion.engine.candidates import enumerate_candidates
from fusion.engine.kernel import build_kernel
from fusion.engine.plan import Group
from fusion.graph.ir import Graph
from fusion.graph.ops import OpType
from fusion.lower.compiler import compile as compile_model
from rtl.cosim import Recorded, cosimulate
from simulator.config import PRESETS
from simulator.run import simulate

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fusion" / "engine"))
# graph builders of the engine's own tests (test modules beside them, no package)
from attention_graphs import AttentionShape, attention_graph  # noqa: E402
from engine_helpers import context, conv_graph, gated_mlp_graph, reference_env, rotary_graph  # noqa: E402
from test_codegen_conv_chain import chain_graph  # noqa: E402
from test_codegen_conv_dequant import residual_graph  # noqa: E402
from test_codegen_conv_pool import _graph as conv_pool_graph  # noqa: E402
from test_codegen_mlp import mlp_graph  # noqa: E402
from test_codegen_patch_embed import patch_graph  # noqa: E402
from test_codegen_row_reductions import _rms_graph  # noqa: E402
from test_cosim_lower import _conv, _pool  # noqa: E402

pytestmark = pytest.mark.rtl
TINY = PRESETS["tiny"]
# `tiny`'s array and lanes (what the RTL units are built with) with four scratchpad and accumulator banks: the
# kernels that keep a spare bank (the whole MLP's hidden panels, the projected attention's accumulated output)
# refuse tiny's two; banks are the simulator's arbitration, not part of the RTL units
TINY_4_BANKS = dataclasses.replace(TINY, name="tiny_4_banks", spad_banks=4, acc_banks=4)
SPARE_BANK = frozenset({"mlp", "attention_proj", "conv_pool_on_chip"})  # conv_pool on chip: its ring there


def _offered(graph: Graph, family: str) -> tuple[str, ...]:
    """The largest group of `family` the engine's candidate enumeration offers."""
    return max((c.nodes for c in enumerate_candidates(graph) if c.family == family), key=len)


def _groups() -> dict[str, tuple[Graph, Group]]:
    packed, packed_nodes = conv_graph(1, 8, 8, (6, 6), (3, 3), (2, 1), (1, 1), (1, 0, 1, 1), 1, True)
    stationary, stationary_nodes = conv_graph(1, 8, 12, (2, 2), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1, True)
    grouped, grouped_nodes = conv_graph(2, 8, 8, (3, 3), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), 2, False)
    band, band_nodes = conv_graph(1, 8, 8, (6, 5), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1, True)
    dilated_1d, dilated_1d_nodes = conv_graph(1, 4, 8, (9,), (3,), (2,), (2,), (2, 1), 1, True)
    block, block_nodes = chain_graph(8, (6, 5), [(8, 3, 1, True), (8, 3, 1, False)], residual=True)
    bottleneck, bottleneck_nodes = chain_graph(8, (7, 6), [(4, 1, 1, True), (8, 3, 2, True), (12, 1, 1, False)])
    inverted, inverted_nodes = inverted_residual(4, (5, 4), 2, 4, 1)  # ReLU6s, a depthwise middle, + x
    dequant = residual_graph(c=8, cout=8, size=6, kernel=3, stride=1, pad=1)
    gated = gated_mlp_graph((), 6, 12, 8, "silu")
    rotary = rotary_graph((2,), 5, 8, 3, False)
    rms, rms_nodes = _rms_graph((6, 12), 1e-5, False, "div1", seed=2)
    # grouped-query attention with causal and key-padding masks, 5 tokens: rows ragged on the 4-wide array
    attention, _ = attention_graph(AttentionShape(seq=5, heads=2, kv_heads=1, head_dim=8, causal=True, key_len=4))
    # a ViT patch embedding: 3 x 9 x 8 image, 3 x 4 patches (a leftover row), class token, position Add, LayerNorm
    patches = patch_graph(1, 3, 6, (9, 8), (3, 4), True, tail="layernorm")
    # a whole MLP: residual Add + LayerNorm, GEMM + bias, GELU, GEMM + bias + residual, the next LayerNorm; 5 tokens
    mlp = mlp_graph(5, 8, 12, "gelu", True, seed=1)
    # an attention with its packed Q/K/V projection and output projection taken in (ViT's), 5 tokens
    projected, _ = attention_graph(
        AttentionShape(seq=5, heads=2, head_dim=4, scale="none", prescale=True, fused_qkv=True)
    )
    # a stem: Conv + ReLU + MaxPool(3, stride 2, pad 1) in one kernel
    pooled, pooled_nodes = conv_pool_graph(3, 8, (7, 7), 3, 2, 1, True, ((3, 3), (2, 2), (1, 1), (1,) * 4, 0))
    return {
        "implicit_packed": (packed, Group(packed_nodes, "implicit_packed")),
        "implicit_stationary": (stationary, Group(stationary_nodes, "implicit_stationary")),  # 2 bands a pass
        "implicit_gemm": (band, Group(band_nodes, "implicit_gemm")),  # a band staged: one DMA, rows moved by v.copy
        "implicit_packed_1d_dilated": (dilated_1d, Group(dilated_1d_nodes, "implicit_packed")),
        "implicit_stationary_grouped": (grouped, Group(grouped_nodes, "implicit_stationary")),  # 2 images, stride 2
        "conv_chain": (block, Group(block_nodes, "conv_chain", 2)),  # bands of 2 rows: a ragged last band
        "conv_chain_bottleneck": (bottleneck, Group(bottleneck_nodes, "conv_chain")),  # strided middle conv
        "conv_chain_inverted": (inverted, Group(inverted_nodes, "conv_chain")),
        "dequantizing_conv": (dequant, Group(("conv", "add", "relu"), "implicit_packed")),
        "gated": (gated, Group(_offered(gated, "gated"), "gated")),
        "segment_chain": (rotary, Group(_offered(rotary, "segment_chain"), "segment_chain")),
        "rms_norm_chain": (rms, Group(rms_nodes, "chain")),
        "attention": (attention, Group(_offered(attention, "attention"), "attention")),
        "patch_embed": (patches, Group(_offered(patches, "patch_embed"), "patch_embed")),
        "mlp": (mlp, Group(_offered(mlp, "mlp"), "mlp")),
        "attention_proj": (projected, Group(_offered(projected, "attention_proj"), "attention_proj")),
        "conv_pool": (pooled, Group(pooled_nodes, "implicit_packed")),
        "conv_pool_on_chip": (pooled, Group(pooled_nodes, "implicit_packed")),
    }


def _engine_run(name: str, graph: Graph, group: Group, dtype: str) -> Recorded:
    """The group's kernel on `tiny` (`TINY_4_BANKS` for a kernel keeping a spare bank), simulated on the
    reference's values; its outputs checked against them."""
    rng = np.random.default_rng(3)
    inputs = {v: rng.standard_normal(graph.types[v].shape).astype(np.float32) for v in graph.inputs}
    cfg = TINY_4_BANKS if name in SPARE_BANK else TINY
    mc = context(graph, inputs, dtype, config=cfg)
    env = reference_env(mc, inputs)
    kernel = build_kernel(mc, group)
    names = kernel.symbols or {}
    sim = simulate(kernel.program, cfg, {names[v]: env[v] for v in kernel.inputs}, record_transactions=True)
    for v in kernel.outputs:
        if dtype == "int8":
            np.testing.assert_array_equal(sim.outputs[names[v]], env[v], err_msg=name)
        else:
            np.testing.assert_allclose(sim.outputs[names[v]], env[v], rtol=1e-4, atol=1e-4, err_msg=name)
    return Recorded(f"{name}:{dtype}", kernel.program, sim.transactions)


FRAME_CASES = {
    "depthwise_strided": _conv("conv", (1, 4, 7, 7), (4, 1, 3, 3), (2, 2), (1, 1, 1, 1), group=4),
    "max_pool_stride_1": _pool("pool", OpType.MaxPool, (1, 3, 6, 6), (2, 2), (1, 1), (1, 0, 0, 1)),
}


def _frame_run(name: str, graph: Graph, dtype: str) -> Recorded:
    x = {"x": np.random.default_rng(3).standard_normal(graph.types["x"].shape).astype(np.float32)}
    model = compile_model(graph, TINY, dtype, samples=[x] if dtype == "int8" else None, cleanup=False)
    sim = simulate(model.program, TINY, {model.tensor_names[k]: v for k, v in x.items()}, record_transactions=True)
    return Recorded(f"{name}:{dtype}", model.program, sim.transactions)


def _runs(dtype: str) -> list[Recorded]:
    runs = [_engine_run(name, graph, group, dtype) for name, (graph, group) in _groups().items()]
    return runs + [_frame_run(name, graph, dtype) for name, graph in FRAME_CASES.items()]


def _units(report) -> set[str]:
    return {b.unit for b in report.batches if b.verdicts}


@pytest.mark.parametrize("dtype", ["int8", "fp32"])
def test_new_kernel_families_match_the_rtl(dtype: str) -> None:
    reports = {r.program.split(":")[0]: r for r in cosimulate(TINY, _runs(dtype))}
    for report in reports.values():
        assert report.ok, "\n".join(report.lines())
        assert report.compared > 0, "\n".join(report.lines())
    if dtype == "int8":
        vector_only = {"segment_chain", "rms_norm_chain", *FRAME_CASES}
        assert all("matrix_unit" in _units(r) for name, r in reports.items() if name not in vector_only)
        requantizing = (
            "implicit_packed",
            "conv_chain",
            "conv_chain_inverted",
            "gated",
            "attention",
            "patch_embed",
            "mlp",
            "attention_proj",
            "conv_pool",
            "conv_pool_on_chip",
        )
        for name in requantizing:
            assert "drain_write" in _units(reports[name]), name
        # the dequantizing drain writes f32 (no RTL datapath): its matmuls are what the RTL checks
        assert any(m == "mx.drain" for m, _ in reports["dequantizing_conv"].skipped)
    else:  # float kernels: their moves (rotary halves at lane offsets, chain loads and stores) on the lanes
        assert reports["segment_chain"].compared >= 5 and reports["rms_norm_chain"].compared >= 2
    assert all("vector_unit" in _units(reports[name]) for name in FRAME_CASES)


def test_a_changed_float_move_is_caught() -> None:
    """A float load replayed as bits can fail: one ulp off in a rotary kernel's `vc.ld` result."""
    graph, group = _groups()["segment_chain"]
    run = _engine_run("segment_chain", graph, group, "fp32")
    index, txn = next((i, t) for i, t in enumerate(run.transactions) if t.mnemonic == "vc.ld")
    bits = txn.result.view(np.int32).copy()
    bits[0] += 1
    doctored = dataclasses.replace(txn, result=bits.view(np.float32))
    wrong = dataclasses.replace(run, name="ld + 1 ulp", transactions=(doctored,))
    (report,) = cosimulate(TINY, [wrong])
    assert (report.compared, report.value_mismatches, report.cycle_mismatches) == (1, 1, 0)
