"""The implicit-GEMM Conv generator over every conv variant: strides, dilations, groups, 1-D, asymmetric padding,
more output channels than the array has columns, more input channels than one K slice, images split into bands of
output rows. Each kernel runs in the simulator's race-checked mode against the numpy reference (fp32 within 1e-4)
and the quantized reference (int8 bit-exact); no DRAM im2col tensor is read or written."""

from __future__ import annotations

import math

import numpy as np
import pytest
from engine_helpers import context, conv_graph, run_group
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fusion.engine.codegen.conv import (
    BandSource,
    _Sizes,
    band_geometry,
    band_traffic,
    choose_tiling,
    conv_shape,
    scratch_bytes,
)
from fusion.engine.errors import CodegenError
from fusion.engine.kernel import build_kernel
from fusion.engine.plan import Group
from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType
from fusion.lower.views import dense
from isa.enums import DType


def _check(graph, names, dtype):
    rng = np.random.default_rng(3)
    inputs = {"x": rng.standard_normal(graph.types["x"].shape).astype(np.float32)}
    mc = context(graph, inputs, dtype)
    _, run, env = run_group(mc, Group(names, "implicit_gemm"), inputs)  # race-checked
    out = graph.outputs[0]
    if dtype == "int8":
        np.testing.assert_array_equal(run.outputs[out], env[out])
    else:
        np.testing.assert_allclose(run.outputs[out], env[out], rtol=1e-4, atol=1e-4)
    return mc, run


@st.composite
def convs(draw):
    s = draw(st.sampled_from([1, 2]))
    groups = draw(st.sampled_from([1, 1, 2]))
    c = groups * draw(st.sampled_from([3, 8, 16, 20]))
    cout = groups * draw(st.sampled_from([8, 16, 24, 40]))
    kernel = tuple(draw(st.sampled_from([1, 2, 3])) for _ in range(s))
    strides = tuple(draw(st.sampled_from([1, 2, 3])) for _ in range(s))
    dilations = tuple(draw(st.sampled_from([1, 2])) for _ in range(s))
    pads = tuple(draw(st.integers(0, 2)) for _ in range(2 * s))
    spatial = []
    for i in range(s):
        span = (kernel[i] - 1) * dilations[i] + 1
        spatial.append(draw(st.integers(max(1, span - pads[i] - pads[s + i]), 14)))
    return (draw(st.sampled_from([1, 2])), c, cout, tuple(spatial), kernel, strides, dilations, pads, groups)


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=convs(), relu=st.booleans())
def test_every_conv_variant_matches_the_reference(dtype: str, case: tuple, relu: bool) -> None:
    graph, names = conv_graph(*case, relu)
    _check(graph, names, dtype)


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_a_large_image_runs_in_bands_of_output_rows_with_k_chunks_and_column_tiles(dtype: str) -> None:
    graph, names = conv_graph(1, 48, 40, (44, 20), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1, True)
    mc = context(graph, {"x": np.zeros((1, 48, 44, 20), np.float32)}, dtype)
    s = conv_shape(graph, mc.config, graph.node("conv"))
    assert s.cg > mc.config.array_size and s.cout > mc.config.array_size
    _check(graph, names, dtype)


def test_a_stride_2_conv_reads_its_input_once_no_im2col_in_dram() -> None:
    """DRAM reads: the input (copied into its padded form), each band's padded input rows once (bands overlap by
    their halo rows only), the weights and bias once per band, the scratch; far below one im2col matrix."""
    graph, names = conv_graph(1, 16, 16, (32, 32), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), 1, False)
    mc, run = _check(graph, names, "fp32")
    node = graph.node("conv")
    s = conv_shape(graph, mc.config, node)
    z = _Sizes(s, mc.config.array_size, DType.f32, DType.f32, DType.f32, False, False)
    rows = choose_tiling(mc.config, z, "conv").rows
    bands = [min(rows, s.out[0] - oh0) for oh0 in range(0, s.out[0], rows)]
    x = 16 * 32 * 32 * 4
    band_reads = sum(s.in_rows(r) * s.padded[1] for r in bands) * 16 * 4
    weights = (16 * 16 * 9 + 16) * 4 * len(bands)
    assert run.dram_read_bytes <= x + band_reads + weights + scratch_bytes(graph, mc.config, node, DType.f32)
    assert band_reads < 1.5 * 16 * math.prod(s.padded) * 4  # the halo rows: under half the input again
    assert run.dram_read_bytes < 9 * x / 4 + x + weights  # an im2col matrix alone would be written and read


def test_depthwise_conv_is_left_to_the_baseline() -> None:
    graph, names = conv_graph(1, 16, 16, (8, 8), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 16, False)
    mc = context(graph, {"x": np.zeros((1, 16, 8, 8), np.float32)}, "fp32")
    with pytest.raises(CodegenError, match="per group"):
        build_kernel(mc, Group(names, "implicit_gemm"))


