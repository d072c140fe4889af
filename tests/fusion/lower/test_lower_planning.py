"""Views -> DMA transfers and tiles, the DRAM planner, and the pipeline's overlap, as properties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lower_helpers import check_fp32, random_inputs

from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType
from fusion.lower.compiler import compile
from fusion.lower.errors import LoweringError, MemoryPlanError
from fusion.lower.memory_plan import ALIGN, Interval, plan_arena
from fusion.lower.views import MAX_COLS, MAX_ROWS, View, blocks, dense, transfers
from isa.enums import DType

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True)


@st.composite
def views(draw) -> tuple[View, np.ndarray]:
    """A random permuted / sliced / broadcast view of a dense tensor, and numpy's version of it."""
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=4)))
    base = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
    view = dense(64, shape, DType.i32)
    arr = base
    perm = draw(st.permutations(range(len(shape))))
    view, arr = view.permute(perm), arr.transpose(perm)
    axis = draw(st.integers(0, len(shape) - 1))
    start = draw(st.integers(0, arr.shape[axis] - 1))
    step = draw(st.integers(1, 3))
    count = len(range(start, arr.shape[axis], step))
    view = view.slice(axis, start, count, step)
    arr = np.take(arr, np.arange(start, arr.shape[axis], step), axis=axis)
    if draw(st.booleans()):
        target = (draw(st.integers(1, 3)), *arr.shape)
        view, arr = view.broadcast_to(target), np.broadcast_to(arr, target)
    return view, arr


