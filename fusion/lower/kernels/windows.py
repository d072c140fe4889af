"""Sliding-window nodes: Conv, MaxPool and AveragePool; and Pad, built like their padded input.

Padding is a phase of its own: a DRAM scratch tensor is filled with the pad value (0, or -inf / -128 for max)
from one vector-filled tile, then the input is copied into its interior. Then:
- a depthwise Conv and a 1-D/2-D MaxPool run on the vector unit over bands of the padded input, one shifted
  vector op per tap (`conv_depthwise`, `pool_vector`), no window copies;
- any other Conv (and a depthwise one the vector kernels refuse) runs as an implicit GEMM over the unpadded
  input (`conv_implicit`): no padding phase, no im2col tensor;
- a MaxPool of another rank takes v.max over the window views (a window position (k_1, ..., k_s) is a strided
  view of the padded tensor) of each output tile;
- AveragePool sums the window views in the reference's order (`sum_order`) and divides by the same window sum over
  a tensor of ones padded like the input, which counts each window's valid positions (explicit pads included with
  count_include_pad).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import product

from fusion.graph.ir import Graph, Node
from fusion.graph.ops import OpType
from fusion.lower.context import LowerContext, storage_dtype
from fusion.lower.emitter import Emitter, Step
from fusion.lower.errors import MemoryPlanError, UnsupportedOpError
from fusion.lower.kernels.conv_depthwise import depthwise_phases, is_depthwise, scratch_elements
from fusion.lower.kernels.conv_geometry import ConvGeometry, conv_geometry
from fusion.lower.kernels.conv_implicit import implicit_conv_phases, quantized_bytes
from fusion.lower.kernels.movement import copy_steps
from fusion.lower.kernels.pool_vector import max_pool_phases
from fusion.lower.kernels.sum_order import SumPlan, sum_plan, sum_tree
from fusion.lower.kernels.vector_ops import dequantize, fill, lowest
from fusion.lower.local_alloc import TileArena, largest_fitting
from fusion.lower.views import View, blocks, dense
from fusion.quant.plan import QuantPlan
from isa.enums import DType, Unit


@dataclass(frozen=True)
class Window:
    """Geometry of one windowed node over s spatial dims."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[int, ...]  # begins then ends
    in_shape: tuple[int, ...]  # N, C, spatial...
    out_spatial: tuple[int, ...]

    @property
    def s(self) -> int:
        return len(self.kernel)

    @property
    def padded_shape(self) -> tuple[int, ...]:
        dims = []
        for i in range(self.s):
            need = (self.out_spatial[i] - 1) * self.strides[i] + (self.kernel[i] - 1) * self.dilations[i] + 1
            size, begin = self.in_shape[2 + i], self.pads[i]
            dims.append(begin + size + max(self.pads[self.s + i], need - size - begin))
        return (*self.in_shape[:2], *dims)

    @property
    def needs_pad(self) -> bool:
        return self.padded_shape != self.in_shape


def window_of(graph: Graph, node: Node) -> Window:
    x = graph.types[node.inputs[0]].shape
    kernel = tuple(graph.types[node.inputs[1]].shape[2:]) if node.op == OpType.Conv else tuple(node.attr("kernel"))
    return Window(
        kernel,
        tuple(node.attr("strides")),
        tuple(node.attr("dilations")),
        tuple(node.attr("pads")),
        tuple(x),
        tuple(graph.types[node.outputs[0]].shape[2:]),
    )


def _scratch(graph: Graph, node: Node, plan: QuantPlan | None) -> list[int]:
    w = window_of(graph, node)
    es = storage_dtype(graph, plan, node.inputs[0]).size
    padded = math.prod(w.padded_shape)
    sizes = [padded * es]  # padded input (unused without padding)
    if node.op == OpType.Conv:  # temp 1: the depthwise vector kernel's output scratch (<= float32), or else the
        depthwise = is_depthwise(graph, node)  # implicit GEMM's quantized input (`conv_implicit.QUANTIZED`)
        vector = scratch_elements(conv_geometry(graph, node, w.padded_shape)) * 4 if depthwise else 0
        if max(vector, quantized_bytes(graph, node, plan)):
            sizes.append(max(vector, quantized_bytes(graph, node, plan)))
    if node.op == OpType.AveragePool:
        sizes.append(padded * 4)  # padded ones
    if node.op == OpType.MaxPool and w.s <= 2:  # the vector kernel's output scratch
        sizes.append(scratch_elements(pool_geometry(w)) * es)
    return sizes


