"""Lower bounds on a group's kernel time from shapes alone, to skip generating dominated schedules.

Planning generates, links and counts a kernel for every schedule it compares; most of that time goes to GEMM
schedules that cannot win. Every GEMM schedule issues at least one `mx.mm` per (GEMM, weight panel, k-slice)
of its orientation and streams a known number of rows in total: the pipelined array needs at least a preload's
time per weight tile or a cycle per row, whichever is more, plus one 2N - 1 skew (`timing.matrix_lower_bound`),
which bounds the analytic model's prediction and the simulated cycles from below, so a schedule whose bound is
above the best prediction so far is never built (branch and bound). The conv schedules count the same from
their geometry (`band_bound`, `packed_bound`, `stationary_bound`; a conv chain's, `chain_bound`, what its band
steps issue: every band recomputes each stage's halo rows), the unfused baseline's Conv its matrix or its load
unit (`baseline_conv_bound`: a DMA per tap and column block, so the plan guard never builds the stem's baseline
to find it past dynamic's cycles). Other strategies get bound 0 (always built). The strategy record names its
bound (`strategies.shape_bound`).

`cycle_bound` bounds a built kernel's simulated cycles from its counted program (the busiest unit's least busy
time, `unit_bounds`: an unfused Relu is DRAM time, an unfused conv the load unit's), so a measurement that only
matters under a budget (`planner.Evaluator.measured_within`: the plan guard's rivals, `settle`'s) is not simulated
when the bound is already past it (tests/fusion/engine/test_bounds_property.py holds it below the simulator).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

import numpy as np

from fusion.engine.codegen.conv import band_geometry, conv_shape
from fusion.engine.codegen.conv_chain import band_ranges, band_rows, chain_sizes, parse_chain
from fusion.engine.codegen.conv_packed import block_width, pieces
from fusion.engine.codegen.gemm import k_slices
from fusion.engine.codegen.matrix_group import EPILOGUE_HEADS
from fusion.engine.codegen.swapped import matrix_head
from fusion.engine.context import ModelContext
from fusion.engine.errors import CodegenError
from fusion.engine.plan import Group
from fusion.graph.ops import OpType
from fusion.lower.kernels.conv_depthwise import is_depthwise
from fusion.lower.kernels.conv_geometry import ConvGeometry
from fusion.lower.kernels.windows import Window, window_of
from fusion.lower.views import MAX_ROWS
from isa import INSTRUCTIONS
from simulator import timing
from simulator.config import MachineConfig

if TYPE_CHECKING:  # fusion.cost imports the strategies, which import this module
    from fusion.cost.interface import KernelFeatures


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _gemm_shape(mc: ModelContext, group: Group) -> tuple[int, int, int, int] | None:
    """(m, k, n, batch) of the group's matrix node, None when it has no 2-D-or-more matrix operands."""
    graph = mc.graph
    head = matrix_head([graph.node(n) for n in group.nodes])
    if head.op not in EPILOGUE_HEADS:
        return None
    a, b = (graph.types[v].shape for v in head.inputs[:2])
    if len(a) < 2 or len(b) < 2:
        return None
    return a[-2], a[-1], b[-1], math.prod(np.broadcast_shapes(a[:-2], b[:-2]))


def _cycles(mc: ModelContext, instrs: int, rows: int) -> float:
    return timing.matrix_lower_bound(mc.config, instrs, rows)


def gemm_bound(mc: ModelContext, group: Group) -> float:
    """One preload + mm per (GEMM, panel, k-slice); each GEMM streams its rows once per panel and k-slice."""
    shape = _gemm_shape(mc, group)
    if shape is None:
        return 0.0
    m, k, n, batch = shape
    n_arr = mc.config.array_size
    gemms = 1 if group.flatten else batch
    per_gemm = m * batch if group.flatten else m
    instrs = gemms * _ceil(n, n_arr) * _ceil(k, n_arr)
    return _cycles(mc, instrs, gemms * per_gemm * _ceil(n, n_arr) * _ceil(k, n_arr))


def swapped_bound(mc: ModelContext, group: Group) -> float:
    """The swapped orientation: n_out rows streamed per k-slice, one A^T preload per k-slice."""
    shape = _gemm_shape(mc, group)
    if shape is None:
        return 0.0
    _, k, n, _ = shape
    k_slices = _ceil(k, mc.config.array_size)
    return _cycles(mc, k_slices, n * k_slices)


