"""Depthwise Conv and MaxPool on the vector unit over the unpadded input's frame (`frame`): per step a block
of whole channels, one DMA per input row phase in, one vector op (plus its masks) per tap, a masked period-sw
reduction keeping the strided columns, and one DMA out of the dense [channels, OH, OW] result.

`lower_conv` / `lower_pool` run a node this way when its geometry has a frame and a channel fits a buffer slot,
else the padded-band / window kernels of `windows` (the routing the baseline compiler registers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fusion.graph.ir import Node
from fusion.graph.ops import OpType
from fusion.lower.context import CONST_I8, LowerContext
from fusion.lower.emitter import Emitter, Step, f32_bits
from fusion.lower.kernels import windows
from fusion.lower.kernels.conv_depthwise import is_depthwise
from fusion.lower.kernels.frame import MAX_N, MAX_PERIOD, Frame, Tap, fill_runs, frame_of, repeat
from fusion.lower.kernels.matrix import bias_view, requant, requant_table
from fusion.lower.local_alloc import TileArena, largest_fitting
from fusion.lower.views import View
from isa.enums import DType, Unit


def node_frame(cx: LowerContext, node: Node) -> Frame | None:
    w = windows.window_of(cx.graph, node)
    s = w.s
    return (
        frame_of(
            w.in_shape[0],
            w.in_shape[1],
            tuple(w.in_shape[2:]),
            w.kernel,
            w.strides,
            w.dilations,
            w.pads,
            w.out_spatial,
        )
        if s in (1, 2)
        else None
    )


@dataclass(frozen=True)
class _Plan:
    """Which masks and expansions a frame's taps need (the same for every step)."""

    f: Frame
    conv: bool

    @property
    def taps(self) -> list[Tap]:
        return self.f.taps()

    @property
    def phases(self) -> list[int]:
        return sorted({t.phase for t in self.taps})

    def expands(self, tap: Tap) -> bool:
        """A conv tap multiplies by per-frame-row weights (zero on rows outside the image)."""
        return tap.dm != 0 or self.f.positions > MAX_PERIOD

    @property
    def row_masks(self) -> list[int]:
        """The dm values needing a per-row mask."""
        if self.conv:
            return sorted({t.dm for t in self.taps if self.expands(t)})
        return sorted({t.dm for t in self.taps if t.dm != 0})

    @property
    def col_masks(self) -> list[int]:
        return sorted({t.o for t in self.taps if self.f.col_mask_needed(t.o)})

    @property
    def expanded(self) -> list[int]:
        return [i for i, t in enumerate(self.taps) if self.conv and self.expands(t)]


def _sizes(p: _Plan, kb: int, xdt: DType, acc: DType, int8: bool, quantize: bool) -> dict[str, int]:
    """Bytes of each tile of a step of kb channels."""
    f = p.f
    pre, post = f.slack()
    wide = pre + kb * f.rows * f.pitch + post
    n = kb * f.positions
    m = kb * f.out[0] * f.out[1]
    rows = kb * f.out[0]
    sizes: dict[str, int] = {}
    for ph in p.phases:
        sizes[f"x{ph}"] = wide * xdt.size
        if int8:
            sizes[f"xi{ph}"] = wide * 4
            if quantize:
                sizes[f"q{ph}"] = wide
    for dm in p.row_masks:
        sizes[f"rm{dm}"] = rows * acc.size
    for o in p.col_masks:
        sizes[f"cm{o}"] = f.pitch * acc.size
    if f.strides[1] > 1:
        sizes["keep"] = f.pitch * acc.size
    sizes["acc"] = n * acc.size
    if p.conv:
        taps = len(p.taps)
        sizes["w"] = taps * kb * 4  # [taps, kb]: each tap's weights contiguous
        sizes["wrow"] = taps * kb * 4  # [kb, taps] as loaded (one DMA)
        sizes["wtmp"] = taps * kb * 4
        sizes["eye"] = taps * taps * 4
        if int8:
            sizes["w8"] = taps * kb
        for i in p.expanded:
            sizes[f"we{i}"] = rows * 4
        sizes["tmp"] = n * 4
        sizes["bias"] = kb * 4
        sizes["table"] = kb * 8
        if f.strides[1] > 1:
            sizes["cmp"] = m * 4
        if int8:
            sizes["res"] = m
    else:
        if p.row_masks or p.col_masks:
            sizes["tmp"] = n * acc.size
        if f.strides[1] > 1:
            sizes["cmp"] = m * acc.size
    return sizes


