"""The channels-last implicit-GEMM schedule (`implicit_packed`): kernel taps packed into K, strides computing only
the kept pixels. Every conv variant (strides, dilations, groups, 1-D, asymmetric padding, few input channels, few
output pixels, residual) in the simulator's race-checked mode against the numpy reference (fp32 within 1e-4) and
the quantized reference (int8 bit-exact); the matrix work and DRAM traffic it promises, counted from the run."""

from __future__ import annotations

import math

import numpy as np
import pytest
from engine_helpers import assert_reference, context, conv_graph, run_group
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_codegen_conv import convs  # the band schedule's conv variants

from fusion.engine.codegen.conv import conv_shape
from fusion.engine.codegen.conv_packed import (
    Piece,
    _pad_runs,
    block_width,
    choose_tiling,
    k_groups,
    pieces,
    stream_rows,
)
from fusion.engine.errors import CodegenError
from fusion.engine.features import kernel_features
from fusion.engine.kernel import build_kernel
from fusion.engine.plan import Group
from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType
from isa.enums import DType

PACKED = "implicit_packed"


def _check(graph, names, dtype, seed=3):
    rng = np.random.default_rng(seed)
    inputs = {"x": rng.standard_normal(graph.types["x"].shape).astype(np.float32)}
    inputs.update({v: rng.standard_normal(graph.types[v].shape).astype(np.float32) for v in graph.inputs if v != "x"})
    mc = context(graph, inputs, dtype)
    kernel, run, env = run_group(mc, Group(names, PACKED), inputs)  # race-checked
    assert_reference(run.outputs, env, graph.outputs[0], dtype, 1e-4)
    return mc, run, kernel


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
@settings(max_examples=14, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=convs(), relu=st.booleans())
def test_every_conv_variant_matches_the_reference(dtype: str, case: tuple, relu: bool) -> None:
    graph, names = conv_graph(*case, relu)
    try:
        conv_shape(graph, context(graph, {}, "fp32").config, graph.node("conv"), packed=True)
    except CodegenError:  # under 1/N of the array: left to the baseline
        return
    _check(graph, names, dtype)


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_a_stem_conv_packs_a_kernel_rows_taps_and_channels_into_k(dtype: str) -> None:
    """7x7/2 on 3 channels (ResNet's stem): each kernel row's 21 (kw, c) elements are two preloads (16 + 5)
    instead of 7 of 3, and the array streams only the kept pixels (+ the positions past each row's end)."""
    graph, names = conv_graph(1, 3, 32, (40, 40), (7, 7), (2, 2), (1, 1), (3, 3, 3, 3), 1, True)
    mc, _, kernel = _check(graph, names, dtype)
    s = conv_shape(graph, mc.config, graph.node("conv"), packed=True)
    assert [p.k for p in pieces(s, 16)] == [16, 5] * 7
    tiling = choose_tiling(mc.config, s, DType.i8 if dtype == "int8" else DType.f32, DType.f32, False)
    bands = [min(tiling.rows, s.out[0] - oh0) for oh0 in range(0, s.out[0], tiling.rows)]
    streamed = sum(stream_rows(s, r) for r in bands) * 14 * 2  # 14 pieces x 2 Cout tiles
    feats = kernel_features(mc, kernel, zero_tile_fraction=0.0)
    assert (feats.preloads, feats.matmul_rows) == (len(bands) * 28, streamed)
    # 23 positions per output row of 20 pixels; the band schedule computes 2 padded rows of 46 per output row
    assert streamed <= s.out[0] * s.positions * 28 < s.out[0] * s.pitch * 28 / 3.5


def test_kept_pixels_only_a_strided_conv_streams_a_quarter_of_the_band_schedules_rows() -> None:
    graph, names = conv_graph(1, 16, 16, (32, 32), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), 1, False)
    mc = context(graph, {"x": np.zeros((1, 16, 32, 32), np.float32)}, "fp32")
    s = conv_shape(graph, mc.config, graph.node("conv"), packed=True)
    assert s.positions == 17 and s.out == (16, 16)  # 17 positions computed per 16 kept pixels
    band = s.out[0] * s.pitch  # the band schedule computes 2 padded rows of 34 per output row
    assert (s.out[0] - 1) * s.positions + s.out[1] < band / 3.9
    _check(graph, names, "fp32")