@cache
def _latencies() -> tuple[int, int, int]:
    """The least ISA-table latency of a vector pass, of a chain op and of a drain (as `features` counts them):
    each adds at least that to its unit's time."""
    from fusion.engine.features import CHAIN_TIMINGS, PASS_TIMINGS  # (features -> strategies -> this module)

    def least(timings: frozenset[str]) -> int:
        return min((spec.latency for spec in INSTRUCTIONS if spec.timing in timings), default=0)

    return least(PASS_TIMINGS), least(CHAIN_TIMINGS), least(frozenset({"drain"}))


@dataclass(frozen=True)
class UnitBounds:
    """Lower bounds on the busy time of each unit (and the DRAM channel) from a kernel's counted instructions, by
    the rules of `simulator.timing` as `simulator.engine` applies them; the kernel takes at least the largest."""

    issue: int  # the scalar unit issues every instruction, `scalar_cycles` each
    load: int  # a DMA holds its unit from its start to its data's end: `dram_latency` + its bursts' transfer
    store: int
    channel: int  # every burst crosses the one DRAM channel, after the first access's latency
    vector: int  # a pass: ceil(n / lanes) beats + its pipeline; a chain op: its pipeline (one at a time)
    matrix: int  # preloads in turn on the weight port, rows one per cycle, waits for results, drains
    phased: int  # fenced phases run one after another: the pipelined phases' busiest DMA or vector unit + the
    # serial phases' busiest

    @property
    def cycles(self) -> int:
        return max(self.issue, self.load, self.store, self.channel, self.vector, self.matrix, self.phased)


def _dma(cfg: MachineConfig, transfers: int, bursts: int) -> int:
    """A DMA unit's least busy time for `transfers` transfers of `bursts` bursts in all: each waits the DRAM
    latency, then moves its bursts (`timing.dma_transfer_cycles`: a ceiling per transfer, at least the sum's,
    which is the time of the bursts as one contiguous transfer)."""
    burst = cfg.burst_bytes
    return transfers * cfg.dram_latency + timing.dma_transfer_cycles(cfg, bursts, burst, burst)


def _vector(cfg: MachineConfig, passes: int, elems: int, chain_ops: int) -> int:
    pass_latency, chain_latency, _ = _latencies()
    streamed = timing.vector_cycles(cfg, elems, passes * pass_latency)  # the passes' beats and pipelines
    return streamed + chain_ops * timing.chain_op_cycles(cfg, chain_latency)


def _matrix(cfg: MachineConfig, feats: KernelFeatures) -> int:
    """The matrix unit in program order (`engine.MatrixPipe`): preloads one after another, rows one per cycle; an
    instruction waiting for every earlier result right after a matmul (`matrix_segments`) starts only once that
    matmul's last row is out (2N - 1 after it entered), and a drain holds the whole unit for its rows and
    pipeline, so a later preload or matmul starts after it. The last results are out 2N - 1 after the last row."""
    preloads, rows = feats.preloads, feats.matmul_rows
    base = timing.matrix_lower_bound(cfg, preloads, rows)
    drains = timing.drain_cycles(cfg, feats.drain_rows, feats.drains * _latencies()[2])
    skew = timing.matmul_cycles(cfg, 0)
    streamed = rows + max(feats.matrix_segments, 1) * skew if rows else 0
    return max(base, preloads * timing.preload_cycles(cfg) + drains, streamed + drains)


def unit_bounds(cfg: MachineConfig, feats: KernelFeatures) -> UnitBounds:
    """Every unit's lower bound (`UnitBounds`) for a kernel whose counted instructions are the executed ones."""
    dma = feats.dma_loads + feats.dma_stores
    load = _dma(cfg, feats.dma_loads, feats.load_bursts)
    store = _dma(cfg, feats.dma_stores, feats.store_bursts)
    vector = _vector(cfg, feats.vector_instrs, feats.vector_pass_elems, feats.chain_ops)
    serial = (
        _dma(cfg, feats.serial_loads, feats.serial_load_bursts),
        _dma(cfg, feats.serial_stores, feats.serial_store_bursts),
        _vector(cfg, feats.serial_vector_instrs, feats.serial_vector_elems, feats.serial_chain_ops),
    )
    pipelined = (
        _dma(cfg, feats.dma_loads - feats.serial_loads, feats.load_bursts - feats.serial_load_bursts),
        _dma(cfg, feats.dma_stores - feats.serial_stores, feats.store_bursts - feats.serial_store_bursts),
        _vector(
            cfg,
            feats.vector_instrs - feats.serial_vector_instrs,
            feats.vector_pass_elems - feats.serial_vector_elems,
            feats.chain_ops - feats.serial_chain_ops,
        ),
    )
    return UnitBounds(
        issue=feats.instructions * timing.scalar_cycles(cfg),
        load=load,
        store=store,
        channel=(cfg.dram_latency if dma else 0) + _dma(cfg, 0, feats.load_bursts + feats.store_bursts),
        vector=vector,
        matrix=_matrix(cfg, feats),
        phased=max(pipelined) + max(serial),
    )