def _channels(cx: LowerContext, p: _Plan, sizes) -> int:
    """Channels per step (0: one channel does not fit a slot, or an op would pass the `n` field)."""
    probe = TileArena(cx.config, 0)

    def fits(kb: int) -> bool:
        n = kb * p.f.positions + sum(p.f.slack())
        return n <= MAX_N and probe.fits(list(sizes(kb).values()))

    return largest_fitting(p.f.c, fits)


def _steps(cx: LowerContext, p: _Plan, x: View, out: View, sizes, kb: int, extra, body) -> list[Step]:
    f = p.f
    pre = f.slack()[0]
    steps = []
    image_out = out.reshape_dense((f.n, f.c, f.out[0] * f.out[1]))
    for img in range(f.n):
        for c0 in range(0, f.c, kb):
            k = min(kb, f.c - c0)
            arena = TileArena(cx.config, len(steps), cx.rotation)
            tiles = {name: arena.tile(size) for name, size in sizes(k).items()}
            loads = []
            for ph in p.phases:
                for view, local in f.phase_view(x, img, c0, k, ph):
                    loads.append((view, tiles[f"x{ph}"] + (pre + local) * x.dtype.size))
            loads += extra(c0, k, tiles)
            result, emit = body(k, tiles)
            stores = [(result, image_out.index((img,)).slice(0, c0, k))]
            steps.append(Step(loads, [(Unit.vector, emit)], stores))
    return steps


def _prepare_x(em: Emitter, f: Frame, tile: int, kb: int, dtype: DType, value: float) -> None:
    """The slack around a phase tile's data and (W' > W) the last row's gap set to the pad value."""
    pre, post = f.slack()
    data = kb * f.rows * f.pitch
    runs = [(0, pre, value), (pre + data, pre + data + post, value)]
    if f.pitch > f.w:
        runs.append((pre + data - f.pitch + f.w, pre + data, value))
    fill_runs(em, tile, runs, dtype)


def _row_mask(em: Emitter, f: Frame, tile: int, kb: int, dm: int, dtype: DType, lo: float, hi: float) -> None:
    r = f.out[0]
    a, b = max(0, -dm), min(r, f.rows - dm)
    fill_runs(em, tile, [(0, a, lo), (a, b, hi), (b, r, lo)], dtype)
    repeat(em, tile, r, kb, dtype)


def _col_mask(em: Emitter, f: Frame, tile: int, o: int, dtype: DType, lo: float, hi: float) -> None:
    fill_runs(em, tile, [(0, f.pitch, hi)] + [(a, b, lo) for a, b in f.col_invalid(o)], dtype)


def _keep_mask(em: Emitter, f: Frame, tile: int, dtype: DType, lo: float, hi: float) -> None:
    sw = f.strides[1]
    fill_runs(em, tile, [(0, 1, hi), (1, sw, lo)], dtype)
    repeat(em, tile, sw, f.out[1], dtype)


# --- depthwise Conv -----------------------------------------------------------------------------------------


def depthwise_frame_phases(cx: LowerContext, node: Node) -> list[list[Step]] | None:
    f = node_frame(cx, node)
    if f is None or not is_depthwise(cx.graph, node):
        return None
    out = cx.view(node.outputs[0])
    if cx.int8 and out.dtype is not DType.i8:
        return None
    x = cx.view(node.inputs[0])
    int8 = cx.int8
    acc = DType.i32 if int8 else DType.f32
    quantize = int8 and x.dtype is DType.f32
    p = _Plan(f, conv=True)

    def sizes(kb: int) -> dict[str, int]:
        return _sizes(p, kb, x.dtype, acc, int8, quantize)

    kb = _channels(cx, p, sizes)
    if kb == 0:
        return None
    weights = cx.const_view(node.inputs[1], CONST_I8) if int8 else cx.view(node.inputs[1])
    taps = weights.reshape_dense((f.c, len(p.taps)))
    bias, table = bias_view(cx, node), requant_table(cx, node)
    pair = None if table is not None or not int8 else requant(cx, node)
    in_scale = cx.matrix(node).input_scale if quantize else None

    def extra(c0: int, k: int, tiles: dict[str, int]) -> list:
        loads = [(taps.slice(0, c0, k), tiles["w8" if int8 else "wrow"])]
        if bias is not None:
            loads.append((bias.slice(0, c0, k), tiles["bias"]))
        if table is not None:
            loads.append((table.slice(0, c0, k), tiles["table"]))
        return loads

    def body(k: int, tiles: dict[str, int]):
        conv = _ConvBody(p, k, tiles, int8, x.dtype, in_scale, bias is not None, table is not None, pair)
        return conv.result, conv

    return [_steps(cx, p, x, out, sizes, kb, extra, body)]


