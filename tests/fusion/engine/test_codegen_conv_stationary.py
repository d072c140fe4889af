"""The patch-stationary conv schedule (`implicit_stationary`): few output pixels, many output channels, the A^T
patch preloaded and the weights streamed. Every conv variant it takes, race-checked, against the numpy reference
(fp32 within 1e-4) and the quantized reference (int8 bit-exact); its matrix work counted from the kernel."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from engine_helpers import assert_reference, context, conv_graph, run_checked_on_x, run_group
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_codegen_conv import convs  # the band schedule's conv variants

from fusion.engine.codegen.conv import conv_shape
from fusion.engine.codegen.conv_packed import pieces, stream_rows
from fusion.engine.codegen.conv_stationary import MIN_STREAMED, choose_tiling, pack_pieces, traffic
from fusion.engine.errors import CodegenError
from fusion.engine.execute import run_kernel
from fusion.engine.features import kernel_features
from fusion.engine.kernel import build_kernel
from fusion.engine.plan import Group
from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType
from isa.enums import DType

STATIONARY = "implicit_stationary"


def _run(graph, names, dtype):
    mc, kernel, _ = run_checked_on_x(graph, names, STATIONARY, dtype)
    return mc, kernel


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
@settings(max_examples=14, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=convs(), relu=st.booleans())
def test_every_conv_variant_it_takes_matches_the_reference(dtype: str, case: tuple, relu: bool) -> None:
    graph, names = conv_graph(*case, relu)
    mc = context(graph, {}, "fp32")
    try:
        choose_tiling(mc.config, conv_shape(graph, mc.config, graph.node("conv"), packed=True), DType.f32)
    except CodegenError:  # a row wider than the array, or under 1/N of it
        return
    _run(graph, names, dtype)


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_resnet_layer4_shape_streams_every_output_channel_per_preload(dtype: str) -> None:
    """2x2 output pixels, K = 9 x 64, Cout = 96 (ResNet layer4's shape, scaled): one preload per K piece and band
    carries the 6 positions of the band, and all 96 channels stream through it (in K groups as they fit)."""
    graph, names = conv_graph(1, 64, 96, (2, 2), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1, True)
    mc, kernel = _run(graph, names, dtype)
    s = conv_shape(graph, mc.config, graph.node("conv"), packed=True)
    tiling = choose_tiling(mc.config, s, DType.i8 if dtype == "int8" else DType.f32)
    assert tiling.rows == 2 and tiling.nc == 96
    feats = kernel_features(mc, kernel, zero_tile_fraction=0.0)
    assert feats.preloads == len(pieces(s, 16)) == 36
    assert feats.matmul_rows == 36 * 96


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_passes_over_several_bands_read_the_weights_once_per_pass(dtype: str) -> None:
    """9x9 pixels, K = 9 x 128, Cout = 160: one band's A^T resident would read all the weights once per band (9
    times); the tiling instead passes over 5 bands (then the last 4) with each step loading its K group's A^T of
    those bands beside the group's weights for 91 (then 69) output channels, every band accumulated in its own
    rows: DRAM reads at most the input, the weights once per pass and A^T once per Cout chunk (`traffic`), and
    the epilogue's tables; against the reference, race-checked."""
    graph, names = conv_graph(1, 128, 160, (9, 9), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1, True)
    mm = DType.i8 if dtype == "int8" else DType.f32
    mc = context(graph, {}, "fp32")
    s = conv_shape(graph, mc.config, graph.node("conv"), packed=True)
    tiling = choose_tiling(mc.config, s, mm)
    assert (tiling.bands, tiling.rows, tiling.nc) == (5, 1, 91) and len(tiling.groups) > 1
    resident = replace(tiling, bands=1)
    assert traffic(s, tiling, 9, mm.size) < traffic(s, resident, 9, mm.size)
    mc, kernel = _run(graph, names, dtype)
    run = run_kernel(mc, kernel, {"x": np.zeros((1, 128, 9, 9), np.float32)})
    assert run.dram_read_bytes <= traffic(s, tiling, 9, mm.size) + 128 * 81 * 4 + 4 * 160 * 12


def test_pack_pieces_holds_each_pieces_rows_of_every_channel_contiguously() -> None:
    graph, _ = conv_graph(1, 6, 4, (5, 5), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 2, False)
    mc = context(graph, {}, "fp32")
    s = conv_shape(graph, mc.config, graph.node("conv"), packed=True)
    w = np.asarray(graph.constants["w"])  # [4, 3, 3, 3]
    flat = pack_pieces(w, s, 4)
    assert flat.size == w.size
    # group 1, kernel row 2, tap kw = 1: channels 2..3 (of the group's 2), input channels 0..2, in (kw, c) order
    p = [p for p in pieces(s, 4) if p.kh == 2 and p.offset == 1 * 6][0]
    start = (1 * s.taps * s.cg + p.row) * s.coutg
    block = flat[start : start + s.coutg * p.k].reshape(s.coutg, p.k)
    np.testing.assert_array_equal(block, w[2:4, :, 2, 1])


