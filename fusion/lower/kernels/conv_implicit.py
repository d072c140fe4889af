"""Conv (1-D or 2-D; any stride, dilation, padding and group count) as an implicit GEMM on the matrix unit: no
im2col tensor and no padded copy in DRAM.

Per image and group, out [Cout/g, P] = W' [Cout/g, K] @ B [K, P] (`gemm`), P the output positions. K is ordered
tap-major (k = tap * C/g + channel), the weight packed so at compile time (`pack_weight`, constant form
`taps_form`), so the B rows of one tap and a run of channels are one strided DMA: B is never stored, each step
gathers its panel [K chunk, <= N positions] (`Windows`). A panel's columns are a run of output positions inside
one output row, or any run when the input rows have the output's pitch (stride 1, W = OW: a "same" conv), and
for tap t channel c the run's inputs are then one contiguous span of the channel's plane (stride sw: every
sw-th element of a span sw times as long). One DMA per (tap, channel run) reads those spans into the panel,
starting at the plane's first element when the span starts before it (the rows shift by that lead, so a row's
tail lands in the next row's head: padding positions). Then on the vector unit: positions whose window element
is padding are zeroed (a 0/1 mask over the run's positions, applied as an integer multiply, exact for Inf and
NaN), a tap reading only padding is zeroed whole, and a horizontal stride is compacted (masked, then period-sw
row sums: one non-zero term per sum, exact). A float input on the int8 path is first quantized once into an int8
DRAM copy (`QUANTIZED`; the taps then read a quarter of the bytes, and nothing is quantized twice). The epilogue
adds the bias per output channel and requantizes (int8; or, for a per-channel Conv read only by Adds, dequantizes
to float32, `gemm.ChannelDequant`): the baseline's unfused Conv.

A weight that is not a constant keeps its natural order (k = channel * taps + tap): one DMA per (channel, tap).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import product

import numpy as np

from fusion.graph.ir import Graph, Node
from fusion.lower.context import (
    CONST_TAPS_F32,
    CONST_TAPS_I8,
    LowerContext,
    split_const_key,
    storage_dtype,
    taps_form,
)
from fusion.lower.emitter import Emit, Emitter, Step
from fusion.lower.kernels.frame import Frame, fill_runs, lifted, value_runs
from fusion.lower.kernels.gemm import ChannelDequant, ChannelRequant, Gemm, Operand, gemm_steps
from fusion.lower.kernels.matrix import bias_view, dequant_scales, matrix_operand, requant, requant_table
from fusion.lower.kernels.movement import copy_steps
from fusion.lower.local_alloc import TileArena
from fusion.lower.views import View, dense
from fusion.quant.plan import QuantPlan
from isa.enums import DType

QUANTIZED = 1  # the DRAM temp (`LowerContext.temp`) of a float input quantized on the int8 path
Piece = tuple[int, int, int, int, int]  # one load: (DRAM address, rows, cols, row stride in bytes, local address)


def quantized_bytes(graph: Graph, node: Node, plan: QuantPlan | None) -> int:
    """Bytes of the Conv's `QUANTIZED` temp (0: its input is int8 already, or the path is fp32)."""
    x = node.inputs[0]
    if plan is None or storage_dtype(graph, plan, x) is not DType.f32:
        return 0
    return graph.types[x].size


def pack_weight(weight: np.ndarray) -> np.ndarray:
    """W [Cout, C/g, *kernel] -> [Cout, *kernel, C/g]: tap-major K rows (`taps_form`)."""
    return np.ascontiguousarray(np.moveaxis(weight, 1, -1))