@dataclass(frozen=True)
class _ConvBody:
    p: _Plan
    kb: int
    tiles: dict[str, int]
    int8: bool
    xdt: DType
    quantize: float | None
    bias: bool
    table: bool
    pair: tuple[int, int] | None

    @property
    def result(self) -> int:
        t = self.tiles
        if self.int8:
            return t["res"]
        return t["cmp"] if self.p.f.strides[1] > 1 else t["acc"]

    def __call__(self, em: Emitter) -> None:
        f, t, b, kb = self.p.f, self.tiles, em.b, self.kb
        acc = "i32" if self.int8 else "f32"
        adt = DType.i32 if self.int8 else DType.f32
        pre, post = f.slack()
        wide = pre + kb * f.rows * f.pitch + post
        n = kb * f.positions
        src = {}
        for ph in self.p.phases:
            _prepare_x(em, f, t[f"x{ph}"], kb, self.xdt, 0.0)
            src[ph] = t[f"x{ph}"]
            if self.int8:
                if self.quantize is not None:
                    b.v_qnt(*em.regs(t[f"q{ph}"], src[ph], f32_bits(1.0 / self.quantize)), wide)
                    src[ph] = t[f"q{ph}"]
                b.v_cvt(*em.regs(t[f"xi{ph}"], src[ph]), wide, "i8", "i32")
                src[ph] = t[f"xi{ph}"]
        taps = self.p.taps
        if self.int8:
            b.v_cvt(*em.regs(t["wrow"], t["w8"]), len(taps) * kb, "i8", "i32")
        _transpose_weights(em, t, kb, len(taps), adt)
        for dm in self.p.row_masks:
            _row_mask(em, f, t[f"rm{dm}"], kb, dm, adt, 0.0, 1.0)
        for o in self.p.col_masks:
            _col_mask(em, f, t[f"cm{o}"], o, adt, 0.0, 1.0)
        rows = kb * f.out[0]
        for i in self.p.expanded:
            tap = taps[i]
            b.v_mul_vc(*em.regs(t[f"we{i}"], t[f"rm{tap.dm}"], t["w"] + i * kb * 4), rows, f.out[0], acc)
        for i, tap in enumerate(taps):
            dst = t["acc"] if i == 0 else t["tmp"]
            x = src[tap.phase] + (pre + tap.offset(f.pitch)) * 4
            if tap.dm != 0 or f.positions > MAX_PERIOD:
                b.v_mul_vc(*em.regs(dst, x, t[f"we{i}"]), n, f.pitch, acc)
            else:
                b.v_mul_vc(*em.regs(dst, x, t["w"] + i * kb * 4), n, f.positions, acc)
            if tap.o in self.p.col_masks:
                b.v_mul_vr(*em.regs(dst, dst, t[f"cm{tap.o}"]), n, f.pitch, acc)
            if i:
                b.v_add(*em.regs(t["acc"], t["acc"], dst), n, acc)
        res, m = t["acc"], n
        if f.strides[1] > 1:
            _keep_mask(em, f, t["keep"], adt, 0.0, 1.0)
            b.v_mul_vr(*em.regs(t["acc"], t["acc"], t["keep"]), n, f.pitch, acc)
            m = n // f.strides[1]
            b.v_rsum(*em.regs(t["cmp"], t["acc"]), n, f.strides[1], acc)
            res = t["cmp"]
        per = f.out[0] * f.out[1]
        if self.bias:
            b.v_add_vc(*em.regs(res, res, t["bias"]), m, per, acc)
        if self.table:
            b.v_rqnt_vc(*em.regs(t["res"], res, t["table"]), m, per)
        elif self.pair is not None:
            mult, shift = self.pair
            b.v_rqnt(*em.regs(t["res"], res, mult), shift, m)