def test_a_shorter_last_band_keeps_its_own_positions() -> None:
    """3 output rows of 6 pixels in bands of 2 (12 positions <= 16 columns): the last band has one row, whose
    out^T is stored and dropped at its own width (regression: it was stored as 12 columns)."""
    graph, names = conv_graph(1, 3, 8, (3, 6), (1, 1), (1, 1), (1, 1), (0, 0, 0, 0), 1, False)
    _run(graph, names, "fp32")


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_a_pointwise_conv_reads_its_nchw_input_directly_and_writes_only_its_output(dtype: str) -> None:
    """1x1 stride 1 after another conv (int8 input in the int8 plan): A^T pieces are [channels, pixels] blocks of
    the input itself and out^T is the NCHW output: no channels-last copy, no scratch (DRAM writes = the output)."""
    rng = np.random.default_rng(5)
    b = GraphBuilder("pw")
    x = b.input("x", (1, 8, 5, 5))
    w1 = b.constant((rng.standard_normal((32, 8, 1, 1)) / 3).astype(np.float32), "w1")
    w2 = b.constant((rng.standard_normal((48, 32, 1, 1)) / 6).astype(np.float32), "w2")
    bias = b.constant((rng.standard_normal(48) * 0.1).astype(np.float32), "b2")
    kw = {"dilations": (1, 1), "group": 1, "pads": (0, 0, 0, 0), "strides": (1, 1)}
    h = b.op(OpType.Conv, x, w1, name="conv1", **kw)
    h = b.op(OpType.Conv, h, w2, bias, name="conv2", **kw)
    b.output(b.op(OpType.Relu, h, name="relu"))
    graph = b.build()
    inputs = {"x": rng.standard_normal((1, 8, 5, 5)).astype(np.float32)}
    mc = context(graph, inputs, dtype)
    _, run, env = run_group(mc, Group(("conv2", "relu"), STATIONARY), inputs)
    assert_reference(run.outputs, env, "relu", dtype, 1e-4)
    assert run.dram_write_bytes == 48 * 25 * (1 if dtype == "int8" else 4)


def test_band_rows_shrink_until_the_bands_patch_fits_a_slot() -> None:
    """ResNet layer4 at 224x224 (7x7 pixels, K = 9 x 512): two output rows (16 positions) of A^T are 72 KiB in
    int8, over a 64 KiB slot; one row (7 positions) fits."""
    graph, names = conv_graph(1, 512, 16, (7, 7), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1, True)
    mc = context(graph, {}, "fp32")
    s = conv_shape(graph, mc.config, graph.node("conv"), packed=True)
    assert choose_tiling(mc.config, s, DType.i8).rows == 1
    _run(graph, names, "int8")


def test_a_channels_last_block_never_exceeds_a_vector_ops_element_count() -> None:
    """An int8 input of 256 channels, 16 padded columns: 16 rows fill a 64 KiB slot with 65536 elements, one more
    than a vector op's n field holds (regression: resnet18 layer3 at 224 failed to assemble)."""
    rng = np.random.default_rng(6)
    b = GraphBuilder("deep")
    x = b.input("x", (1, 16, 14, 14))
    w1 = b.constant((rng.standard_normal((256, 16, 1, 1)) / 4).astype(np.float32), "w1")
    w2 = b.constant((rng.standard_normal((16, 256, 3, 3)) / 48).astype(np.float32), "w2")
    kw = {"dilations": (1, 1), "group": 1, "strides": (1, 1)}
    h = b.op(OpType.Conv, x, w1, name="conv1", pads=(0, 0, 0, 0), **kw)
    b.output(b.op(OpType.Conv, h, w2, name="conv2", pads=(1, 1, 1, 1), **kw))
    graph = b.build()
    mc = context(graph, {"x": rng.standard_normal((1, 16, 14, 14)).astype(np.float32)}, "int8")
    assert mc.qplan.scales["conv1"] is not None  # conv2 reads int8
    build_kernel(mc, Group(("conv2",), STATIONARY))


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_a_pass_streams_at_least_min_streamed_channels_through_each_preload(dtype: str) -> None:
    """resnet18 224's layer3.0.conv1 (28x28x128 -> 14x14x256, 3x3 stride 2): the pass with the fewest bytes (5
    bands, 58 channels per step) spent 3% more cycles than the unfused Conv + Relu, so the plan kept their 4.76 MB;
    a pass streams at least MIN_STREAMED x N channels per preload (4 bands of 73 in int8), and every pass the
    tiling could take reads fewer bytes than one band resident."""
    graph, _ = conv_graph(1, 128, 256, (28, 28), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), 1, True)
    mm = DType.i8 if dtype == "int8" else DType.f32
    mc = context(graph, {}, "fp32")
    s = conv_shape(graph, mc.config, graph.node("conv"), packed=True)
    tiling = choose_tiling(mc.config, s, mm)
    assert tiling.nc >= MIN_STREAMED * mc.config.array_size and tiling.bands > 1
    if dtype == "int8":
        assert (tiling.bands, tiling.nc) == (4, 73)
    m = stream_rows(s, tiling.rows)
    assert traffic(s, tiling, m, mm.size) < traffic(s, replace(tiling, bands=1), m, mm.size)