def slab_layout(key: str, array: np.ndarray, n: int) -> np.ndarray:
    """A constant as stored for an N-wide array: a tap-major Conv weight (`taps_form`) as [K / N, Cout, N] slabs
    (K zero-padded to a multiple of N), so an array-wide k-slice of any row block is one contiguous DMA; any other
    constant unchanged."""
    form = split_const_key(key)
    if form is None or form[0] not in (CONST_TAPS_F32, CONST_TAPS_I8):
        return array
    rows = array.reshape(array.shape[0], -1)
    k = rows.shape[1]
    padded = np.zeros((rows.shape[0], -(-k // n) * n), rows.dtype)
    padded[:, :k] = rows
    return np.ascontiguousarray(padded.reshape(rows.shape[0], -1, n).transpose(1, 0, 2))


def tap_major(weight_shape: tuple[int, ...]) -> bool:
    """K tap-major (one DMA per tap and channel run) unless a group has fewer channels than the kernel has
    columns: then channel-major, the natural order, whose taps along a kernel row are one DMA per (channel,
    kernel row) (`_merged`: a 7x7 stem on 3 channels, 21 DMAs per panel instead of 49)."""
    return weight_shape[1] >= weight_shape[-1]


def packs(weight_shape: tuple[int, ...]) -> bool:
    """Whether the weight is packed tap-major: the order is tap-major and that reorders anything (more than one
    channel per group and tap)."""
    return tap_major(weight_shape) and weight_shape[1] > 1 and math.prod(weight_shape[2:]) > 1


@dataclass(frozen=True)
class ConvShape:
    """The conv's geometry (`frame.lifted`: a 1-D conv has H = OH = 1) and its group count. (Its sizes are cached:
    a panel asks them per tap and channel.)"""

    f: Frame
    groups: int

    @cached_property
    def taps(self) -> int:
        return self.f.kernel[0] * self.f.kernel[1]

    @cached_property
    def cg(self) -> int:
        return self.f.c // self.groups

    @cached_property
    def plane(self) -> int:
        return self.f.h * self.f.w

    @property
    def flat(self) -> bool:
        """A run of output positions reads one contiguous span per (tap, channel) across output rows."""
        return self.f.strides == (1, 1) and self.f.w == self.f.out[1]

    def span(self, width: int) -> int:
        """Input elements a run of `width` positions spans per (tap, channel)."""
        return width * self.f.strides[1]

    def runs(self, width: int) -> list[tuple[int, int]]:
        """Column blocks (first position, positions) of at most `width` positions."""
        oh, ow = self.f.out
        if self.flat:
            return [(p, min(width, oh * ow - p)) for p in range(0, oh * ow, width)]
        return [(r * ow + j, min(width, ow - j)) for r in range(oh) for j in range(0, ow, width)]

    def windows(self, taps: Sequence[int], p0: int, cols: int) -> tuple[list[int], np.ndarray]:
        """Per tap, (plane index of the run's first tap element, which of the run's positions read inside the
        image), as (first plane indices, in-image flags [taps, cols]): a panel has a window per (tap, channel
        run), a panel per column block, so one numpy pass per panel, not per tap."""
        f = self.f
        kh, kw = np.divmod(np.asarray(taps, np.int64), f.kernel[1])
        oh, ow = np.divmod(p0 + np.arange(cols), f.out[1])
        ih = (oh * f.strides[0] - f.pads[0])[None, :] + (kh * f.dilations[0])[:, None]
        iw = (ow * f.strides[1] - f.pads[1])[None, :] + (kw * f.dilations[1])[:, None]
        valid = (ih >= 0) & (ih < f.h) & (iw >= 0) & (iw < f.w)
        return (ih[:, 0] * f.w + iw[:, 0]).tolist(), valid


def conv_shape(cx: LowerContext, node: Node) -> ConvShape:
    x = cx.graph.types[node.inputs[0]].shape
    return ConvShape(
        lifted(
            x[0],
            x[1],
            tuple(x[2:]),
            tuple(cx.graph.types[node.inputs[1]].shape[2:]),
            tuple(node.attr("strides")),
            tuple(node.attr("dilations")),
            tuple(node.attr("pads")),
            tuple(cx.graph.types[node.outputs[0]].shape[2:]),
        ),
        node.attr("group"),
    )


@dataclass(frozen=True)
class Windows:
    """B of one (image, group) as `gemm.Gathered`: its K rows are `blocks` (first k, tap, first channel of the
    group, channels), each block's channels consecutive K rows."""

    s: ConvShape
    x: View  # the input [N, C, H * W]
    img: int
    group: int
    blocks: tuple[tuple[int, int, int, int], ...]

    @property
    def raw(self) -> DType:
        """What the input and the matrix unit hold (int8 or float32)."""
        return self.x.dtype

    @property
    def mask_dtype(self) -> DType:
        """Masks multiply as integers: int8 data as i8, float32 data by its bits as i32."""
        return DType.i8 if self.raw is DType.i8 else DType.i32

    def columns(self, width: int) -> list[tuple[int, int]]:
        return self.s.runs(width)

    def _pieces(self, k0: int, kc: int) -> list[tuple[int, int, int, int]]:
        """The blocks' parts inside rows [k0, k0 + kc): (row in the panel, tap, first channel, channels)."""
        out = []
        for first, tap, c0, count in self.blocks:
            lo, hi = max(k0, first), min(k0 + kc, first + count)
            if lo < hi:
                out.append((lo - k0, tap, c0 + lo - first, hi - lo))
        return out

    def panel_bytes(self, kc: int, cols: int) -> list[int]:
        span, es = self.s.span(cols), self.raw.size
        sizes = [(kc * span + span) * es]  # raw rows at the span's pitch, and the last row's lead
        if self.s.f.strides[1] > 1:
            sizes.append(kc * cols * (4 if self.raw is DType.i8 else es))  # compacted (int8: as int32 sums)
            sizes.append(kc * cols * es)
        sizes += [span * self.mask_dtype.size] * min(self.s.taps, kc)  # one mask per tap at most
        return sizes

    def prep_elements(self, kc: int, cols: int) -> int:
        """Elements the vector unit touches completing a panel, at most: the masks, every row masked, and with
        a horizontal stride the period sums (and their int8 conversion)."""
        pitch = self.s.span(cols)
        elements = pitch * min(self.s.taps, kc) + kc * pitch
        if self.s.f.strides[1] > 1:
            elements += kc * pitch + (kc * cols if self.raw is DType.i8 else 0)
        return elements

    def panel(
        self, arena: TileArena, k0: int, kc: int, j0: int, cols: int, width: int
    ) -> tuple[int, list[tuple[View, int]], list[Emit]]:
        s, es = self.s, self.raw.size
        span = s.span(width)
        pitch = s.span(cols)  # the raw rows' pitch
        staged = arena.tile((kc * span + span) * es)
        strided = s.f.strides[1] > 1
        sums = arena.tile(kc * width * (4 if self.raw is DType.i8 else es)) if strided else 0
        compact = arena.tile(kc * width * es) if strided else staged
        loads: list[Piece] = []
        masks: dict[bytes, int] = {}
        work: list[tuple[int, int, bytes | None]] = []  # (panel row, rows, kept-position pattern or None)
        pieces = self._pieces(k0, kc)
        starts, valid = s.windows([tap for _, tap, _, _ in pieces], j0, cols)
        keep = np.zeros((len(pieces), pitch), np.uint8)  # 0/1 per raw position: read inside the image
        keep[:, :: s.f.strides[1]] = valid
        kept = b"\x01" * pitch  # every position read inside the image: no mask
        for (row, _, c0, count), start, used, pattern in zip(
            pieces, starts, valid.any(axis=1).tolist(), map(bytes, keep), strict=True
        ):
            if not used:
                work.append((row, count, None))
                continue
            loads += self._dma(start, c0, count, pitch, staged + row * pitch * es)
            if pattern != kept and pattern not in masks:
                masks[pattern] = arena.tile(span * self.mask_dtype.size)
            work.append((row, count, pattern))

        work = _joined(work)

        def prepare(em: Emitter) -> None:
            b, mdt = em.b, self.mask_dtype
            for pattern, tile in masks.items():
                fill_runs(em, tile, value_runs(np.frombuffer(pattern, np.uint8)), mdt)
            for row, count, pattern in work:
                src = staged + row * pitch * es
                if pattern is None:  # only padding: zero the rows (any stale bits, NaN included)
                    fill_runs(em, compact + row * cols * es, [(0, count * cols, 0.0)], self.raw)
                    continue
                if pattern != kept:
                    b.v_mul_vr(*em.regs(src, src, masks[pattern]), count * pitch, pitch, mdt.name)
                if strided:
                    n, sw = count * pitch, s.f.strides[1]
                    if self.raw is DType.i8:
                        b.v_rsum(*em.regs(sums + row * cols * 4, src), n, sw, "i8")
                        b.v_cvt(*em.regs(compact + row * cols, sums + row * cols * 4), count * cols, "i32", "i8")
                    else:
                        b.v_rsum(*em.regs(compact + row * cols * es, src), n, sw, self.raw.name)

        return compact, _merged(loads, self.raw), [prepare]

    def _dma(self, start: int, c0: int, rows: int, pitch: int, local: int) -> list[Piece]:
        """Rows of `pitch` plane elements from `start` (clamped to the plane's first element, the rows then land
        `lead` elements late) of channels [c0, c0 + rows) of the group; no read passes the tensor's end."""
        s, es = self.s, self.raw.size
        first = max(start, 0)
        local += (first - start) * es
        channel = self.group * s.cg + c0
        base = self.x.address + ((self.img * s.f.c + channel) * s.plane + first) * es
        last = self.img == s.f.n - 1 and channel + rows == s.f.c and first + pitch > s.plane
        body = rows - 1 if last else rows
        out = []
        if body:
            out.append((base, body, pitch, s.plane * es, local))
        if last and first < s.plane:
            out.append((base + body * s.plane * es, 1, s.plane - first, es, local + body * pitch * es))
        return out


def _joined(work: list[tuple[int, int, bytes | None]]) -> list[tuple[int, int, bytes | None]]:
    """Consecutive panel rows with the same vector work (zeroing, or the same kept positions) as one run."""
    out: list[tuple[int, int, bytes | None]] = []
    for row, count, pattern in work:
        if out:
            first, rows, same = out[-1]
            if row == first + rows and pattern == same:
                out[-1] = (first, rows + count, same)
                continue
        out.append((row, count, pattern))
    return out


def _merged(pieces: list[Piece], dtype: DType) -> list[tuple[View, int]]:
    """One-row loads continuing a load's run of panel rows from evenly spaced DRAM addresses (a channel's taps
    along a kernel row, channel-major) joined into it: one strided DMA. (Runs are plain lists until the end: a
    panel has a piece per (tap, channel), a view only per merged run.)"""
    es = dtype.size
    runs: list[list[int]] = []
    for address, rows, cols, stride, local in pieces:
        if runs:
            run = runs[-1]  # [address, rows, cols, row stride, local]
            gap = address - (run[0] + (run[1] - 1) * run[3])  # from the run's last row
            adjacent = local == run[4] + run[1] * run[2] * es
            if rows == 1 and cols == run[2] and adjacent and gap > 0 and (run[1] == 1 or gap == run[3]):
                run[1] += 1
                run[3] = gap
                continue
        runs.append([address, rows, cols, stride, local])
    return [(View(address, (rows, cols), (stride, es), dtype), local) for address, rows, cols, stride, local in runs]


def implicit_conv_phases(cx: LowerContext, node: Node) -> list[list[Step]]:
    """The Conv's GEMMs, one per image and group, in one pipeline."""
    s = conv_shape(cx, node)
    weight = node.inputs[1]
    wshape = cx.graph.types[weight].shape
    m, mg = wshape[0], wshape[0] // s.groups
    q = cx.matrix(node) if cx.int8 else None
    x = cx.view(node.inputs[0])
    major = tap_major(wshape) and (not packs(wshape) or cx.graph.is_constant(weight))
    k, n = s.cg * s.taps, cx.config.array_size
    if packs(wshape) and cx.graph.is_constant(weight):
        packed = cx.const_view(weight, taps_form(cx.int8))
        slabs = dense(packed.address, (-(-k // n), m, n), packed.dtype)
        a2 = Operand(packed.reshape_dense((m, k)), slabs=slabs)
    else:
        a = matrix_operand(cx, node, weight, q.weight_scale if q else None)
        a2 = Operand(a.view.reshape_dense((m, k)), a.quantize_scale)
    if major:
        blocks = tuple((t * s.cg, t, 0, s.cg) for t in range(s.taps))
    else:
        blocks = tuple((c * s.taps + t, t, c, 1) for c in range(s.cg) for t in range(s.taps))
    phases = []
    if q is not None and x.dtype is DType.f32:  # a float input on the int8 path: quantized once, into DRAM
        quantized = dense(cx.temp(node, QUANTIZED), x.shape, DType.i8)
        phases.append(copy_steps(cx, [(x, quantized, q.input_scale)]))
        x = quantized
    flat_x = x.reshape_dense((s.f.n, s.f.c, s.plane))
    out = cx.view(node.outputs[0]).reshape_dense((s.f.n, m, s.f.out[0] * s.f.out[1]))
    bias = bias_view(cx, node)
    scales = dequant_scales(cx, node)
    table = None if scales is not None else requant_table(cx, node)
    p = s.f.out[0] * s.f.out[1]
    gemms = []
    for img, g in product(range(s.f.n), range(s.groups)):
        bias_g = None
        if bias is not None:
            bias_g = View(bias.address + g * mg * bias.dtype.size, (mg, p), (bias.dtype.size, 0), bias.dtype)
        gemms.append(
            Gemm(
                _group_rows(a2, g * mg, mg),
                Windows(s, flat_x, img, g, blocks),
                out.index((img,)).slice(0, g * mg, mg),
                bias_g,
                _epilogue(cx, node, table, scales, g * mg, mg),
            )
        )
    return [*phases, gemm_steps(cx.config, gemms, cx.rotation)]


def _group_rows(a: Operand, first: int, count: int) -> Operand:
    """The weight rows (output channels) of one group."""
    slabs = None if a.slabs is None else a.slabs.slice(1, first, count)
    return Operand(a.view.slice(0, first, count), a.quantize_scale, slabs)


def _epilogue(
    cx: LowerContext, node: Node, table: View | None, scales: View | None, first: int, count: int
) -> tuple[int, int] | ChannelRequant | ChannelDequant | None:
    """The GEMM's int8 epilogue for output channels [first, first + count) (one group's): per-channel
    dequantization or requantization, or one (mult, shift) (None: fp32)."""
    if scales is not None:
        return ChannelDequant(scales.slice(0, first, count), per_row=True)
    if table is not None:
        return ChannelRequant(table.slice(0, first, count), per_row=True)
    return requant(cx, node)
