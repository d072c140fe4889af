"""Conv with the activation patch stationary and the weights streamed (`implicit_stationary`): for few output
pixels and many output channels (ResNet layer4 at 64x64: M = 4 pixels, K = 4608, Cout = 512).

The weight-stationary schedules pay a preload and a 2N - 1 skew per K piece and Cout tile for only a few streamed
rows. Here each K piece of the band's positions is the preloaded operand instead: A^T [k, M] (M <= N positions of
the channels-last input, `codegen.conv_packed`; one transposing DMA per kernel row brings [kw * C, M], whose row
blocks are the pieces), and the piece's weights stream through it as rows, [Cout chunk, k] -> acc [Cout chunk, M]:
per piece one preload and Cout + 2N - 1 cycles for all output channels. The accumulator holds out^T, channels as
rows, so the epilogue runs on the vector unit (bias per row, ReLU, per-channel requantize as the baseline GEMM
does) and the result is already NCHW: stored straight to the output when a band is one output row, else through a
DRAM scratch that drops the positions past each row's end. A pointwise conv (1x1, stride 1, no padding) whose
input is already the matrix dtype needs no channels-last copy: its A^T pieces are [channels, pixels] blocks of the
NCHW input, a band any N pixels, and out^T goes straight to the output.

Weights are packed at compile time piece-major ([group][piece][Cout/group][k], `pack_pieces`), so each step's
weights are one contiguous DMA (one strided DMA for a chunk of the output channels).

With one band's A^T resident, every band reads all the weights (resnet18 224 layer4.0.conv1: 4 bands, 4.7 of its
5.2 MB). When it moves fewer bytes (`traffic`), the kernel instead passes over several bands of an image per read
of the weights (`Tiling.bands`): each step loads its K group's A^T of every band of the pass beside the group's
weights for a chunk of output channels and accumulates each band in its own accumulator rows, so the weights are
read once per pass and A^T once per chunk (layer4.0.conv1: 444,415 -> 332,236 cycles, 5.21 -> 2.49 MB).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fusion.engine.codegen.conv import Epilogue, conv_epilogue, conv_shape, pack_taps
from fusion.engine.codegen.conv_packed import (
    Piece,
    channels_last_phases,
    channels_last_view,
    k_groups,
    pieces,
    stream_rows,
)
from fusion.engine.codegen.gemm import k_slices
from fusion.engine.errors import CodegenError
from fusion.graph.ir import Graph, Node
from fusion.lower.context import LowerContext, const_key
from fusion.lower.emitter import Emitter, Step
from fusion.lower.kernels.conv_geometry import ConvGeometry
from fusion.lower.kernels.matmul_loops import emit_keyed
from fusion.lower.kernels.windows import window_of
from fusion.lower.local_alloc import TileArena, largest_fitting
from fusion.lower.views import MAX_COLS, MAX_ROWS, View, dense
from isa.enums import Activation, DType, Unit
from simulator.config import MachineConfig

PIECES = "pieces"  # constant-form key of a Conv weight packed piece-major (see pack_pieces)
SCRATCH, CHANNELS_LAST = 2, 3  # the Conv's DRAM temps: out^T bands before dropping positions, the input
# A pass over several bands streams at least this many times N output channels through each preload: fewer, and
# each step's fixed costs (its loads, the preloads of every band, the epilogue) no longer hide behind the rows
# streamed (resnet18 224 layer3.0.conv1 int8, passes of 7 / 5 / 4 / 3 bands streaming 41 / 58 / 73 / 97 channels:
# 331,369 / 291,589 / 283,490 / 279,948 cycles for 2.44 / 2.29 / 2.36 / 2.43 MB; at 2N the kernel took the
# 5-band pass, 3% slower than the unfused Conv + Relu, so the plan kept their 4.76 MB)
MIN_STREAMED = 4


def pack_pieces(weights: np.ndarray, s: ConvGeometry, n: int) -> np.ndarray:
    """W[Cout, C/group, kh, kw] as [group][piece][Cout/group][k] (flat): piece p's K rows of every output channel
    of a group, contiguous (the rows the array streams)."""
    taps = pack_taps(weights).reshape(s.taps * s.cg, s.cout)  # [K, Cout], K = (kh, kw, c)
    blocks = [
        taps[p.row : p.row + p.k, g * s.coutg : (g + 1) * s.coutg].T.ravel()
        for g in range(s.groups)
        for p in pieces(s, n)
    ]
    return np.ascontiguousarray(np.concatenate(blocks))


def scratch_sizes(graph: Graph, cfg: MachineConfig, node: Node, mm_dt: DType) -> dict[int, int]:
    """Bytes of the DRAM temps: out^T bands (int32 / float32 at most), the channels-last input."""
    s = conv_shape(graph, cfg, node, packed=True)
    rows = _band_rows(cfg, s)
    bands = -(-s.out[0] // rows)
    out_t = s.n * s.groups * bands * s.coutg * stream_rows(s, rows) * 4
    return {SCRATCH: out_t, CHANNELS_LAST: s.n * s.strides[0] * s.phase_rows * s.phase_width * s.c * mm_dt.size}


def _band_rows(cfg: MachineConfig, s: ConvGeometry) -> int:
    """Output rows per band: the most whose positions fit the array's columns."""
    rows = largest_fitting(s.out[0], lambda r: stream_rows(s, r) <= cfg.array_size)
    if rows == 0:
        raise CodegenError(f"one output row of {s.out[1]} pixels exceeds the array's {cfg.array_size} columns")
    return rows


