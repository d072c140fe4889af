"""The baseline's Conv as an implicit GEMM (`conv_implicit`) against the numpy reference (fp32) and the quantized
reference (int8 bit-exact), compiled and simulated in checked (race-detecting) mode: every conv kind (1-D and 2-D,
strides, dilations, asymmetric padding, groups, constant and run-time weights, float and int8 inputs), the padding
masks exact for Inf and NaN next to padded positions, and no im2col or padded tensor in DRAM."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from lower_helpers import check_both, random_inputs

from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType
from fusion.lower.compiler import compile as compile_model
from fusion.lower.kernels.conv_implicit import ConvShape, pack_weight
from fusion.lower.kernels.frame import lifted
from fusion.reference.interpreter import run

SETTINGS = settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)


def _conv(n, c, spatial, cout, kernel, strides, dilations, pads, group, bias=True, relu=False, weight_input=False):
    rng = np.random.default_rng(7)
    b = GraphBuilder("conv")
    x = b.input("x", (n, c, *spatial))
    if relu:  # an int8 input on the int8 path
        x = b.op(OpType.Relu, x, name="relu")
    shape = (cout, c // group, *kernel)
    w = b.input("w", shape) if weight_input else b.constant(rng.standard_normal(shape).astype(np.float32), "w")
    args = [x, w]
    if bias:
        args.append(b.constant(rng.standard_normal(cout).astype(np.float32), "b"))
    attrs = {"strides": strides, "dilations": dilations, "pads": pads, "group": group}
    b.output(b.op(OpType.Conv, *args, name="conv", **attrs))
    return b.build()


@st.composite
def convs(draw, max_kernel: int = 3) -> tuple:
    rank = draw(st.sampled_from([1, 2]))
    group = draw(st.sampled_from([1, 1, 2, 3]))
    c = group * draw(st.integers(1, 3))
    cout = group * draw(st.integers(1, 3))
    kernel = tuple(draw(st.integers(1, max_kernel)) for _ in range(rank))
    strides = tuple(draw(st.integers(1, 3)) for _ in range(rank))
    dilations = tuple(draw(st.integers(1, 2)) for _ in range(rank))
    pads = tuple(draw(st.integers(0, 2)) for _ in range(2 * rank))
    spatial = tuple(draw(st.integers(1, 7)) for _ in range(rank))
    for i in range(rank):
        span = (kernel[i] - 1) * dilations[i] + 1
        assume(spatial[i] + pads[i] + pads[rank + i] >= span)
    return draw(st.integers(1, 2)), c, spatial, cout, kernel, strides, dilations, pads, group


@SETTINGS
@given(case=convs(), bias=st.booleans(), relu=st.booleans())
def test_conv_matches_the_references(case: tuple, bias: bool, relu: bool) -> None:
    check_both(_conv(*case, bias=bias, relu=relu))


@SETTINGS
@given(case=convs(max_kernel=2))
def test_conv_with_a_run_time_weight_matches_the_reference(case: tuple) -> None:
    """The weight as a graph input: its natural K order, one DMA per (channel, tap)."""
    check_both(_conv(*case, weight_input=True))


def test_resnet_and_mobilenet_shapes_on_the_base_machine() -> None:
    """Several K chunks, Cout tiles and multi-row runs on the 16-wide array: a 3x3 'same' conv, a strided one
    and a 1x1 projection."""
    check_both(_conv(1, 40, (9, 9), 36, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1), config="base")
    check_both(_conv(1, 24, (11, 10), 20, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), 1), config="base")
    check_both(_conv(1, 48, (5, 5), 40, (1, 1), (1, 1), (1, 1), (0, 0, 0, 0), 1), config="base")


def test_padding_masks_are_exact_for_inf_and_nan() -> None:
    """Inf and NaN in the image's border pixels: a padded tap's garbage is zeroed by integer mask multiplies,
    never multiplied as a float (Inf x 0 = NaN); the reference is the oracle for the non-finite outputs too."""
    graph = _conv(1, 2, (5, 6), 3, (3, 3), (1, 2), (1, 1), (1, 1, 1, 1), 1)
    x = random_inputs(graph)["x"]
    x[0, 0, 0, 0], x[0, 1, 4, 5], x[0, 0, 2, 5] = np.inf, np.nan, -np.inf
    model = compile_model(graph, "tiny", "fp32", cleanup=False)
    got, _ = model.run({"x": x}, checked=True)
    want = run(graph, {"x": x})[graph.outputs[0]]
    np.testing.assert_array_equal(np.isnan(got[graph.outputs[0]]), np.isnan(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[graph.outputs[0]][finite], want[finite], rtol=0, atol=1e-4)


def test_no_im2col_or_padding_in_dram() -> None:
    """A padded 3x3 conv writes its output and nothing else to DRAM (int8: and its float graph input quantized
    once), and reads its input once per tap at most, plus the weights once and the bias (and an int8 per-channel
    requantizer) once per run of 16 output positions."""
    graph = _conv(1, 8, (12, 12), 8, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1)
    x = random_inputs(graph)
    elements = 8 * 12 * 12  # of the input, and of the output
    epilogue = 9 * 8 * 12
    model = compile_model(graph, "base", "fp32", cleanup=False)
    _, counters = model.run(x)
    assert counters.dram_write_bytes == elements * 4
    assert counters.dram_read_bytes <= 9 * elements * 4 + 8 * 8 * 9 * 4 + epilogue
    model = compile_model(graph, "base", "int8", samples=[x], cleanup=False)
    _, counters = model.run(x)
    assert counters.dram_write_bytes == elements * 2
    assert counters.dram_read_bytes <= elements * 4 + 9 * elements + 8 * 8 * 9 + epilogue


def test_runs_cross_output_rows_only_where_the_input_has_their_pitch() -> None:
    same = ConvShape(lifted(1, 4, (6, 6), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), (6, 6)), 1)
    assert same.flat and same.runs(16) == [(0, 16), (16, 16), (32, 4)]
    strided = ConvShape(lifted(1, 4, (6, 6), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), (3, 3)), 1)
    assert not strided.flat and strided.runs(16) == [(0, 3), (3, 3), (6, 3)]
    starts, valid = strided.windows((0,), 3, 3)  # tap (0, 0), output row 1: input row 1, columns -1, 1, 3
    assert starts == [5] and list(valid[0]) == [False, True, True]


def test_weights_are_packed_tap_major() -> None:
    w = np.arange(2 * 3 * 2 * 2).reshape(2, 3, 2, 2)
    packed = pack_weight(w).reshape(2, 12)
    assert list(packed[1, :3]) == [w[1, 0, 0, 0], w[1, 1, 0, 0], w[1, 2, 0, 0]]
