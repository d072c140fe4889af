"""GEMM with a fused epilogue: C = act(A @ B + bias + residual), requantized on the way out of the accumulator.

Each tile's accumulator is drained through the matrix unit's epilogue (`ep.cfg` + `mx.drain`): bias (a per-column
row vector), residual (a tile of the output's shape), ReLU and the int8 requantization happen in the drain, so
none of the consumers' intermediates goes to DRAM. Schedules differ by `tile_m` (activation rows per tile) and
by `flatten` (a batched MatMul with a shared 2-D weight runs as one GEMM over all rows, loading each weight
panel once instead of once per batch). The zero-skip variant tests every activation k-slice with `bz.tile` and
skips its weight preload and matmul when the slice is all zero (the accumulator starts cleared), so sparse
activations cost fewer matrix-unit cycles; it is selected at dispatch time by the data's sparsity class.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fusion.engine.errors import CodegenError
from fusion.lower.emitter import Emitter, Step, f32_bits
from fusion.lower.kernels.gemm import Operand
from fusion.lower.local_alloc import DEPTH, TileArena, largest_fitting
from fusion.lower.memory_plan import align
from fusion.lower.views import MAX_ROWS, View, dense
from isa import BY_MNEMONIC
from isa.enums import Activation, DType, Unit
from simulator import timing
from simulator.config import MachineConfig

COPY_LATENCY, QNT_LATENCY = BY_MNEMONIC["v.copy"].latency, BY_MNEMONIC["v.qnt"].latency
ZERO_SKIP_MAX_PANELS = 12  # 1 + 2 * panels register values per k-slice stay within the emitter's 31 registers


ChainStep = tuple[list, Callable[[Emitter], None], list]  # (loads, the vector unit's emitter, stores)


@dataclass(frozen=True)
class ChainEpilogue:
    """A vector chain run on each drained output tile before it is stored (`codegen.stream` for K or N beyond the
    array): `step(arena, (i0, rows), [(j0, cols, drained tile address), ...])` allocates its operand tiles for one
    step's panels and returns (loads, the vector unit's emitter, stores); `tile_bytes` / `row_bytes` say what it
    allocates per output element (its tile operands and output) and per column (its row operands, loaded once per
    step for all its panels), so the tiling counts them."""

    step: Callable[
        [TileArena, tuple[int, int], list[tuple[int, int, int]]], tuple[list, Callable[[Emitter], None], list]
    ]
    tile_bytes: tuple[int, ...]
    row_bytes: tuple[int, ...]


@dataclass(frozen=True)
class FusedGemm:
    """C[M, N] = epilogue(A[M, K] @ B[K, N]); `bias` is a length-N view, `residual` a view shaped like `out`."""

    a: Operand
    b: Operand
    out: View
    bias: View | None = None
    residual: View | None = None
    relu: bool = False
    requant: tuple[int, int] | None = None  # int8 path: (mult, shift)
    out_scale: float = 1.0  # without requant: the drain writes f32(t) * out_scale (int8 operands: accumulator scale)
    b_panels: View | None = None  # a constant B pre-packed panel-major (P, K, N): one contiguous DMA per panel
    chain: ChainEpilogue | None = None  # applied to each drained tile instead of storing it (`out` is not stored)
    # int8: panel p drains with panel_requant[p % len] instead of `requant` (interleaved GEMMs, `codegen.gated`)
    panel_requant: tuple[tuple[int, int], ...] = ()
    # columns stored to several outputs instead of `out`: (first column, view of those columns as rows x n), in
    # column order (GEMMs side by side, `codegen.siblings`); a tile never straddles two
    split_out: tuple[tuple[int, View], ...] = ()

    def target(self, j0: int) -> tuple[View, int]:
        """The view holding column j0 and the column it starts at."""
        for start, view in reversed(self.split_out):
            if j0 >= start:
                return view, start
        return self.out, 0

    @property
    def int8(self) -> bool:
        return self.requant is not None


def pack_panels(weights: np.ndarray, n_arr: int) -> np.ndarray:
    """A constant K x N weight as (ceil(N / n_arr), K, n_arr) panels, zero-padded: each panel one dense block."""
    k, n = weights.shape
    panels = -(-n // n_arr)
    padded = np.zeros((k, panels * n_arr), dtype=weights.dtype)
    padded[:, :n] = weights
    return np.ascontiguousarray(padded.reshape(k, panels, n_arr).transpose(1, 0, 2))


def k_slices(k: int, n: int) -> list[tuple[int, int]]:
    """(start, length) of the array-wide slices of a length-k axis (the last one may be short)."""
    return [(k0, min(n, k - k0)) for k0 in range(0, k, n)]


def _load_operand(arena: TileArena, op: Operand, part: View, loads: list, quants: list) -> tuple[int, DType]:
    """Load one operand tile; a float operand on the int8 path is quantized (`v.qnt`) into a second tile.
    Returns the local address and dtype the matrix unit reads."""
    raw = arena.tile(part.size * part.dtype.size)
    loads.append((part, raw))
    if op.quantize_scale is None:
        return raw, part.dtype
    q = arena.tile(part.size)
    quants.append((q, raw, part.size, 1.0 / op.quantize_scale))
    return q, DType.i8


@dataclass(frozen=True)
class Schedule:
    tile_m: int = 0  # activation rows per step; 0: the largest that fits a buffer half
    panels: int = 1  # weight-column panels (N wide) per step: A is loaded once for all of them; 0: most that fit
    zero_skip: bool = False
    resident_a: bool = False  # A-stationary loop order: A loaded once per buffer half, steps stream weight panels
    panel_multiple: int = 1  # a step's panels are a multiple of this (a chain epilogue needing whole heads)


def split_a(cfg: MachineConfig, g: FusedGemm, rows: int) -> bool:
    """Whether a row block's A comes in as ONE contiguous DMA, cut into its k-slice tiles on the vector unit (one
    copy, or the int8 quantization, per row and k-slice), instead of one strided DMA per k-slice: where the DMA
    cycles saved exceed the vector cycles added, by the timing rules (ViT's 17 x 64 projections: 4 strided loads
    of 17 rows, ~536 load cycles, become one of ~134-236)."""
    k, es = g.a.view.shape[1], g.a.view.dtype.size
    slices = k_slices(k, cfg.array_size)
    if len(slices) < 2 or not is_dense(g.a.view):
        return False
    strided = sum(timing.dma_cycles(cfg, rows, kb * es, k * es) for _, kb in slices)
    whole = timing.dma_cycles(cfg, 1, rows * k * es, rows * k * es)
    quantize = g.a.quantize_scale is not None
    cut = rows * sum(timing.vector_cycles(cfg, kb, QNT_LATENCY if quantize else COPY_LATENCY) for _, kb in slices)
    before = sum(timing.vector_cycles(cfg, rows * kb, QNT_LATENCY) for _, kb in slices) if quantize else 0
    return strided - whole > cut - before


def panel_width(cfg: MachineConfig, g: FusedGemm, rows: int, cols: int) -> int:
    """Columns of a weight panel loaded for `cols` output columns: a narrow packed panel of a one-row GEMM (a
    classifier on one token) whole, zero padding and all, as one dense DMA instead of one strided row per weight
    row, where the timing rules say it is faster (int8: 4 x fewer bursts); one accumulator row then holds the
    padded columns and its first `cols` drain as they would from a narrow one."""
    n, k, es = cfg.array_size, g.a.view.shape[1], g.b.view.dtype.size
    if g.b_panels is None or rows != 1 or cols == n or g.b.quantize_scale is not None:
        return cols
    whole = timing.dma_cycles(cfg, 1, k * n * es, k * n * es)
    return n if whole < timing.dma_cycles(cfg, k, cols * es, n * es) else cols


def _a_bytes(cfg: MachineConfig, g: FusedGemm, rows: int, cut: bool) -> list[int]:
    """Scratchpad tiles of one row block's A: per k-slice (raw, and quantized), or the whole block and its cut."""
    k, es, quantize = g.a.view.shape[1], g.a.view.dtype.size, g.a.quantize_scale is not None
    slices = k_slices(k, cfg.array_size)
    if cut:
        return [rows * k * es] + [rows * kb * (1 if quantize else es) for _, kb in slices]
    return [size for _, kb in slices for size in [rows * kb * es] + ([rows * kb] if quantize else [])]


