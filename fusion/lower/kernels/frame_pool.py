"""MaxPool and AveragePool on the vector unit over the unpadded input's frame (`frame`, steps and masks of
`frame_windows`): one DMA per input row phase in, one DMA of the dense [channels, OH, OW] result out.

MaxPool is separable (max is exact in any order): a column pass takes the max over the window's rows at every
input column of the kept output rows (the row phases shifted by whole rows), then a row pass each kept output
column's max over the window's columns (k_h + k_w ops per output instead of k_h * k_w; the row pass runs over OH
rows, not H). With a column stride sw > 1 the row pass reads in period-sw groups: `v.rmax` of period sw at shift
s gives, for every output column j, the max of columns sw * j + s .. sw * j + s + sw - 1, so only the kept
columns are ever computed; a window of k >= sw columns is a union of such groups (the last one overlapping,
harmless for a max). A group reading a column outside the image is masked to the lowest value, which is exact
when another group of the window covers its valid columns (checked per output column, else the per-tap kernel
runs). A channel larger than a buffer slot (fp32 112x112) runs in bands of output rows (`Band`), each loading
its halo rows too.

AveragePool sums the window's taps in the reference's order (`sum_order`: numpy's sum over the window axes,
which adds each kernel row's columns then the rows, or all taps in turn, depending on the window view's strides)
with masked (zero) out-of-image reads, keeps the strided columns with a masked period-sw sum, and divides by the
window's count (explicit pads counted with count_include_pad; a product of a per-row and a per-column count),
all in float32 (the int8 path dequantizes its input first, as the quantized reference does).

Other geometries and nodes (no frame, a depthwise or AveragePool channel larger than a buffer slot, an
AveragePool whose sum numpy orders otherwise, an int8 AveragePool output) run on the padded-band / window
kernels of `windows`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fusion.graph.ir import Node
from fusion.graph.ops import OpType
from fusion.lower.context import LowerContext
from fusion.lower.emitter import Emitter, Step
from fusion.lower.kernels import windows
from fusion.lower.kernels.frame import MAX_N, Frame, Mask, fill_runs, mask_tap, repeat, value_runs
from fusion.lower.kernels.frame_windows import (
    Plan,
    build_masks,
    channels,
    frame_steps,
    mask_sizes,
    node_frame,
    phase_sizes,
    prepare_x,
)
from fusion.lower.kernels.sum_order import PAIRWISE, numpy_order
from fusion.lower.kernels.vector_ops import dequantize, lowest
from fusion.lower.local_alloc import TileArena, largest_fitting
from fusion.lower.views import View
from isa.enums import DType, Unit

# --- separable MaxPool --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Separable:
    """The row pass's column groups (shift s: input columns sw * j + s .. + sw - 1) and the column pass's row
    taps (row phase, whole-row shift dm) of a frame's MaxPool."""

    f: Frame
    groups: tuple[int, ...]

    @property
    def sw(self) -> int:
        return self.f.strides[1]

    @property
    def width(self) -> int:
        """Columns one group reads (1 when the row pass reads single taps)."""
        return self.sw if len(self.groups) and self.sw > 1 and self.f.dilations[1] == 1 else 1

    def invalid(self, s: int) -> list[tuple[int, int]]:
        """Output column ranges [a, b) where group s reads a column outside the image."""
        j = np.arange(self.f.out[1])
        cols = self.f.strides[1] * j[:, None] + s + np.arange(self.width)
        bad = ((cols < 0) | (cols >= self.f.cols)).any(axis=1)
        edges = np.flatnonzero(np.diff(np.concatenate([[0], bad.astype(np.int8), [0]])))
        return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]

    @property
    def row_taps(self) -> list[tuple[int, int]]:
        f, sh = self.f, self.f.strides[0]
        v = [kh * f.dilations[0] - f.pads[0] for kh in range(f.kernel[0])]
        return sorted({(x % sh, x // sh) for x in v})

    @property
    def phases(self) -> list[int]:
        return sorted({ph for ph, _ in self.row_taps})

    @property
    def row_masks(self) -> list[int]:
        return sorted({dm for _, dm in self.row_taps if dm != 0})

    @property
    def col_masks(self) -> list[int]:
        return [s for s in self.groups if self.invalid(s)]

    def x_slack(self) -> tuple[int, int]:
        """Slack around a loaded row phase for the column pass's whole-row shifts."""
        low, high = _halo(self)
        return -low * self.f.pitch, high * self.f.pitch

    def v_slack(self) -> tuple[int, int]:
        """Slack around the column pass's result for the row pass's group shifts."""
        return max(0, -min(self.groups)), max(0, max(self.groups) + self.width - self.sw)


def separable_of(f: Frame) -> Separable | None:
    """The separable form of a frame's MaxPool, or None when a window's valid columns are not covered by its
    unmasked groups (the per-tap kernel runs it)."""
    sw, kw, dw, pl = f.strides[1], f.kernel[1], f.dilations[1], f.pads[1]
    if sw == 1:
        return Separable(f, tuple(kw_ * dw - pl for kw_ in range(kw)))
    if dw != 1 or kw < sw:
        return None
    groups = tuple(sorted({-pl + t * sw for t in range(kw // sw)} | {-pl + kw - sw}))
    sep = Separable(f, groups)
    j = np.arange(f.out[1])[:, None]
    cols = sw * j - pl + np.arange(kw)  # [OW, kw] the window's columns
    covered = np.zeros(cols.shape, bool)
    for s in groups:
        ok = np.ones(f.out[1], bool)
        for a, b in sep.invalid(s):
            ok[a:b] = False
        covered |= ok[:, None] & (cols >= sw * j + s) & (cols < sw * j + s + sw)
    inside = (cols >= 0) & (cols < f.cols)
    return sep if bool(np.all(covered | ~inside)) else None


def _separable_sizes(sep: Separable, kb: int, dtype: DType, band: int = 0) -> dict[str, int]:
    """Tiles of a step of kb channels (band > 0: of that many output rows of one channel)."""
    f, es = sep.f, dtype.size
    rows = band or kb * f.out[0]
    low, high = _halo(sep)
    n, q = rows * f.pitch, rows * f.out[1]
    mask = Mask(dtype, for_max=True)
    if band:
        sizes = {f"x{ph}": (band + high - low) * f.pitch * es for ph in sep.phases}
    else:
        sizes = phase_sizes(Plan(f, conv=False), kb, dtype, sep.x_slack())
    sizes["v"] = (sum(sep.v_slack()) + n) * es
    for s in sep.col_masks:
        sizes.update(mask.sizes(f"cm{s}", f.out[1]))
    for dm in sep.row_masks:
        sizes.update(mask.sizes(f"rm{dm}", rows))
    sizes["tmp"] = n * es
    sizes["out"] = q * es
    return sizes


@dataclass(frozen=True)
class Band:
    """Output rows [top, top + rows) of one channel, for a channel larger than a buffer slot: the row pass runs
    over the phase rows the band's column pass reads (its halo: dm_min .. dm_max rows around it)."""

    top: int
    rows: int


def _halo(sep: Separable) -> tuple[int, int]:
    dms = [dm for _, dm in sep.row_taps]
    return min(0, min(dms)), max(0, max(dms))


def band_loads(sep: Separable, x: View, img: int, c: int, band: Band, tiles: dict[str, int]) -> list:
    """Each row phase's image rows of the band and its halo, at their rows of the phase tile."""
    f, es = sep.f, x.dtype.size
    lo, hi = _halo(sep)
    first, last = max(0, band.top + lo), min(f.rows, band.top + band.rows + hi)
    loads = []
    for ph in sep.phases:
        at = tiles[f"x{ph}"] + (first - band.top - lo) * f.pitch * es
        loads += [(view, at + local * es) for view, local in f.phase_view(x, img, c, 1, ph, first, last)]
    return loads


@dataclass(frozen=True)
class _SeparableMax:
    """The column pass first (the max over the window's rows, at every input column of the kept rows), then the
    row pass over its result (only OH rows: with a row stride that is fewer than the input's)."""

    sep: Separable
    kb: int
    tiles: dict[str, int]
    dtype: DType
    band: Band | None = None  # None: every row of kb channels

    def __call__(self, em: Emitter) -> None:
        sep, f, t, kb, d = self.sep, self.sep.f, self.tiles, self.kb, self.dtype
        es, lo, ow, pitch = d.size, lowest(d), f.out[1], f.pitch
        mask = Mask(d, for_max=True)
        low, _ = _halo(sep)
        for s in sep.col_masks:
            mask.build(em, t, f"cm{s}", sep.invalid(s), ow)
        if self.band is None:
            rows, base = kb * f.out[0], sep.x_slack()[0]
            for ph in sep.phases:
                prepare_x(em, f, t[f"x{ph}"], kb, d, lo, sep.x_slack())
            for dm in sep.row_masks:
                mask.build(em, t, f"rm{dm}", f.row_invalid(dm), f.out[0], kb)
        else:
            top, rows, base = self.band.top, self.band.rows, -low * pitch
            for ph in sep.phases:
                self._prepare_band(em, t[f"x{ph}"])
            for dm in sep.row_masks:
                mask.build(em, t, f"rm{dm}", [(0, max(0, -dm - top)), (max(0, f.rows - dm - top), rows)], rows)
        n, q = rows * pitch, rows * ow
        vpre, vpost = sep.v_slack()
        fill_runs(em, t["v"], [(0, vpre, lo), (vpre + n, vpre + n + vpost, lo)], d)

        def row(ph: int, dm: int, dst: int) -> int:  # the column pass
            src = t[f"x{ph}"] + (base + dm * pitch) * es
            if dm:
                mask.apply(em, t, f"rm{dm}", dst, src, n, pitch, "vc")
                return dst
            return src

        _fold_max(em, t["v"] + vpre * es, [lambda dst, r=r: row(*r, dst) for r in sep.row_taps], t, n, d)

        def group(i: int, dst: int) -> int:  # the row pass
            s = sep.groups[i]
            src = t["v"] + (vpre + s) * es
            if sep.sw > 1:
                em.b.v_rmax(*em.regs(dst, src), n, sep.sw, d.name)
                src = dst
            if s in sep.col_masks:
                mask.apply(em, t, f"cm{s}", dst, src, q, ow, "vr")
                src = dst
            return src

        _fold_max(em, t["out"], [lambda dst, i=i: group(i, dst) for i in range(len(sep.groups))], t, q, d)

    def _prepare_band(self, em: Emitter, tile: int) -> None:
        """The halo rows outside the image and (W' > W) the last image row's gap: the lowest value."""
        sep, f, d, band = self.sep, self.sep.f, self.dtype, self.band
        low, high = _halo(sep)
        first, last = max(0, band.top + low), min(f.rows, band.top + band.rows + high)
        a, b = (first - band.top - low) * f.pitch, (last - band.top - low) * f.pitch
        runs = [(0, a), (b, (band.rows + high - low) * f.pitch)]
        if f.pitch > f.w and last == f.rows:
            runs.append((b - f.pitch + f.w, b))
        fill_runs(em, tile, [(x, y, lowest(d)) for x, y in runs], d)


def _fold_max(em: Emitter, acc: int, operands: list, t: dict[str, int], n: int, d: DType) -> None:
    """acc = the max of the operands; each is a function (a tile it may write) -> the address of its values,
    the first one given acc itself, the others the scratch tile."""
    have = operands[0](acc)
    for make in operands[1:]:
        other = make(t["tmp"])
        em.b.v_max(*em.regs(acc, have, other), n, d.name)
        have = acc
    if have != acc:
        em.b.v_copy(*em.regs(acc, have), n, d.name)


# --- per-tap MaxPool (geometries the separable form does not cover) ------------------------------------------


def _tap_sizes(p: Plan, kb: int, dtype: DType) -> dict[str, int]:
    f = p.f
    n, m = kb * f.positions, kb * f.out[0] * f.out[1]
    sizes = phase_sizes(p, kb, dtype, f.slack())
    sizes.update(mask_sizes(p, Mask(dtype, for_max=True), kb))
    sizes["acc"] = n * dtype.size
    sizes["tmp"] = n * dtype.size
    if f.strides[1] > 1:
        sizes["cmp"] = m * dtype.size
    return sizes


@dataclass(frozen=True)
class _TapMax:
    p: Plan
    kb: int
    tiles: dict[str, int]
    dtype: DType

    def __call__(self, em: Emitter) -> None:
        f, t, kb, d = self.p.f, self.tiles, self.kb, self.dtype
        mask = Mask(d, for_max=True)
        es, pre = d.size, f.slack()[0]
        n = kb * f.positions
        for ph in self.p.phases:
            prepare_x(em, f, t[f"x{ph}"], kb, d, lowest(d), f.slack())
        build_masks(em, self.p, mask, t, kb)

        def tap(i: int, dst: int) -> int:
            tp = self.p.taps[i]
            src = t[f"x{tp.phase}"] + (pre + tp.offset(f.pitch)) * es
            return mask_tap(em, mask, t, tp, src, dst, n, f.pitch, self.p.col_masks)

        _fold_max(em, t["acc"], [lambda dst, i=i: tap(i, dst) for i in range(len(self.p.taps))], t, n, d)
        if f.strides[1] > 1:
            mask.apply(em, t, "keep", t["acc"], t["acc"], n, f.pitch, "vr")
            em.b.v_rmax(*em.regs(t["cmp"], t["acc"]), n, f.strides[1], d.name)


def max_pool_frame_phases(cx: LowerContext, node: Node) -> list[list[Step]] | None:
    f = node_frame(cx, node)
    if f is None:
        return None
    x, out = cx.view(node.inputs[0]), cx.view(node.outputs[0])
    if out.dtype is not x.dtype:
        return None
    d = x.dtype
    sep = separable_of(f)
    p = Plan(f, conv=False)
    if sep is not None:
        slack = sep.x_slack()

        def sizes(kb: int) -> dict[str, int]:
            return _separable_sizes(sep, kb, d)

        def body(k: int, tiles: dict[str, int]):
            return tiles["out"], _SeparableMax(sep, k, tiles, d)
    else:
        slack = f.slack()

        def sizes(kb: int) -> dict[str, int]:
            return _tap_sizes(p, kb, d)

        def body(k: int, tiles: dict[str, int]):
            return (tiles["cmp"] if f.strides[1] > 1 else tiles["acc"]), _TapMax(p, k, tiles, d)

    kb = channels(cx, f, slack, sizes)
    if kb == 0:
        return None if sep is None else _banded_steps(cx, sep, x, out)
    return [frame_steps(cx, p, slack[0], x, out, sizes, kb, lambda c0, k, tiles: [], body)]


def _banded_steps(cx: LowerContext, sep: Separable, x: View, out: View) -> list[list[Step]] | None:
    """A channel larger than a buffer slot: steps over bands of its output rows, each with its halo rows."""
    f, d = sep.f, x.dtype
    low, high = _halo(sep)
    probe = TileArena(cx.config, 0)

    def fits(r: int) -> bool:
        return (r + high - low) * f.pitch + sum(sep.v_slack()) <= MAX_N and probe.fits(
            list(_separable_sizes(sep, 1, d, r).values())
        )

    band = largest_fitting(f.out[0], fits)
    if band == 0:
        return None
    image_out = out.reshape_dense((f.n, f.c, f.out[0] * f.out[1]))
    steps = []
    for img in range(f.n):
        for c in range(f.c):
            for top in range(0, f.out[0], band):
                b = Band(top, min(band, f.out[0] - top))
                arena = TileArena(cx.config, len(steps), cx.rotation)
                tiles = {name: arena.tile(size) for name, size in _separable_sizes(sep, 1, d, b.rows).items()}
                target = image_out.index((img,)).slice(0, c, 1).slice(1, top * f.out[1], b.rows * f.out[1])
                body = _SeparableMax(sep, 1, tiles, d, b)
                steps.append(
                    Step(band_loads(sep, x, img, c, b, tiles), [(Unit.vector, body)], [(tiles["out"], target)])
                )
    return [steps]


# --- AveragePool --------------------------------------------------------------------------------------------


def window_counts(
    size: int, out: int, stride: int, kernel: int, dilation: int, pads: tuple[int, int], include_pad: bool
) -> np.ndarray:
    """Per output index along one axis: the window positions counted by the mean (inside the input, or inside
    the explicitly padded input with count_include_pad; never the ceil_mode overhang)."""
    pos = np.arange(out)[:, None] * stride + np.arange(kernel) * dilation - pads[0]
    lo, hi = (-pads[0], size + pads[1]) if include_pad else (0, size)
    return ((pos >= lo) & (pos < hi)).sum(axis=1)


def sum_order(w: windows.Window) -> str | None:
    """The frame kernel's way to add the taps in numpy's order (`sum_order.numpy_order`): "rows" (each kernel row's
    columns summed, then the row sums in turn), "flat" (every tap in turn, row-major), or None: a pairwise sum of
    8 or more terms, or a window with one output column (the window kernel, `windows`, follows those)."""
    kh, kw = ((1,) * (2 - w.s) + tuple(w.kernel))[-2:]
    if kh > 1 and kw > 1 and w.out_spatial[-1] == 1:
        return None
    order = numpy_order(w)
    if order == "pairwise":
        return "flat" if kh * kw < PAIRWISE else None
    if order == "flat":
        return "flat"
    return "rows" if max(kh, kw) < PAIRWISE else None


@dataclass(frozen=True)
class _Average:
    p: Plan
    kb: int
    tiles: dict[str, int]
    xdt: DType
    scale: float | None  # the int8 input's scale (dequantized first)
    rows: tuple[tuple[int, int, float], ...]  # runs of the per-output-row counts
    cols: tuple[tuple[int, int, float], ...]
    flat: bool  # `sum_order`

    def __call__(self, em: Emitter) -> None:
        f, t, kb, b = self.p.f, self.tiles, self.kb, em.b
        mask = Mask(DType.f32, for_max=False)
        slack = f.slack()
        pre, wide = slack[0], sum(slack) + kb * f.rows * f.pitch
        n, m = kb * f.positions, kb * f.out[0] * f.out[1]
        src = {}
        for ph in self.p.phases:
            prepare_x(em, f, t[f"x{ph}"], kb, self.xdt, 0.0, slack)
            src[ph] = t[f"x{ph}"]
            if self.scale is not None:
                dequantize(em, t[f"xf{ph}"], src[ph], wide, self.scale)
                src[ph] = t[f"xf{ph}"]
        build_masks(em, self.p, mask, t, kb)

        def tap(i: int, dst: int) -> int:
            tp = self.p.taps[i]
            a = src[tp.phase] + (pre + tp.offset(f.pitch)) * 4
            return mask_tap(em, mask, t, tp, a, dst, n, f.pitch, self.p.col_masks)

        taps = [lambda dst, i=i: tap(i, dst) for i in range(len(self.p.taps))]
        kw = 1 if self.flat else f.kernel[1]
        total = None
        for r in range(len(taps) // kw):  # the reference's order (`sum_order`)
            row = _fold_sum(em, t["acc"] if r == 0 else t["row"], taps[r * kw : (r + 1) * kw], t["tmp"], n)
            if total is None:
                total = row
            else:
                b.v_add(*em.regs(t["acc"], total, row), n, "f32")
                total = t["acc"]
        if total != t["acc"]:
            b.v_copy(*em.regs(t["acc"], total), n, "f32")
        res = t["acc"]
        if f.strides[1] > 1:
            mask.apply(em, t, "keep", res, res, n, f.pitch, "vr")
            b.v_rsum(*em.regs(t["cmp"], res), n, f.strides[1], "f32")
            res = t["cmp"]
        per, ow = f.out[0] * f.out[1], f.out[1]
        fill_runs(em, t["cnt"], list(self.cols), DType.f32)
        repeat(em, t["cnt"], ow, f.out[0], DType.f32)
        fill_runs(em, t["rc"], list(self.rows), DType.f32)
        b.v_mul_vc(*em.regs(t["cnt"], t["cnt"], t["rc"]), per, ow, "f32")
        b.v_div_vr(*em.regs(res, res, t["cnt"]), m, per, "f32")

    @property
    def result(self) -> int:
        return self.tiles["cmp"] if self.p.f.strides[1] > 1 else self.tiles["acc"]


def _fold_sum(em: Emitter, acc: int, operands: list, tmp: int, n: int) -> int:
    """The operands summed left to right (the first given acc, the others tmp); returns where the sum is (the
    first operand's own address when it is alone)."""
    have = operands[0](acc)
    for make in operands[1:]:
        other = make(tmp)
        em.b.v_add(*em.regs(acc, have, other), n, "f32")
        have = acc
    return have


def average_pool_frame_phases(cx: LowerContext, node: Node) -> list[list[Step]] | None:
    f = node_frame(cx, node)
    w = windows.window_of(cx.graph, node)
    order = sum_order(w)
    if f is None or order is None:
        return None
    x, out = cx.view(node.inputs[0]), cx.view(node.outputs[0])
    if out.dtype is not DType.f32 or x.dtype not in (DType.f32, DType.i8):
        return None
    include = bool(node.attr("count_include_pad"))
    lift = 2 - w.s
    axes = [
        window_counts(
            w.in_shape[2 + a],
            w.out_spatial[a],
            w.strides[a],
            w.kernel[a],
            w.dilations[a],
            (w.pads[a], w.pads[w.s + a]),
            include,
        )
        for a in range(w.s)
    ]
    counts = [np.ones(1, np.int64)] * lift + axes
    scale = cx.scale(node.inputs[0]) if x.dtype is DType.i8 else None
    p = Plan(f, conv=False)

    def sizes(kb: int) -> dict[str, int]:
        wide = sum(f.slack()) + kb * f.rows * f.pitch
        n, m = kb * f.positions, kb * f.out[0] * f.out[1]
        sizes = phase_sizes(p, kb, x.dtype, f.slack())
        if scale is not None:
            sizes.update({f"xf{ph}": wide * 4 for ph in p.phases})
        sizes.update(mask_sizes(p, Mask(DType.f32, for_max=False), kb))
        sizes.update(acc=n * 4, row=n * 4, tmp=n * 4, cnt=f.out[0] * f.out[1] * 4, rc=f.out[0] * 4)
        if f.strides[1] > 1:
            sizes["cmp"] = m * 4
        return sizes

    kb = channels(cx, f, f.slack(), sizes)
    if kb == 0:
        return None
    rows, cols = tuple(value_runs(counts[0])), tuple(value_runs(counts[1]))

    def body(k: int, tiles: dict[str, int]):
        avg = _Average(p, k, tiles, x.dtype, scale, rows, cols, order == "flat")
        return avg.result, avg

    return [frame_steps(cx, p, f.slack()[0], x, out, sizes, kb, lambda c0, k, tiles: [], body)]


# --- routing ------------------------------------------------------------------------------------------------


def lower_pool(cx: LowerContext, node: Node) -> list[list[Step]]:
    """A MaxPool or AveragePool on its frame when it has one, else the window kernels'."""
    frame = max_pool_frame_phases if node.op == OpType.MaxPool else average_pool_frame_phases
    phases = frame(cx, node)
    return phases if phases is not None else windows.lower_pool(cx, node)


LOWERINGS = {OpType.MaxPool: lower_pool, OpType.AveragePool: lower_pool}