@SETTINGS
@given(views())
def test_transfers_fill_a_dense_tile_in_view_order(case) -> None:
    view, expected = case
    dram = np.zeros(64 // 4 + expected.size * 200, dtype=np.int32)
    dram[16 : 16 + int(np.max(expected)) + 1] = np.arange(int(np.max(expected)) + 1)
    tile = np.full(expected.size, -1, dtype=np.int32)
    for t in transfers(view):
        assert 1 <= t.rows <= MAX_ROWS and 1 <= t.cols <= MAX_COLS and t.stride >= 0
        rows = [dram[(t.dram + r * t.stride) // 4 :][: t.cols] for r in range(t.rows)]
        tile[t.local : t.local + t.rows * t.cols] = np.concatenate(rows)
    np.testing.assert_array_equal(tile, expected.reshape(-1))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.just(1), min_size=1, max_size=3), st.lists(st.integers(1, 5), min_size=1, max_size=2))
def test_leading_unit_dims_are_dropped_when_broadcasting_to_a_lower_rank(ones: list[int], tail: list[int]) -> None:
    """A (1, ..., 1, *tail) tensor broadcast to `tail` (a chain reading a (1, d) tensor as a length-d row) keeps
    its elements (it read a stride of 0 once: every element was the first); any other rank reduction is refused."""
    shape = (*ones, *tail)
    view = dense(64, shape, DType.i32).broadcast_to(tuple(tail))
    dram = np.arange(16 + int(np.prod(shape)), dtype=np.int32) - 16
    tile = np.concatenate(
        [
            np.concatenate([dram[(t.dram + r * t.stride) // 4 :][: t.cols] for r in range(t.rows)])
            for t in transfers(view)
        ]
    )
    np.testing.assert_array_equal(tile, np.arange(int(np.prod(tail))))
    with pytest.raises(LoweringError, match="does not broadcast"):
        dense(64, (2, *tail), DType.i32).broadcast_to(tuple(tail))


def _element_addresses(view: View) -> np.ndarray:
    """Every element's byte address, in the view's row-major order (an oracle independent of `transfers`)."""
    grids = np.indices(view.shape).reshape(len(view.shape), -1)
    return view.address + (np.asarray(view.strides)[:, None] * grids).sum(axis=0)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=4), st.randoms(use_true_random=False), st.data())
def test_reshaped_views_agree_with_numpy_no_copy_reshapes(shape: list[int], rnd, data) -> None:
    """A permuted view reshaped: the same element addresses as numpy's reshape of the permuted array, returned
    exactly when numpy can reshape without a copy."""
    perm = list(range(len(shape)))
    rnd.shuffle(perm)
    x = np.arange(int(np.prod(shape))).reshape(shape).transpose(perm)
    dims, rest = [], x.size
    while rest > 1:
        d = data.draw(st.sampled_from([d for d in range(2, rest + 1) if rest % d == 0]))
        dims.append(d)
        rest //= d
    dims.insert(data.draw(st.integers(0, len(dims))), 1)
    view = dense(0, shape, DType.f32).permute(perm).reshaped(dims)
    no_copy = x.view()
    try:
        no_copy.shape = dims  # numpy raises when the reshape needs a copy
    except AttributeError:
        assert view is None
        return
    assert view is not None and view.shape == tuple(dims)
    np.testing.assert_array_equal(_element_addresses(view) // 4, x.reshape(dims).ravel())


def test_long_contiguous_runs_split_into_legal_transfers() -> None:
    ts = transfers(dense(0, (3 * 4099,), DType.i8))
    assert sum(t.rows * t.cols for t in ts) == 3 * 4099
    assert all(t.cols <= MAX_COLS and t.rows <= MAX_ROWS for t in ts)


@SETTINGS
@given(st.lists(st.integers(1, 6), min_size=1, max_size=4).map(tuple), st.integers(1, 50), st.integers(0, 2))
def test_blocks_cover_each_element_once_and_keep_rows_whole(shape, budget, trailing) -> None:
    trailing = min(trailing, len(shape))
    whole = int(np.prod(shape[len(shape) - trailing :]))
    index = dense(0, shape, DType.i8)
    seen = np.zeros(int(np.prod(shape)), dtype=int)
    for block in blocks(shape, budget, whole):
        part = block.of(index)
        assert part.size <= max(budget, whole) and part.size % whole == 0
        offsets = np.indices(part.shape).reshape(len(part.shape), -1).T @ np.array(part.strides) + part.address
        seen[offsets] += 1
    assert (seen == 1).all()


@SETTINGS
@given(st.lists(st.tuples(st.integers(1, 300), st.integers(0, 10), st.integers(0, 5)), min_size=1, max_size=25))
def test_planner_never_overlaps_live_buffers(specs) -> None:
    intervals = [Interval(f"v{i}", n, s, s + d) for i, (n, s, d) in enumerate(specs)]
    plan = plan_arena(intervals, 4096, 1 << 20)
    assert plan.arena_bytes <= plan.naive_bytes
    for a in intervals:
        assert plan.addresses[a.name] % ALIGN == 0 and plan.addresses[a.name] >= 4096
        for b in intervals:
            if a.name < b.name and not (a.end < b.start or b.end < a.start):
                lo_a, lo_b = plan.addresses[a.name], plan.addresses[b.name]
                assert lo_a + a.nbytes <= lo_b or lo_b + b.nbytes <= lo_a, (a, b)


def test_planner_reports_dram_overflow() -> None:
    with pytest.raises(MemoryPlanError, match="activations need"):
        plan_arena([Interval("big", 1 << 20, 0, 1)], 0, 1 << 16)


def test_chain_reuses_dead_buffers() -> None:
    b = GraphBuilder("chain")
    v = b.input("x", (64, 64))
    for _ in range(6):
        v = b.op(OpType.Relu, v)
    b.output(v)
    graph = b.build()
    model, _ = check_fp32(graph, random_inputs(graph), "base")
    assert model.memory.arena_bytes <= 3 * 64 * 64 * 4 < model.memory.naive_bytes


def test_double_buffering_overlaps_dma_with_compute() -> None:
    """A many-tile GEMM finishes well before the sum of its units' busy times: they run concurrently."""
    b = GraphBuilder("gemm")
    w = np.random.default_rng(0).standard_normal((32, 32)).astype(np.float32)
    b.output(b.op(OpType.MatMul, b.input("x", (256, 32)), b.constant(w)))
    graph = b.build()
    _, c = check_fp32(graph, random_inputs(graph), "tiny")
    serial = c.load_busy + c.matrix_busy + c.vector_busy + c.store_busy
    assert c.cycle < 0.9 * serial


def test_int8_without_samples_calibrates_on_the_first_run() -> None:
    b = GraphBuilder("mm")
    b.output(b.op(OpType.MatMul, b.input("x", (5, 7)), b.constant(np.ones((7, 3), np.float32))))
    graph = b.build()
    inputs = random_inputs(graph)
    lazy = compile(graph, "tiny", "int8", cleanup=False)
    got, _ = lazy.run(inputs, checked=True)
    eager = compile(graph, "tiny", "int8", samples=[inputs], cleanup=False)
    np.testing.assert_array_equal(got[graph.outputs[0]], eager.run(inputs)[0][graph.outputs[0]])


def test_bad_dtype_and_inputs_are_clear_errors() -> None:
    b = GraphBuilder("relu")
    b.output(b.op(OpType.Relu, b.input("x", (2, 3))))
    graph = b.build()
    with pytest.raises(LoweringError, match="dtype must be one of fp32, int8"):
        compile(graph, "tiny", "fp16")
    model = compile(graph, "tiny", "fp32")
    with pytest.raises(LoweringError, match=r"input 'x' has shape \(3, 2\)"):
        model.run({"x": np.zeros((3, 2), np.float32)})