def test_tiling_keeps_one_band_within_a_buffer_slot() -> None:
    graph, _ = conv_graph(1, 64, 64, (56, 56), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1, False)
    mc = context(graph, {"x": np.zeros((1, 64, 56, 56), np.float32)}, "fp32")
    s = conv_shape(graph, mc.config, graph.node("conv"))
    z = _Sizes(s, mc.config.array_size, DType.f32, DType.f32, DType.f32, False, False)
    t = choose_tiling(mc.config, z, "conv")
    assert 1 <= t.rows < s.out[0] and t.tn == mc.config.array_size


def test_a_stem_conv_with_fewer_input_channels_than_the_array_chunks_k_within_them() -> None:
    """ResNet's 7x7/2 stem on 3 channels, fp32: a K chunk never exceeds the group's channels (regression: a
    chunk of a whole array width did not fit beside the band and left a zero chunk)."""
    graph, names = conv_graph(1, 3, 64, (64, 64), (7, 7), (2, 2), (1, 1), (3, 3, 3, 3), 1, True)
    mc = context(graph, {"x": np.zeros((1, 3, 64, 64), np.float32)}, "fp32")
    s = conv_shape(graph, mc.config, graph.node("conv"))
    z = _Sizes(s, mc.config.array_size, DType.f32, DType.f32, DType.f32, False, False)
    assert choose_tiling(mc.config, z, "conv").chunk == 3
    _check(graph, names, "fp32")


def test_a_float_input_whose_bands_do_not_fit_is_quantized_to_int8_first() -> None:
    """int8, a float input of 512 channels (a ResNet layer4 block output after the float residual sum): its float
    bands and their int8 copies exceed a buffer slot even for one output row, so the kernel quantizes the input to
    an int8 DRAM copy first (one pass) and bands that; bit-exact against the quantized reference."""
    graph, names = conv_graph(1, 512, 16, (7, 7), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1, True)
    rng = np.random.default_rng(3)
    mc = context(graph, {"x": rng.standard_normal((1, 512, 7, 7)).astype(np.float32)}, "int8")
    s = conv_shape(graph, mc.config, graph.node("conv"))
    floats = _Sizes(s, mc.config.array_size, DType.f32, DType.i8, DType.i8, True, False)
    with pytest.raises(CodegenError, match="does not fit"):
        choose_tiling(mc.config, floats, "conv")
    _, run = _check(graph, names, "int8")
    assert run.dram_write_bytes >= 512 * 7 * 7  # the int8 copy


def test_a_float_input_is_quantized_first_when_its_int8_bands_keep_the_weights_from_being_read_again() -> None:
    """int8, a float input (a ResNet block output) whose float bands fit a slot but not the spare bank, with
    weights larger than the spare bank: as float bands every band reads all the weights again; its int8 copy fits
    one band in the spare bank, so the kernel quantizes first and reads each weight once (DRAM reads at most the
    float input, its int8 copy, the weights, bias and requantizer table once, and the output's transposing loads
    back); bit-exact against the quantized reference, race-checked."""
    graph, names = conv_graph(1, 64, 128, (14, 14), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1, True)
    rng = np.random.default_rng(3)
    mc = context(graph, {"x": rng.standard_normal((1, 64, 14, 14)).astype(np.float32)}, "int8")
    s, tail = band_geometry(graph, graph.node("conv"), conv_shape(graph, mc.config, graph.node("conv")))
    floats = _Sizes(s, mc.config.array_size, DType.f32, DType.i8, DType.i8, True, False, tail)
    ints = _Sizes(s, mc.config.array_size, DType.i8, DType.i8, DType.i8, False, False, tail)
    as_floats, as_ints = choose_tiling(mc.config, floats, "conv"), choose_tiling(mc.config, ints, "conv")
    assert not (as_floats.spare or as_floats.weights) and as_floats.rows < s.out[0] and as_ints.spare
    assert band_traffic(ints, as_ints, 64 * 14 * 14) < band_traffic(floats, as_floats)
    _, run = _check(graph, names, "int8")
    assert run.dram_read_bytes <= 64 * 14 * 14 * 5 + 128 * 64 * 9 + 128 * 12 + 128 * 14 * s.cols