def test_no_im2col_in_dram_writes_are_the_padded_and_channels_last_copies_and_the_output() -> None:
    """DRAM writes: the padded input (its zero fill, then the interior), its channels-last copy, the output
    scratch and the output; no im2col matrix (9x the input). Reads: each K piece's A tile once per band (with
    C >= N that is an im2col's volume, read by strided DMAs: the band schedule reads less, and the planner
    prices both)."""
    graph, names = conv_graph(1, 16, 16, (32, 32), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1, False)
    mc, run, _ = _check(graph, names, "fp32")
    s = conv_shape(graph, mc.config, graph.node("conv"), packed=True)
    padded = 16 * math.prod(s.padded) * 4
    channels_last = s.strides[0] * s.phase_rows * s.phase_width * 16 * 4
    out = 16 * 32 * 32 * 4
    assert run.dram_write_bytes <= 2 * padded + channels_last + 2 * out < 9 * out
    tiling = choose_tiling(mc.config, s, DType.f32, DType.f32, False)
    bands = [min(tiling.rows, s.out[0] - oh0) for oh0 in range(0, s.out[0], tiling.rows)]
    a_reads = sum(stream_rows(s, r) for r in bands) * 3 * 48 * 4
    weights = (16 * 16 * 9 + 16) * 4 * len(bands)
    assert run.dram_read_bytes <= out + padded + a_reads + weights + out


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_few_output_pixels_and_a_long_k_split_into_k_groups(dtype: str) -> None:
    """ResNet layer4 at 64x64 (M = 4 output pixels, K = 9 x C): K cut into groups when one band's A tiles do
    not fit beside the weights (fp32 here), accumulated across steps."""
    graph, names = conv_graph(1, 256, 32, (2, 2), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1, True)
    _check(graph, names, dtype)


def test_large_k_fp32_runs_in_k_groups() -> None:
    graph, names = conv_graph(1, 512, 16, (14, 14), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1, False)
    mc = context(graph, {"x": np.zeros((1, 512, 14, 14), np.float32)}, "fp32")
    s = conv_shape(graph, mc.config, graph.node("conv"), packed=True)
    tiling = choose_tiling(mc.config, s, DType.f32, DType.f32, False)
    assert not tiling.resident and sum(len(g) for g in tiling.groups) == len(pieces(s, 16))
    _check(graph, names, "fp32")


def test_a_residual_add_after_a_strided_conv_is_absorbed_fp32() -> None:
    b = GraphBuilder("conv")
    x = b.input("x", (1, 8, 12, 12))
    res = b.input("r", (1, 16, 6, 6))
    rng = np.random.default_rng(1)
    w = b.constant((rng.standard_normal((16, 8, 3, 3)) / 8).astype(np.float32), "w")
    h = b.op(OpType.Conv, x, w, name="conv", dilations=(1, 1), group=1, pads=(1, 1, 1, 1), strides=(2, 2))
    h = b.op(OpType.Add, h, res, name="add")
    b.output(b.op(OpType.Relu, h, name="relu"))
    _check(b.build(), ("conv", "add", "relu"), "fp32")


def test_depthwise_is_left_to_the_vector_kernel() -> None:
    graph, names = conv_graph(1, 16, 16, (8, 8), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 16, False)
    mc = context(graph, {"x": np.zeros((1, 16, 8, 8), np.float32)}, "fp32")
    with pytest.raises(CodegenError, match="of the array"):
        build_kernel(mc, Group(names, PACKED))


def _conv_clip(hi: float):
    b = GraphBuilder("conv")
    x = b.input("x", (1, 8, 10, 10))
    rng = np.random.default_rng(4)
    w = b.constant((rng.standard_normal((16, 8, 3, 3)) / 8).astype(np.float32), "w")
    bias = b.constant((rng.standard_normal(16) * 0.1).astype(np.float32), "b")
    h = b.op(OpType.Conv, x, w, bias, name="conv", dilations=(1, 1), group=1, pads=(1, 1, 1, 1), strides=(2, 2))
    b.output(b.op(OpType.Clip, h, name="clip", min=0.0, max=hi))
    return b.build(), ("conv", "clip")