def _conv(mc: ModelContext, group: Group, packed: bool) -> ConvGeometry | None:
    """The geometry of the group's head Conv as the matrix-unit conv generators see it (`codegen.conv.conv_shape`,
    `packed`: taps packed into K), None where they refuse it."""
    try:
        return conv_shape(mc.graph, mc.config, mc.graph.node(group.nodes[0]), packed)
    except CodegenError:
        return None


def _banded(mc: ModelContext, per_band: int, out_rows: int, pitch: int, valid: int) -> float:
    """A conv schedule of `per_band` preloads per band of output rows, each streaming the band's computed
    positions, (rows - 1) * pitch + valid for `rows` rows (at most MAX_ROWS): with b bands, b * per_band preloads
    stream (out_rows - b) * pitch + b * valid positions each. More bands, more preloads and fewer rows: the least
    over every band count bounds any tiling."""
    tallest = max(1, (MAX_ROWS - valid) // pitch + 1)
    bands = range(_ceil(out_rows, tallest), out_rows + 1)
    return min(_cycles(mc, per_band * b, per_band * ((out_rows - b) * pitch + b * valid)) for b in bands)


def band_bound(mc: ModelContext, group: Group) -> float:
    """The band schedule (`codegen.conv`): per band, output channel tile, tap and input channel block, one preload
    and one matmul streaming the band over the padded width (`ConvGeometry.stream_rows`; the stem's 49 taps of 3
    channels: 4.6x its channels-last schedule's time)."""
    s = _conv(mc, group, False)
    if s is None:
        return 0.0
    s = band_geometry(mc.graph, mc.graph.node(group.nodes[0]), s)[0]
    n = mc.config.array_size
    return _banded(mc, s.n * s.groups * _ceil(s.coutg, n) * s.taps * _ceil(s.cg, n), s.out[0], s.pitch, s.valid)


def packed_bound(mc: ModelContext, group: Group) -> float:
    """The channels-last schedule (`codegen.conv_packed`): per band, output channel tile and K piece, one preload
    and one matmul streaming `positions` per output row up to the band's last kept pixel."""
    s = _conv(mc, group, True)
    if s is None:
        return 0.0
    n = mc.config.array_size
    per_band = s.n * s.groups * _ceil(s.coutg, n) * len(pieces(s, n, block_width(n, s)))
    return _banded(mc, per_band, s.out[0], s.positions, s.out[1])


def stationary_bound(mc: ModelContext, group: Group) -> float:
    """The patch-stationary schedule (`codegen.conv_stationary`): per band of at most N output pixels and K piece,
    one preload of the patch, every output channel of the group streamed through it as a row."""
    s = _conv(mc, group, True)
    if s is None:
        return 0.0
    n = mc.config.array_size
    preloads = s.n * s.groups * _ceil(s.out[0] * s.out[1], n) * len(pieces(s, n))
    return _cycles(mc, preloads, preloads * s.coutg)


def chain_bound(mc: ModelContext, group: Group) -> float:
    """A conv chain's matrix-unit time from its shapes (`codegen.conv_chain`): per band and stage, one preload per
    (Cout tile, tap, input channel block) (a depthwise stage: its tile's own block), each streaming the stage's
    rows of the band with their halo (a vertically strided stage: each output row's positions alone). 0 when the
    chain does not run in this schedule (the generator says why)."""
    graph, cfg = mc.graph, mc.config
    try:
        chain = parse_chain(graph, [graph.node(n) for n in group.nodes], cfg)
        rows = band_rows(cfg, chain_sizes(graph, cfg, mc.qplan, chain, group.resident_a), group.tile_m)
    except CodegenError:
        return 0.0
    n = cfg.array_size
    last = chain.stages[-1].s
    preloads = streamed = 0
    for o0, r in k_slices(last.out[0], rows):
        for st, (a, b) in zip(chain.stages, band_ranges(chain, o0, r), strict=True):
            s = st.s
            run = s.stream_rows(b - a) if s.strides[0] == 1 else (b - a) * s.valid
            tiles = _ceil(s.cout, n) * s.taps * (1 if st.depthwise else _ceil(s.c, n))
            preloads += tiles
            streamed += tiles * run
    images = last.n
    return _cycles(mc, images * preloads, images * streamed)


def _taps_read(mc: ModelContext, w: Window) -> np.ndarray:
    """For the baseline's implicit GEMM Conv (`lower.kernels.conv_implicit`), per kernel row, kernel column and
    column block (at most N output positions: inside one output row, or any run for a "same" stride-1 conv):
    whether the tap reads some element inside the image there (a tap reading only padding is zeroed, not
    loaded)."""
    lift = 2 - w.s  # a 1-D conv as a 2-D one of height 1
    kernel, strides, dilations = (1,) * lift + w.kernel, (1,) * lift + w.strides, (1,) * lift + w.dilations
    begins, size, out = (0,) * lift + w.pads[: w.s], (1,) * lift + w.in_shape[2:], (1,) * lift + w.out_spatial

    def inside(axis: int) -> np.ndarray:  # [kernel offset, output index]: the input index is in the image
        at = np.arange(out[axis]) * strides[axis] - begins[axis] + (np.arange(kernel[axis]) * dilations[axis])[:, None]
        return (at >= 0) & (at < size[axis])

    reads = inside(0)[:, None, :, None] & inside(1)[None, :, None, :]  # [kh, kw, output row, output column]
    n = mc.config.array_size
    width = out[0] * out[1] if strides == (1, 1) and size[1] == out[1] else out[1]
    runs = reads.reshape(*kernel, -1, width)
    padded = np.zeros((*runs.shape[:3], _ceil(width, n) * n), bool)
    padded[..., :width] = runs
    return padded.reshape(*kernel, -1, n).any(axis=3)


def baseline_conv_bound(mc: ModelContext, group: Group) -> float:
    """The unfused baseline's Conv (`lower.kernels.conv_implicit`), whichever is more: its matrix unit (per image,
    group, column block and K slice one preload, the group's output channels streamed through it), or its load
    unit, each DMA waiting the DRAM latency: per column block, one DMA per tap used there (K tap-major, a tap's
    channels are rows a plane apart) or per channel and kernel row used (channel-major: a kernel row's taps,
    evenly spaced, join one DMA, and so may the next kernel row's or channel's where they continue the spacing),
    and each channel row of a used tap a burst of its own (the rows of a block spanning the whole plane may be
    contiguous: a burst per tap then). 0 for any other node, and for a depthwise Conv (the baseline's vector
    kernel, `lower.kernels.conv_depthwise`: mobilenet_v2's were bounded up to 16x past their cycles)."""
    graph, cfg = mc.graph, mc.config
    node = graph.node(group.nodes[0])
    if len(group.nodes) != 1 or node.op != OpType.Conv or is_depthwise(graph, node):
        return 0.0  # (a depthwise Conv runs on the vector unit where its kernel applies: `lower.kernels.windows`)
    w = window_of(graph, node)
    used = _taps_read(mc, w)
    kh, kw, blocks = used.shape
    x, (cout, cg, *_) = graph.types[node.inputs[0]].shape, graph.types[node.inputs[1]].shape
    groups, n = node.attr("group"), cfg.array_size
    per_block = used.reshape(kh * kw, blocks).sum(axis=0)  # taps used per column block
    if cg >= kw:  # tap-major: a tap's channels one DMA, of 2 rows or more wherever K chunks cut them (only
        # one-row loads join another's run); fewer channels: at least one DMA per column block
        transfers = int(per_block.sum()) if cg >= 3 else int(np.count_nonzero(per_block))
    else:  # channel-major: one-row loads, joined while they keep the spacing of a kernel row's taps
        width, dh, dw = x[-1], w.dilations[0] if w.s == 2 else 0, w.dilations[-1]
        plane = math.prod(x[2:])
        next_row = w.s == 2 and width * dh == kw * dw  # a kernel row's run continues into the next kernel row's
        next_channel = plane - (kh - 1) * width * dh - (kw - 1) * dw == dw  # ... into the next channel's
        if next_channel:
            transfers = int(np.count_nonzero(per_block))
        else:
            transfers = cg * int(np.count_nonzero(per_block) if next_row else used.any(axis=1).sum())
    bursts = int(per_block.sum()) * (1 if blocks == 1 else cg)
    preloads = x[0] * groups * blocks * _ceil(cg * kh * kw, n)
    load = _dma(cfg, x[0] * groups * transfers, x[0] * groups * bursts)
    return max(_cycles(mc, preloads, preloads * (cout // groups)), load)


def cycle_bound(mc: ModelContext, feats: KernelFeatures) -> int:
    """A lower bound on the simulated cycles of a kernel whose program runs without zero tests (every generator
    but the zero-skip ones emits no branch; the conv generators' `loopi` bodies are counted as they issue,
    `features.program_counts`), so its counted instructions are the executed ones: the busiest unit's least busy
    time (`unit_bounds`: the scalar issue, the DMA units and the DRAM channel, the vector and matrix units). 0 for
    a kernel that tests tiles."""
    if feats.zero_tests:
        return 0
    return unit_bounds(mc.config, feats).cycles