def test_a_first_band_with_pad_rows_above_comes_in_by_one_dma_per_channel_block() -> None:
    """A band with pad rows above the image (the first of each image) is staged: one transposing DMA per channel
    block brings its rows densely, vector copies move them to their padded places (the last row first); a band
    starting inside the image keeps one DMA per row. The two-band kernel is bit-exact, race-checked (int8)."""
    graph, names = conv_graph(1, 32, 16, (24, 20), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1, True)
    mc = context(graph, {"x": np.zeros((1, 32, 24, 20), np.float32)}, "int8")
    node = graph.node("conv")
    s, tail = band_geometry(graph, node, conv_shape(graph, mc.config, node))
    source = BandSource.of(graph, node, dense(0, (1, 32, 24, 20), DType.i8), s, tail)
    first, inner = source.band(0, 0, 16, 0, s.in_rows(8)), source.band(0, 0, 16, 8, s.in_rows(8))
    assert first.staged and len(first.loads(0)) == 1
    assert not inner.staged and len(inner.loads(0)) == s.in_rows(8)
    _check(graph, names, "int8")


def test_one_band_in_the_spare_bank_reads_weights_and_input_once() -> None:
    """A ResNet layer3-like conv (14x14, 64 -> 48 channels, 3x3, fp32): every output row fits one band in the
    scratchpad bank no slot uses, so the kernel reads its input and each weight once (DRAM reads at most input +
    weights + bias + the output's transposing loads back), race-checked."""
    graph, names = conv_graph(1, 64, 48, (14, 14), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1, True)
    mc = context(graph, {"x": np.zeros((1, 64, 14, 14), np.float32)}, "fp32")
    s = conv_shape(graph, mc.config, graph.node("conv"))
    z = _Sizes(s, mc.config.array_size, DType.f32, DType.f32, DType.f32, False, False)
    tiling = choose_tiling(mc.config, z, "conv")
    assert tiling.spare and tiling.rows == s.out[0]
    _, run = _check(graph, names, "fp32")
    assert run.dram_read_bytes <= (64 * 14 * 14 + 48 * 64 * 9 + 48 + 48 * 14 * s.cols) * 4


def test_bands_share_weights_held_in_the_spare_bank() -> None:
    """A ResNet layer1-like conv (fp32, 40x40, 16 -> 32 channels, 3x3) runs in several bands of output rows; its
    weights fit the spare scratchpad bank, so they are loaded once by the first band and read by all (DRAM reads
    at most the input with its band halos, the weights and bias once, and the output's transposing loads back),
    race-checked."""
    graph, names = conv_graph(1, 16, 32, (40, 40), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1, True)
    mc = context(graph, {"x": np.zeros((1, 16, 40, 40), np.float32)}, "fp32")
    s = conv_shape(graph, mc.config, graph.node("conv"))
    z = _Sizes(s, mc.config.array_size, DType.f32, DType.f32, DType.f32, False, False)
    tiling = choose_tiling(mc.config, z, "conv")
    assert tiling.weights and not tiling.spare and tiling.rows < s.out[0]
    _, run = _check(graph, names, "fp32")
    bands = -(-s.out[0] // tiling.rows)
    x_rows = 40 + bands * (s.in_rows(tiling.rows) - tiling.rows)  # each band's halo rows read again
    assert run.dram_read_bytes <= (16 * 40 * x_rows + 32 * 16 * 9 + 32 + 32 * 40 * s.cols) * 4


def _relu_conv_graph(n, c, cout, spatial, kernel, strides, dilations, pads, seed=7):
    """x -> Relu -> Conv (+ bias) -> Relu: the Conv's input is an intermediate (int8 in the quantized plan, as
    between a network's kernels), so its bands are read as they are, no quantized copy."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("relu_conv")
    x = b.op(OpType.Relu, b.input("x", (n, c, *spatial)), name="pre")
    w = b.constant((rng.standard_normal((cout, c, *kernel)) / np.sqrt(c * math.prod(kernel))).astype(np.float32))
    bias = b.constant((rng.standard_normal(cout) * 0.1).astype(np.float32))
    h = b.op(OpType.Conv, x, w, bias, name="conv", dilations=dilations, group=1, pads=pads, strides=strides)
    b.output(b.op(OpType.Relu, h, name="relu"))
    return b.build(), ("conv", "relu")


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.sampled_from([1, 2]),
    c=st.sampled_from([16, 24]),
    cout=st.sampled_from([16, 40]),
    height=st.integers(20, 40),
    width=st.integers(12, 30),
    kernel=st.sampled_from([(1, 1), (3, 3), (3, 2)]),
    strides=st.sampled_from([(1, 1), (2, 2), (1, 2)]),
    dilations=st.sampled_from([(1, 1), (2, 1)]),
    pads=st.sampled_from([(1, 1, 1, 1), (0, 0, 0, 0), (2, 1, 0, 1)]),
)
def test_bands_keep_the_rows_they_share_on_chip(dtype, n, c, cout, height, width, kernel, strides, dilations, pads):
    """Images of several bands: a band's padded rows shared with the band before it are copied on chip from that
    band's tiles (`Halo`), the rest loaded; against the reference, race-checked."""
    graph, names = _relu_conv_graph(n, c, cout, (height, width), kernel, strides, dilations, pads)
    _check(graph, names, dtype)
