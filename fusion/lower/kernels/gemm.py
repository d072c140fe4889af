"""Tiled GEMM on the systolic array: C[M, N] = A[M, K] @ B[K, N] (+ bias), int8 or fp32.

An output tile (tm x tn) is computed over one or more K chunks (kc columns of A, kc rows of B), one pipeline
step per chunk: the loader brings the chunk's k-slices of A (tm x n, one DMA each) and B's kc x tn panel
(one DMA; its k-slices are consecutive dense blocks); on the int8 path float operands are quantized (v.qnt)
first; the matrix unit runs mx.preload + mx.mm/mma over the k-slices into the tile's accumulator (mx.mm only
on the tile's first slice, so the chunks add up); after the last chunk the vector unit adds the bias and
(int8) requantizes to an int8 tile, or dequantizes per channel to a float32 one (`ChannelDequant`: v.cvt and a
per-channel v.mul), and the store unit writes the tile. K is split (see `choose_tiling`)
only when too few rows fit beside the whole of it; a chunk and its row block always fit one buffer slot, so any
K works. The matrix unit accumulates the k-slices in the same order either way: splitting changes no result.

B is a DRAM view (`Operand`) or `Gathered`: a panel no DRAM tensor holds, assembled in the scratchpad by the
operand itself (an implicit-GEMM convolution's windows, `conv_implicit`), with its own column blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import product
from typing import Protocol

import numpy as np

from fusion.lower.emitter import Emit, Emitter, Step
from fusion.lower.errors import MemoryPlanError
from fusion.lower.kernels.vector_ops import quantize_tile
from fusion.lower.local_alloc import ALIGN, TileArena, largest_fitting
from fusion.lower.views import MAX_ROWS, View
from isa.enums import DType, Unit
from simulator.config import MachineConfig
from simulator.timing import dma_cycles


@dataclass(frozen=True)
class Operand:
    """A 2-D DRAM view; `quantize_scale` set means: stored float32, quantize to int8 on the way in. `slabs`: an A
    stored slab-major, [K / N, M, N] (N the array size, K zero-padded), so each array-wide k-slice of a row block
    is one contiguous DMA (`view` then only gives the logical [M, K] shape and dtype)."""

    view: View
    quantize_scale: float | None = None
    slabs: View | None = None

    def part(self, i0: int, rows: int, k0: int, kb: int) -> View:
        """Rows [i0, i0 + rows) of k-slice [k0, k0 + kb) (within one array-wide slice when slab-major)."""
        if self.slabs is None:
            return self.view.slice(0, i0, rows).slice(1, k0, kb)
        n = self.slabs.shape[2]
        return self.slabs.index((k0 // n,)).slice(0, i0, rows).slice(1, k0 % n, kb)


class Gathered(Protocol):
    """A B operand gathered into the scratchpad rather than read as one view: `panel` allocates the dense
        [kc, cols] panel of rows [k0, k0 + kc) and columns [j0, j0 + cols) (matrix-ready dtype; room for `width` >= cols
    columns) in `arena` and returns
        its address, the DMA loads and the vector work (after the loads) that complete it; `panel_bytes` are the
        scratchpad tiles it allocates (for tiling); `prep_elements` bounds the elements that vector work touches
        (for pricing); `columns` the column blocks of at most `width` columns."""

    def panel_bytes(self, kc: int, cols: int) -> list[int]: ...

    def prep_elements(self, kc: int, cols: int) -> int: ...

    def panel(
        self, arena: TileArena, k0: int, kc: int, j0: int, cols: int, width: int
    ) -> tuple[int, list[tuple[View, int]], list[Emit]]: ...

    def columns(self, width: int) -> list[tuple[int, int]]: ...


@dataclass(frozen=True)
class ChannelRequant:
    """A per-channel requantizer: `table` [channels, 2] int32 (mult, shift) pairs in DRAM, one per output row
    (`per_row`) or per output column (`v.rqnt.vc` / `v.rqnt.vr`)."""

    table: View
    per_row: bool


@dataclass(frozen=True)
class ChannelDequant:
    """A per-channel dequantizer: `scales` [channels] float32 in DRAM, one per output row (`per_row`) or column;
    the int32 accumulator becomes f32(acc) * scale (`MatrixQuant.dequantize`)."""

    scales: View
    per_row: bool


@dataclass(frozen=True)
class Gemm:
    """One GEMM: `bias` is a view broadcast to [M, N] (stride 0 along rows: per column; along columns: per
    row), `requant` (mult, shift), or a per-channel table, turns the int32 accumulator into int8 on the int8
    path (a `ChannelDequant`: into float32)."""

    a: Operand
    b: Operand | Gathered
    out: View
    bias: View | None = None
    requant: tuple[int, int] | ChannelRequant | ChannelDequant | None = None

    @property
    def int8(self) -> bool:
        return self.requant is not None

    @property
    def out_size(self) -> int:
        """Bytes per element of the int8 path's result tile."""
        return 4 if isinstance(self.requant, ChannelDequant) else 1

    @property
    def bias_mode(self) -> str:
        if self.bias is None:
            return "none"
        if self.bias.strides[0] == 0:
            return "col"
        return "row" if self.bias.strides[1] == 0 else "full"


