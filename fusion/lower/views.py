"""Strided views of DRAM tensors and how they split into DMA transfers and tiles.

Every kernel moves data as views: a transpose, slice, broadcast, concat slot or im2col window is the same
tensor seen with other strides, so one DMA splitter serves every operator. Local tiles are always dense,
in the view's row-major order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from itertools import product
from operator import mul

from assembler.program import slot_setters
from fusion.lower.errors import LoweringError
from isa.enums import DType

MAX_ROWS = 4095  # `rows` field of dma.ld / dma.st
MAX_COLS = 4095  # `cols` field
SPLITS_KEPT = 4096  # distinct view layouts whose DMA split `transfers` keeps


@dataclass(frozen=True, slots=True, init=False)
class View:
    """`shape` elements of `dtype` at DRAM `address` + sum(index * stride) (strides in bytes, 0 = broadcast)."""

    address: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: DType

    def __init__(self, address: int, shape: tuple[int, ...], strides: tuple[int, ...], dtype: DType) -> None:
        """Sets the slots directly: half the cost of a frozen dataclass's `__init__` (`object.__setattr__` per
        field), and a kernel generator makes hundreds of thousands of views."""
        _VIEW_SET[0](self, address)
        _VIEW_SET[1](self, shape)
        _VIEW_SET[2](self, strides)
        _VIEW_SET[3](self, dtype)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def permute(self, perm: Sequence[int]) -> View:
        shape, strides = self.shape, self.strides
        return View(self.address, tuple(shape[p] for p in perm), tuple(strides[p] for p in perm), self.dtype)

    def broadcast_to(self, shape: tuple[int, ...]) -> View:
        """Numpy broadcasting: missing leading dims and size-1 dims get stride 0; leading size-1 dims beyond
        `shape`'s rank are dropped (a (1, d) tensor read as a length-d row)."""
        pad = len(shape) - len(self.shape)
        dims, strides = (1,) * pad + self.shape, (0,) * pad + self.strides
        if pad < 0:
            if any(d != 1 for d in self.shape[:-pad]):
                raise LoweringError(f"a view of shape {self.shape} does not broadcast to {shape}")
            dims, strides = self.shape[-pad:], self.strides[-pad:]
        return View(
            self.address, shape, tuple(0 if d == 1 else s for d, s in zip(dims, strides, strict=True)), self.dtype
        )

    def slice(self, axis: int, start: int, count: int, step: int = 1) -> View:
        shape, strides = self.shape, self.strides
        return View(
            self.address + start * strides[axis],
            (*shape[:axis], count, *shape[axis + 1 :]),
            (*strides[:axis], strides[axis] * step, *strides[axis + 1 :]),
            self.dtype,
        )

    def index(self, prefix: Sequence[int]) -> View:
        """Fix the leading len(prefix) indices."""
        offset = sum(map(mul, prefix, self.strides))  # (map stops at the shorter: the prefix)
        k = len(prefix)
        return View(self.address + offset, self.shape[k:], self.strides[k:], self.dtype)

    def reshape_dense(self, shape: tuple[int, ...]) -> View:
        """A new shape over a dense view (only valid for dense views)."""
        return dense(self.address, shape, self.dtype)

    def reshaped(self, shape: Sequence[int]) -> View | None:
        """The same elements in row-major order under a new shape, as a view of the same bytes (numpy's no-copy
        reshape: merged axes must be contiguous with each other, split axes take strides from the axis they
        split); None when the reshape would need a copy."""
        shape = tuple(int(d) for d in shape)
        if math.prod(shape) != self.size:
            return None
        old = [(d, s) for d, s in zip(self.shape, self.strides, strict=True) if d != 1]
        new = [d for d in shape if d != 1]
        strides: list[int] = []
        i = j = 0
        while i < len(old) and j < len(new):
            i_end, j_end, have, want = i + 1, j + 1, old[i][0], new[j]
            while have != want:  # grow the smaller side until both cover the same elements
                if have < want:
                    have *= old[i_end][0]
                    i_end += 1
                else:
                    want *= new[j_end]
                    j_end += 1
            if any(old[k][1] != old[k + 1][1] * old[k + 1][0] for k in range(i, i_end - 1)):
                return None  # the merged old axes are not contiguous with each other
            step = old[i_end - 1][1]
            group = []
            for d in reversed(new[j:j_end]):
                group.append(step)
                step *= d
            strides.extend(reversed(group))
            i, j = i_end, j_end
        found = iter(strides)
        return View(self.address, shape, tuple(0 if d == 1 else next(found) for d in shape), self.dtype)


_VIEW_SET = slot_setters(View)


def dense(address: int, shape: Sequence[int], dtype: DType) -> View:
    shape = tuple(int(d) for d in shape)
    strides, step = [], dtype.size
    for d in reversed(shape):
        strides.append(step)
        step *= d
    return View(address, shape, tuple(reversed(strides)), dtype)