def _transpose_weights(em: Emitter, t: dict[str, int], kb: int, taps: int, dtype: DType) -> None:
    """w[tap, c] = wrow[c, tap]: each tap's column picked by a one-hot row (`.vr`) and a period-taps sum (exact:
    one term is the weight, the others zero), so the weights load as one contiguous DMA instead of one per tap."""
    eye = t["eye"]
    fill_runs(em, eye, [(0, taps * taps, 0.0)] + [(i * taps + i, i * taps + i + 1, 1.0) for i in range(taps)], dtype)
    n = kb * taps
    for i in range(taps):
        em.b.v_mul_vr(*em.regs(t["wtmp"], t["wrow"], eye + i * taps * 4), n, taps, dtype.name)
        em.b.v_rsum(*em.regs(t["w"] + i * kb * 4, t["wtmp"]), n, taps, dtype.name)


# --- MaxPool ------------------------------------------------------------------------------------------------


def max_pool_frame_phases(cx: LowerContext, node: Node) -> list[list[Step]] | None:
    f = node_frame(cx, node)
    if f is None:
        return None
    x, out = cx.view(node.inputs[0]), cx.view(node.outputs[0])
    if out.dtype is not x.dtype:
        return None
    p = _Plan(f, conv=False)

    def sizes(kb: int) -> dict[str, int]:
        return _sizes(p, kb, x.dtype, x.dtype, False, False)

    kb = _channels(cx, p, sizes)
    if kb == 0:
        return None

    def body(k: int, tiles: dict[str, int]):
        pool = _MaxBody(p, k, tiles, x.dtype)
        return (tiles["cmp"] if f.strides[1] > 1 else tiles["acc"]), pool

    return [_steps(cx, p, x, out, sizes, kb, lambda c0, k, tiles: [], body)]


def _bounds(dtype: DType) -> tuple[float, float]:
    return (-128.0, 127.0) if dtype is DType.i8 else (-math.inf, math.inf)


@dataclass(frozen=True)
class _MaxBody:
    p: _Plan
    kb: int
    tiles: dict[str, int]
    dtype: DType

    def __call__(self, em: Emitter) -> None:
        f, t, b, kb, d = self.p.f, self.tiles, em.b, self.kb, self.dtype
        lo, hi = _bounds(d)
        es, pre = d.size, f.slack()[0]
        n = kb * f.positions
        for ph in self.p.phases:
            _prepare_x(em, f, t[f"x{ph}"], kb, d, lo)
        for dm in self.p.row_masks:
            _row_mask(em, f, t[f"rm{dm}"], kb, dm, d, lo, hi)
        for o in self.p.col_masks:
            _col_mask(em, f, t[f"cm{o}"], o, d, lo, hi)
        for i, tap in enumerate(self.p.taps):
            x = t[f"x{tap.phase}"] + (pre + tap.offset(f.pitch)) * es
            operand = x
            dst = t["acc"] if i == 0 else t.get("tmp", 0)
            if tap.dm != 0:
                b.v_min_vc(*em.regs(dst, operand, t[f"rm{tap.dm}"]), n, f.pitch, d.name)
                operand = dst
            if tap.o in self.p.col_masks:
                b.v_min_vr(*em.regs(dst, operand, t[f"cm{tap.o}"]), n, f.pitch, d.name)
                operand = dst
            if i == 0:
                if operand != t["acc"]:
                    b.v_copy(*em.regs(t["acc"], operand), n, d.name)
            else:
                b.v_max(*em.regs(t["acc"], t["acc"], operand), n, d.name)
        if f.strides[1] > 1:
            _keep_mask(em, f, t["keep"], d, lo, hi)
            b.v_min_vr(*em.regs(t["acc"], t["acc"], t["keep"]), n, f.pitch, d.name)
            b.v_rmax(*em.regs(t["cmp"], t["acc"]), n, f.strides[1], d.name)


# --- routing ------------------------------------------------------------------------------------------------


def lower_conv(cx: LowerContext, node: Node) -> list[list[Step]]:
    """A depthwise Conv on its frame when it has one, else the window kernels'."""
    if is_depthwise(cx.graph, node):
        phases = depthwise_frame_phases(cx, node)
        if phases is not None:
            return phases
    return windows.lower_conv(cx, node)


def lower_pool(cx: LowerContext, node: Node) -> list[list[Step]]:
    """A MaxPool on its frame when it has one, else the window kernels'."""
    if node.op == OpType.MaxPool:
        phases = max_pool_frame_phases(cx, node)
        if phases is not None:
            return phases
    return windows.lower_pool(cx, node)


LOWERINGS = {OpType.Conv: lower_conv, OpType.MaxPool: lower_pool}
