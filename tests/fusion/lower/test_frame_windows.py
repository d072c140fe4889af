"""Depthwise Conv and MaxPool on the unpadded input's frame (`frame_windows`): geometries the frame covers (row
stride dividing the height, "same"-like vertical padding, asymmetric horizontal padding, dilation, 1-D and 2-D,
channel counts that split into several steps) against the numpy reference (fp32) and the quantized reference
(int8 bit-exact), compiled and simulated in checked (race-detecting) mode on `tiny` and `base`; and that these
nodes do take the frame kernel (no DRAM padding phase, one DMA per row phase)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from lower_helpers import check_both, random_inputs

from assembler.disasm import disassemble
from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType
from fusion.lower.compiler import compile as compile_model
from fusion.lower.context import LowerContext
from fusion.lower.kernels.frame import frame_of
from fusion.lower.kernels.frame_windows import Plan, node_frame, split_pays


def _conv(n, c, spatial, kernel, strides, dilations, pads, bias):
    rng = np.random.default_rng(3)
    b = GraphBuilder("depthwise")
    args = [b.input("x", (n, c, *spatial)), b.constant(rng.standard_normal((c, 1, *kernel)).astype(np.float32), "w")]
    if bias:
        args.append(b.constant(rng.standard_normal(c).astype(np.float32), "b"))
    attrs = {"strides": strides, "pads": pads, "dilations": dilations, "group": c}
    b.output(b.op(OpType.Conv, *args, name="conv", **attrs))
    return b.build()


def _pool(n, c, spatial, kernel, strides, dilations, pads, relu):
    b = GraphBuilder("pool")
    x = b.input("x", (n, c, *spatial))
    if relu:  # an int8 input on the int8 path (a graph input is float)
        x = b.op(OpType.Relu, x, name="relu")
    attrs = {"kernel": kernel, "strides": strides, "pads": pads, "dilations": dilations, "ceil_mode": 0}
    b.output(b.op(OpType.MaxPool, x, name="pool", **attrs))
    return b.build()


@st.composite
def framed(draw, max_kernel=5):
    """A window the frame covers: vertical padding making OH = H / sh, any horizontal padding and stride."""
    s = draw(st.sampled_from([1, 2]))
    kernel = tuple(draw(st.integers(1, max_kernel)) for _ in range(s))
    dilations = tuple(draw(st.sampled_from([1, 2])) for _ in range(s))
    strides = tuple(draw(st.sampled_from([1, 2, 3])) for _ in range(s))
    span = [(k - 1) * d + 1 for k, d in zip(kernel, dilations, strict=True)]
    pads = [draw(st.integers(0, sp - 1)) for sp in span] + [0] * s
    spatial = []
    for i in range(s):
        lo = max(1, span[i] - pads[i])
        size = draw(st.integers(lo, 13))
        if i == 0 and s == 2:  # rows: H a multiple of sh and OH = H / sh
            size = strides[0] * max(1, -(-size // strides[0]))
            pads[s] = max(0, (size // strides[0] - 1) * strides[0] + span[0] - size - pads[0])
        else:
            pads[s + i] = draw(st.integers(0, max(0, span[i] - 1 - pads[i])))
        spatial.append(size)
    return (
        draw(st.sampled_from([1, 2])),
        draw(st.sampled_from([1, 3, 17])),
        tuple(spatial),
        kernel,
        strides,
        dilations,
        tuple(pads),
    )


def _framed(graph) -> bool:
    node = graph.nodes[-1]
    cx = LowerContext(graph, None, None, None, {})
    return node_frame(cx, node) is not None


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=framed(), bias=st.booleans())
def test_depthwise_on_the_frame_matches_the_references(case: tuple, bias: bool) -> None:
    graph = _conv(*case, bias)
    assume(_framed(graph))
    check_both(graph)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=framed(max_kernel=3), relu=st.booleans())
def test_max_pool_on_the_frame_matches_the_references(case: tuple, relu: bool) -> None:
    graph = _pool(*case, relu)
    assume(_framed(graph))
    check_both(graph)


def test_mobilenet_and_resnet_windows_have_a_frame() -> None:
    """3x3 stride 1 and 2 'same' depthwise convs and the 3x3 stride 2 MaxPool (even sizes) are on the frame; a
    valid (unpadded) 3x3 conv is not (OH != H)."""
    assert frame_of(1, 96, (32, 32), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), (16, 16)) is not None
    assert frame_of(1, 960, (2, 2), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), (2, 2)) is not None
    assert frame_of(1, 64, (112, 112), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), (56, 56)) is not None
    assert frame_of(1, 8, (8, 8), (3, 3), (1, 1), (1, 1), (0, 0, 0, 0), (6, 6)) is None


def test_frame_kernel_has_no_padding_phase_and_one_load_per_row_phase() -> None:
    graph = _conv(1, 16, (24, 24), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), True)
    x = random_inputs(graph)
    model = compile_model(graph, "base", "int8", samples=[x], cleanup=False)
    text = disassemble(model.program)
    assert "v.rsum" in text and "mx." not in text  # compacted strided columns, vector unit only
    conv = text[text.index(".kernel conv") : text.index(".endkernel", text.index(".kernel conv"))]
    steps = conv.count("dma.st ")  # one store per step
    assert conv.count("fence") == 1  # one phase: no DRAM padding, scratch or copy phase
    assert conv.count("dma.ld ") == 5 * steps  # two row phases, weights, bias, requantization table
    _, counters = model.run(x, checked=True)
    compulsory = x["x"].nbytes + 16 * 9 + 16 * 4 + 16 * 8 + 16 * 12 * 12  # float input, int8 weights and output
    assert counters.dram_read_bytes + counters.dram_write_bytes == compulsory


def test_strided_depthwise_splits_its_column_phases_where_it_pays() -> None:
    """MobileNet's 3x3 stride-2 depthwise conv splits each row phase into its 2 column phases before the taps
    (taps over the kept columns only, reading column phase o % 2 shifted by o // 2); a 1x3 stride-3 one (3 taps)
    computes every column and compacts (the split's 2 * 3 ops per input element would cost more)."""
    f = frame_of(1, 96, (32, 32), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), (16, 16))
    p = Plan(f, conv=True, int8=True, split=split_pays(Plan(f, conv=True, int8=True)))
    assert p.split and not p.compacts and p.pitch == 16
    assert [(p.column_phase(t), p.offset(t)) for t in p.taps[:3]] == [(1, -16 - 1), (0, -16), (1, -16)]
    assert p.col_masks == [-1] and p.col_invalid(-1) == [(0, 1)]
    g = frame_of(1, 4, (6, 9), (1, 3), (2, 3), (1, 1), (0, 0, 0, 2), (3, 3))
    assert not split_pays(Plan(g, conv=True, int8=True))
