"""`transfers` (a view's DMA split, memoised by layout and moved by address) against the view's element addresses
computed with numpy: the transfers cover exactly the view's elements, in row-major order, filling a dense tile."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fusion.lower.views import MAX_COLS, MAX_ROWS, View, transfers
from isa.enums import DType


def element_addresses(view: View) -> np.ndarray:
    """The DRAM byte address of every element of `view`, row-major (an oracle sharing no code with `transfers`)."""
    grids = np.meshgrid(*(np.arange(d) for d in view.shape), indexing="ij")
    offsets = sum((g * s for g, s in zip(grids, view.strides, strict=True)), np.zeros(view.shape, dtype=np.int64))
    return (view.address + np.asarray(offsets, dtype=np.int64)).reshape(-1)


def transferred_addresses(view: View) -> tuple[np.ndarray, np.ndarray]:
    """What the transfers move: DRAM byte addresses and the dense tile's element offsets, in transfer order."""
    es = view.dtype.size
    dram, local = [], []
    for t in transfers(view):
        assert 1 <= t.rows <= MAX_ROWS and 1 <= t.cols <= MAX_COLS
        rows, cols = np.meshgrid(np.arange(t.rows), np.arange(t.cols), indexing="ij")
        dram.append((t.dram + rows * t.stride + cols * es).reshape(-1))
        local.append(t.local + np.arange(t.rows * t.cols))
    return np.concatenate(dram), np.concatenate(local)


layouts = st.integers(1, 4).flatmap(
    lambda n: st.tuples(
        st.lists(st.sampled_from([1, 2, 3, 5, 16, 4100]), min_size=n, max_size=n),
        st.lists(st.sampled_from([0, 1, 2, 4, 8, 48, 4096]), min_size=n, max_size=n),
        st.sampled_from(list(DType)),
    )
)


@settings(deadline=None)  # a view of thousands of transfers: the oracle's per-transfer numpy adds up
@given(layouts, st.lists(st.integers(0, 1 << 20), min_size=2, max_size=3), st.booleans())
def test_transfers_cover_the_view_in_row_major_order(layout, addresses, dense_last) -> None:
    shape, strides, dtype = layout
    if np.prod(shape) > 5_000:  # a long last dim kept (the row and column limits), few transfers
        shape = [*(min(d, 4) for d in shape[:-1]), shape[-1]]
    es = dtype.size
    strides = [s * es for s in strides]
    if dense_last:
        strides[-1] = es
    for address in addresses:  # the same layout at several addresses: the memoised split moved by each
        view = View(address, tuple(shape), tuple(strides), dtype)
        dram, local = transferred_addresses(view)
        assert np.array_equal(dram, element_addresses(view))
        assert np.array_equal(local, np.arange(view.size))
