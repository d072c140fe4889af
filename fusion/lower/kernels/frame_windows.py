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
from fusion.lower.kernels.frame import MAX_N, MAX_PERIOD, Frame, Mask, Tap, fill_runs, frame_of, mask_tap
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
    its row masks into per-frame-row weights; fp32 masks each product instead (exact for Inf and NaN: `Mask`).

    `split` (a conv with column stride sw > 1): each row phase is split on chip into sw column phases (column
    sw * j + pc at [row, j] of phase pc, by a masked period-sw `v.rsum`), so the taps run over the kept output
    columns only, at pitch OW: tap column offset o reads column phase o % sw shifted by o // sw."""

    f: Frame
    conv: bool
    int8: bool = False
    split: bool = False

    @property
    def taps(self) -> list[Tap]:
        return self.f.taps()

    @property
    def phases(self) -> list[int]:
        return sorted({t.phase for t in self.taps})

    @property
    def pitch(self) -> int:
        """Positions per row the taps run over."""
        return self.f.out[1] if self.split else self.f.pitch

    @property
    def positions(self) -> int:
        return self.f.out[0] * self.pitch

    def offset(self, tap: Tap) -> int:
        """Where the tap reads, relative to the output position, in its (column-)phase tile."""
        return tap.dm * self.pitch + (tap.o // self.f.strides[1] if self.split else tap.o)

    def column_phase(self, tap: Tap) -> int:
        return tap.o % self.f.strides[1] if self.split else 0

    def slack(self) -> tuple[int, int]:
        offsets = [self.offset(t) for t in self.taps]
        return max(0, -min(offsets)), max(0, max(offsets))

    def col_invalid(self, o: int) -> list[tuple[int, int]]:
        """Row positions [a, b) where column offset o reads outside the image."""
        if not self.split:
            return self.f.col_invalid(o)
        sw, ow = self.f.strides[1], self.f.out[1]
        dn, pc = o // sw, o % sw
        end = -(-(self.f.cols - pc) // sw) - dn  # first j reading past the last column
        return [(a, b) for a, b in ((0, min(ow, -dn)), (max(0, end), ow)) if a < b]

    def expands(self, tap: Tap) -> bool:
        """An int8 conv tap multiplies by per-frame-row weights (zero on rows outside the image)."""
        return self.conv and self.int8 and (tap.dm != 0 or self.positions > MAX_PERIOD)

    @property
    def row_masks(self) -> list[int]:
        """The dm values needing a per-row mask."""
        dms = {t.dm for t in self.taps if t.dm != 0}
        return sorted(dms | {t.dm for t in self.taps if self.expands(t)})

    @property
    def col_masks(self) -> list[int]:
        if self.split:
            return sorted({t.o for t in self.taps if self.col_invalid(t.o)})
        return sorted({t.o for t in self.taps if self.f.col_mask_needed(t.o)})

    def column_phases(self, phase: int) -> list[int]:
        return sorted({self.column_phase(t) for t in self.taps if t.phase == phase})

    def x_slack(self) -> tuple[int, int]:
        """Slack around a loaded row phase: the taps' (split: none, the column phases have it)."""
        return (0, 0) if self.split else self.slack()

    @property
    def compacts(self) -> bool:
        """The strided columns are computed and then dropped (not split before the taps)."""
        return self.f.strides[1] > 1 and not self.split

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
        sizes.update(mask.sizes(f"cm{o}", p.pitch))
    if p.compacts:
        sizes.update(mask.sizes("keep", f.pitch))
    return sizes


def build_masks(em: Emitter, p: Plan, mask: Mask, tiles: dict[str, int], kb: int) -> None:
    f = p.f
    for dm in p.row_masks:
        mask.build(em, tiles, f"rm{dm}", f.row_invalid(dm), f.out[0], kb)
    for o in p.col_masks:
        mask.build(em, tiles, f"cm{o}", p.col_invalid(o), p.pitch)
    if p.compacts:
        mask.build(em, tiles, "keep", [(1, f.strides[1])], f.strides[1], f.out[1])


def phase_sizes(p: Plan, kb: int, xdt: DType, slack: tuple[int, int]) -> dict[str, int]:
    wide = sum(slack) + kb * p.f.rows * p.f.pitch
    return {f"x{ph}": wide * xdt.size for ph in p.phases}


def _sizes(p: Plan, kb: int, xdt: DType, acc: DType, quantize: bool) -> dict[str, int]:
    """Bytes of each tile of a depthwise step of kb channels."""
    f = p.f
    raw = kb * f.rows * f.pitch  # a row phase as loaded
    wide = sum(p.x_slack()) + raw
    n = kb * p.positions
    rows = kb * f.out[0]
    taps = len(p.taps)
    sizes = phase_sizes(p, kb, xdt, p.x_slack())
    for ph in p.phases:
        if quantize:
            sizes[f"q{ph}"] = wide
        if p.split:
            for pc in p.column_phases(ph):
                sizes[f"xs{ph}_{pc}"] = (sum(p.slack()) + n) * 4
        elif p.int8:
            sizes[f"xi{ph}"] = wide * 4
    if p.split:
        sizes["sel"] = raw * (1 if p.int8 else 4)
        sizes.update({f"sp{pc}": f.strides[1] * 4 for pc in range(f.strides[1])})
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
    if p.compacts:
        sizes["cmp"] = kb * f.out[0] * f.out[1] * 4
    if p.int8:
        sizes["res"] = kb * f.out[0] * f.out[1]
    return sizes


def split_pays(p: Plan) -> bool:
    """Splitting the column phases (2 sw ops per input element of each row phase) costs less than computing
    every column and compacting (each tap's ops over sw times the kept positions, plus 2 to compact), counted
    in vector elements per kept output."""
    sw = p.f.strides[1]
    per_tap = 2 + len(p.col_masks) / len(p.taps)
    whole = sw * (len(p.taps) * per_tap + 2)
    split = len(p.taps) * per_tap + len(p.phases) * 2 * sw * sw
    return sw > 1 and split < whole


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
    p = Plan(f, conv=True, int8=int8)
    p = Plan(f, conv=True, int8=int8, split=split_pays(p))
    if not int8 and p.positions > MAX_PERIOD:  # fp32 multiplies each tap by one weight per channel (`.vc`)
        return None
    x = cx.view(node.inputs[0])
    acc = DType.i32 if int8 else DType.f32
    quantize = int8 and x.dtype is DType.f32

    def sizes(kb: int) -> dict[str, int]:
        return _sizes(p, kb, x.dtype, acc, quantize)

    kb = channels(cx, f, p.x_slack(), sizes)
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

    return [frame_steps(cx, p, p.x_slack()[0], x, out, sizes, kb, extra, body)]


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
        return t["cmp"] if self.p.compacts else t["acc"]

    def _sources(self, em: Emitter) -> dict[tuple[int, int], int]:
        """Each (row phase, column phase) tile the taps read, widened to int32 on the int8 path: the loaded
        row phases themselves, or (split) their column phases."""
        p, f, t, b, kb = self.p, self.p.f, self.tiles, em.b, self.kb
        raw = kb * f.rows * f.pitch
        wide = sum(p.x_slack()) + raw
        pre, post = p.slack()
        n = kb * p.positions
        xdt = "i8" if self.int8 else "i32"  # the split's select: int8 data, or a float's bits
        if p.split:
            sw = f.strides[1]
            for pc in range(sw):
                fill_runs(em, t[f"sp{pc}"], [(0, sw, 0), (pc, pc + 1, 1)], DType.i8 if self.int8 else DType.i32)
        src = {}
        for ph in p.phases:
            prepare_x(em, f, t[f"x{ph}"], kb, self.xdt, 0.0, p.x_slack())
            x = t[f"x{ph}"]
            if self.quantize is not None:
                b.v_qnt(*em.regs(t[f"q{ph}"], x, f32_bits(1.0 / self.quantize)), wide)
                x = t[f"q{ph}"]
            if not p.split:
                if self.int8:
                    b.v_cvt(*em.regs(t[f"xi{ph}"], x), wide, "i8", "i32")
                    x = t[f"xi{ph}"]
                src[(ph, 0)] = x
                continue
            for pc in p.column_phases(ph):  # column sw * j + pc -> j: a one-hot period-sw select and sum
                xs = t[f"xs{ph}_{pc}"]
                fill_runs(em, xs, [(0, pre, 0.0), (pre + n, pre + n + post, 0.0)], DType.i32)
                b.v_mul_vr(*em.regs(t["sel"], x, t[f"sp{pc}"]), raw, sw, xdt)
                b.v_rsum(*em.regs(xs + pre * 4, t["sel"]), raw, sw, "i8" if self.int8 else "f32")
                src[(ph, pc)] = xs
        return src

    def __call__(self, em: Emitter) -> None:
        p, f, t, b, kb = self.p, self.p.f, self.tiles, em.b, self.kb
        acc = "i32" if self.int8 else "f32"
        adt = DType.i32 if self.int8 else DType.f32
        mask = Mask(adt, for_max=False)
        pre = p.slack()[0]
        n = kb * p.positions
        src = self._sources(em)
        taps = p.taps
        if self.int8:
            b.v_cvt(*em.regs(t["wrow"], t["w8"]), len(taps) * kb, "i8", "i32")
        _transpose_weights(em, t, kb, len(taps), adt)
        build_masks(em, p, mask, t, kb)
        rows = kb * f.out[0]
        for i in p.expanded:  # int8: the row mask (int32 0/1) folded into per-row weights
            tap = taps[i]
            b.v_mul_vc(*em.regs(t[f"we{i}"], t[f"rm{tap.dm}"], t["w"] + i * kb * 4), rows, f.out[0], acc)
        for i, tap in enumerate(taps):
            dst = t["acc"] if i == 0 else t["tmp"]
            x = src[(tap.phase, p.column_phase(tap))] + (pre + p.offset(tap)) * 4
            if p.expands(tap):
                b.v_mul_vc(*em.regs(dst, x, t[f"we{i}"]), n, p.pitch, acc)
            else:
                b.v_mul_vc(*em.regs(dst, x, t["w"] + i * kb * 4), n, p.positions, acc)
            mask_tap(em, mask, t, tap, dst, dst, n, p.pitch, p.col_masks, row_mask=not p.expands(tap))
            if i:
                b.v_add(*em.regs(t["acc"], t["acc"], dst), n, acc)
        res, m = t["acc"], n
        if p.compacts:
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