@dataclass(frozen=True)
class Tiling:
    """Output tiles of `rows` x `cols` (cols at most the array size), K in chunks of `chunk` (a multiple of
    the array size unless it is all of K); split K: `group` column tiles share each step's A chunk (one
    accumulator tile each, all in one accumulator slot), so A is read once per group of column tiles."""

    rows: int
    cols: int
    chunk: int
    group: int = 1


def _operand_bytes(op: Operand, elems: int) -> list[int]:
    sizes = [elems * op.view.dtype.size]
    return sizes + [elems] if op.quantize_scale is not None else sizes


def _k_slices(k: int, n: int) -> list[tuple[int, int]]:
    """The array-wide k-slices (start, length) of [0, k)."""
    return [(s, min(n, k - s)) for s in range(0, k, n)]


def _sizes(g: Gemm, tm: int, tn: int, kc: int, n: int, group: int = 1) -> tuple[list[int], list[int]]:
    """Scratchpad and accumulator bytes of one step's tiles over `group` column tiles (bias and int8 result
    counted on every step)."""
    spad: list[int] = _panel(g).panel_bytes(kc, tn) * group  # one B panel per column tile, k-slices stacked
    for _, kb in _k_slices(kc, n):
        spad += _operand_bytes(g.a, tm * kb)
    per_column: list[int] = []
    mode = g.bias_mode
    if mode != "none":
        per_column.append({"col": tn, "row": tm, "full": tm * tn}[mode] * 4)
    if g.int8:
        per_column.append(tm * tn * g.out_size)
    if isinstance(g.requant, ChannelRequant | ChannelDequant):
        per_channel = 8 if isinstance(g.requant, ChannelRequant) else 4
        per_column.append((tm if g.requant.per_row else tn) * per_channel)
    return spad + per_column * group, [tm * tn * 4] * group


def choose_tiling(cfg: MachineConfig, g: Gemm) -> Tiling:
    """The whole K in one step if at least min(M, array size) rows fit beside it (the matrix unit's fill is
    amortised and A stays resident); else split K (`_split_tiling`)."""
    m, k = g.a.view.shape
    n_arr = cfg.array_size
    tn = min(n_arr, g.out.shape[1])
    probe = TileArena(cfg, 0)
    tm = largest_fitting(min(m, MAX_ROWS), lambda t: probe.fits(*_sizes(g, t, tn, k, n_arr)))
    if tm >= min(m, n_arr):
        return Tiling(tm, tn, k)
    return _split_tiling(cfg, g, tn)