def merge_dims(views: Sequence[View]) -> tuple[View, ...]:
    """The same views over the fewest dims: size-1 dims dropped, neighbours merged where every view is
    contiguous across them (element order is unchanged, so dense local tiles keep their layout)."""
    keep = [i for i, d in enumerate(views[0].shape) if d != 1]
    shapes = [[v.shape[i] for i in keep] for v in views]
    strides = [[v.strides[i] for i in keep] for v in views]
    i = len(keep) - 2
    while i >= 0:
        if all(st[i] == st[i + 1] * sh[i + 1] for sh, st in zip(shapes, strides, strict=True)):
            for sh, st in zip(shapes, strides, strict=True):
                sh[i : i + 2] = [sh[i] * sh[i + 1]]
                st[i : i + 2] = [st[i + 1]]
        i -= 1
    return tuple(
        View(v.address, tuple(sh), tuple(st), v.dtype) for v, sh, st in zip(views, shapes, strides, strict=True)
    )


@dataclass(frozen=True, slots=True, init=False)
class Transfer:
    """One dma.ld / dma.st: rows x cols elements, DRAM row stride in bytes, at element offset `local` of the tile."""

    dram: int
    rows: int
    cols: int
    stride: int
    local: int

    def __init__(self, dram: int, rows: int, cols: int, stride: int, local: int) -> None:
        """Sets the slots directly (as `View`: one per DMA a kernel emits)."""
        _TRANSFER_SET[0](self, dram)
        _TRANSFER_SET[1](self, rows)
        _TRANSFER_SET[2](self, cols)
        _TRANSFER_SET[3](self, stride)
        _TRANSFER_SET[4](self, local)


_TRANSFER_SET = slot_setters(Transfer)


def transfers(view: View) -> list[Transfer]:
    """Split a view into DMA transfers filling (or draining) a dense tile in row-major order."""
    at = view.address
    return [
        Transfer(at + t.dram, t.rows, t.cols, t.stride, t.local)
        for t in _split(tuple(view.shape), tuple(view.strides), view.dtype)
    ]


@lru_cache(maxsize=SPLITS_KEPT)
def _split(shape: tuple[int, ...], strides: tuple[int, ...], dtype: DType) -> tuple[Transfer, ...]:
    """`transfers` of the view of this shape, strides and dtype at address 0 (a view's transfers are these moved
    by its address; memoised: a generator splits views of a few shapes at many addresses)."""
    (v,) = merge_dims((View(0, shape, strides, dtype),))
    es = v.dtype.size
    shape, strides = list(v.shape), list(v.strides)
    if not shape:
        return (Transfer(v.address, 1, 1, es, 0),)
    if strides[-1] == es:
        cols, col_stride = shape.pop(), strides.pop()
        if cols > MAX_COLS:  # a long contiguous run becomes rows of a divisor of its length
            width = widest_divisor(cols, MAX_COLS)
            shape.append(cols // width)
            strides.append(width * col_stride)
            cols = width
    else:
        cols = 1
    if shape:
        rows, row_stride = shape.pop(), strides.pop()
    else:
        rows, row_stride = 1, cols * es
    out, local = [], 0
    for outer in product(*(range(d) for d in shape)):
        base = v.address + sum(i * s for i, s in zip(outer, strides, strict=True))
        for r0 in range(0, rows, MAX_ROWS):
            n = min(MAX_ROWS, rows - r0)
            out.append(Transfer(base + r0 * row_stride, n, cols, row_stride, local))
            local += n * cols
    return tuple(out)


@cache
def widest_divisor(n: int, limit: int) -> int:
    """The largest divisor of `n` (>= 1) that is at most `limit` (divisors in pairs up to sqrt(n); memoised: the
    generators split the same runs again and again)."""
    pairs = ((d, n // d) for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    return max(x for pair in pairs for x in pair if x <= limit)


@dataclass(frozen=True)
class Block:
    """One tile of a logical shape S seen as (1, *S): the leading indices fixed by `prefix`, `count` indices
    of the next dim from `start`, and every index of the dims after it."""

    prefix: tuple[int, ...]
    start: int
    count: int

    def of(self, view: View) -> View:
        """The part of `view` (whose shape is the blocked shape S) this block covers."""
        lifted = View(view.address, (1, *view.shape), (0, *view.strides), view.dtype)
        return lifted.index(self.prefix).slice(0, self.start, self.count)


def blocks(shape: tuple[int, ...], budget: int, whole: int = 1) -> list[Block]:
    """Tiles of at most `budget` elements in row-major order; the trailing dims whose product is `whole`
    (e.g. a softmax row) are never split, so a tile may exceed `budget` only when one such row does."""
    full = (1, *shape)
    if 0 in full:
        return []
    dim, inner = len(full) - 1, 1
    while dim > 0 and (inner < whole or inner * full[dim] <= budget):
        inner *= full[dim]
        dim -= 1
    chunk = max(1, budget // inner)
    return [
        Block(prefix, start, min(chunk, full[dim] - start))
        for prefix in product(*(range(d) for d in full[:dim]))
        for start in range(0, full[dim], chunk)
    ]