def row_runs(s: ConvGeometry) -> list[int]:
    """Elements of each A^T tile of a band: one per kernel row (per tap for dilated or grouped convs), the runs of
    `conv_packed.pieces` before they are cut."""
    per_row = [s.kernel[1] * s.cg] if s.groups == 1 and s.dilations[1] == 1 else [s.cg] * s.kernel[1]
    return per_row * s.kernel[0]


def _output_row(nchw: View, img: int, ch0: int, nc: int, oh: int) -> View:
    """out[img, ch0 : ch0 + nc, oh, :] as [nc, OW]."""
    part = nchw.index((img,)).slice(0, ch0, nc).slice(1, oh, 1)
    return View(part.address, (nc, part.shape[2]), (part.strides[0], part.strides[2]), part.dtype)


@dataclass(frozen=True)
class Tiling:
    rows: int  # output rows per band
    nc: int  # output channels per step (rows streamed)
    groups: tuple[tuple[Piece, ...], ...]  # the K pieces of each step
    # bands per pass over the weights: 1, each band's A^T stays resident while all the weights stream past it
    # (the weights read once per band); more, each step loads its K group's A^T of that many bands beside the
    # group's weights and accumulates every band's out^T (the weights read once per pass, A^T once per Cout chunk)
    bands: int = 1