def _split_tiling(cfg: MachineConfig, g: Gemm, tn: int) -> Tiling:
    """Split K, both operands streamed: A is read once per group of column tiles and B once per row block. Of
    the column-tile group sizes whose accumulators fit one slot with at least min(M, array size) rows each (the
    matrix unit's fill stays amortised), the one moving the fewest DRAM bytes whose operands cost the load and
    vector units no more cycles than one column tile per step does (B's panels are many small DMAs and, for a
    conv, masking and stride compaction: regathering them for more row blocks can cost more than A's re-reads
    save)."""
    m, k = g.a.view.shape
    panel = _panel(g)
    columns = panel.columns(tn)
    single = _grouped(cfg, g, tn, 1)
    a_bytes, b_bytes = m * k * g.a.view.dtype.size, len(columns) * panel.panel_bytes(k, tn)[0]
    a_pass, b_pass = _a_pass_cycles(cfg, g, single), _b_pass_cycles(cfg, g, single, columns)

    def cost(t: Tiling) -> tuple[int, int]:
        """(DRAM bytes, load- and vector-unit cycles) of bringing the tiling's operands in."""
        a_passes, b_passes = -(-len(columns) // t.group), -(-m // t.rows)
        return a_bytes * a_passes + b_bytes * b_passes, a_pass * a_passes + b_pass * b_passes

    best, budget = single, cost(single)[1]
    for group in range(2, len(columns) + 1):
        tiling = _grouped(cfg, g, tn, group)
        if tiling.rows < min(m, cfg.array_size):
            break  # more column tiles only leave fewer rows
        if cost(tiling)[1] <= budget and cost(tiling)[0] < cost(best)[0]:
            best = tiling
    return best


def _dma_cycles(cfg: MachineConfig, loads: list[tuple[View, int]]) -> int:
    """Load-unit cycles of these 2-D DMAs (`simulator.timing.dma_cycles`)."""
    return sum(dma_cycles(cfg, v.shape[0], v.shape[1] * v.dtype.size, v.strides[0]) for v, _ in loads)


def _a_pass_cycles(cfg: MachineConfig, g: Gemm, t: Tiling) -> int:
    """Load cycles of reading all of A once in `t`'s row blocks and chunks (slices joined as `_fill` joins them),
    and of quantizing it (a float A on the int8 path)."""
    m, k = g.a.view.shape
    total = 0
    for (i0, rows), (c0, cw) in product(_blocks(m, t.rows), _blocks(k, t.chunk)):
        parts = [g.a.part(i0, rows, c0 + k0, kb) for k0, kb in _k_slices(cw, cfg.array_size)]
        locals_ = np.cumsum([0] + [-(-p.size * p.dtype.size // ALIGN) * ALIGN for p in parts])
        total += _dma_cycles(cfg, _runs([(p, int(at)) for p, at in zip(parts, locals_, strict=False)]))
    quantized = m * k if g.a.quantize_scale is not None else 0
    return total + -(-quantized // cfg.vector_lanes)


def _b_pass_cycles(cfg: MachineConfig, g: Gemm, t: Tiling, columns: list[tuple[int, int]]) -> int:
    """Load and vector cycles of gathering every column tile's B panels once, in `t`'s chunks (the vector
    work priced by the elements it touches at most)."""
    total, panel = 0, _panel(g)
    for (j0, cols), (c0, cw) in product(columns, _blocks(g.a.view.shape[1], t.chunk)):
        total += _dma_cycles(cfg, panel.panel(TileArena(cfg, 0), c0, cw, j0, cols, cols)[1])
        total += -(-panel.prep_elements(cw, cols) // cfg.vector_lanes)
    return total


def _grouped(cfg: MachineConfig, g: Gemm, tn: int, group: int) -> Tiling:
    """Split K over `group` column tiles: the most rows that fit beside one k-slice (the matrix instructions
    and B's reloads fall with the rows), then the longest chunk that fits beside them (rows 0: none fit)."""
    m, k = g.a.view.shape
    n_arr = cfg.array_size
    probe = TileArena(cfg, 0)
    tm = largest_fitting(min(m, MAX_ROWS), lambda t: probe.fits(*_sizes(g, t, tn, n_arr, n_arr, group)))
    if tm == 0 and group == 1:
        raise MemoryPlanError(
            f"a GEMM with K={k} does not fit: one output row of one {n_arr}-wide k-slice needs more than a "
            f"buffer slot of the scratchpad ({probe.spad.size} bytes) or accumulator ({probe.acc.size} bytes)"
        )
    if tm == 0:
        return Tiling(0, tn, 0, group)
    slices = largest_fitting(-(-k // n_arr), lambda c: probe.fits(*_sizes(g, tm, tn, c * n_arr, n_arr, group)))
    return Tiling(tm, tn, min(k, slices * n_arr), group)


@dataclass(frozen=True)
class _Tiles:
    """Local tiles of one operand's k-slices: where the matrix unit reads each slice (raw or quantized)."""

    raw: tuple[int, ...]
    ready: tuple[int, ...]
    dtype: DType


def _alloc(arena: TileArena, op: Operand, slice_elems: list[int]) -> _Tiles:
    raw = tuple(arena.tile(e * op.view.dtype.size) for e in slice_elems)
    if op.quantize_scale is None:
        return _Tiles(raw, raw, op.view.dtype)
    return _Tiles(raw, tuple(arena.tile(e) for e in slice_elems), DType.i8)


def _fill(op: Operand, tiles: _Tiles, parts: list[View], loads: list, quants: list[Emit]) -> None:
    """Load the slices (`_runs`); queue their quantization (float operands on the int8 path)."""
    loads += _runs(list(zip(parts, tiles.raw, strict=True)))
    for part, raw, ready in zip(parts, tiles.raw, tiles.ready, strict=True):
        if op.quantize_scale is not None:

            def quantize(em: Emitter, q=ready, raw=raw, count=part.size, scale=op.quantize_scale) -> None:
                quantize_tile(em, q, raw, count, scale)

            quants.append(quantize)


def _runs(loads: list[tuple[View, int]]) -> list[tuple[View, int]]:
    """Loads of contiguous 2-D blocks of one size, evenly spaced in DRAM and landing back to back (a slab-major
    A's k-slices of one row block), joined into one strided DMA each: one DRAM latency per run, not per slice."""
    runs: list[tuple[View, int, int, int]] = []  # (first load, local, blocks, DRAM gap between blocks)
    for view, local in loads:
        if runs and _contiguous(view):
            first, start, blocks, gap = runs[-1]
            step = view.address - (first.address + (blocks - 1) * gap)
            lands = local == start + blocks * first.size * first.dtype.size
            alike = _contiguous(first) and first.size == view.size and first.dtype == view.dtype
            if alike and lands and step > 0 and (blocks == 1 or step == gap):
                runs[-1] = (first, start, blocks + 1, step)
                continue
        runs.append((view, local, 1, 0))
    return [
        (first if blocks == 1 else View(first.address, (blocks, first.size), (gap, first.dtype.size), first.dtype), at)
        for first, at, blocks, gap in runs
    ]


def _contiguous(view: View) -> bool:
    """A 2-D view whose elements are one contiguous run."""
    es = view.dtype.size
    return len(view.shape) == 2 and view.strides[1] == es and view.strides[0] == view.shape[1] * es


@dataclass(frozen=True)
class _ViewPanel:
    """B as a DRAM view: a panel is one DMA (then quantized on the int8 path when stored float)."""

    op: Operand

    def panel_bytes(self, kc: int, cols: int) -> list[int]:
        return _operand_bytes(self.op, kc * cols)

    def prep_elements(self, kc: int, cols: int) -> int:
        return kc * cols if self.op.quantize_scale is not None else 0

    def panel(self, arena: TileArena, k0: int, kc: int, j0: int, cols: int, width: int) -> tuple[int, list, list[Emit]]:
        tiles = _alloc(arena, self.op, [kc * width])
        loads: list = []
        quants: list[Emit] = []
        _fill(self.op, tiles, [self.op.view.slice(0, k0, kc).slice(1, j0, cols)], loads, quants)
        return tiles.ready[0], loads, quants

    def columns(self, width: int) -> list[tuple[int, int]]:
        return _blocks(self.op.view.shape[1], width)


def _panel(g: Gemm) -> Gathered:
    return _ViewPanel(g.b) if isinstance(g.b, Operand) else g.b


@dataclass
class _Progress:
    """Counters running across the GEMMs of one pipeline: steps, resident blocks, output tiles."""

    steps: list[Step]
    rotation: int  # the buffer slot step 0 uses (`LowerContext.rotation`)
    blocks: int = 0
    tiles: int = 0


def gemm_steps(cfg: MachineConfig, gemms: Sequence[Gemm], rotation: int = 0) -> list[Step]:
    """The tiles of a sequence of same-shaped GEMMs (e.g. a batch), as one pipeline.

    Whole-K tiles: one operand stays resident while the other streams: A's row block (loaded and quantized
    once per block, reused for every column tile), or B's column panel when there is a single column tile and
    several row blocks. Resident tiles sit at the start of the buffer slot of their block's index; streamed
    tiles follow them in the slot of the step's index, so the pipeline's credits cover both (blocks, across
    GEMMs too, rotate through the slots, so a resident region is rewritten DEPTH blocks, hence DEPTH steps,
    later). Split-K tiles stream both operands chunk by chunk. A tile's accumulator sits in the accumulator
    slot of the tile's index: the next tile in that slot starts DEPTH tiles, hence at least DEPTH steps, after
    this tile's last step L, so its first mx.mm follows (matrix unit program order) the matmuls of step
    L + DEPTH, which follow the credit L's store passed on: the reuse is ordered after L's epilogue and store.
    """
    progress = _Progress([], rotation)
    for g in gemms:
        tiling = choose_tiling(cfg, g)
        if tiling.chunk == g.a.view.shape[1]:
            _whole_k(cfg, g, tiling, progress)
        else:
            _split_k(cfg, g, tiling, progress)
    return progress.steps


def _blocks(size: int, step: int) -> list[tuple[int, int]]:
    return [(i0, min(step, size - i0)) for i0 in range(0, size, step)]


def _whole_k(cfg: MachineConfig, g: Gemm, tiling: Tiling, progress: _Progress) -> None:
    m, k = g.a.view.shape
    tm, tn = tiling.rows, tiling.cols
    ks = _k_slices(k, cfg.array_size)
    panel = _panel(g)
    row_blocks = _blocks(m, tm)
    col_blocks = panel.columns(tn)
    a_resident = not (len(col_blocks) == 1 and len(row_blocks) > 1)
    outer, inner = (row_blocks, col_blocks) if a_resident else (col_blocks, row_blocks)
    a_elems = [tm * kb for _, kb in ks]  # A: one tile per k-slice (a column block of A's rows)
    b_bytes = panel.panel_bytes(k, tn)  # B: the k x cols panel; its k-slices are consecutive dense blocks
    for b_index, ob in enumerate(outer, progress.blocks):
        block = TileArena(cfg, b_index, progress.rotation)
        if a_resident:
            a_res = _alloc(block, g.a, a_elems)
        else:
            b_res = panel.panel(block, 0, k, *ob, tn)
        for first, ib in enumerate(inner):
            (i0, rows), (j0, cols) = (ob, ib) if a_resident else (ib, ob)
            arena = TileArena(cfg, len(progress.steps), progress.rotation)
            for size in a_elems if a_resident else b_bytes:  # skip the resident region of this slot
                arena.tile(size * g.a.view.dtype.size if a_resident else size)
            if a_resident and g.a.quantize_scale is not None:
                for size in a_elems:
                    arena.tile(size)
            a_parts = [g.a.part(i0, rows, k0, kb) for k0, kb in ks] if first == 0 or not a_resident else []
            loads: list = []
            quants: list[Emit] = []
            if a_resident:
                a_tiles = a_res
                if first == 0:
                    _fill(g.a, a_tiles, a_parts, loads, quants)
                b_ready, b_loads, b_prep = panel.panel(arena, 0, k, j0, cols, tn)
                loads += b_loads
                quants += b_prep
            else:
                b_ready, b_loads, b_prep = b_res
                if first == 0:
                    loads += b_loads
                    quants += b_prep
                a_tiles = _alloc(arena, g.a, a_elems)
                _fill(g.a, a_tiles, a_parts, loads, quants)
            acc = TileArena(cfg, progress.tiles, progress.rotation).acc_tile(rows * cols * 4)
            chunk = _Chunk(ks, a_tiles, first=True, last=True)
            step = _chunk_step(arena, g, (i0, rows), [_Column(j0, cols, acc, b_ready)], chunk, loads, quants)
            progress.steps.append(step)
            progress.tiles += 1
    progress.blocks += len(outer)


def _split_k(cfg: MachineConfig, g: Gemm, tiling: Tiling, progress: _Progress) -> None:
    """Every group of `tiling.group` output tiles of a row block as a run of K-chunk steps, both operands
    streamed (nothing resident): each step loads the chunk of A once for the group's column tiles."""
    m, k = g.a.view.shape
    chunks = _blocks(k, tiling.chunk)
    columns = _panel(g).columns(tiling.cols)
    groups = [columns[c : c + tiling.group] for c in range(0, len(columns), tiling.group)]
    for (i0, rows), group in product(_blocks(m, tiling.rows), groups):
        accs = TileArena(cfg, progress.tiles, progress.rotation)
        tiles = [(j0, cols, accs.acc_tile(rows * cols * 4)) for j0, cols in group]
        for index, (c0, cw) in enumerate(chunks):
            ks = _k_slices(cw, cfg.array_size)
            arena = TileArena(cfg, len(progress.steps), progress.rotation)
            loads: list = []
            quants: list[Emit] = []
            parts = []
            for j0, cols, acc in tiles:
                b_ready, b_loads, b_prep = _panel(g).panel(arena, c0, cw, j0, cols, cols)
                loads += b_loads
                quants += b_prep
                parts.append(_Column(j0, cols, acc, b_ready))
            a_tiles = _alloc(arena, g.a, [rows * kb for _, kb in ks])
            _fill(g.a, a_tiles, [g.a.part(i0, rows, c0 + k0, kb) for k0, kb in ks], loads, quants)
            chunk = _Chunk(ks, a_tiles, first=index == 0, last=index == len(chunks) - 1)
            progress.steps.append(_chunk_step(arena, g, (i0, rows), parts, chunk, loads, quants))
        progress.tiles += 1


@dataclass(frozen=True)
class _Chunk:
    """One step's share of a tile's K: its k-slices (offsets within B's panels), where A's slices sit, and
    whether it opens (mx.mm) or closes (epilogue, store) the tiles."""

    slices: list[tuple[int, int]]
    a: _Tiles
    first: bool
    last: bool


@dataclass(frozen=True)
class _Column:
    """One output tile of a step: output columns [j0, j0 + cols), its accumulator tile, its matrix-ready B
    panel."""

    j0: int
    cols: int
    acc: int
    b: int


def _chunk_step(
    arena: TileArena,
    g: Gemm,
    block: tuple[int, int],
    columns: list[_Column],
    chunk: _Chunk,
    loads: list,
    quants: list,
) -> Step:
    """The step of rows [i0, i0 + rows) over `columns` (the same A chunk for each)."""
    i0, rows = block
    outs = [_column_epilogue(arena, g, i0, rows, c, chunk.last, loads) for c in columns]
    dt = chunk.a.dtype

    def quantize(em: Emitter) -> None:
        for prepare in quants:
            prepare(em)

    def matmul(em: Emitter) -> None:
        size, name = dt.size, dt.name
        preload, mx_mm, mx_mma = em.emitter("mx_preload"), em.emitter("mx_mm"), em.emitter("mx_mma")  # (unrolled)
        for c in columns:
            for index, (a_addr, (k0, kb)) in enumerate(zip(chunk.a.ready, chunk.slices, strict=True)):
                preload(em.reg(c.b + k0 * c.cols * size), kb, c.cols, name)
                mm = mx_mm if index == 0 and chunk.first else mx_mma
                mm(*em.regs(c.acc, a_addr), rows)

    def epilogue(em: Emitter) -> None:
        for _, emit in outs:
            emit(em)

    compute = [(Unit.vector, quantize)] if quants else []
    compute.append((Unit.matrix, matmul))
    if chunk.last and (g.bias_mode != "none" or g.requant is not None):
        compute.append((Unit.vector, epilogue))
    stores = [(at, g.out.slice(0, i0, rows).slice(1, c.j0, c.cols)) for (at, _), c in zip(outs, columns, strict=True)]
    return Step(loads, compute, stores if chunk.last else [])


def _column_epilogue(
    arena: TileArena, g: Gemm, i0: int, rows: int, c: _Column, last: bool, loads: list
) -> tuple[int, Emit]:
    """One column tile's closing work (on the step closing the tile): its tiles and loads, and where the result
    is (the accumulator itself without an int8 result) with the bias and (int8) requantization or
    dequantization that put it there."""
    j0, cols, acc = c.j0, c.cols, c.acc
    acc_dt = DType.i32 if g.int8 else DType.f32
    mode = g.bias_mode if last else "none"
    bias_addr = 0
    if mode != "none":
        part = g.bias.slice(0, i0, rows).slice(1, j0, cols)
        part = {"col": part.index((0,)), "row": part.permute((1, 0)).index((0,)), "full": part}[mode]
        bias_addr = arena.tile(part.size * 4)
        loads.append((part, bias_addr))
    requant = g.requant if last else None
    out_addr = arena.tile(rows * cols * g.out_size) if requant is not None else acc
    n = rows * cols
    table_addr = 0
    if isinstance(requant, ChannelRequant | ChannelDequant):
        table = requant.table if isinstance(requant, ChannelRequant) else requant.scales
        part = table.slice(0, i0, rows) if requant.per_row else table.slice(0, j0, cols)
        table_addr = arena.tile(part.size * 4)
        loads.append((part, table_addr))

    def epilogue(em: Emitter) -> None:
        if mode == "col":
            em.b.v_add_vr(*em.regs(acc, acc, bias_addr), n, cols, acc_dt.name)
        elif mode == "row":
            em.b.v_add_vc(*em.regs(acc, acc, bias_addr), n, cols, acc_dt.name)
        elif mode == "full":
            em.b.v_add(*em.regs(acc, acc, bias_addr), n, acc_dt.name)
        if isinstance(requant, ChannelRequant):
            per_channel = em.b.v_rqnt_vc if requant.per_row else em.b.v_rqnt_vr
            per_channel(*em.regs(out_addr, acc, table_addr), n, cols)
        elif isinstance(requant, ChannelDequant):
            em.b.v_cvt(*em.regs(out_addr, acc), n, "i32", "f32")
            scale = em.b.v_mul_vc if requant.per_row else em.b.v_mul_vr
            scale(*em.regs(out_addr, out_addr, table_addr), n, cols, "f32")
        elif requant is not None:
            mult, shift = requant
            em.b.v_rqnt(*em.regs(out_addr, acc, mult), shift, n)

    return out_addr, epilogue