@pytest.mark.parametrize("strategy", [PACKED, "implicit_gemm"])
def test_int8_relu6_is_the_requantization_clamp_of_the_drain(strategy: str) -> None:
    """Clip(0, 6) after a Conv whose int8 output range ends below 6 (as every MobileNetV2 conv's does): the drain's
    ReLU + requantization, dequantized to the Clip's float32 output on the way out; bit-exact in both schedules."""
    graph, names = _conv_clip(6.0)
    rng = np.random.default_rng(3)
    inputs = {"x": rng.standard_normal((1, 8, 10, 10)).astype(np.float32)}
    mc = context(graph, inputs, "int8")
    assert 127 * mc.qplan.scales["conv"] < 6.0
    _, run, env = run_group(mc, Group(names, strategy), inputs)
    assert run.outputs["clip"].dtype == np.float32
    np.testing.assert_array_equal(run.outputs["clip"], env["clip"])


def test_a_clip_binding_inside_the_int8_range_or_in_fp32_is_refused() -> None:
    graph, names = _conv_clip(0.25)
    inputs = {"x": np.random.default_rng(3).standard_normal((1, 8, 10, 10)).astype(np.float32)}
    with pytest.raises(CodegenError, match="binds inside the int8 range"):
        build_kernel(context(graph, inputs, "int8"), Group(names, PACKED))
    with pytest.raises(CodegenError, match="no upper clamp"):
        build_kernel(context(graph, inputs, "fp32"), Group(names, PACKED))


def test_channels_in_whole_blocks_of_the_array_width_make_each_a_tile_contiguous() -> None:
    """C = 32 = 2 blocks of 16: X holds each block apart, so a piece (one tap's block) reads rows of 16 elements
    16 apart: packed bursts, not one burst per position row (which every A tile would cost with C-wide rows)."""
    graph, names = conv_graph(1, 32, 16, (24, 24), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1, False)
    mc, _, kernel = _check(graph, names, "int8")
    s = conv_shape(graph, mc.config, graph.node("conv"), packed=True)
    assert block_width(16, s) == 16 and {p.k for p in pieces(s, 16, 16)} == {16}
    tiling = choose_tiling(mc.config, s, DType.i8, DType.i8, False)
    bands = [min(tiling.rows, s.out[0] - oh0) for oh0 in range(0, s.out[0], tiling.rows)]
    row_bursts = sum(stream_rows(s, r) for r in bands) * len(pieces(s, 16, 16))
    assert kernel_features(mc, kernel, zero_tile_fraction=0.0).load_bursts < row_bursts / 2


def test_only_the_pad_positions_of_a_channels_last_block_are_cleared() -> None:
    """Rows 0-3 of a frame 5 positions wide whose input rows are 1-2 (1 left pad, 3 pixels, 1 right pad): the
    top row, each row's side pads and the bottom row, adjacent runs merged; no input position is cleared (the
    loads need not wait for the clear)."""
    assert _pad_runs(range(0, 4), range(1, 3), 1, 3, 5) == [(0, 6), (9, 2), (14, 6)]
    assert _pad_runs(range(1, 3), range(1, 3), 0, 5, 5) == []


def test_k_groups_are_as_few_as_the_greedy_cut_and_near_equal() -> None:
    """72 pieces of 16 K rows, at most 368 rows a group: the greedy cut needs 4 groups (23 + 23 + 23 + 3 pieces);
    the groups are then 18 pieces each, so no step is left with too little matrix work to cover the next loads;
    when near-equal groups do not fit (here: a long piece at the end), the greedy cut stays."""
    every = [Piece(0, 16 * i, 16 * i, 16) for i in range(72)]
    rows = lambda group: sum(p.k for p in group) <= 368  # noqa: E731
    assert [len(g) for g in k_groups(every, rows)] == [18, 18, 18, 18]
    uneven = [*every[:69], Piece(0, 16 * 69, 16 * 69, 300)]
    assert [len(g) for g in k_groups(uneven, rows)] == [23, 23, 23, 1]