def pool_geometry(w: Window) -> ConvGeometry:
    """A 1-D or 2-D pooling window as the geometry of a depthwise conv (one channel per group)."""
    lift = (1,) * (2 - w.s)
    n, c = w.in_shape[:2]
    return ConvGeometry(
        n,
        c,
        c,
        c,
        (*lift, *w.kernel),
        (*lift, *w.strides),
        (*lift, *w.dilations),
        (*lift, *w.padded_shape[2:]),
        (*lift, *w.out_spatial),
    )


def _fill_steps(cx: LowerContext, target: View, value: float, start: int = 0) -> list[Step]:
    """One tile filled with `value`, stored over every block of `target`."""
    probe = TileArena(cx.config, 0)
    budget = min(target.size, largest_fitting(1 << 15, lambda e: probe.fits([e * target.dtype.size])))
    arena = TileArena(cx.config, start, cx.rotation)
    tile = arena.tile(budget * target.dtype.size)

    def body(em: Emitter) -> None:
        fill(em, tile, budget, target.dtype, value)

    stores = [(tile, block.of(target)) for block in blocks(target.shape, budget)]
    return [Step([], [(Unit.vector, body)], stores)]


def padded_input(cx: LowerContext, node: Node, w: Window, value: float) -> tuple[View, list[list[Step]]]:
    """The padded input view and the phases that build it (none without padding)."""
    x = cx.view(node.inputs[0])
    if not w.needs_pad:
        return x, []
    padded = dense(cx.temp(node, 0), w.padded_shape, x.dtype)
    interior = padded
    for i in range(w.s):
        interior = interior.slice(2 + i, w.pads[i], w.in_shape[2 + i])
    return padded, [_fill_steps(cx, padded, value), copy_steps(cx, [(x, interior, None)])]


def lower_pad(cx: LowerContext, node: Node) -> list[list[Step]]:
    """Pad: the input copied into the output's interior, then the borders: filled with the value (constant mode;
    an int8 output is int8-preserving only for a zero value, see `fusion.quant.plan`), or copied from the
    interior's edge or mirror rows, one axis per phase (each later axis copies the rows the earlier ones filled,
    so corners come out as numpy's)."""
    mode = node.attr("mode")
    if mode not in ("constant", "edge", "reflect"):
        raise UnsupportedOpError(node.name, node.op.value, f"pad mode {mode!r}")
    x = node.inputs[0]
    src, out = cx.view(x), cx.view(node.outputs[0])
    pads, rank = node.attr("pads"), len(out.shape)
    interior = out
    for axis in range(rank):
        interior = interior.slice(axis, pads[axis], src.shape[axis])
    scale = cx.scale(x) if src.dtype is DType.i8 and out.dtype is DType.f32 else None
    if mode == "constant":
        value = 0.0 if out.dtype is DType.i8 else float(node.attr("value"))
        return [_fill_steps(cx, out, value), copy_steps(cx, [(src, interior, scale)])]
    phases = [copy_steps(cx, [(src, interior, scale)])]
    filled = interior  # the region already holding data, growing axis by axis
    for axis in range(rank):
        begin, size = pads[axis], src.shape[axis]
        copies = []
        for j in range(pads[axis]):  # before the interior, nearest first
            source = begin if mode == "edge" else begin + j + 1
            copies.append((filled.slice(axis, source - begin, 1), _rows_at(filled, out, axis, begin - 1 - j), None))
        for j in range(pads[rank + axis]):
            source = begin + size - 1 if mode == "edge" else begin + size - 2 - j
            copies.append((filled.slice(axis, source - begin, 1), _rows_at(filled, out, axis, begin + size + j), None))
        if copies:
            phases.append(copy_steps(cx, copies))
        filled = _span(filled, out, axis)
    return phases


