"""Depthwise Conv on the vector unit over the unpadded input's frame (`frame`): per step a block of whole
channels, one DMA per input row phase in, one vector op (plus its masks) per tap, a masked period-sw reduction
keeping the strided columns, and one DMA out of the dense [channels, OH, OW] result. Also the frame's step
machinery (plan of masks, tile sizes, steps, phase preparation) that the pooling kernels (`frame_pool`) share.

`lower_conv` runs a depthwise Conv this way when its geometry has a frame and a channel fits a buffer slot,
else the padded-band / window kernels of `windows` (the routing the baseline compiler registers).
"""

from __future__ import annotations

from dataclasses import dataclass

from fusion.graph.ir import Node
from fusion.graph.ops import OpType
from fusion.lower.context import CONST_I8, LowerContext
from fusion.lower.emitter import Emitter, Step, f32_bits
from fusion.lower.kernels import windows
from fusion.lower.kernels.conv_depthwise import is_depthwise
from fusion.lower.kernels.frame import MAX_N, MAX_PERIOD, Frame, Mask, Tap, fill_runs, frame_of
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
class Plan:
    """Which masks and expansions a frame's taps need (the same for every step). A conv on the int8 path folds
    its row masks into per-frame-row weights; fp32 masks each product instead (exact for Inf and NaN: `Mask`)."""

    f: Frame
    conv: bool
    int8: bool = False

    @property
    def taps(self) -> list[Tap]:
        return self.f.taps()

    @property
    def phases(self) -> list[int]:
        return sorted({t.phase for t in self.taps})

    def expands(self, tap: Tap) -> bool:
        """An int8 conv tap multiplies by per-frame-row weights (zero on rows outside the image)."""
        return self.conv and self.int8 and (tap.dm != 0 or self.f.positions > MAX_PERIOD)

    @property
    def row_masks(self) -> list[int]:
        """The dm values needing a per-row mask."""
        dms = {t.dm for t in self.taps if t.dm != 0}
        return sorted(dms | {t.dm for t in self.taps if self.expands(t)})

    @property
    def col_masks(self) -> list[int]:
        return sorted({t.o for t in self.taps if self.f.col_mask_needed(t.o)})

    @property
    def expanded(self) -> list[int]:
        return [i for i, t in enumerate(self.taps) if self.expands(t)]


def mask_sizes(p: Plan, mask: Mask, kb: int) -> dict[str, int]:
    """The row, column and (strided columns) keep masks of a step of kb channels."""
    f = p.f
    sizes: dict[str, int] = {}
    for dm in p.row_masks:
        sizes.update(mask.sizes(f"rm{dm}", kb * f.out[0]))
    for o in p.col_masks:
        sizes.update(mask.sizes(f"cm{o}", f.pitch))
    if f.strides[1] > 1:
        sizes.update(mask.sizes("keep", f.pitch))
    return sizes


def build_masks(em: Emitter, p: Plan, mask: Mask, tiles: dict[str, int], kb: int) -> None:
    f = p.f
    for dm in p.row_masks:
        mask.build(em, tiles, f"rm{dm}", f.row_invalid(dm), f.out[0], kb)
    for o in p.col_masks:
        mask.build(em, tiles, f"cm{o}", f.col_invalid(o), f.pitch)
    if f.strides[1] > 1:
        mask.build(em, tiles, "keep", [(1, f.strides[1])], f.strides[1], f.out[1])


def phase_sizes(p: Plan, kb: int, xdt: DType, slack: tuple[int, int]) -> dict[str, int]:
    wide = sum(slack) + kb * p.f.rows * p.f.pitch
    return {f"x{ph}": wide * xdt.size for ph in p.phases}


def _sizes(p: Plan, kb: int, xdt: DType, acc: DType, quantize: bool) -> dict[str, int]:
    """Bytes of each tile of a depthwise step of kb channels."""
    f = p.f
    slack = f.slack()
    wide = sum(slack) + kb * f.rows * f.pitch
    n = kb * f.positions
    m = kb * f.out[0] * f.out[1]
    rows = kb * f.out[0]
    taps = len(p.taps)
    sizes = phase_sizes(p, kb, xdt, slack)
    for ph in p.phases:
        if p.int8:
            sizes[f"xi{ph}"] = wide * 4
            if quantize:
                sizes[f"q{ph}"] = wide
    sizes.update(mask_sizes(p, Mask(acc, for_max=False), kb))
    sizes["acc"] = n * acc.size
    sizes["w"] = taps * kb * 4  # [taps, kb]: each tap's weights contiguous
    sizes["wrow"] = taps * kb * 4  # [kb, taps] as loaded (one DMA)
    sizes["wtmp"] = taps * kb * 4
    sizes["eye"] = taps * taps * 4
    if p.int8:
        sizes["w8"] = taps * kb
    for i in p.expanded:
        sizes[f"we{i}"] = rows * 4
    sizes["tmp"] = n * 4
    sizes["bias"] = kb * 4
    sizes["table"] = kb * 8
    if f.strides[1] > 1:
        sizes["cmp"] = m * 4
    if p.int8:
        sizes["res"] = m
    return sizes


