"""`sum_order`: the plan of adds follows numpy's float32 window sum bit for bit (numpy itself is the oracle, on
magnitudes spread so that any other association changes the result), and the window kernel's AveragePool
(`windows`, which the frame kernel hands one-output-column and pairwise windows to) is bit-exact against the
references through it."""

from __future__ import annotations

from itertools import product

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lower_helpers import check_both

from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType
from fusion.lower.kernels.frame_pool import sum_order
from fusion.lower.kernels.sum_order import sum_plan, sum_tree
from fusion.lower.kernels.windows import Window
from fusion.reference.windows import windows


def _window(spatial, kernel, strides, dilations, pads) -> Window:
    s = len(kernel)
    out = tuple(
        (spatial[i] + pads[i] + pads[s + i] - (kernel[i] - 1) * dilations[i] - 1) // strides[i] + 1 for i in range(s)
    )
    return Window(tuple(kernel), tuple(strides), tuple(dilations), tuple(pads), (1, 3, *spatial), out)


def _planned_sum(view: np.ndarray, w: Window) -> np.ndarray:
    """The window sums as the plan adds them, in float32."""
    taps = view.reshape(*view.shape[: -w.s], -1)
    slots: dict[int, np.ndarray] = {}
    for _, kind, dst, operand in sum_plan(sum_tree(w)).ops:
        if kind == "set":
            slots[dst] = taps[..., operand].copy()
        elif kind == "tap":
            slots[dst] = slots[dst] + taps[..., operand]
        else:
            slots[dst] = slots[dst] + slots[operand]
    return slots[0]


def _geometries():
    for h, w, kh, kw, sh, sw, dh, dw, p in product(
        (2, 3, 5), (1, 2, 4, 6, 9), (1, 2, 3), (1, 2, 3, 4), (1, 2), (1, 2, 4), (1, 2), (1, 3), (0, 1)
    ):
        if h + 2 * p >= (kh - 1) * dh + 1 and w + 2 * p >= (kw - 1) * dw + 1:
            yield (h, w), (kh, kw), (sh, sw), (dh, dw), (p, p, p, p)
    yield (4, 12), (3, 12), (1, 1), (1, 1), (0, 0, 0, 0)  # a row pairwise, 8 running sums
    yield (9, 9), (9, 9), (1, 1), (1, 1), (1, 1, 1, 1)  # 81 taps pairwise (one output column)
    yield (12, 12), (12, 12), (1, 1), (1, 1), (0, 0, 0, 0)  # 144 taps: the pairwise halves


def test_the_plan_adds_in_numpys_order() -> None:
    rng = np.random.default_rng(0)
    checked = 0
    for spatial, kernel, strides, dilations, pads in _geometries():
        w = _window(spatial, kernel, strides, dilations, pads)
        shape = (1, 3, *spatial)
        x = (rng.standard_normal(shape) * np.exp(rng.uniform(-9, 9, shape))).astype(np.float32)
        view = windows(x, kernel, strides, dilations, pads, w.out_spatial, 0.0)
        want = np.sum(view, axis=(-2, -1))
        np.testing.assert_array_equal(_planned_sum(view, w), want, err_msg=str((spatial, kernel, strides, pads)))
        checked += 1
    assert checked > 1000


def test_one_output_column_is_added_row_major() -> None:
    """The case the window kernel summed as row sums: numpy adds the four taps in turn."""
    w = _window((2, 2), (2, 2), (1, 2), (1, 1), (0, 0, 1, 1))
    assert w.out_spatial == (2, 1) and sum_order(w) is None
    assert sum_tree(w) == ("pair", (0, 1, 2, 3))
    assert [op[1] for op in sum_plan(sum_tree(w)).ops] == ["set", "tap", "tap", "tap"]


def _average(spatial, kernel, strides, pads, include):
    b = GraphBuilder("average")
    x = b.input("x", (1, 3, *spatial))
    attrs = {"kernel": kernel, "strides": strides, "pads": pads, "dilations": (1,) * len(kernel), "ceil_mode": 0}
    b.output(b.op(OpType.AveragePool, x, name="pool", count_include_pad=int(include), **attrs))
    return b.build()


@pytest.mark.parametrize("include", [False, True])
def test_reported_case_is_bit_exact(include: bool) -> None:
    check_both(_average((2, 2), (2, 2), (1, 2), (0, 0, 1, 1), include))


@st.composite
def one_column(draw) -> tuple:
    """A 2-D window whose padded width holds one window position: the window kernel's case."""
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(2, 4))
    pads = [draw(st.integers(0, k - 1)) for k in (kh, kw, kh, kw)]
    h = draw(st.integers(max(1, kh - pads[0] - pads[2]), 6))
    w = draw(st.integers(max(1, kw - pads[1] - pads[3]), 6))
    sw = w + pads[1] + pads[3] - kw + 1  # one output column
    return (h, w), (kh, kw), (draw(st.integers(1, 2)), sw), tuple(pads)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=one_column(), include=st.booleans(), seed=st.integers(0, 3))
def test_average_pool_with_one_output_column_matches_the_references(case: tuple, include: bool, seed: int) -> None:
    check_both(_average(*case, include), seed=seed)