def _rows_at(filled: View, out: View, axis: int, index: int) -> View:
    """The output's `index` along `axis`, over the extent `filled` covers on every other axis."""
    address = filled.address + (index - _start(filled, out)[axis]) * out.strides[axis]
    return View(address, (*filled.shape[:axis], 1, *filled.shape[axis + 1 :]), filled.strides, filled.dtype)


def _start(filled: View, out: View) -> tuple[int, ...]:
    """The output index `filled` starts at (`out` is dense, strides decreasing)."""
    rest, index = filled.address - out.address, []
    for stride in out.strides:
        index.append(rest // stride)
        rest %= stride
    return tuple(index)


def _span(filled: View, out: View, axis: int) -> View:
    """`filled` widened to the whole output along `axis`."""
    start = list(_start(filled, out))
    address = filled.address - start[axis] * out.strides[axis]
    shape = (*filled.shape[:axis], out.shape[axis], *filled.shape[axis + 1 :])
    return View(address, shape, filled.strides, filled.dtype)


def _window_view(padded: View, w: Window, offset: tuple[int, ...]) -> View:
    """Elements [n, c, o...] = padded[n, c, o_i * stride_i + offset_i * dilation_i]."""
    sp = padded.strides[2:]
    address = padded.address + sum(k * d * s for k, d, s in zip(offset, w.dilations, sp, strict=True))
    strides = (*padded.strides[:2], *(st * s for st, s in zip(w.strides, sp, strict=True)))
    return View(address, (*padded.shape[:2], *w.out_spatial), strides, padded.dtype)


def lower_conv(cx: LowerContext, node: Node) -> list[list[Step]]:
    """A depthwise Conv on the vector unit over bands of its padded input where that kernel applies, else (any
    Conv) the implicit GEMM, which reads the unpadded input."""
    if is_depthwise(cx.graph, node):
        w = window_of(cx.graph, node)
        padded, phases = padded_input(cx, node, w, 0.0)
        geometry = conv_geometry(cx.graph, node, w.padded_shape)
        vector = depthwise_phases(cx, node, padded, geometry, cx.temp(node, 1))
        if vector is not None:
            return phases + vector
    return implicit_conv_phases(cx, node)


def lower_pool(cx: LowerContext, node: Node) -> list[list[Step]]:
    w = window_of(cx.graph, node)
    x_dt = cx.dtype(node.inputs[0])
    is_max = node.op == OpType.MaxPool
    pad_value = lowest(x_dt) if is_max else 0.0
    padded, phases = padded_input(cx, node, w, pad_value)
    if is_max and w.s <= 2:
        vector = max_pool_phases(cx, pool_geometry(w), padded, cx.view(node.outputs[0]), cx.temp(node, 1))
        if vector is not None:
            return phases + vector
    offsets = list(product(*(range(k) for k in w.kernel)))
    sources = [_window_view(padded, w, o) for o in offsets]
    if not is_max:
        ones = dense(cx.temp(node, 1), w.padded_shape, DType.f32)
        valid = ones
        for i in range(w.s):
            size = w.in_shape[2 + i] + (w.pads[i] + w.pads[w.s + i] if node.attr("count_include_pad") else 0)
            valid = valid.slice(2 + i, 0 if node.attr("count_include_pad") else w.pads[i], size)
        phases += [_fill_steps(cx, ones, 0.0), _fill_steps(cx, valid, 1.0)]
        counts = [_window_view(ones, w, o) for o in offsets]
    out = cx.view(node.outputs[0])
    kinds = [(sources, x_dt)] + ([] if is_max else [(counts, DType.f32)])
    scale = cx.scale(node.inputs[0]) if not is_max and x_dt is DType.i8 else None
    body = _PoolBody(is_max, x_dt, scale, len(offsets), None if is_max else sum_plan(sum_tree(w)))
    phases.append(_window_steps(cx, node, out, kinds, body))
    return phases


@dataclass(frozen=True)
class _PoolBody:
    """Accumulates window tiles into a block's result: max; or (average) window sums in the reference's order
    (`sum_order`: numpy's association of the taps, as a plan of adds over partial-sum tiles), a count sum, and a
    division."""

    is_max: bool
    dtype: DType
    dequantize_scale: float | None
    taps: int
    plan: SumPlan | None  # average only

    def reserved(self, n: int, out_size: int) -> list[int]:
        """Per-block tiles at fixed offsets of a buffer slot: the result (max), or the partial sums (slot 0 is the
        result), the count sum and a float copy."""
        return [n * out_size] if self.is_max else [n * 4] * (self.plan.slots + 2)

    def emit(self, em: Emitter, res: list[int], tiles: list[list[int]], n: int, picked: range) -> None:
        b = em.b
        if self.is_max:
            for t, i in zip(tiles[0], picked, strict=True):
                if i == 0:
                    b.v_copy(*em.regs(res[0], t), n, self.dtype.name)
                else:
                    b.v_max(*em.regs(res[0], res[0], t), n, self.dtype.name)
            return
        cnt, tmp = res[self.plan.slots], res[self.plan.slots + 1]
        data = dict(zip(picked, tiles[0], strict=True))
        for tap, kind, dst, operand in self.plan.ops:
            if tap not in data:
                continue
            if kind == "add":
                b.v_add(*em.regs(res[dst], res[dst], res[operand]), n, "f32")
                continue
            src = data[operand]
            if self.dequantize_scale is not None:
                dequantize(em, res[dst] if kind == "set" else tmp, src, n, self.dequantize_scale)
                src = res[dst] if kind == "set" else tmp
            elif kind == "set":
                b.v_copy(*em.regs(res[dst], src), n, "f32")
            if kind == "tap":
                b.v_add(*em.regs(res[dst], res[dst], src), n, "f32")
        for ct, i in zip(tiles[1], picked, strict=True):
            if i == 0:
                b.v_copy(*em.regs(cnt, ct), n, "f32")
            else:
                b.v_add(*em.regs(cnt, cnt, ct), n, "f32")
        if picked[-1] == self.taps - 1:
            b.v_div(*em.regs(res[0], res[0], cnt), n, "f32")


def _window_steps(
    cx: LowerContext, node: Node, out: View, kinds: list[tuple[list[View], DType]], body: _PoolBody
) -> list[Step]:
    """Output blocks, each over groups of window offsets: a group's tiles rotate with the step index, the
    block's result tiles with the block index (so a block's store never races the next block's compute)."""
    count = len(kinds[0][0])
    probe = TileArena(cx.config, 0)

    def sizes(e: int, group: int) -> list[int]:
        return body.reserved(e, out.dtype.size) + [e * dt.size for _, dt in kinds for _ in range(group)]

    group, budget = min(count, 8) * 2, 0
    while budget == 0 and group > 1:
        group //= 2
        budget = largest_fitting(1 << 15, lambda e, g=group: probe.fits(sizes(e, g)))
    if budget == 0:
        raise MemoryPlanError(f"node {node.name!r}: window tiles do not fit the scratchpad")
    steps: list[Step] = []
    for b, block in enumerate(blocks(out.shape, budget)):
        n = block.of(out).size
        res_arena = TileArena(cx.config, b, cx.rotation)
        res = [res_arena.tile(size) for size in body.reserved(budget, out.dtype.size)]  # same offsets every block
        for g0 in range(0, count, group):
            arena = TileArena(cx.config, len(steps), cx.rotation)
            for size in body.reserved(budget, out.dtype.size):
                arena.tile(size)
            picked = range(g0, min(count, g0 + group))
            tiles = [[arena.tile(n * dt.size) for _ in picked] for _, dt in kinds]
            loads = [
                (block.of(views[i]), t)
                for (views, _), ts in zip(kinds, tiles, strict=True)
                for i, t in zip(picked, ts, strict=True)
            ]

            def compute(em: Emitter, res=res, tiles=tiles, n=n, picked=picked) -> None:
                body.emit(em, res, tiles, n, picked)

            stores = [(res[0], block.of(out))] if picked[-1] == count - 1 else []
            steps.append(Step(loads, [(Unit.vector, compute)], stores))
    return steps


WINDOWS = {OpType.Conv: lower_conv, OpType.MaxPool: lower_pool, OpType.AveragePool: lower_pool}
SCRATCH = dict.fromkeys(WINDOWS, _scratch)
LOWERINGS = {**WINDOWS, OpType.Pad: lower_pad}