def _spad_bytes(
    cfg: MachineConfig, g: FusedGemm, tm: int, panels: int, tn: int, k: int, cut: bool = False
) -> tuple[list[int], list[int]]:
    spad: list[int] = _a_bytes(cfg, g, tm, cut)
    width = panel_width(cfg, g, tm, tn)
    for _ in range(panels):
        spad += [k * width * g.b.view.dtype.size] + ([k * tn] if g.b.quantize_scale is not None else [])
        spad.append(tm * tn * (1 if g.int8 else 4))
        if g.residual is not None:
            spad.append(tm * tn * 4)
        if g.chain is not None:
            spad += [tm * tn * size for size in g.chain.tile_bytes] + [tn * size for size in g.chain.row_bytes]
    if g.bias is not None:
        spad.append(panels * tn * 4)
    return spad, [tm * width * 4] * panels


def _fits(cfg: MachineConfig, g: FusedGemm, tm: int, panels: int, cut: bool = False) -> bool:
    k = g.a.view.shape[1]
    tn = min(cfg.array_size, g.out.shape[1])
    return TileArena(cfg, 0).fits(*_spad_bytes(cfg, g, tm, panels, tn, k, cut))


def cut_a(cfg: MachineConfig, g: FusedGemm, tm: int, panels: int) -> bool:
    """Whether the schedule's row blocks load A whole and cut it on chip (`split_a`), where the extra whole-block
    tile fits beside the step's tiles (the tiling itself is chosen without it, so it stays monotone in rows)."""
    return split_a(cfg, g, tm) and _fits(cfg, g, tm, panels, cut=True)


