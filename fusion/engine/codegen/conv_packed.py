"""Conv as an implicit GEMM over a channels-last copy of its input, kernel taps packed into K (`implicit_packed`).

The band schedule (`codegen.conv`) preloads one [channel block, Cout tile] weight tile per kernel tap, so a Conv
with few input channels fills K = Cin of the N array rows (ResNet's first layer: 3 of 16), and a strided one
computes every padded position and drops the ones between kept pixels. This schedule instead:

- phase 1 rewrites the (padded) input as X[img][row phase][i][w][c]: padded row h = i * stride_h + phase,
  channels last, `phase_width` (a multiple of stride_w) positions per row (a transposing load of the rows' pixels,
  stores of whole rows: no im2col);
- in X, the elements kernel row kh needs for output row r, position q are one contiguous run of kw * C (+ c)
  starting at row (r + kh * dilation_h // stride_h) of phase (kh * dilation_h % stride_h), position q * stride_w;
  consecutive positions are stride_w * C elements apart, and output rows `phase_width * C`: so ONE strided DMA
  (rows = a band's positions, DRAM row stride stride_w * C, cols = up to N elements of the run) is a packed
  [positions, K] A tile, and a preload carries up to N rows of K (one kernel row's taps and channels together:
  with a dilation or groups, one tap's channel slice);
- positions step by stride_w and rows go through the row phase, so the array computes only the kept pixels plus
  `positions - OW` past each output row's end (those read the next row's elements and are never drained).

The weights, [kh * kw * C/group, Cout] with (kh, kw, c) rows, are packed at compile time in Cout-tile panels
(`pack_panels`): each A tile's K rows of one Cout tile are one contiguous run. Loop order per band of output
rows: the A tiles stay resident while every Cout tile's weights stream past; the drain applies bias, residual,
activation and requantization per output row into a dense [rows * OW, Cout tile] tile stored to a DRAM scratch,
brought back as NCHW by transposing loads. Where the A tiles live, best first:

- X whole on chip (`Tiling.whole`, when X fits the rotating slots' banks): phase 1 writes X there instead of to
  DRAM, and every A tile is read in place by `mx.mm.s` (rows stride_w * C elements apart); the steps' tiles sit
  in the spare bank, and K is cut into groups only for the weights;
- a band's windows of X (`windows`: one run per row phase and channel block, loaded once per band), read in
  place the same way: kernel rows and taps overlap in X, so this reads each element about once where a packed A
  tile per piece read it kh * kw / (stride_h * stride_w) times;
- a packed A tile per piece loaded by one strided DMA (when a band's windows do not fit: K groups whose A tiles
  each step loads again).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from fusion.engine.codegen.conv import (
    DrainBand,
    Epilogue,
    conv_epilogue,
    conv_shape,
    load_transposed,
    pack_taps,
    step_arena,
    step_region,
    to_nchw,
)
from fusion.engine.codegen.conv_pool import PoolGeometry, RowPool, pool_steps, pooled_bytes, split_pool
from fusion.engine.codegen.gemm import k_slices
from fusion.engine.errors import CodegenError
from fusion.graph.ir import Graph, Node
from fusion.lower.context import LowerContext, const_key
from fusion.lower.emitter import Emit, Emitter, Step
from fusion.lower.errors import MemoryPlanError
from fusion.lower.kernels.conv_geometry import ConvGeometry
from fusion.lower.kernels.frame import MAX_N
from fusion.lower.kernels.matmul_loops import emit_keyed
from fusion.lower.kernels.vector_ops import fill, quantize_tile
from fusion.lower.kernels.windows import window_of
from fusion.lower.local_alloc import ALIGN, DEPTH, Slot, TileArena, aligned, largest_fitting, slot
from fusion.lower.views import MAX_ROWS, View, dense
from isa.enums import DType, Unit
from simulator.config import MachineConfig

SCRATCH, CHANNELS_LAST, POOLED = 2, 3, 4  # the Conv's DRAM temps: the output before NCHW, the channels-last input,
# the pooled output before NCHW (`codegen.conv_pool`)
CONV_PANELS = "conv_panels"  # constant-form key of a Conv weight as Cout-tile panels (see pack_panels)


def panel_width(cfg: MachineConfig, s: ConvGeometry) -> int:
    """Output channels per Cout tile (the array's columns, or a group's channels when fewer)."""
    return min(cfg.array_size, s.coutg)


def pack_panels(weights: np.ndarray, s: ConvGeometry, tn: int) -> np.ndarray:
    """W[Cout, C/group, kh, kw] as the panels each step reads: for every group's Cout tile [col, col + tn), the
    [kh * kw * C/group, tn] block, row-major, at offset K * col (one contiguous DMA of a step's K rows, not tn of
    every Cout-wide row: measured on resnet18 layer1 at 224, 1252 -> 388 load cycles per step)."""
    taps = pack_taps(weights).reshape(s.taps * s.cg, s.cout)
    cols = [(g * s.coutg + j0, width) for g in range(s.groups) for j0, width in k_slices(s.coutg, tn)]
    return np.ascontiguousarray(np.concatenate([taps[:, c : c + width].ravel() for c, width in cols]))


@dataclass(frozen=True)
class Piece:
    """One preload's K rows: elements [offset, offset + k) past a position's start in X (kernel row kh; plus
    g * C/group for group g), which are rows [row, row + k) of the weight as [kh * kw * C/group, Cout]."""

    kh: int
    offset: int
    row: int
    k: int


def block_width(n: int, s: ConvGeometry) -> int:
    """Channels per block of X: n when the channels are several whole blocks of the array's width (one group, no
    horizontal stride), so that a piece is one tap's block and its A tile's rows are contiguous in X (a DMA of
    packed bursts, not one burst per row), else all of them (with a horizontal stride the rows are not contiguous
    either way, and blocks cost a transposing load per block in phase 1: resnet18's 1x1/2 downsample at 224,
    98k -> 116k cycles)."""
    return n if s.groups == 1 and s.c > n and s.c % n == 0 and s.strides[1] == 1 else s.c


def pieces(s: ConvGeometry, n: int, block: int | None = None) -> list[Piece]:
    """The K pieces of every kernel row: the whole kw * C run when taps are adjacent in X (no dilation, one
    group), else each tap's channel slice (with X in `block`-channel blocks: each tap's block); cut into runs of
    at most n."""
    kw, cg = s.kernel[1], s.cg
    if block is not None and block < s.c:
        size = s.n * s.strides[0] * s.phase_rows * s.phase_width * block  # elements of one block of X
        blocks = range(s.c // block)
        runs = [
            (cb * size + j * s.dilations[1] * block, j * cg + cb * block, block) for j in range(kw) for cb in blocks
        ]
    elif s.groups == 1 and s.dilations[1] == 1:
        runs = [(0, 0, kw * cg)]
    else:
        runs = [(j * s.dilations[1] * s.c, j * cg, cg) for j in range(kw)]
    return [
        Piece(kh, offset + a, kh * kw * cg + row + a, k)
        for kh in range(s.kernel[0])
        for offset, row, length in runs
        for a, k in k_slices(length, n)
    ]


def stream_rows(s: ConvGeometry, rows: int) -> int:
    """Positions a band of `rows` output rows computes, up to its last kept pixel."""
    return (rows - 1) * s.positions + s.out[1]


@dataclass(frozen=True)
class Windows:
    """A band's resident runs of X that its pieces' A tiles are read from in place (`mx.mm.s`, rows stride_w *
    block elements apart): `runs` (first element past the band's origin, elements), and per piece (its run, its
    first A row's element offset in the run). Kernel rows and taps overlap in X, so a run is read once where
    every piece's A tile re-read it (the stem at 224, 7x7/2: 1.85 of its 3.5 MB)."""

    runs: tuple[tuple[int, int], ...]
    at: tuple[tuple[int, int], ...]


def piece_start(s: ConvGeometry, block: int, p: Piece) -> int:
    """Element offset in X of piece p's first A row past X[0, img, 0, oh0] (+ the group's channels)."""
    phase, down = s.row_phase(p.kh)
    return (phase * s.phase_rows + down) * s.phase_width * block + p.offset


def windows(s: ConvGeometry, block: int, rows: int, group: Sequence[Piece]) -> Windows:
    """The runs of X a band of `rows` output rows reads for `group`: one per row phase and channel block (the
    same runs for every band), from its pieces' first A row to their last, relative to X[0, img, 0, oh0] (+ the
    group's channels)."""
    row, stride = s.phase_width * block, s.strides[1] * block
    last = (stream_rows(s, rows) - 1) * stride
    starts = [((s.row_phase(p.kh)[0], p.offset // row), piece_start(s, block, p)) for p in group]
    keys = list(dict.fromkeys(key for key, _ in starts))
    first = {key: min(a for k, a in starts if k == key) for key in keys}
    end = {key: max(a + last + p.k for (k, a), p in zip(starts, group, strict=True) if k == key) for key in keys}
    return Windows(
        tuple((first[key], end[key] - first[key]) for key in keys),
        tuple((keys.index(key), a - first[key]) for key, a in starts),
    )


def scratch_sizes(
    graph: Graph, cfg: MachineConfig, nodes: Sequence[Node], out_dt: DType, mm_dt: DType
) -> dict[int, int]:
    """Bytes of the DRAM temps: the output before its layout change, the channels-last input (and with a
    trailing MaxPool, the pooled output before its layout change)."""
    s = conv_shape(graph, cfg, nodes[0], packed=True)
    channels_last = s.n * s.strides[0] * s.phase_rows * s.phase_width * s.c * mm_dt.size
    sizes = {SCRATCH: s.n * s.out[0] * s.out[1] * s.cout * out_dt.size, CHANNELS_LAST: channels_last}
    _, pool = split_pool(nodes)
    return sizes | ({} if pool is None else {POOLED: pooled_bytes(graph, pool, out_dt)})


@dataclass(frozen=True)
class Tiling:
    """Output rows per band, output channels per column tile, the K pieces of each step, and whether the A tiles
    (then one K group) stay resident for the band or each step loads its group's."""

    rows: int
    tn: int
    groups: tuple[tuple[Piece, ...], ...]
    resident: bool
    # all of X resident in the rotating slots' banks, written there by the channels-last phase (never stored to
    # DRAM), every band reading its A tiles in place; the steps' tiles in the spare bank (K groups: their weights)
    whole: bool = False


def x_bytes(s: ConvGeometry, dt: DType) -> int:
    """Bytes of X (the channels-last input)."""
    return s.n * s.strides[0] * s.phase_rows * s.phase_width * s.c * dt.size


def slots_region(cfg: MachineConfig) -> Slot:
    """The scratchpad the rotating slots take together: where X sits whole (`Tiling.whole`)."""
    first = slot(cfg.spad_bytes, cfg.spad_banks, 0)
    return Slot(first.base, DEPTH * first.size)


def choose_tiling(cfg: MachineConfig, s: ConvGeometry, mm_dt: DType, out_dt: DType, residual: bool) -> Tiling:
    """The most output rows per band with every A tile resident beside one Cout tile's weights (fewer bands read
    the weights fewer times); when one output row's A tiles do not fit, the most rows beside the largest piece
    and K groups as long as fit."""
    n = cfg.array_size
    block = block_width(n, s)
    tn, probe, every = panel_width(cfg, s), TileArena(cfg, 0), pieces(s, n, block)

    def fits(rows: int, group: Sequence[Piece], resident: bool = False) -> bool:
        """A tiles and one step's tiles in a slot (resident: the band's windows of X, the step's tiles in a third
        of `step_region`)."""
        stream = stream_rows(s, rows)
        if resident:
            a = [size * mm_dt.size for _, size in windows(s, block, rows, group).runs]
        else:
            a = [stream * p.k * mm_dt.size for p in group]
        step = [sum(p.k for p in group) * tn * mm_dt.size, tn * 4, tn * 8, rows * s.out[1] * tn * out_dt.size]
        step += [rows * s.out[1] * tn * 4] if residual else []
        if stream > MAX_ROWS or not probe.fits([] if resident else a, [stream * tn * 4]):
            return False
        if not resident:
            return probe.fits(a + step)
        region = step_region(cfg, probe.spad, a)
        return probe.fits(a) and sum(map(aligned, step)) <= region.size // DEPTH // ALIGN * ALIGN

    rows = largest_fitting(s.out[0], lambda r: fits(r, every, True))
    whole = _whole(cfg, s, mm_dt, out_dt, residual, tn, every)
    if whole is not None and whole.rows >= rows:
        return whole
    if rows:
        return Tiling(rows, tn, (tuple(every),), True)
    widest = max(every, key=lambda p: p.k)
    rows = largest_fitting(s.out[0], lambda r: fits(r, [widest]))
    if rows == 0:
        raise CodegenError(f"one output row of one K piece does not fit a buffer slot ({probe.spad.size} bytes)")
    return Tiling(rows, tn, k_groups(every, lambda group: fits(rows, group)), False)


def _whole(
    cfg: MachineConfig, s: ConvGeometry, mm_dt: DType, out_dt: DType, residual: bool, tn: int, every: list[Piece]
) -> Tiling | None:
    """The `Tiling.whole` schedule when X fits the slots' banks (one group, a spare bank for the steps): the most
    output rows per band the accumulator takes, K groups whose weights (unless all of them fit beside X) and
    epilogue tiles fit a third of the spare bank. X is read once and the weights once per band (the layers whose
    bands' windows do not fit one slot, resnet18 224 layer3.0.conv1: 2 bands, 1 here)."""
    spare, probe, region = TileArena.spare(cfg), TileArena(cfg, 0), slots_region(cfg)
    size = x_bytes(s, mm_dt)
    if spare is None or s.groups > 1 or size > region.size:
        return None
    held = aligned(size) + aligned(s.taps * s.cg * s.cout * mm_dt.size) <= region.size
    third = spare.spad.size // DEPTH // ALIGN * ALIGN

    def fits(rows: int, group: Sequence[Piece]) -> bool:
        stream = stream_rows(s, rows)
        step = [tn * 4, tn * 8, rows * s.out[1] * tn * out_dt.size]
        step += [] if held else [sum(p.k for p in group) * tn * mm_dt.size]
        step += [rows * s.out[1] * tn * 4] if residual else []
        return stream <= MAX_ROWS and probe.fits([], [stream * tn * 4]) and sum(map(aligned, step)) <= third

    widest = max(every, key=lambda p: p.k)
    rows = largest_fitting(s.out[0], lambda r: fits(r, [widest]))
    if rows == 0:
        return None
    return Tiling(rows, tn, k_groups(every, lambda group: fits(rows, group)), True, True)


def k_groups(every: Sequence[Piece], fits: Callable[[list[Piece]], bool]) -> tuple[tuple[Piece, ...], ...]:
    """The pieces in order, cut into the longest runs (K groups) that `fits` accepts (a piece alone always)."""
    groups: list[list[Piece]] = [[]]
    for p in every:
        if groups[-1] and not fits([*groups[-1], p]):
            groups.append([])
        groups[-1].append(p)
    # as many groups, of near-equal piece counts when they fit: a short last group gives the matrix too little
    # work to cover the next step's loads (resnet18 224 layer3.0.conv1: 368 + 368 + 368 + 48 K rows)
    count, size = len(groups), len(every)
    even = [list(every[i * size // count : (i + 1) * size // count]) for i in range(count)]
    return tuple(tuple(g) for g in (even if all(fits(g) for g in even) else groups))


def packed_phases(cx: LowerContext, nodes: Sequence[Node]) -> list[list[Step]]:
    """The Conv `nodes[0]` and the consumers its drain absorbs as phases: the padded input (none without padding),
    its channels-last copy, the implicit GEMM into the DRAM scratch, the transposing loads to NCHW."""
    graph, cfg, node = cx.graph, cx.config, nodes[0]
    s = conv_shape(graph, cfg, node, packed=True)
    out = cx.view(nodes[-1].outputs[0])
    drained, pool = split_pool(nodes)
    ep = conv_epilogue(cx, drained, s, out)
    if pool is not None and ep.dequant is not None:
        raise CodegenError(f"node {pool.name!r}: a MaxPool after a dequantizing Clip is not pooled in the kernel")
    mm_dt = DType.i8 if cx.int8 else DType.f32
    tiling = choose_tiling(cfg, s, mm_dt, ep.work_dt, ep.residual is not None)
    block = block_width(cfg.array_size, s)
    x = channels_last_view(cx.temp(node, CHANNELS_LAST), s, block, mm_dt)
    phases = channels_last_phases(cx, node, s, x, slots_region(cfg).base if tiling.whole else None)
    scratch = dense(cx.temp(node, SCRATCH), (s.n, s.out[0] * s.out[1], s.cout), ep.out_dt)
    rows_k = s.taps * s.cg
    weights = dense(cx.addresses[const_key(node.inputs[1], CONV_PANELS)], (s.cout * rows_k,), mm_dt)
    k = _Kernel(s, tiling, ep, weights, x, scratch)
    reserved = k.a_sizes(tiling.rows, tiling.groups[0]) if tiling.resident else []
    # the whole weight beside a band's A tiles when it fits: loaded by the first band of each slot, read by all
    # (the stem at 224: 9.4 KB, read once per 2-row band before, 0.53 MB)
    # (with X whole: beside X, loaded once)
    region = slots_region(cfg) if tiling.whole else TileArena(cfg, 0).spad
    held = tiling.resident and sum(map(aligned, [*reserved, weights.size * mm_dt.size])) <= region.size
    reserved += [weights.size * mm_dt.size] if held else []
    k = replace(k, held=held)
    spans = [(img, g, *band) for img in range(s.n) for g in range(s.groups) for band in k_slices(s.out[0], tiling.rows)]
    arenas = [_arena(cfg, b, cx.rotation, tiling.whole) for b in range(len(spans))]
    copies = 1 if tiling.whole else DEPTH  # bands that load the held weights: the first of each slot
    bands = [
        (_Tile(img, g, 0, 0, oh0, rows, 0, 0), _tiles(arenas[b], reserved))
        for b, (img, g, oh0, rows) in enumerate(spans)
    ]
    per_band = len(k_slices(s.coutg, tiling.tn)) * len(tiling.groups)
    chip = None if pool is None else _row_pool(cx, node, k, PoolGeometry.of(graph, pool), per_band, reserved)
    steps: list[Step] = []
    tiles = 0
    for b, (band, resident) in enumerate(bands):
        # a band's resident A tiles: loaded by its own first step (the first band, or bands of one step), else
        # spread over the previous band's steps so they load while it computes (its slot's last user, three
        # bands back, is done: every step waits for the one `DEPTH` before it, and bands have >= 2 steps)
        own = tiling.resident and (b == 0 or per_band < 2)
        ahead = k.band_loads(bands, b + 1) if tiling.resident and per_band >= 2 and b + 1 < len(bands) else []
        ahead += [(weights, bands[b + 1][1][-1])] if held and per_band >= 2 and b + 1 < min(copies, len(bands)) else []
        for j0, tn in k_slices(s.coutg, tiling.tn):
            acc = TileArena(cfg, tiles, cx.rotation).acc_tile(stream_rows(s, band.rows) * tn * 4)
            for gi in range(len(tiling.groups)):
                if chip is not None:
                    arena = step_arena(cfg, chip[1], len(steps))
                elif tiling.resident:
                    arena = step_arena(cfg, step_region(cfg, arenas[b].spad, reserved), len(steps))
                else:
                    arena = TileArena(cfg, len(steps), cx.rotation)
                t = replace(band, col=band.g * s.coutg + j0, tn=tn, acc=acc, kgroup=gi)
                i = len(steps) - b * per_band
                loads = k.band_loads(bands, b) if own and i == 0 else []
                loads += [(weights, resident[-1])] if held and own and b < copies and i == 0 else []
                loads += ahead[len(ahead) * i // per_band : len(ahead) * (i + 1) // per_band]
                steps.append(k.step(arena, t, resident, loads, None if chip is None else chip[0]))
            tiles += 1
    phases.append(steps)
    if chip is not None:  # pooled on chip: the kept columns of the pooled rows go to NCHW
        g = chip[0].pool.g
        pixels = g.w.out_spatial[0] * g.w.out_spatial[1]
        phases.append(to_nchw(cfg, g.w.strides[1], chip[0].dst, out.reshape_dense((s.n, s.cout, pixels)), cx.rotation))
        return phases
    if pool is not None:  # pooled from the channels-last scratch, then only the pooled pixels go to NCHW
        g = PoolGeometry.of(graph, pool)
        pixels = g.w.out_spatial[0] * g.w.out_spatial[1]
        pooled = dense(cx.temp(node, POOLED), (s.n, pixels, s.cout), ep.out_dt)
        phases.append(pool_steps(cfg, g, scratch, pooled, cx.rotation))
        scratch, nchw = pooled, out.reshape_dense((s.n, s.cout, pixels))
    else:
        nchw = out.reshape_dense((s.n, s.cout, s.out[0] * s.out[1]))
    phases.append(to_nchw(cfg, 1, scratch, nchw, cx.rotation, ep.dequant))
    return phases


def _row_pool(
    cx: LowerContext, node: Node, k: _Kernel, g: PoolGeometry, per_band: int, reserved: Sequence[int]
) -> tuple[_Pooled, Slot] | None:
    """The trailing MaxPool computed on chip (`conv_pool.RowPool`) and the region the steps' tiles then rotate
    in, or None (pooled from the DRAM scratch): only for the resident schedule with a spare bank, which then holds
    the ring of pooled rows at its end and the steps' tiles before it, when a step's tiles still fit a third."""
    cfg, s, tiling, dt = cx.config, k.s, k.tiling, k.ep.out_dt
    spare = TileArena.spare(cfg)
    if not tiling.resident or spare is None:
        return None
    pool = RowPool.of(g, s.n, tiling.rows, per_band, DEPTH)
    cols = tuple(gi * s.coutg + j0 for gi in range(s.groups) for j0, _ in k_slices(s.coutg, tiling.tn))
    ring = aligned(len(cols) * pool.ring * pool.tile_bytes(tiling.tn, dt))
    if ring >= spare.spad.size:
        return None
    region = Slot(spare.spad.base, spare.spad.size - ring)
    probe = step_arena(cfg, region, 0)
    rows = tiling.rows
    try:  # a last K group's step: its weights (unless held), the epilogue's tiles, the drained rows, a pooled row
        if not k.held:
            probe.tile(sum(p.k for p in tiling.groups[-1]) * tiling.tn * k.dt.size)
        k.ep.tiles(probe, rows, tiling.tn)
        probe.tile(rows * s.out[1] * tiling.tn * k.ep.work_dt.size)
        probe.tile(pool.tile_bytes(tiling.tn, dt))
    except MemoryPlanError:
        return None
    oh = g.w.out_spatial[0]
    dst = dense(cx.temp(node, POOLED), (s.n, oh * pool.pitch, s.cout), dt)
    stride = pool.tile_bytes(tiling.tn, dt)
    return _Pooled(pool, region.base + region.size, stride, cols, dst, dt), region


def _arena(cfg: MachineConfig, b: int, rotation: int, whole: bool) -> TileArena:
    """Band b's resident tiles: in its slot, or (X whole) all bands' in the slots' region."""
    arena = TileArena(cfg, b, rotation)
    if whole:
        arena.spad = slots_region(cfg)
    return arena


def _tiles(arena: TileArena, sizes: Sequence[int]) -> list[int]:
    return [arena.tile(size) for size in sizes]


RUN_COLS = 4032  # elements per row of a long run's load: a multiple of the 64-byte burst under MAX_COLS


def _run(address: int, size: int, tile: int, dt: DType) -> list[tuple[View, int]]:
    """Loads of `size` contiguous elements at `address` to `tile`: whole rows of RUN_COLS, then the rest (one
    view of a length with no wide divisor would split into narrow rows)."""
    rows, rest = divmod(size, RUN_COLS)
    loads = [(dense(address, (rows, RUN_COLS), dt), tile)] if rows else []
    head = rows * RUN_COLS * dt.size
    return loads + ([(dense(address + head, (rest,), dt), tile + head)] if rest else [])


def _matmul(
    accumulate: bool, acc: int, tile: int, stride: int, dense_stride: int, rows: int
) -> tuple[tuple[str, int, tuple], tuple[int, ...]]:
    """The matrix op of one piece (its shape and register operand values, as `matmul_loops.Keyed` holds them):
    mx.mm(a) on a dense A tile, mx.mm(a).s on rows `stride` bytes apart."""
    name = "mx_mma" if accumulate else "mx_mm"
    if stride == dense_stride:
        return (name, 2, (rows,)), (acc, tile)
    return (name + "_s", 3, (rows,)), (acc, tile, stride)


def channels_last_view(address: int, s: ConvGeometry, block: int, dtype: DType) -> View:
    """X as [channel block, img, row phase, row, phase width * block]."""
    shape = (s.c // block, s.n, s.strides[0], s.phase_rows, s.phase_width * block)
    return dense(address, shape, dtype)


def channels_last_phases(
    cx: LowerContext, node: Node, s: ConvGeometry, x: View, local: int | None = None
) -> list[list[Step]]:
    """The Conv's input -> X (see the module docstring): the padding is written as zeros with the data, no
    padded copy. Blocks of padded rows in a tile [rows, W', C]: cleared (only when the conv pads: the pad
    positions stay zero), each input row brought into its place by one transposing load ([C, W] -> [W, C]),
    quantized to int8 when the input is float on the int8 path, each padded row stored where its row phase
    keeps it (one store for the block when stride_h is 1). `local`: X's scratchpad address when it stays on
    chip (`Tiling.whole`): each padded row is written in its place there (a float row quantized from a tile in
    the spare bank), no store and no load of X back (the stem at 224: 0.32 MB)."""
    cfg, w = cx.config, window_of(cx.graph, node)
    image = cx.view(node.inputs[0])
    quantize = cx.matrix(node).input_scale if cx.int8 and image.dtype is DType.f32 else None
    height, width = (w.in_shape[2] if w.s == 2 else 1), w.in_shape[-1]
    top, left = (w.pads[0], w.pads[1]) if w.s == 2 else (0, w.pads[0])
    image = image.reshape_dense((s.n, s.c, height * width))
    pitch, c, es = s.padded[1], x.shape[-1] // s.phase_width, image.dtype.size  # c: channels per block
    spare = TileArena.spare(cfg) if local is not None else None
    probe = TileArena(cfg, 0) if spare is None else step_arena(cfg, spare.spad, 0)
    direct = local is not None and quantize is None  # the rows loaded straight into X on chip, no tile
    contiguous = s.strides[0] == 1 and s.phase_width == pitch  # a block's rows adjacent in X

    def sizes(rows: int) -> list[int]:
        if direct:
            return []
        return [rows * pitch * c * es] + ([rows * pitch * c] if quantize is not None and local is None else [])

    block = largest_fitting(s.padded[0], lambda r: r * pitch * c <= MAX_N and probe.fits(sizes(r)))  # n fields
    if block == 0:
        raise CodegenError(f"one padded input row of {c} channels does not fit a buffer slot")
    steps = []
    for cb, img in ((cb, img) for cb in range(s.c // c) for img in range(s.n)):

        def place(h: int, cb: int = cb, img: int = img) -> View:
            return x.index((cb, img, h % s.strides[0], h // s.strides[0]))

        def on_chip(h: int) -> int:
            assert local is not None
            return local + place(h).address - x.address

        for h0, rows in k_slices(s.padded[0], block):
            arena = (
                TileArena(cfg, len(steps), cx.rotation) if spare is None else step_arena(cfg, spare.spad, len(steps))
            )
            tiles = [arena.tile(size) for size in sizes(rows)]
            # where block row r is written first: the tile, or (direct) its place in X on chip
            row_at = [on_chip(h) if direct else tiles[0] + (h - h0) * pitch * c * es for h in range(h0, h0 + rows)]
            inside = [h for h in range(h0, h0 + rows) if top <= h < top + height]
            channels = image.index((img,)).slice(0, cb * c, c)
            parts = [(channels.slice(1, (h - top) * width, width), row_at[h - h0] + left * c * es) for h in inside]

            def load(em: Emitter, parts=parts) -> None:
                for part, at in parts:
                    load_transposed(em, part, at)

            compute = [(Unit.load, load)]
            if w.needs_pad:  # only the pad positions, disjoint from the loaded rows: the next block's loads need
                # not wait for this block's vector work (clearing the whole tile first serialised every block)
                if direct and not contiguous:  # rows apart in X: each row's runs
                    runs = [
                        (row_at[r] + first * c * es, count)
                        for r, h in enumerate(range(h0, h0 + rows))
                        for first, count in _pad_runs(range(h, h + 1), range(top, top + height), left, width, pitch)
                    ]
                else:
                    runs = [
                        (row_at[0] + first * c * es, count)
                        for first, count in _pad_runs(
                            range(h0, h0 + rows), range(top, top + height), left, width, pitch
                        )
                    ]

                def clear(em: Emitter, runs=runs) -> None:
                    for at, count in runs:
                        fill(em, at, count * c, image.dtype, 0.0)

                compute.append((Unit.vector, clear))
            if quantize is not None:
                if local is None:
                    outs = [(tiles[1], tiles[0], rows * pitch * c)]
                elif contiguous:
                    outs = [(on_chip(h0), tiles[0], rows * pitch * c)]
                else:
                    outs = [(on_chip(h), row_at[h - h0], pitch * c) for h in range(h0, h0 + rows)]

                def to_int8(em: Emitter, outs=outs) -> None:
                    for dst, raw, n in outs:
                        quantize_tile(em, dst, raw, n, quantize)

                compute.append((Unit.vector, to_int8))
            if local is not None:
                steps.append(Step([], compute, []))
                continue
            ready, row_bytes = tiles[-1], pitch * c * x.dtype.size
            if s.strides[0] == 1:
                stores = [(ready, x.index((cb, img, 0)).slice(0, h0, rows).slice(1, 0, pitch * c))]
            else:
                stores = [
                    (ready + r * row_bytes, place(h).slice(0, 0, pitch * c)) for r, h in enumerate(range(h0, h0 + rows))
                ]
            steps.append(Step([], compute, stores))
    return [steps]


def _pad_runs(rows: range, inside: range, left: int, width: int, pitch: int) -> list[tuple[int, int]]:
    """(first position, positions) of a block of padded rows `pitch` wide that hold no input element: the rows
    outside `inside`, each inside row's `left` positions before and those after its `width`, adjacent runs
    merged."""
    runs: list[tuple[int, int]] = []
    for r, h in enumerate(rows):
        parts = [(0, left), (left + width, pitch)] if h in inside else [(0, pitch)]
        for a, b in parts:
            if b <= a:
                continue
            if runs and sum(runs[-1]) == r * pitch + a:
                runs[-1] = (runs[-1][0], runs[-1][1] + b - a)
            else:
                runs.append((r * pitch + a, b - a))
    return runs


@dataclass(frozen=True)
class _Tile:
    """One step: image, group, output channel columns [col, col + tn), output rows [oh0, oh0 + rows), the
    accumulator tile, the K group."""

    img: int
    g: int
    col: int
    tn: int
    oh0: int
    rows: int
    acc: int
    kgroup: int


@dataclass(frozen=True)
class _Kernel:
    """What every step of one kernel shares."""

    s: ConvGeometry
    tiling: Tiling
    ep: Epilogue
    weights: View  # flat, Cout-tile panels (`pack_panels`)
    x: View  # [channel blocks, n, stride_h, phase rows, phase width * channels per block]
    scratch: View  # [n, OH * OW, Cout]
    held: bool = False  # the whole weight sits past each band's A tiles (the last resident tile)

    @property
    def dt(self) -> DType:
        return self.weights.dtype

    @property
    def block(self) -> int:
        """Channels per block of X."""
        return self.x.shape[-1] // self.s.phase_width

    @cached_property
    def starts(self) -> tuple[tuple[int, ...], ...]:
        """Per K group, each piece's `piece_start` (asked by every step reading X in place, tens of thousands)."""
        return tuple(tuple(piece_start(self.s, self.block, p) for p in group) for group in self.tiling.groups)

    def a_sizes(self, rows: int, group: Sequence[Piece]) -> list[int]:
        """Bytes of a band's A tiles: resident, its windows of X; else one packed tile per piece."""
        if self.tiling.whole:
            return [x_bytes(self.s, self.dt)]
        if self.tiling.resident:
            return [size * self.dt.size for _, size in windows(self.s, self.block, rows, group).runs]
        return [stream_rows(self.s, rows) * p.k * self.dt.size for p in group]

    def origin(self, t: _Tile) -> int:
        """The address of X[0, t.img, 0, t.oh0] plus t.g's channels: what `windows` are relative to."""
        return self.x.index((0, t.img, 0, t.oh0)).address + t.g * self.s.cg * self.dt.size

    def band_loads(self, bands: Sequence[tuple[_Tile, list[int]]], b: int) -> list[tuple[View, int]]:
        """The loads of band b's resident A tiles (none with X whole: it is written on chip)."""
        band, tiles = bands[b]
        return [] if self.tiling.whole else self.a_loads(band, tiles)

    def a_view(self, t: _Tile, p: Piece) -> View:
        """The packed A tile of piece p over the band: positions stride_w * C elements apart."""
        s, es = self.s, self.dt.size
        phase, down = s.row_phase(p.kh)
        start = self.x.index((0, t.img, phase, t.oh0 + down)).address + (p.offset + t.g * s.cg) * es
        block = self.x.shape[-1] // s.phase_width
        return View(start, (stream_rows(s, t.rows), p.k), (s.strides[1] * block * es, es), self.dt)

    def a_loads(self, band: _Tile, tiles: list[int], group: Sequence[Piece] | None = None) -> list[tuple[View, int]]:
        """The DMAs bringing a band's A tiles (of a K group; default: the first) to local `tiles`."""
        group = self.tiling.groups[0] if group is None else group
        if not self.tiling.resident:
            return [(self.a_view(band, p), tile) for p, tile in zip(group, tiles[: len(group)], strict=True)]
        es, runs = self.dt.size, windows(self.s, self.block, band.rows, group).runs
        origin = self.x.index((0, band.img, 0, band.oh0)).address + band.g * self.s.cg * es
        return [
            load
            for (a, size), tile in zip(runs, tiles, strict=False)
            for load in _run(origin + a * es, size, tile, self.dt)
        ]

    def step(
        self,
        arena: TileArena,
        t: _Tile,
        resident: list[int],
        a_loads: list[tuple[View, int]],
        pooled: _Pooled | None = None,
    ) -> Step:
        """One Cout tile x K group of a band; `a_loads`: the resident A tiles this step loads (its own band's or
        the next band's); `pooled`: the trailing MaxPool computed on chip from the drained rows (`RowPool`)."""
        s, es, group = self.s, self.dt.size, self.tiling.groups[t.kgroup]
        a_stride = [p.k * es for p in group]
        if self.tiling.whole:  # in place in X, rows stride_w * block elements apart
            base = resident[0] + self.origin(t) - self.x.address
            a_tiles = [base + start * es for start in self.starts[t.kgroup]]
            a_stride = [s.strides[1] * self.block * es] * len(group)
        elif self.tiling.resident:  # in place in the band's windows, rows stride_w * block elements apart
            at = windows(s, self.block, t.rows, group).at
            a_tiles = [resident[r] + offset * es for r, offset in at]
            a_stride = [s.strides[1] * self.block * es] * len(group)
        else:
            a_tiles = [arena.tile(size) for size in self.a_sizes(t.rows, group)]
            a_loads = self.a_loads(t, a_tiles, group)
        row0, krows = group[0].row, sum(p.k for p in group)
        kt = s.taps * s.cg  # the panel of columns [col, col + tn) starts at kt * col: its rows one contiguous run
        panel = kt * t.col + row0 * t.tn
        w_tile = resident[-1] + panel * es if self.held else arena.tile(krows * t.tn * es)
        last = t.kgroup == len(self.tiling.groups) - 1
        tiles = self.ep.tiles(arena, t.rows, t.tn) if last else (0, 0, 0)
        out_tile = arena.tile(t.rows * s.out[1] * t.tn * self.ep.work_dt.size) if last else 0
        stream = stream_rows(s, t.rows)

        def load(em: Emitter) -> None:
            for view, tile in a_loads:
                em.dma_load(view, tile)
            if not self.held:
                em.dma_load(self.weights.slice(0, panel, krows * t.tn), w_tile)
            self.ep.load(em, tiles, t.img, t.col, t.tn, t.oh0, t.rows)

        def matmul(em: Emitter) -> None:
            dt = self.dt.name
            items = []
            for i, (p, tile, stride) in enumerate(zip(group, a_tiles, a_stride, strict=True)):
                # a later piece adds to the accumulator the first one opened
                op, values = _matmul(bool(t.kgroup or i), t.acc, tile, stride, p.k * es, stream)
                items.append(((("mx_preload", 1, (p.k, t.tn, dt)), op), (w_tile + (p.row - row0) * t.tn * es, *values)))
            emit_keyed(em, items)
            if last:
                band = DrainBand(t.acc, t.rows, t.tn, s.positions, s.out[1], s.out[1])
                self.ep.drain(em, band, tiles, out_tile)

        def rescale(em: Emitter) -> None:
            self.ep.rescale(em, t.rows * s.out[1], t.tn, tiles, out_tile)

        compute = [(Unit.load, load), (Unit.matrix, matmul)]
        if last and self.ep.scales is not None:
            compute.append((Unit.vector, rescale))
        if last and pooled is not None:
            work, stores = pooled.band(t, out_tile, arena.tile(pooled.pool.tile_bytes(t.tn, self.ep.out_dt)))
            compute.append((Unit.vector, work))
            return Step([], compute, stores)
        stores = []
        if last:
            view = self.scratch.index((t.img,)).slice(0, t.oh0 * s.out[1], t.rows * s.out[1]).slice(1, t.col, t.tn)
            stores.append((out_tile, view))
        return Step([], compute, stores)


@dataclass(frozen=True)
class _Pooled:
    """A band step's share of the on-chip MaxPool (`conv_pool.RowPool`): its drained rows reduced into the ring
    of pooled rows (`ring`: the ring's first tile; Cout tile `cols.index(col)` owns `pool.ring` tiles), each
    finished pooled row stored to `dst` [n, OH' * pitch, Cout]."""

    pool: RowPool
    ring: int
    stride: int  # bytes of one ring tile (a full Cout tile's)
    cols: tuple[int, ...]
    dst: View
    dtype: DType

    def tile(self, t: _Tile, p: int) -> int:
        """Pooled row p's (of image t.img) tile in Cout tile t.col's ring."""
        index = self.cols.index(t.col) * self.pool.ring + (t.img * self.pool.g.w.out_spatial[0] + p) % self.pool.ring
        return self.ring + index * self.stride

    def band(self, t: _Tile, out_tile: int, spare: int) -> tuple[Emit, list[tuple[int, View]]]:
        """The vector work over the band's drained rows and the stores of the pooled rows it finishes."""
        width, n, es = self.pool.width, self.pool.pitch * t.tn, self.dtype.size
        rows = [(t.oh0 + r, self.pool.contributions(t.oh0 + r)) for r in range(t.rows)]

        def work(em: Emitter) -> None:
            for r, (_, found) in enumerate(rows):
                if not found:
                    continue
                starts = [p for p, first, _ in found if first]
                target = self.tile(t, starts[0]) if starts else spare
                self.pool.emit_row(em, out_tile + r * width * t.tn * es, target, t.tn, self.dtype)
                for p, first, _ in found:
                    tile = self.tile(t, p)
                    if tile == target:
                        continue
                    if first:
                        em.b.v_copy(*em.regs(tile, target), n, self.dtype.name)
                    else:
                        em.b.v_max(*em.regs(tile, tile, target), n, self.dtype.name)

        pitch, image = self.pool.pitch, self.dst.index((t.img,))
        stores = [
            (self.tile(t, p), image.slice(0, p * pitch, pitch).slice(1, t.col, t.tn))
            for _, found in rows
            for p, _, last in found
            if last
        ]
        return work, stores
