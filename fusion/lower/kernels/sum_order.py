"""The order numpy adds a window's taps in, and a plan of vector adds that follows it exactly.

The reference averages a window as numpy's float32 sum over the window view [.., *out, *kernel] (`fusion.reference.
kernels.average_pool`), so an average pool is bit-exact only if its kernel adds the taps in numpy's order. numpy
runs one strided loop nest whose inner loop is the smallest-stride axis; a reduction inner loop adds its terms by
pairwise summation (in turn below 8 terms; else 8 running sums joined as a tree, and halves above 128 terms) onto
the output, and the outer loops add in turn. Hence (measured over small geometries: H 2-9, W 1-9, kernels,
strides and dilations 1-3, pads 0-1; `tests/fusion/lower/test_sum_order.py` checks it against numpy):
- "rows": the kernel columns are the inner loop: each kernel row pairwise, the row sums added in turn;
- "flat": the output columns are the inner loop (dilation above stride): every tap added in turn, row-major;
- "pairwise": the kernel rows and columns are one axis (a padded row exactly a window's width), or numpy drops a
  size-1 output column axis and the output rows do not step less than the kernel rows: numpy's pairwise sum over
  every tap, row-major.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fusion.lower.kernels.windows import Window

PAIRWISE = 8  # numpy sums an inner loop of 8 or more terms pairwise
BLOCK = 128  # numpy's pairwise sum splits longer runs in halves

Tree = int | tuple[str, tuple["Tree", ...]]  # a tap index, ("seq", terms) or ("pair", terms)


def numpy_order(w: Window) -> str:
    """ "rows", "flat" or "pairwise" (the module docstring) for a 1-D or 2-D window; rank 3 and above: "rows"."""
    if w.s > 2:
        return "rows"
    kh, kw = ((1,) * (2 - w.s) + tuple(w.kernel))[-2:]
    sw, dw, dh = w.strides[-1], w.dilations[-1], w.dilations[0] if w.s == 2 else 1
    if kh > 1 and kw > 1 and w.out_spatial[-1] == 1:  # numpy drops the output column axis
        sh, oh = (w.strides[0], w.out_spatial[0]) if w.s == 2 else (1, 1)
        return "rows" if dh > sh and oh > 1 else "pairwise"  # the output rows' loop inside the kernel rows'
    if dw > sw and w.out_spatial[-1] > 1 and kw > 1:
        return "flat"
    if kh > 1 and kw > 1 and dh * w.padded_shape[-1] == kw * dw:
        return "pairwise"
    return "rows"


def sum_tree(w: Window) -> Tree:
    """numpy's association of the window's taps (row-major indices)."""
    taps = tuple(range(math.prod(w.kernel)))
    order = numpy_order(w)
    if order == "flat":
        return ("seq", taps)
    if order == "pairwise":
        return ("pair", taps)
    inner = w.kernel[-1]
    rows: tuple[Tree, ...] = tuple(("pair", taps[i : i + inner]) for i in range(0, len(taps), inner))
    return ("seq", rows)


@dataclass(frozen=True)
class SumPlan:
    """Vector adds computing a tree into slot 0, in the taps' arrival order: (tap, kind, dst slot, operand) with
    kind "set" (dst = tap), "tap" (dst += tap) or "add" (dst += slot operand), each op listed with the tap whose
    tile it waits for (every op of a tap comes after the ops of earlier taps); `slots` partial sums live at once."""

    ops: tuple[tuple[int, str, int, int], ...]
    slots: int


def sum_plan(tree: Tree) -> SumPlan:
    ops: list[tuple[int, str, int, int]] = []
    free: list[int] = []
    used = [0, 0]  # slots made, and the tap last read

    def alloc() -> int:
        if free:
            return free.pop(min(range(len(free)), key=free.__getitem__))
        used[0] += 1
        return used[0] - 1

    def add(dst: int, term: Tree) -> None:
        if isinstance(term, int):
            used[1] = term
            ops.append((term, "tap", dst, term))
            return
        src = value(term)
        ops.append((used[1], "add", dst, src))
        free.append(src)

    def value(term: Tree) -> int:
        if isinstance(term, int):
            used[1] = term
            slot = alloc()
            ops.append((term, "set", slot, term))
            return slot
        kind, terms = term
        n = len(terms)
        if kind == "seq" or n < PAIRWISE:
            slot = value(terms[0])
            for t in terms[1:]:
                add(slot, t)
            return slot
        if n > BLOCK:
            half = n // 2 - (n // 2) % PAIRWISE
            slot = value(("pair", terms[:half]))
            add(slot, ("pair", terms[half:]))
            return slot
        sums = [value(t) for t in terms[:PAIRWISE]]
        full = n - n % PAIRWISE
        for i in range(PAIRWISE, full, PAIRWISE):
            for j in range(PAIRWISE):
                add(sums[j], terms[i + j])
        for step in (1, 2, 4):  # ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
            for j in range(0, PAIRWISE, 2 * step):
                ops.append((used[1], "add", sums[j], sums[j + step]))
                free.append(sums[j + step])
        for t in terms[full:]:
            add(sums[0], t)
        return sums[0]

    root = value(tree)
    assert root == 0, "the first slot made holds the sum"
    return SumPlan(tuple(ops), used[0])
