"""MaxPool (separable and per-tap) and AveragePool on the unpadded input's frame (`frame_pool`) against the numpy
reference (fp32) and the quantized reference (int8 bit-exact), compiled and simulated in checked (race-detecting)
mode; the frame kernels' masks exact for Inf and NaN inputs next to padded and dropped positions; and which
kernel a geometry takes."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from lower_helpers import FP32_TOL, check_both, random_inputs
from test_frame_windows import _conv, _framed, _pool, framed

from assembler.disasm import disassemble
from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType
from fusion.lower.compiler import compile as compile_model
from fusion.lower.kernels import frame_pool
from fusion.lower.kernels.frame import frame_of
from fusion.lower.kernels.frame_pool import separable_of, sum_order, window_counts
from fusion.lower.kernels.windows import Window, window_of
from fusion.reference.interpreter import run
from fusion.reference.windows import windows as reference_windows

SETTINGS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)


def _average(n, c, spatial, kernel, strides, dilations, pads, relu, include):
    b = GraphBuilder("average")
    x = b.input("x", (n, c, *spatial))
    if relu:  # an int8 input on the int8 path
        x = b.op(OpType.Relu, x, name="relu")
    attrs = {"kernel": kernel, "strides": strides, "pads": pads, "dilations": dilations, "ceil_mode": 0}
    b.output(b.op(OpType.AveragePool, x, name="pool", count_include_pad=int(include), **attrs))
    return b.build()


@SETTINGS
@given(case=framed(max_kernel=4), relu=st.booleans(), include=st.booleans())
def test_average_pool_on_the_frame_matches_the_references(case: tuple, relu: bool, include: bool) -> None:
    graph = _average(*case, relu, include)
    assume(_framed(graph))
    assume(sum_order(window_of(graph, graph.nodes[-1])) is not None)  # else the window kernel (`windows`)
    check_both(graph)


@SETTINGS
@given(case=framed(max_kernel=4))
def test_max_pool_separable_and_per_tap_match_the_reference(case: tuple) -> None:
    """Wider kernels than test_frame_windows' (separable groups overlapping, several per window)."""
    graph = _pool(*case, relu=True)
    assume(_framed(graph))
    check_both(graph)


def test_resnet_max_pool_is_separable_and_computes_only_kept_columns() -> None:
    f = frame_of(1, 64, (112, 112), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), (56, 56))
    sep = separable_of(f)
    assert sep is not None and sep.groups == (-1, 0) and sep.col_masks == [-1]
    graph = _pool(1, 8, (16, 16), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), relu=True)
    x = random_inputs(graph)
    text = disassemble(compile_model(graph, "base", "int8", samples=[x], cleanup=False).program)
    pool = text[text.index(".kernel pool") : text.index(".endkernel", text.index(".kernel pool"))]
    assert "v.rmax" in pool and "v.rsum" not in pool and pool.count("fence") == 1


def test_uncovered_window_edge_is_not_separable() -> None:
    """Width 3, stride 2, left pad 2: output column 0's only valid column (0) is in group -1 {-1, 0}, masked
    since it reads column -1: the per-tap kernel runs it."""
    assert separable_of(frame_of(1, 1, (8, 9), (1, 3), (1, 2), (1, 1), (0, 2, 0, 0), (8, 5))) is None


def test_window_counts_follow_count_include_pad() -> None:
    assert list(window_counts(5, 3, 2, 3, 1, (1, 1), False)) == [2, 3, 2]
    assert list(window_counts(5, 3, 2, 3, 1, (1, 1), True)) == [3, 3, 3]
    assert list(window_counts(4, 3, 2, 3, 1, (1, 0), True)) == [3, 3, 1]  # the ceil overhang is never counted


def _with_non_finite(graph) -> dict[str, np.ndarray]:
    x = random_inputs(graph)["x"]
    x[..., 0, 0], x[..., -1, -1], x[..., 0, -1], x[..., -1, 0] = np.inf, np.nan, -np.inf, np.nan
    x[..., 1::3, 1::4] = np.inf
    return {"x": x}