def traffic(s: ConvGeometry, tiling: Tiling, m: int, es: int) -> int:
    """DRAM bytes of a tiling's weight and A^T reads (the rest does not depend on it)."""
    total = s.n * s.groups * -(-s.out[0] // tiling.rows)
    weights = s.taps * s.cg * s.cout * es
    patch = total * s.taps * s.cg * m * es
    if tiling.bands == 1:
        return weights * total + patch
    return weights * -(-total // tiling.bands) + patch * -(-s.coutg // tiling.nc)


def choose_tiling(cfg: MachineConfig, s: ConvGeometry, mm_dt: DType, direct: bool = False) -> Tiling:
    """Band rows by the array's columns (`direct`: pixels, N at most); the most output channels per step whose
    accumulator and output tiles fit beside the band's A^T; K groups as long as their weights fit beside them."""
    probe, every = TileArena(cfg, 0), pieces(s, cfg.array_size)
    runs = [p.k for p in every] if direct else row_runs(s)

    def fits(nc: int, group: Sequence[Piece], rows: int) -> bool:
        m = rows if direct else stream_rows(s, rows)
        step = [sum(p.k for p in group) * nc * mm_dt.size, nc * 4, nc * 8, nc * m * 4]
        return probe.fits([run * m * mm_dt.size for run in runs] + step, [nc * m * 4])

    widest = min(cfg.array_size, s.out[0] * s.out[1]) if direct else _band_rows(cfg, s)
    rows = largest_fitting(widest, lambda r: fits(1, every[:1], r))  # the band's A^T must fit a slot
    m = rows if direct else stream_rows(s, rows)
    a_bytes = sum(runs) * m * mm_dt.size

    if rows == 0:
        raise CodegenError(f"a band's A^T ({sum(runs) * mm_dt.size} bytes per position) does not fit a buffer slot")
    nc = largest_fitting(min(s.coutg, MAX_ROWS), lambda c: fits(c, every[:1], rows))
    if nc == 0:
        raise CodegenError(f"a band's A^T ({a_bytes} bytes) and one output channel do not fit a buffer slot")
    resident = Tiling(rows, nc, k_groups(every, lambda group: fits(nc, group, rows)))
    passes = (
        []
        if direct or s.groups > 1
        else [t for b in range(2, _bands(s, rows) + 1) if (t := _pass(cfg, s, mm_dt, rows, b))]
    )
    return min([resident, *passes], key=lambda t: (traffic(s, t, m, mm_dt.size), -t.bands))


def _bands(s: ConvGeometry, rows: int) -> int:
    """Bands of one image."""
    return -(-s.out[0] // rows)


def _pass(cfg: MachineConfig, s: ConvGeometry, mm_dt: DType, rows: int, bands: int) -> Tiling | None:
    """A tiling streaming each K group's A^T of `bands` bands beside its weights (`Tiling.bands`), or None when
    its accumulators leave fewer than `MIN_STREAMED` output channels per step (see there)."""
    n, probe, m = cfg.array_size, TileArena(cfg, 0), stream_rows(s, rows)

    def fits(nc: int, group: Sequence[Piece]) -> bool:
        k = sum(p.k for p in group)
        step = [k * m * mm_dt.size] * bands + [k * nc * mm_dt.size, nc * 4, nc * 8] + [nc * m * 4] * bands
        return probe.fits(step, [bands * nc * m * 4])

    every = pieces(s, n)
    nc = largest_fitting(min(s.coutg, MAX_ROWS), lambda c: fits(c, every[:1]))
    if nc < min(s.coutg, MIN_STREAMED * n):
        return None
    return Tiling(rows, nc, k_groups(every, lambda group: fits(nc, group)), bands)


def stationary_phases(cx: LowerContext, nodes: Sequence[Node]) -> list[list[Step]]:
    """The Conv `nodes[0]` and its absorbed bias / ReLU as phases: the padded input (none without padding), its
    channels-last copy, the GEMM (out^T per band), and the positions past each row's end dropped (bands of more
    than one output row)."""
    graph, cfg, node = cx.graph, cx.config, nodes[0]
    s = conv_shape(graph, cfg, node, packed=True)
    out = cx.view(nodes[-1].outputs[0])
    ep = conv_epilogue(cx, nodes, s, out)
    if ep.residual is not None or ep.dequant is not None:
        raise CodegenError(f"node {node.name!r}: the patch-stationary conv absorbs a bias and a ReLU only")
    mm_dt = DType.i8 if cx.int8 else DType.f32
    image = cx.view(node.inputs[0])
    unpadded = not window_of(graph, node).needs_pad
    direct = s.kernel == (1, 1) and s.strides == (1, 1) and unpadded and image.dtype is mm_dt
    tiling = choose_tiling(cfg, s, mm_dt, direct)  # refuses before anything is built
    if direct:  # a pointwise conv: A^T pieces are [channels, pixels] blocks of the NCHW input itself
        x, phases = image.reshape_dense((s.n, s.c, s.out[0] * s.out[1])), []
    else:
        x = channels_last_view(cx.temp(node, CHANNELS_LAST), s, s.c, mm_dt)
        phases = channels_last_phases(cx, node, s, x)
    m = tiling.rows if direct else stream_rows(s, tiling.rows)
    spans = k_slices(s.out[0] * s.out[1] if direct else s.out[0], tiling.rows)
    bands = [(img, g, *band) for img in range(s.n) for g in range(s.groups) for band in spans]
    acc_dt = DType.i32 if cx.int8 else DType.f32
    scratch = dense(cx.temp(node, SCRATCH), (len(bands), s.coutg, m), ep.out_dt if cx.int8 else acc_dt)
    weights = dense(cx.addresses[const_key(node.inputs[1], PIECES)], (s.groups * s.taps * s.cg * s.coutg,), mm_dt)
    nchw = out.reshape_dense((s.n, s.cout, s.out[0], s.out[1]))
    k = _Kernel(s, tiling, ep, weights, x, mm_dt, acc_dt, direct, tuple(pieces(s, cfg.array_size)))
    a_sizes = [size * m * mm_dt.size for size in ([p.k for p in k.every] if direct else row_runs(s))]
    steps: list[Step] = []
    accs = 0

    def dest(b: int, c0: int, nc: int) -> View:
        """Where band b's out^T rows [c0, c0 + nc) go."""
        img, g, oh0, rows = bands[b]
        if direct:
            flat = out.reshape_dense((s.n, s.cout, s.out[0] * s.out[1]))
            return flat.index((img,)).slice(0, g * s.coutg + c0, nc).slice(1, oh0, rows)
        if tiling.rows == 1:
            return _output_row(nchw, img, g * s.coutg + c0, nc, oh0)
        return scratch.index((b,)).slice(0, c0, nc).slice(1, 0, stream_rows(s, rows))

    if tiling.bands > 1:  # passes of `bands` bands of one image, each K group's A^T loaded with its weights
        per_image = _bands(s, tiling.rows)
        passes = [
            list(range(i * per_image + j, i * per_image + min(j + tiling.bands, per_image)))
            for i in range(s.n)
            for j in range(0, per_image, tiling.bands)
        ]
        for members in passes:
            for c0, nc in k_slices(s.coutg, tiling.nc):
                acc = TileArena(cfg, accs, cx.rotation).acc_tile(len(members) * nc * m * 4)
                accs += 1
                for gi in range(len(tiling.groups)):
                    arena = TileArena(cfg, len(steps), cx.rotation)
                    tiles = [_Tile(*bands[b], c0, nc, gi, acc + i * nc * m * 4) for i, b in enumerate(members)]
                    steps.append(k.pass_step(arena, tiles, [dest(b, c0, nc) for b in members]))
    for b, (img, g, oh0, rows) in enumerate(bands if tiling.bands == 1 else []):
        band = TileArena(cfg, b, cx.rotation)
        a_tiles = [band.tile(size) for size in a_sizes]
        for c0, nc in k_slices(s.coutg, tiling.nc):
            acc = TileArena(cfg, accs, cx.rotation).acc_tile(nc * m * 4)
            accs += 1
            for gi in range(len(tiling.groups)):
                arena = TileArena(cfg, len(steps), cx.rotation)
                for size in a_sizes:  # every step keeps clear the bytes a band's A^T tiles use
                    arena.tile(size)
                first = c0 == 0 and gi == 0
                steps.append(k.step(arena, _Tile(img, g, oh0, rows, c0, nc, gi, acc), a_tiles, first, dest(b, c0, nc)))
    phases.append(steps)
    if tiling.rows > 1 and not direct:
        phases.append(_drop_positions(cx, s, tiling.rows, bands, scratch, nchw))
    return phases


@dataclass(frozen=True)
class _Tile:
    img: int
    g: int
    oh0: int
    rows: int
    c0: int  # first output channel of the group
    nc: int
    kgroup: int
    acc: int


@dataclass(frozen=True)
class _Kernel:
    s: ConvGeometry
    tiling: Tiling
    ep: Epilogue
    weights: View  # flat, piece-major
    x: View
    mm_dt: DType
    acc_dt: DType
    direct: bool  # x is the NCHW input [n, C, pixels] (a pointwise conv), a band `rows` pixels from `oh0`
    every: tuple[Piece, ...]  # every K piece, in order

    def m(self, t: _Tile) -> int:
        """Positions (preload columns) of the band."""
        return t.rows if self.direct else stream_rows(self.s, t.rows)

    def a_loads(self, em: Emitter, t: _Tile, tiles: list[int]) -> None:
        """A^T of the band: per kernel row (or tap) run, one transposing DMA of [positions, run] -> [run, M]
        (`direct`: per piece, one DMA of its [k channels, pixels] block)."""
        s, es, m = self.s, self.mm_dt.size, self.m(t)
        if self.direct:
            for p, tile in zip(self.every, tiles, strict=True):
                em.dma_load(self.x.index((t.img,)).slice(0, t.g * s.cg + p.offset, p.k).slice(1, t.oh0, m), tile)
            return
        runs = row_runs(s)
        per_row = len(runs) // s.kernel[0]
        for i, (run, tile) in enumerate(zip(runs, tiles, strict=True)):
            kh, j = divmod(i, per_row)
            phase, down = s.row_phase(kh)
            offset = j * s.dilations[1] * s.c if per_row > 1 else 0
            start = self.x.index((0, t.img, phase, t.oh0 + down)).address + (offset + t.g * s.cg) * es
            for c0 in range(0, run, MAX_COLS):
                cols = min(MAX_COLS, run - c0)
                local, dram, stride = em.regs(tile + c0 * m * es, start + c0 * es, s.strides[1] * s.c * es)
                em.b.dma_ldt(local, dram, stride, m, cols, self.mm_dt.name)

    def piece_tile(self, tiles: list[int], p: Piece, m: int) -> int:
        """Local address of piece p's [k, M] rows inside its kernel row's (or tap's) A^T tile."""
        if self.direct:
            return tiles[self.every.index(p)]
        runs = row_runs(self.s)
        index, start = 0, 0
        while start + runs[index] <= p.row:
            start += runs[index]
            index += 1
        return tiles[index] + (p.row - start) * m * self.mm_dt.size

    def step(self, arena: TileArena, t: _Tile, a_tiles: list[int], first: bool, dest: View) -> Step:
        es, group = self.mm_dt.size, self.tiling.groups[t.kgroup]
        m = self.m(t)
        w_tile = arena.tile(sum(p.k for p in group) * t.nc * es)
        last = t.kgroup == len(self.tiling.groups) - 1
        bias, table, scales = self._epilogue_tiles(arena, t) if last else (0, 0, 0)
        out_tile = self._out_tile(arena, t, m, (bias, table, scales)) if last else t.acc

        def load(em: Emitter) -> None:
            if first:
                self.a_loads(em, t, a_tiles)
            self.weight_loads(em, t, w_tile)
            self.epilogue_loads(em, t, (bias, table, scales))

        def matmul(em: Emitter) -> None:
            local = w_tile
            for i, p in enumerate(group):
                em.b.mx_preload(em.reg(self.piece_tile(a_tiles, p, m)), p.k, m, self.mm_dt.name)
                (em.b.mx_mma if t.kgroup or i else em.b.mx_mm)(*em.regs(t.acc, local), t.nc)
                local += t.nc * p.k * es

        def epilogue(em: Emitter) -> None:
            self.epilogue(em, t, m, (bias, table, scales), out_tile)

        compute = [(Unit.load, load), (Unit.matrix, matmul)]
        if last:
            compute.append((Unit.vector, epilogue))
        return Step([], compute, [(out_tile, dest)] if last else [])

    def pass_step(self, arena: TileArena, tiles: list[_Tile], dests: list[View]) -> Step:
        """One K group x Cout chunk of a pass (`Tiling.bands`): the group's A^T of every band of the pass (one
        transposing DMA per band and run of the group's pieces in one kernel row) and its weights, each band's
        pieces preloaded in turn and the weights streamed through them into the band's accumulator rows."""
        s, es, t0 = self.s, self.mm_dt.size, tiles[0]
        group = self.tiling.groups[t0.kgroup]
        k = sum(p.k for p in group)
        full = stream_rows(s, self.tiling.rows)
        a_tiles = [arena.tile(k * full * es) for _ in tiles]
        w_tile = arena.tile(k * t0.nc * es)
        last = t0.kgroup == len(self.tiling.groups) - 1
        epi = self._epilogue_tiles(arena, t0) if last else (0, 0, 0)
        outs = [self._out_tile(arena, t, full, epi) if last else t.acc for t in tiles]

        def load(em: Emitter) -> None:
            for t, tile in zip(tiles, a_tiles, strict=True):
                self.group_loads(em, t, group, tile)
            self.weight_loads(em, t0, w_tile)
            self.epilogue_loads(em, t0, epi)

        def matmul(em: Emitter) -> None:
            items = []
            for t, tile in zip(tiles, a_tiles, strict=True):
                m, local = self.m(t), w_tile
                for i, p in enumerate(group):
                    mm = "mx_mma" if t.kgroup or i else "mx_mm"
                    shape = (("mx_preload", 1, (p.k, m, self.mm_dt.name)), (mm, 2, (t.nc,)))
                    items.append((shape, (tile + (p.row - group[0].row) * m * es, t.acc, local)))
                    local += t.nc * p.k * es
            emit_keyed(em, items)

        def epilogue(em: Emitter) -> None:
            for t, out_tile in zip(tiles, outs, strict=True):
                self.epilogue(em, t, self.m(t), epi, out_tile)

        compute = [(Unit.load, load), (Unit.matrix, matmul)]
        if last:
            compute.append((Unit.vector, epilogue))
        return Step([], compute, list(zip(outs, dests, strict=True)) if last else [])

    def group_loads(self, em: Emitter, t: _Tile, group: Sequence[Piece], tile: int) -> None:
        """A^T of a K group over band t into `tile` ([k, M] per piece, back to back): pieces adjacent in X (one
        kernel row's consecutive runs) come in by one transposing DMA."""
        s, es, m = self.s, self.mm_dt.size, self.m(t)
        runs: list[list[Piece]] = []
        for p in group:
            if runs and runs[-1][-1].kh == p.kh and runs[-1][-1].offset + runs[-1][-1].k == p.offset:
                runs[-1].append(p)
            else:
                runs.append([p])
        local = tile
        for run in runs:
            phase, down = s.row_phase(run[0].kh)
            start = self.x.index((0, t.img, phase, t.oh0 + down)).address + (run[0].offset + t.g * s.cg) * es
            count = sum(p.k for p in run)
            for c0 in range(0, count, MAX_COLS):
                cols = min(MAX_COLS, count - c0)
                regs = em.regs(local + c0 * m * es, start + c0 * es, s.strides[1] * s.c * es)
                em.b.dma_ldt(*regs, m, cols, self.mm_dt.name)
            local += count * m * es

    def weight_loads(self, em: Emitter, t: _Tile, w_tile: int) -> None:
        """The K group's weights for channels [c0, c0 + nc): one contiguous run for all its pieces when nc is all
        of the group's channels, else one per piece."""
        s, es, group = self.s, self.mm_dt.size, self.tiling.groups[t.kgroup]
        kt = s.taps * s.cg
        if t.nc == s.coutg:  # the group's pieces are one contiguous run
            runs = [group]
        elif len({p.k for p in group}) == 1:  # one strided DMA: a [nc, k] block per piece, coutg * k apart
            k = group[0].k
            start = self.weights.slice(0, (t.g * kt + group[0].row) * s.coutg + t.c0 * k, 1).address
            em.dma_load(View(start, (len(group), t.nc * k), (s.coutg * k * es, es), self.mm_dt), w_tile)
            return
        else:
            runs = [[p] for p in group]
        local = w_tile
        for run in runs:
            count = sum(p.k for p in run) * t.nc
            em.dma_load(self.weights.slice(0, (t.g * kt + run[0].row) * s.coutg + t.c0 * run[0].k, count), local)
            local += count * es

    def _epilogue_tiles(self, arena: TileArena, t: _Tile) -> tuple[int, int, int]:
        """Bias, requantizer table and dequantizing scales tiles of a last K group's step (0 = none)."""
        bias = arena.tile(t.nc * 4) if self.ep.bias is not None else 0
        table = arena.tile(t.nc * 8) if self.ep.table is not None else 0
        scales = arena.tile(t.nc * 4) if self.ep.scales is not None else 0
        return bias, table, scales

    def _out_tile(self, arena: TileArena, t: _Tile, m: int, epi: tuple[int, int, int]) -> int:
        """The epilogue's output tile (int8 or a dequantizing conv's f32), or the accumulator itself (fp32)."""
        return arena.tile(t.nc * m * (4 if epi[2] else 1)) if self.acc_dt is DType.i32 else t.acc

    def epilogue_loads(self, em: Emitter, t: _Tile, epi: tuple[int, int, int]) -> None:
        col = t.g * self.s.coutg + t.c0
        for tile, view in zip(epi, (self.ep.bias, self.ep.table, self.ep.scales), strict=True):
            if tile:
                em.dma_load(view.slice(0, col, t.nc), tile)

    def epilogue(self, em: Emitter, t: _Tile, m: int, epi: tuple[int, int, int], out_tile: int) -> None:
        """Bias per row, ReLU, then per-channel requantization (or dequantization) of out^T [nc, m]."""
        (bias, table, scales), n, dt = epi, t.nc * m, self.acc_dt.name
        if bias:
            em.b.v_add_vc(*em.regs(t.acc, t.acc, bias), n, m, dt)
        if self.ep.act is Activation.relu:
            em.b.v_relu(*em.regs(t.acc, t.acc), n, dt)
        if table:
            em.b.v_rqnt_vc(*em.regs(out_tile, t.acc, table), n, m)
        elif scales:  # f32(acc + bias) * the row's channel scale, as the quantized reference dequantizes
            em.b.v_cvt(*em.regs(out_tile, t.acc), n, "i32", "f32")
            em.b.v_mul_vc(*em.regs(out_tile, out_tile, scales), n, m, "f32")
        elif self.acc_dt is DType.i32:
            mult, shift = self.ep.requant
            em.b.v_rqnt(*em.regs(out_tile, t.acc, mult), shift, n)


def _drop_positions(
    cx: LowerContext, s: ConvGeometry, rows: int, bands: list[tuple[int, int, int, int]], scratch: View, nchw: View
) -> list[Step]:
    """Each band's out^T [Cout/group, M] -> the output's rows: for output row r, the OW positions from r * L."""
    steps = []
    for b, (img, g, oh0, count) in enumerate(bands):
        src = scratch.index((b,))  # [coutg, M]
        for c0, nc in k_slices(s.coutg, max(1, min(s.coutg, MAX_ROWS))):
            for r in range(count):
                tile = TileArena(cx.config, len(steps), cx.rotation).tile(nc * s.out[1] * src.dtype.size)
                part = src.slice(0, c0, nc).slice(1, r * s.positions, s.out[1])
                steps.append(Step([(part, tile)], [], [(tile, _output_row(nchw, img, g * s.coutg + c0, nc, oh0 + r))]))
    return steps
