"""ConvGeometry Conv (one input and one output channel per group) on the vector unit, with no im2col.

A depthwise conv has one multiply-accumulate per tap per output element: on the matrix unit it would use one
column of one row of the array. Here a block of `kb` channels of a band of padded input rows is loaded as one
[kb, P] tile (P = the band's rows x padded width W'). Output position q of a channel's row (q = r * stride_h * W' +
column, computed over the padded width) reads input position q + offset(kh, kw) of that row, so each tap is ONE
vector multiply of the whole tile, shifted by the tap's offset, by a per-row (per-channel) weight (`v.mul.vc`),
accumulated with `v.add`; positions past a row's end read the next row and are never kept. Then the bias per row,
and on the int8 path the exact int32 arithmetic of the quantized reference (input and weights widened with
`v.cvt`, requantized per tensor or per channel with `v.rqnt` / `v.rqnt.vc`). Each band's [kb, P] result is stored
to a DRAM scratch [C, (OH * stride_h + kh_span) * W'] at its output rows (a band's tail overlaps the next band's
rows, which that band's later store overwrites); a copy phase then picks the output pixels (every stride-th
column) into the NCHW output.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fusion.graph.ir import Graph, Node
from fusion.graph.ops import OpType
from fusion.lower.context import CONST_I8, LowerContext
from fusion.lower.emitter import Emit, Emitter, Step, f32_bits
from fusion.lower.kernels.conv_geometry import ConvGeometry
from fusion.lower.kernels.matrix import bias_view, requant, requant_table
from fusion.lower.kernels.movement import copy_steps
from fusion.lower.local_alloc import TileArena, largest_fitting
from fusion.lower.views import View, dense
from isa.enums import DType, Unit


def band_positions(g: ConvGeometry, rows: int) -> int:
    """P: padded input positions of one channel's band of `rows` output rows."""
    return g.in_rows(rows) * g.padded[1]


def tap_slack(g: ConvGeometry) -> int:
    """The largest tap offset: positions read past a tile's last row."""
    return g.offset(g.kernel[0] - 1, g.kernel[1] - 1)


def _scratch_pitch(g: ConvGeometry) -> int:
    """Scratch positions per channel: its output rows at the band tiles' pitch, so the kept positions of every
    channel and row are one evenly strided run (the copy phase then needs few DMAs). A band's tail past its
    channel's last row lands in the next channel's first rows, which are stored later (channels in order)."""
    return g.out[0] * g.pitch


def is_depthwise(graph: Graph, node: Node) -> bool:
    w = graph.types[node.inputs[1]].shape
    return node.op == OpType.Conv and graph.is_constant(node.inputs[1]) and w[1] == 1 and node.attr("group") == w[0]


def scratch_elements(g: ConvGeometry) -> int:
    """The DRAM scratch: every channel's positions, plus the last band's tail."""
    return g.n * g.c * _scratch_pitch(g) + g.span * g.padded[1]


@dataclass(frozen=True)
class _Dtypes:
    x: DType  # the padded input's storage dtype
    out: DType
    int8: bool

    @property
    def acc(self) -> DType:
        return DType.i32 if self.int8 else DType.f32


def _sizes(g: ConvGeometry, dt: _Dtypes, kb: int, rows: int) -> list[int]:
    n = kb * band_positions(g, rows)
    wide = n + tap_slack(g)
    sizes = [wide * dt.x.size, g.taps * kb * 4, kb * 4, kb * 8, n * 4, n * 4]  # x, weights, bias, table, acc, tmp
    if dt.int8:
        sizes += [wide, wide * 4, g.taps * kb, n]  # int8 copy of a float x, widened x, int8 weights, int8 result
    return sizes


def depthwise_phases(
    cx: LowerContext, node: Node, padded: View, g: ConvGeometry, scratch: int
) -> list[list[Step]] | None:
    """The conv over `padded` (its padded input) as vector steps + the copy phase; None when one output row of
    one channel does not fit a buffer slot, or the int8 output is not int8 (the im2col kernel runs it then)."""
    out = cx.view(node.outputs[0])
    dt = _Dtypes(padded.dtype, out.dtype, cx.int8)
    if cx.int8 and out.dtype is not DType.i8:
        return None
    weights = cx.const_view(node.inputs[1], CONST_I8) if cx.int8 else cx.view(node.inputs[1])
    taps = weights.reshape_dense((g.c, g.taps)).permute((1, 0))
    bias, table = bias_view(cx, node), requant_table(cx, node)
    pair = None if table is not None or not cx.int8 else requant(cx, node)
    scale = _input_scale(cx, node, dt)

    def step(c0: int, k: int, p: int, tiles: list[int]) -> tuple[list, Emit, int]:
        loads = [(taps.slice(1, c0, k), tiles[8] if cx.int8 else tiles[1])]
        if bias is not None:
            loads.append((bias.slice(0, c0, k), tiles[2]))
        if table is not None:
            loads.append((table.slice(0, c0, k), tiles[3]))
        body = _Body(g, dt, k, p, tiles, bias is not None, table is not None, pair, scale)
        return loads, body, tiles[9] if cx.int8 else tiles[4]

    return band_phases(cx, g, padded, out, scratch, lambda k, r: _sizes(g, dt, k, r), step)