def _check_fp32_exactly(graph) -> None:
    inputs = _with_non_finite(graph)
    got, _ = compile_model(graph, "tiny", "fp32", cleanup=False).run(inputs, checked=True)
    want = run(graph, inputs)
    for name in graph.outputs:
        finite = np.isfinite(want[name])
        np.testing.assert_array_equal(np.isnan(got[name]), np.isnan(want[name]), err_msg=name)
        np.testing.assert_array_equal(
            got[name][~finite & ~np.isnan(want[name])], want[name][~finite & ~np.isnan(want[name])]
        )
        scale = max(1.0, float(np.max(np.abs(want[name][finite]), initial=0.0)))
        np.testing.assert_allclose(got[name][finite], want[name][finite], rtol=0, atol=FP32_TOL * scale)


GEOMETRIES = [
    ((1, 3, (8, 8), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)), True),
    ((1, 3, (6, 7), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)), True),
    ((1, 2, (8, 9), (1, 3), (1, 2), (1, 1), (0, 2, 0, 0)), False),
]


def test_frame_masks_are_exact_for_inf_and_nan() -> None:
    """Inf and NaN on the borders (next to padded positions and, with a stride, dropped columns) reach only the
    outputs whose windows hold them, in depthwise Conv, MaxPool (separable and per tap) and AveragePool."""
    for case, with_conv in GEOMETRIES:
        for include in (False, True):
            _check_fp32_exactly(_average(*case, False, include))
        _check_fp32_exactly(_pool(*case, relu=False))
        if with_conv:
            _check_fp32_exactly(_conv(*case, True))


BANDED = [
    (1, 2, (48, 48), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),
    (2, 3, (40, 37), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    (1, 1, (60, 50), (3, 2), (2, 2), (1, 1), (1, 0, 1, 1)),
    (1, 2, (64, 64), (2, 3), (1, 2), (1, 1), (0, 1, 1, 1)),
]


def test_max_pool_channel_larger_than_a_slot_runs_in_row_bands(monkeypatch) -> None:
    """fp32 channels that do not fit one buffer slot of `tiny`: bands of output rows with their halo rows, Inf
    and NaN on the borders included."""
    bands = []
    banded = frame_pool._banded_steps
    monkeypatch.setattr(frame_pool, "_banded_steps", lambda *a: bands.append(banded(*a)) or bands[-1])
    for case in BANDED:
        bands.clear()
        _check_fp32_exactly(_pool(*case, relu=False))
        assert bands and bands[0] is not None and len(bands[0][0]) > case[0] * case[1]  # several bands a channel


@SETTINGS
@given(
    geometry=st.tuples(*[st.integers(1, 6)] * 2, *[st.integers(1, 3)] * 6, *[st.integers(0, 2)] * 4),
    seed=st.integers(0, 2**16),
)
def test_sum_order_is_the_order_numpy_sums_a_window(geometry: tuple, seed: int) -> None:
    """Where `sum_order` names an order, adding the taps that way reproduces the reference's float32 window sum
    bit for bit (heavy-tailed data: another order differs)."""
    h, w, kh, kw, sh, sw, dh, dw, *pads = geometry
    spans = ((kh - 1) * dh + 1, (kw - 1) * dw + 1)
    assume(spans[0] <= h + pads[0] + pads[2] and spans[1] <= w + pads[1] + pads[3])
    out = ((h + pads[0] + pads[2] - spans[0]) // sh + 1, (w + pads[1] + pads[3] - spans[1]) // sw + 1)
    order = sum_order(Window((kh, kw), (sh, sw), (dh, dw), tuple(pads), (1, 3, h, w), out))
    assume(order is not None)
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((1, 3, h, w)) * np.exp(rng.standard_normal((1, 3, h, w)) * 4)).astype(np.float32)
    taps = reference_windows(x, (kh, kw), (sh, sw), (dh, dw), tuple(pads), out, 0.0)
    rows = [taps[..., r, :] for r in range(kh)] if order == "rows" else [taps.reshape(*taps.shape[:-2], -1)]
    total = None
    for row in rows:
        part = row[..., 0].copy()
        for c in range(1, row.shape[-1]):
            part = part + row[..., c]
        total = part if total is None else total + part
    np.testing.assert_array_equal(total, np.sum(taps, axis=(-2, -1)))