def plan_tiles(cfg: MachineConfig, g: FusedGemm, schedule: Schedule) -> tuple[int, int]:
    """(tile rows, panels per step) for the schedule: requested values, capped by what fits a buffer half."""
    m, k = g.a.view.shape
    all_panels = -(-g.out.shape[1] // cfg.array_size)
    want_panels = min(schedule.panels or all_panels, all_panels)
    if schedule.zero_skip:  # a skipped block must find every register it uses already loaded (see _tile_step)
        want_panels = min(want_panels, ZERO_SKIP_MAX_PANELS)
    rows_limit = MAX_ROWS if g.chain is None else cfg.vreg_elems // cfg.array_size  # a chain's tile: one register
    tm = largest_fitting(min(m, rows_limit), lambda t: _fits(cfg, g, t, schedule.panel_multiple))
    if tm == 0:
        raise CodegenError(f"a fused GEMM with K={k} does not fit a buffer half of the scratchpad or accumulator")
    if schedule.tile_m:
        tm = min(schedule.tile_m, tm)
    elif want_panels > 1:  # "largest that fits" beside the requested panels, so A is reused across all of them
        tm = largest_fitting(tm, lambda t: _fits(cfg, g, t, want_panels)) or tm
    unit = schedule.panel_multiple
    panels = unit * largest_fitting(-(-want_panels // unit), lambda p: _fits(cfg, g, tm, p * unit))
    if panels == 0 and unit > 1:
        raise CodegenError(f"{unit} weight panels (a step's least) do not fit a buffer half beside {tm} rows")
    return tm, max(panels, 1)


def fused_gemm_steps(
    cfg: MachineConfig,
    g: FusedGemm,
    schedule: Schedule,
    start: int = 0,
    block: int = 0,
    alone: bool = False,
    rotation: int = 0,
) -> list[Step]:
    """The tiles of one fused GEMM: output-row blocks outer, groups of `panels` weight-column panels inner.

    A row block's A tiles are loaded (and quantized) once, by its first step, into the buffer slot of the block's
    index `block + i` (blocks rotate through the slots); every step's own slot keeps a full block's region free
    (the last block may be shorter) and holds the streamed weight panels and outputs after it, as in the baseline
    GEMM (`fusion.lower.kernels.gemm`): block
    b + DEPTH starts at least DEPTH steps after block b's last, so its load waits on a later store. With
    `resident_a` (all rows in one tile) a prologue step loads A once and copies it into the other buffer slots,
    and every later step only streams its weight panels. A program's only GEMM (`alone`) with a single row block
    keeps its A in the spare scratchpad banks instead (`TileArena.spare`; A-stationary: no copies), so no later
    step's weight DMA lands in the bank the matrix unit reads A from (a bank conflict stalls one of them)."""
    m, _ = g.a.view.shape
    n_out = g.out.shape[1]
    tm, panels = plan_tiles(cfg, g, schedule)
    cut = cut_a(cfg, g, tm, panels)
    if schedule.resident_a and tm < m:
        raise CodegenError(f"A-stationary order needs all {m} rows in one tile (at most {tm} fit)")
    width = panels * cfg.array_size
    steps = []
    resident = None  # A-stationary: A's k-slices in the spare banks, shared by every step (None: a copy per slot)
    if schedule.resident_a:
        resident = _spare_a(cfg, g, m, alone, cut)
        steps.append(_resident_prologue(cfg, g, m, start, resident, rotation, cut))
    for index, i0 in enumerate(range(0, m, tm)):
        rows = min(tm, m - i0)
        a_loads: list = []
        a_quants: list = []
        if not schedule.resident_a:
            spare = TileArena.spare(cfg) if alone and rows == m and _a_fits(cfg, g, rows, cut) else None
            arena = spare or TileArena(cfg, block + index, rotation)
            a_block = _a_tiles(cfg, arena, g, i0, rows, a_loads, a_quants, cut)
        for j0 in range(0, n_out, width):
            arena = TileArena(cfg, start + len(steps), rotation)
            a_here = _a_tiles(cfg, arena, g, 0, tm, [], [], cut)  # this slot's A copy (A-stationary) or a block gap
            a_slices = (resident or a_here) if schedule.resident_a else a_block
            cols = [(j, min(cfg.array_size, n_out - j)) for j in range(j0, min(n_out, j0 + width), cfg.array_size)]
            step = _tile_step(cfg, arena, g, (i0, rows), cols, schedule.zero_skip, a_slices, a_loads, a_quants)
            a_loads, a_quants = [], []  # the block's later steps reuse its A
            if schedule.resident_a:  # order the matrix unit after the prologue's copy (a vector -> matrix token)
                step = Step(step.loads, [(Unit.vector, _nothing), *step.compute], step.stores)
            steps.append(step)
    return steps


def row_blocks(cfg: MachineConfig, g: FusedGemm, schedule: Schedule) -> int:
    """How many row blocks `fused_gemm_steps` uses (the next GEMM of a batch starts its blocks after them)."""
    tm, _ = plan_tiles(cfg, g, schedule)
    return -(-g.a.view.shape[0] // tm)


def _a_tiles(
    cfg: MachineConfig, arena: TileArena, g: FusedGemm, i0: int, rows: int, loads: list, quants: list, cut: bool
) -> list:
    """Allocate (and, into `loads`/`quants`, schedule) the k-slices of A's row tile: (k0, kb, address, dtype);
    `cut`: loaded whole and cut on chip (`cut_a`)."""
    if cut:
        return _cut_tiles(cfg, arena, g, i0, rows, loads, quants)
    out = []
    for k0, kb in k_slices(g.a.view.shape[1], cfg.array_size):
        a_addr, dt = _load_operand(arena, g.a, g.a.view.slice(0, i0, rows).slice(1, k0, kb), loads, quants)
        out.append((k0, kb, a_addr, dt))
    return out


def _cut_tiles(cfg: MachineConfig, arena: TileArena, g: FusedGemm, i0: int, rows: int, loads: list, quants: list):
    """A's row block loaded whole, then each row's k-slice runs copied (or quantized) into the k-slice tiles."""
    k, es = g.a.view.shape[1], g.a.view.dtype.size
    raw = arena.tile(rows * k * es)
    loads.append((g.a.view.slice(0, i0, rows), raw))
    inv = None if g.a.quantize_scale is None else 1.0 / g.a.quantize_scale
    dt = g.a.view.dtype if inv is None else DType.i8
    out = []
    for k0, kb in k_slices(k, cfg.array_size):
        tile = arena.tile(rows * kb * dt.size)
        quants += [(tile + r * kb * dt.size, raw + (r * k + k0) * es, kb, inv, dt) for r in range(rows)]
        out.append((k0, kb, tile, dt))
    return out


def _a_fits(cfg: MachineConfig, g: FusedGemm, rows: int, cut: bool) -> bool:
    """Whether one row block's A (all k-slices, raw and quantized) fits the spare banks."""
    spare = TileArena.spare(cfg)
    if spare is None:
        return False
    return spare.fits(_a_bytes(cfg, g, rows, cut))


def coalesced(loads: list[tuple[View, int]]) -> list[tuple[View, int]]:
    """Adjacent loads of dense views that continue each other in DRAM and in local memory as one load (a step's
    packed weight panels: one DMA latency instead of one per panel). A view may also start at the next aligned
    address after the previous one's end, in DRAM (`memory_plan.align`: no buffer starts in between) and locally
    (`TileArena.tile`) alike: the padding is read along, in the burst the previous view's end needs anyway (a
    bias and the packed weight panel after it)."""
    out: list[tuple[View, int]] = []
    for view, local in loads:
        if out:
            prev, at = out[-1]
            end, at_end = prev.address + prev.size * prev.dtype.size, at + prev.size * prev.dtype.size
            padded = view.address in (end, align(end)) and local - at_end == view.address - end
            if padded and is_dense(prev) and is_dense(view):
                total = view.address + view.size * view.dtype.size - prev.address
                same = prev.dtype == view.dtype and total % view.dtype.size == 0
                dt = view.dtype if same else DType.i8  # a raw byte copy: the DMA converts nothing
                out[-1] = (dense(prev.address, (total // dt.size,), dt), at)
                continue
        out.append((view, local))
    return out


def is_dense(view: View) -> bool:
    """One row-major block at its address: a size-1 axis's stride is never used, so a broadcast one (0) is dense."""
    row_major = dense(view.address, view.shape, view.dtype)
    return all(n == 1 or s == t for n, s, t in zip(view.shape, view.strides, row_major.strides, strict=True))


def _nothing(em: Emitter) -> None:
    return None


def _spare_a(cfg: MachineConfig, g: FusedGemm, m: int, alone: bool, cut: bool) -> list | None:
    """A's k-slices allocated in the spare banks, when the GEMM is its program's only one and A fits there."""
    spare = TileArena.spare(cfg) if alone and _a_fits(cfg, g, m, cut) else None
    return None if spare is None else _a_tiles(cfg, spare, g, 0, m, [], [], cut)


def _resident_prologue(
    cfg: MachineConfig, g: FusedGemm, m: int, start: int, spare: list | None, rotation: int, cut: bool
) -> Step:
    """Load (and quantize) A once: into the spare banks (`spare`: its tiles there), or into this step's buffer
    slot and then copied locally into the other slots."""
    loads: list = []
    quants: list = []
    if spare is not None:
        _a_tiles(cfg, TileArena.spare(cfg), g, 0, m, loads, quants, cut)  # the same addresses as `spare`
        return Step(loads, [(Unit.vector, _quantizer(quants))], [])
    here = _a_tiles(cfg, TileArena(cfg, start, rotation), g, 0, m, loads, quants, cut)
    others = [_a_tiles(cfg, TileArena(cfg, start + d, rotation), g, 0, m, [], [], cut) for d in range(1, DEPTH)]

    def copy(em: Emitter) -> None:
        _quantizer(quants)(em)
        for there in others:
            for (_, kb, src, dt), (_, _, dst, _) in zip(here, there, strict=True):
                em.b.v_copy(*em.regs(dst, src), m * kb, dt.name)

    return Step(loads, [(Unit.vector, copy)], [])


def _quantizer(quants: list):
    """(destination, source, count, 1 / scale) entries as `v.qnt`; (.., None, dtype) as a `v.copy` (a cut of A)."""

    def quantize(em: Emitter) -> None:
        for q, raw, count, inv, *dtype in quants:
            if inv is None:
                em.b.v_copy(*em.regs(q, raw), count, dtype[0].name)
            else:
                em.b.v_qnt(*em.regs(q, raw, f32_bits(inv)), count)

    return quantize


def _epilogue_mode(g: FusedGemm) -> tuple[str, Activation, str]:
    flags = {(False, False): "none", (True, False): "bias", (False, True): "res", (True, True): "bias_res"}
    act = Activation.relu if g.relu else Activation.none
    return flags[(g.bias is not None, g.residual is not None)], act, "i8" if g.int8 else "f32"


def _tile_step(
    cfg: MachineConfig,
    arena: TileArena,
    g: FusedGemm,
    block: tuple[int, int],
    panels: list,
    zero_skip: bool,
    a_slices: list,
    a_loads: list,
    a_quants: list,
) -> Step:
    """One step: the row block's (first row, rows) A k-slices (loaded by this step when `a_loads` is not empty)
    times `panels`."""
    i0, rows = block
    loads: list = list(a_loads)
    quants: list = list(a_quants)
    j_first, span = panels[0][0], panels[-1][0] + panels[-1][1] - panels[0][0]
    bias_addr = 0
    if g.bias is not None:
        bias_addr = arena.tile(span * 4)
        loads.append((g.bias.slice(0, j_first, span), bias_addr))
    tiles = []  # per panel: (cols, weight panel address and width, dtype size, residual, accumulator, output)
    weights = []  # every panel's weights first: packed panels then sit back to back, one load (`coalesced`)
    for j0, cols in panels:
        width = panel_width(cfg, g, rows, cols)
        part = g.b.view.slice(1, j0, cols) if g.b_panels is None else g.b_panels.index((j0 // cfg.array_size,))
        weights.append((width, *_load_operand(arena, g.b, part.slice(1, 0, width), loads, quants)))
    for (j0, cols), (width, b_addr, b_dt) in zip(panels, weights, strict=True):
        res = 0
        if g.residual is not None:
            res = arena.tile(rows * cols * 4)
            loads.append((g.residual.slice(0, i0, rows).slice(1, j0, cols), res))
        out = arena.tile(rows * cols * g.out.dtype.size)
        tiles.append((j0, (cols, width), b_addr, b_dt.size, res, arena.acc_tile(rows * width * 4), out))
    flags, act, out_dt = _epilogue_mode(g)
    mult, shift = g.requant if g.requant is not None else (f32_bits(g.out_scale), 0)

    def clear(em: Emitter) -> None:  # integer zero bits are also f32 zeros
        for _, (_, width), _, _, _, acc, _ in tiles:
            em.b.v_sub(*em.regs(acc, acc, acc), rows * width, "i32")

    def matmul(em: Emitter) -> None:
        preload, mx_mm, mx_mma = em.emitter("mx_preload"), em.emitter("mx_mm"), em.emitter("mx_mma")  # (unrolled)
        for index, (k0, kb, a_addr, dt) in enumerate(a_slices):
            ra = em.reg(a_addr)
            skip = em.local_label("zs")
            if zero_skip:
                for _, (_, width), b_addr, es, _, acc, _ in tiles:  # every register before the branch
                    em.regs(a_addr, b_addr + k0 * width * es, acc)
                ra = em.reg(a_addr)
                em.b.bz_tile(ra, rows * kb, dt.name, skip)
            for _, (_, width), b_addr, es, _, acc, _ in tiles:
                preload(em.reg(b_addr + k0 * width * es), kb, width, dt.name)
                mm = mx_mm if index == 0 and not zero_skip else mx_mma
                mm(*em.regs(acc, a_addr), rows)
            if zero_skip:
                em.b.label(skip)
        for j0, (cols, _), _, _, res, acc, out in tiles:
            rq = g.panel_requant[j0 // cfg.array_size % len(g.panel_requant)] if g.panel_requant else (mult, shift)
            em.b.ep_cfg(*em.regs(bias_addr + (j0 - j_first) * 4, res, rq[0]), rq[1], act, flags, out_dt)
            em.b.mx_drain(*em.regs(out, acc), rows, cols)

    compute: list = [(Unit.vector, _quantizer(quants))] if quants else []
    if zero_skip:
        compute += [(Unit.vector, clear), (Unit.scalar, lambda em: None)]
    compute.append((Unit.matrix, matmul))
    if g.chain is None:
        stores = []
        for j0, (cols, _), _, _, _, _, out in tiles:
            view, start = g.target(j0)
            stores.append((out, view.slice(0, i0, rows).slice(1, j0 - start, cols)))
        return Step(coalesced(loads), compute, stores)
    more_loads, emit, stores = g.chain.step(arena, block, [(j0, cols, out) for j0, (cols, _), _, _, _, _, out in tiles])
    compute.append((Unit.vector, emit))
    return Step(coalesced(loads) + more_loads, compute, stores)