def channels(cx: LowerContext, f: Frame, slack: tuple[int, int], sizes) -> int:
    """Channels per step (0: one channel does not fit a slot, or an op would pass the `n` field)."""
    probe = TileArena(cx.config, 0)

    def fits(kb: int) -> bool:
        n = kb * f.positions + sum(slack)
        return n <= MAX_N and probe.fits(list(sizes(kb).values()))

    return largest_fitting(f.c, fits)


def frame_steps(cx: LowerContext, p: Plan, pre: int, x: View, out: View, sizes, kb: int, extra, body) -> list[Step]:
    """Steps over images x blocks of kb channels: each loads its row phases (data `pre` elements into each
    phase tile) and `extra`'s loads, runs `body`'s vector work and stores the dense result tile it names."""
    f = p.f
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


def prepare_x(em: Emitter, f: Frame, tile: int, kb: int, dtype: DType, value: float, slack: tuple[int, int]) -> None:
    """The slack around a phase tile's data and (W' > W) the last row's gap set to the pad value."""
    pre, post = slack
    data = kb * f.rows * f.pitch
    runs = [(0, pre, value), (pre + data, pre + data + post, value)]
    if f.pitch > f.w:
        runs.append((pre + data - f.pitch + f.w, pre + data, value))
    fill_runs(em, tile, runs, dtype)


# --- depthwise Conv -----------------------------------------------------------------------------------------


def depthwise_frame_phases(cx: LowerContext, node: Node) -> list[list[Step]] | None:
    f = node_frame(cx, node)
    if f is None or not is_depthwise(cx.graph, node):
        return None
    out = cx.view(node.outputs[0])
    if cx.int8 and out.dtype is not DType.i8:
        return None
    int8 = cx.int8
    if not int8 and f.positions > MAX_PERIOD:  # fp32 multiplies each tap by one weight per channel (`.vc`)
        return None
    x = cx.view(node.inputs[0])
    acc = DType.i32 if int8 else DType.f32
    quantize = int8 and x.dtype is DType.f32
    p = Plan(f, conv=True, int8=int8)

    def sizes(kb: int) -> dict[str, int]:
        return _sizes(p, kb, x.dtype, acc, quantize)

    kb = channels(cx, f, f.slack(), sizes)
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
        conv = _ConvBody(p, k, tiles, x.dtype, in_scale, bias is not None, table is not None, pair)
        return conv.result, conv

    return [frame_steps(cx, p, f.slack()[0], x, out, sizes, kb, extra, body)]


@dataclass(frozen=True)
class _ConvBody:
    p: Plan
    kb: int
    tiles: dict[str, int]
    xdt: DType
    quantize: float | None
    bias: bool
    table: bool
    pair: tuple[int, int] | None

    @property
    def int8(self) -> bool:
        return self.p.int8

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
        mask = Mask(adt, for_max=False)
        slack = f.slack()
        pre = slack[0]
        wide = sum(slack) + kb * f.rows * f.pitch
        n = kb * f.positions
        src = {}
        for ph in self.p.phases:
            prepare_x(em, f, t[f"x{ph}"], kb, self.xdt, 0.0, slack)
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
        build_masks(em, self.p, mask, t, kb)
        rows = kb * f.out[0]
        for i in self.p.expanded:  # int8: the row mask (int32 0/1) folded into per-row weights
            tap = taps[i]
            b.v_mul_vc(*em.regs(t[f"we{i}"], t[f"rm{tap.dm}"], t["w"] + i * kb * 4), rows, f.out[0], acc)
        for i, tap in enumerate(taps):
            dst = t["acc"] if i == 0 else t["tmp"]
            x = src[tap.phase] + (pre + tap.offset(f.pitch)) * 4
            if self.p.expands(tap):
                b.v_mul_vc(*em.regs(dst, x, t[f"we{i}"]), n, f.pitch, acc)
            else:
                b.v_mul_vc(*em.regs(dst, x, t["w"] + i * kb * 4), n, f.positions, acc)
                if tap.dm != 0:
                    mask.apply(em, t, f"rm{tap.dm}", dst, dst, n, f.pitch, "vc")
            if tap.o in self.p.col_masks:
                mask.apply(em, t, f"cm{tap.o}", dst, dst, n, f.pitch, "vr")
            if i:
                b.v_add(*em.regs(t["acc"], t["acc"], dst), n, acc)
        res, m = t["acc"], n
        if f.strides[1] > 1:
            mask.apply(em, t, "keep", t["acc"], t["acc"], n, f.pitch, "vr")
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


def lower_conv(cx: LowerContext, node: Node) -> list[list[Step]]:
    """A depthwise Conv on its frame when it has one, else the window kernels'."""
    if is_depthwise(cx.graph, node):
        phases = depthwise_frame_phases(cx, node)
        if phases is not None:
            return phases
    return windows.lower_conv(cx, node)


LOWERINGS = {OpType.Conv: lower_conv}