def test_a_weight_fitting_beside_the_bands_a_tiles_is_read_once_per_slot() -> None:
    """int8, a 7x7/2 stem on 3 channels over 96x96 pixels runs in several bands; its weight (64 x 147) fits beside
    a band's A tiles, so the first band of each buffer slot loads it and every band reads it there: DRAM reads are
    the input, the bands' A tiles, the weight at most once per slot, the bias and requantizer table per band and the
    scratch read back (before: the weight once per band). Race-checked, bit-exact."""
    graph, names = conv_graph(1, 3, 64, (96, 96), (7, 7), (2, 2), (1, 1), (3, 3, 3, 3), 1, True)
    mc, run, _ = _check(graph, names, "int8")
    s = conv_shape(graph, mc.config, graph.node("conv"), packed=True)
    tiling = choose_tiling(mc.config, s, DType.i8, DType.i8, False)
    spans = [min(tiling.rows, s.out[0] - oh0) for oh0 in range(0, s.out[0], tiling.rows)]
    assert tiling.resident and len(spans) > 3
    a_tiles = sum(stream_rows(s, r) for r in spans) * 147
    assert run.dram_read_bytes <= 3 * 96 * 96 * 4 + a_tiles + 3 * 64 * 147 + len(spans) * 64 * 12 + 64 * 48 * 48


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
@pytest.mark.parametrize(
    "case",
    [
        (2, 256, 64, (10, 10), (3, 3), (2, 2)),  # two images, K groups (int8 whole, fp32 windows do not fit)
        (1, 512, 32, (6, 6), (3, 3), (1, 1)),  # fp32: X whole with 15 K groups of weights
        (2, 64, 48, (12, 12), (3, 3), (2, 2)),
        (1, 8, 16, (9, 11), (3, 3), (1, 2)),  # stride_h 1, stride_w 2, odd padded width: X rows apart
    ],
)
def test_a_tiles_read_in_place_match_the_reference(dtype: str, case: tuple) -> None:
    """The A tiles read in place by mx.mm.s, from X whole on chip (written there by the channels-last phase) or
    from a band's windows: several images, K groups, a stride on one axis only. Race-checked, bit-exact int8."""
    n, c, cout, spatial, kernel, strides = case
    graph, names = conv_graph(n, c, cout, spatial, kernel, strides, (1, 1), (1, 1, 1, 1), 1, True)
    _check(graph, names, dtype)


def test_x_whole_on_chip_is_never_stored_the_weight_read_once() -> None:
    """int8, a 7x7/2 stem on 3 channels over 96x96 pixels: X (both row phases, 3 channels) fits the slots' banks,
    so the channels-last phase writes it on chip and bands read their A tiles there. DRAM writes are the output
    scratch and the output only; reads the float input, the weight once, the bias and requantizer table per band
    and the scratch read back."""
    graph, names = conv_graph(1, 3, 64, (96, 96), (7, 7), (2, 2), (1, 1), (3, 3, 3, 3), 1, True)
    mc, run, _ = _check(graph, names, "int8")
    s = conv_shape(graph, mc.config, graph.node("conv"), packed=True)
    tiling = choose_tiling(mc.config, s, DType.i8, DType.i8, False)
    assert tiling.whole
    bands = -(-s.out[0] // tiling.rows)
    out = 64 * 48 * 48
    assert run.dram_write_bytes == 2 * out
    assert run.dram_read_bytes <= 3 * 96 * 96 * 4 + 64 * 147 + bands * 64 * 12 + out


def test_a_bands_windows_read_each_element_of_x_about_once() -> None:
    """fp32, 3x3/2 on 16 channels over 56x56 pixels: X (0.21 MB) does not fit on chip and a band's packed A tiles
    would read it 9/4 times; its windows (one run per row phase) read the band's rows once, so X is read about
    once plus a row per phase per band."""
    graph, names = conv_graph(1, 16, 32, (56, 56), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), 1, True)
    mc, run, _ = _check(graph, names, "fp32")
    s = conv_shape(graph, mc.config, graph.node("conv"), packed=True)
    tiling = choose_tiling(mc.config, s, DType.f32, DType.f32, False)
    assert tiling.resident and not tiling.whole
    bands = -(-s.out[0] // tiling.rows)
    row = s.phase_width * 16 * 4
    x = s.strides[0] * s.phase_rows * row
    weights, out = 9 * 16 * 32 * 4, 32 * 28 * 28 * 4
    assert run.dram_read_bytes <= 16 * 56 * 56 * 4 + x + 2 * bands * row + bands * (weights + 32 * 12) + out