def band_phases(
    cx: LowerContext,
    g: ConvGeometry,
    padded: View,
    out: View,
    scratch: int,
    sizes: Callable[[int, int], list[int]],
    step: Callable[[int, int, int, list[int]], tuple[list, Emit, int]],
) -> list[list[Step]] | None:
    """Vector steps over blocks of channels x bands of output rows, each loading its [kb, P] band of `padded`
    into its first tile (of `sizes(kb, rows)`) and storing the result tile `step` names to the DRAM scratch; then
    the copy phase picking the output pixels. None when one output row of one channel does not fit a slot."""
    probe = TileArena(cx.config, 0)
    rows = largest_fitting(g.out[0], lambda r: probe.fits(sizes(1, r)))
    if rows == 0:
        return None
    kb = largest_fitting(g.c, lambda k: probe.fits(sizes(k, rows)))
    image = padded.reshape_dense((g.n, g.c, g.padded[0] * g.padded[1]))
    store = dense(scratch, (g.n, g.c, _scratch_pitch(g)), out.dtype)
    steps = []
    for img in range(g.n):
        for c0 in range(0, g.c, kb):
            k = min(kb, g.c - c0)
            for oh0 in range(0, g.out[0], rows):
                p = band_positions(g, min(rows, g.out[0] - oh0))
                arena = TileArena(cx.config, len(steps), cx.rotation)
                tiles = [arena.tile(size) for size in sizes(k, min(rows, g.out[0] - oh0))]
                start = oh0 * g.strides[0] * g.padded[1]
                loads, body, result = step(c0, k, p, tiles)
                loads.insert(0, (image.index((img,)).slice(0, c0, k).slice(1, start, p), tiles[0]))
                view = store.index((img,)).slice(0, c0, k).slice(1, start, p)
                steps.append(Step(loads, [(Unit.vector, body)], [(result, view)]))
    es = out.dtype.size
    rows = g.n * g.c * g.out[0]  # every (image, channel, output row), evenly strided in the scratch
    picked = View(store.address, (rows, g.out[1]), (g.pitch * es, g.strides[1] * es), out.dtype)
    target = out.reshape_dense((rows, g.out[1]))
    if g.strides[1] != 1:  # columns apart: one strided DMA per output column instead of per row
        picked, target = picked.permute((1, 0)), target.permute((1, 0))
    return [steps, copy_steps(cx, [(picked, target, None)])]


def _input_scale(cx: LowerContext, node: Node, dt: _Dtypes) -> float | None:
    """The scale a float input is quantized at on the int8 path (None: already int8, or fp32)."""
    return cx.matrix(node).input_scale if dt.int8 and dt.x is DType.f32 else None


@dataclass(frozen=True)
class _Body:
    g: ConvGeometry
    dt: _Dtypes
    kb: int
    p: int
    tiles: list[int]
    bias: bool
    table: bool
    pair: tuple[int, int] | None
    quantize: float | None

    def __call__(self, em: Emitter) -> None:
        g, b = self.g, em.b
        x, w, bias, table, acc, tmp = self.tiles[:6]
        n, wide = self.kb * self.p, self.kb * self.p + tap_slack(g)
        acc_dt = self.dt.acc.name
        if self.dt.int8:
            q8, xi, w8 = self.tiles[6:9]
            if self.quantize is not None:
                b.v_qnt(*em.regs(q8, x, f32_bits(1.0 / self.quantize)), wide)
                x = q8
            b.v_cvt(*em.regs(xi, x), wide, "i8", "i32")
            b.v_cvt(*em.regs(w, w8), g.taps * self.kb, "i8", "i32")
            x = xi
        for tap in range(g.taps):
            src = x + g.offset(*divmod(tap, g.kernel[1])) * self.dt.acc.size
            dst = acc if tap == 0 else tmp
            b.v_mul_vc(*em.regs(dst, src, w + tap * self.kb * 4), n, self.p, acc_dt)
            if tap:
                b.v_add(*em.regs(acc, acc, tmp), n, acc_dt)
        if self.bias:
            b.v_add_vc(*em.regs(acc, acc, bias), n, self.p, acc_dt)
        if self.table:
            b.v_rqnt_vc(*em.regs(self.tiles[9], acc, table), n, self.p)
        elif self.pair is not None:
            mult, shift = self.pair
            b.v_rqnt(*em.regs(self.tiles[9], acc, mult), shift, n)
