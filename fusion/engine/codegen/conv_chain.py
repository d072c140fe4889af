"""Layer fusion (depth-first execution) of consecutive convolutions (`conv_chain`): a ResNet basic block (3x3 ->
3x3, + the residual Add of the block input), a bottleneck (1x1 -> 3x3 -> 1x1), a MobileNetV2 inverted residual
(1x1 expand -> ReLU6 -> 3x3 depthwise -> ReLU6 -> 1x1 project, + the block input), any chain of ungrouped or
depthwise Convs each read only by the next, computed band by band with every intermediate kept in the scratchpad
(an inverted residual's 6x expanded tensor never reaches DRAM).

The last Conv's output is computed in bands of `rows` output rows. Each band needs a range of rows of every
intermediate (with the halo its consumer's kernel reads: recomputed by the neighbouring band, never stored), and
of the chain input. Each stage runs the band schedule of `codegen.conv` (the implicit GEMM over the padded width,
output channels as columns), with one difference: a stage's drain writes its requantized (int8) or float output
rows straight into the next stage's padded input tile in the scratchpad, pixel-major with the channels of one
array-wide column tile per row, which is exactly the [positions, channel block] A tile the next stage streams.
Only the chain input is read from DRAM (transposing loads of its rows into a padded tile; quantized on the int8
path when it is float), and only the last stage's output is written (through the DRAM scratch and the transposing
loads to NCHW that every conv kernel uses, `codegen.conv.to_nchw`).

Memory: a band's tiles (the padded inputs of every stage) live in the band's buffer slot (bands rotate over the
slots, so band b + 1's input loads while band b computes), or, for wide bands (`Group.resident_a`), in all but
the last slot at once (bands then run one phase each: fewer, taller bands recompute fewer halo rows and re-read
the weights fewer times). Every step (one stage's Cout tile x K chunk) has its weights, bias and requantizer
tiles in a third of the spare scratchpad bank (wide: halves of the last slot and the spare bank, alternating, so
the next step's weight DMA and this step's preloads mostly use different banks: resnet18 layer1's block at 64x64
fp32, matrix bank stalls 56k -> 22k cycles), and its accumulator tile in the step's accumulator slot. The tiles'
padding is cleared once per slot (a first phase); rows of a band's tiles past an image edge are zeroed by DMAs
from a zero constant (the slot's previous band may have left data there).

A depthwise stage runs on the matrix unit like the others, each Cout tile reading only its own channel block,
with one diagonal [block, block] weight tile per tap (`pack_stage`): in the pixel-major tiles a tap is one
stream of the block's positions accumulated in place, where the vector unit would need a per-channel multiply and
an add per tap over the same elements. A vertically strided stage streams each output row's positions alone.
A Clip (ReLU6) between stages is applied by the vector unit to the stage's rows in the next stage's tile as each
Cout tile drains (fp32 in place; int8: dequantized at the Conv's output scale, clipped unless the drain's
requantization clamp already is the Clip, quantized at the next Conv's input scale, as the quantized reference's
float32 Clip between two Convs); the matrix unit waits for the stage's last before the next stage reads them.

int8: each stage requantizes its accumulator per output channel (bias, folded ReLU) in the drain, exactly as the
unfused conv kernel does; a residual Add (+ ReLU) of the chain input runs after the transposing loads, in float32:
on the dequantized output (f32(q) x f32(scale)), or, for a last Conv the plan dequantizes (read only by the Add),
on its int32 accumulator + bias scaled per channel (f32(acc + bias) x f32(s_in x s_w[c])), as the quantized
reference does; an int8 Add (`fusion.quant.plan.int8_add`, a residual block's) then quantizes the sum (after the
ReLU) at its scale, so the block's output is stored as int8. fp32 runs the same path (the sum rounded once, then
the ReLU).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from fusion.engine.codegen.conv import (
    DrainBand,
    Epilogue,
    clip_tail,
    conv_epilogue,
    conv_shape,
    load_transposed,
    pack_taps,
    to_nchw,
)
from fusion.engine.codegen.gemm import k_slices
from fusion.engine.errors import CodegenError
from fusion.graph.ir import Graph, Node
from fusion.graph.ops import OpType
from fusion.lower.context import LowerContext, const_key, storage_dtype
from fusion.lower.emitter import Emitter, Step, f32_bits
from fusion.lower.kernels.conv_depthwise import is_depthwise
from fusion.lower.kernels.conv_geometry import ConvGeometry, conv_geometry
from fusion.lower.kernels.matmul_loops import Item, emit_items, emit_run, steps
from fusion.lower.kernels.matrix import bias_view, dequant_scales
from fusion.lower.kernels.vector_ops import dequantize, fill, quantize_tile
from fusion.lower.kernels.windows import window_of
from fusion.lower.local_alloc import ALIGN, DEPTH, Slot, TileArena, largest_fitting
from fusion.lower.views import MAX_ROWS, View, dense
from fusion.quant.plan import QuantPlan
from isa.enums import Activation, DType, Unit
from simulator.config import MachineConfig

CHAIN_TAPS = "chain_taps"  # constant-form key of each chained Conv's weight as per-tap [C, Cout] tiles (pack_taps)
CHAIN_ZEROS = "chain_zeros"  # constant-form key of a zero run (one buffer slot's bytes) that edge rows are loaded from
SCRATCH = 2  # the last Conv's DRAM temp: its output before the layout change


def zero_bytes(cfg: MachineConfig) -> int:
    """Bytes of the zero constant: a buffer slot (no tile is larger)."""
    return TileArena(cfg, 0).spad.size


@dataclass(frozen=True)
class Stage:
    """One Conv of the chain and the Relu its drain applies or the Clip (ReLU6) the vector unit applies to its
    output rows in the next stage's tile; its input's padding and unpadded size."""

    nodes: tuple[Node, ...]
    s: ConvGeometry
    top: int
    left: int
    height: int
    width: int

    @property
    def conv(self) -> Node:
        return self.nodes[0]

    @property
    def clip(self) -> Node | None:
        return self.nodes[-1] if self.nodes[-1].op == OpType.Clip else None

    @property
    def drained(self) -> tuple[Node, ...]:
        """The nodes the drain applies (the Conv and its Relu)."""
        return self.nodes[:-1] if self.clip is not None else self.nodes

    @property
    def depthwise(self) -> bool:
        """One channel per group: runs on the matrix unit with a diagonal [channel block, channel block] weight
        per tap (pixel-major tiles: a tap is one stream of the block's positions, accumulated in place; on the
        vector unit each tap would be a per-column multiply and an add over the same elements, two passes)."""
        return self.s.groups > 1


@dataclass(frozen=True)
class Chain:
    stages: tuple[Stage, ...]
    residual: Node | None  # an Add of the last stage's output and the chain input
    relu: Node | None  # a Relu after that Add

    @property
    def input(self) -> str:
        return self.stages[0].conv.inputs[0]


def parse_chain(graph: Graph, nodes: Sequence[Node], cfg: MachineConfig) -> Chain:
    """The chain's stages; CodegenError for node lists this generator does not run."""
    stages: list[list[Node]] = []
    rest = list(nodes)
    while rest and rest[0].op == OpType.Conv:
        conv = rest.pop(0)
        if stages and conv.inputs[0] != stages[-1][-1].outputs[0]:
            raise CodegenError(f"node {conv.name!r} does not read the previous stage's output")
        stage = [conv]
        if rest and rest[0].op in (OpType.Relu, OpType.Clip) and rest[0].inputs[0] == conv.outputs[0]:
            stage.append(rest.pop(0))
        stages.append(stage)
    if len(stages) < 2:
        raise CodegenError("a conv chain needs at least two consecutive Convs")
    for stage in stages:
        if stage[-1].op == OpType.Clip:
            _check_clip(stage[-1], stage is stages[-1])
    residual = relu = None
    last = stages[-1][-1].outputs[0]
    if rest and rest[0].op == OpType.Add:
        residual = rest.pop(0)
        if sorted(residual.inputs) != sorted((last, stages[0][0].inputs[0])):
            raise CodegenError(f"node {residual.name!r}: the chain absorbs an Add of its output and its input only")
        if graph.types[residual.inputs[0]].shape != graph.types[residual.inputs[1]].shape:
            raise CodegenError(f"node {residual.name!r}: a broadcasting residual Add is not absorbed")
        if rest and rest[0].op == OpType.Relu and rest[0].inputs[0] == residual.outputs[0]:
            relu = rest.pop(0)
    if rest:
        raise CodegenError(f"node {rest[0].name!r} ({rest[0].op.value}) does not belong to a conv chain")
    return Chain(tuple(_stage(graph, cfg, stage) for stage in stages), residual, relu)


def _check_clip(clip: Node, last: bool) -> None:
    """A Clip between stages, bounds around zero (the tiles' zero padding stays zero through it)."""
    if last:
        raise CodegenError(f"node {clip.name!r}: a Clip after the chain's last Conv is not absorbed")
    lo, hi = float(clip.attr("min")), float(clip.attr("max"))
    if not lo <= 0.0 <= hi:
        raise CodegenError(f"node {clip.name!r}: Clip({lo:g}, {hi:g}) would change the zero padding")


def _stage(graph: Graph, cfg: MachineConfig, nodes: list[Node]) -> Stage:
    conv = nodes[0]
    w = window_of(graph, conv)
    if w.s != 2:
        raise CodegenError(f"node {conv.name!r}: the conv chain runs 2-D Convs")
    if conv.attr("group") != 1 and not is_depthwise(graph, conv):
        raise CodegenError(f"node {conv.name!r}: a grouped Conv that is not depthwise is not chained")
    s = conv_geometry(graph, conv, w.padded_shape) if conv.attr("group") != 1 else conv_shape(graph, cfg, conv)
    return Stage(tuple(nodes), s, w.pads[0], w.pads[1], w.in_shape[2], w.in_shape[3])


def pack_stage(st: Stage, weights: np.ndarray, n: int) -> np.ndarray:
    """A stage's weight (float32 or int8 form) as its steps read it: [Cout tiles, taps, K, n], a Cout tile's
    weights of every tap and input channel contiguous (K = C), so a step's [taps, K chunk, tile] is one run per
    tap (one run for a 1x1 Conv or a whole K), not a burst per row; a depthwise stage's tile is [taps, n, n], K =
    its own channel block, channel c's tap weight on the diagonal (row c % n): the [block, block] weight tile one
    preload takes. Cout is zero-padded to whole tiles."""
    taps, c, cout = st.s.taps, st.s.c, st.s.cout
    tiles = -(-cout // n)
    if st.depthwise:
        diagonal = np.zeros((taps, n, tiles * n), weights.dtype)
        diagonal[:, np.arange(c) % n, np.arange(c)] = weights.reshape(c, taps).T
        rows = diagonal  # [taps, K = n, Cout]
    else:
        rows = np.zeros((taps, c, tiles * n), weights.dtype)
        rows[..., :cout] = pack_taps(weights).reshape(taps, c, cout)
    return np.ascontiguousarray(rows.reshape(taps, rows.shape[1], tiles, n).transpose(2, 0, 1, 3))


def scratch_bytes(chain: Chain, out_dt: DType) -> int:
    """Bytes of the last stage's DRAM scratch (its output before the layout change)."""
    s = chain.stages[-1].s
    return s.n * s.out[0] * s.cols * s.cout * out_dt.size


def band_ranges(chain: Chain, o0: int, rows: int) -> list[tuple[int, int]]:
    """Per stage, the output rows [a, b) a band of the last stage's rows [o0, o0 + rows) needs (its halo included,
    clipped to the image: rows outside it are the next stage's padding)."""
    a, b = o0, o0 + rows
    out = [(a, b)]
    for st in reversed(chain.stages[1:]):
        lo, hi = a * st.s.strides[0] - st.top, (b - 1) * st.s.strides[0] + st.s.span - st.top
        a, b = max(lo, 0), min(hi, st.height)
        out.append((a, b))
    return out[::-1]


def edge_rows(chain: Chain, ranges: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """Per stage, the runs [t0, t1) of a band's input tile rows that lie past an image edge (padding, zeroed)."""
    runs = []
    for st, (a, b) in zip(chain.stages, ranges, strict=True):
        p0, rows = a * st.s.strides[0], st.s.in_rows(b - a)
        above, below = min(rows, max(0, st.top - p0)), max(0, st.height + st.top - p0)
        runs.append([r for r in ((0, above), (below, rows)) if r[1] > r[0]])
    return runs


@dataclass(frozen=True)
class Sizes:
    """Tile bytes of one chain kernel, for a band height."""

    chain: Chain
    n: int  # array size
    mm_dt: DType
    in_dt: DType  # the chain input's storage dtype
    out_dt: DType  # the last stage's drained dtype
    quantize: bool  # float chain input on the int8 path
    wide: bool = False  # a band's tiles span every rotating slot (bands fenced), the steps' the spare bank

    def rows(self, band: int) -> list[int]:
        """Per stage, the most output rows any band of `band` last-stage rows computes."""
        s = self.chain.stages[-1].s
        spans = [band_ranges(self.chain, o0, r) for o0, r in k_slices(s.out[0], band)]
        return [max(rng[i][1] - rng[i][0] for rng in spans) for i in range(len(self.chain.stages))]

    def band_tiles(self, band: int) -> list[int]:
        """The padded input tile of every stage (channel blocks), the raw float input first when quantizing; then
        every stage's bias and requantizer table, each of all its output channels (one DMA per band, not per
        step)."""
        sizes = []
        for i, (st, r) in enumerate(zip(self.chain.stages, self.rows(band), strict=True)):
            pixels = st.s.in_rows(r) * st.s.padded[1]
            if i == 0 and self.quantize:
                sizes += [pixels * kb * self.in_dt.size for _, kb in k_slices(st.s.c, self.n)]
            sizes += [pixels * kb * self.mm_dt.size for _, kb in k_slices(st.s.c, self.n)]
        return sizes + [size for st in self.chain.stages for size in (st.s.cout * 4, st.s.cout * 8)]

    def step_tiles(self, i: int, rows: int, kc: int) -> list[int]:
        """Weights of one step of stage i; the last stage's out tile; an int8 Clip stage's float32 rows of one
        channel block of the next stage's tile (`_Kernel.clip_rows`)."""
        st, stages = self.chain.stages[i], self.chain.stages
        tn = min(self.n, st.s.cout)
        sizes = [st.s.taps * kc * tn * self.mm_dt.size]
        if i == len(stages) - 1:
            return sizes + [rows * st.s.cols * tn * self.out_dt.size]
        clip_rows = st.clip is not None and self.mm_dt is DType.i8
        return sizes + ([rows * stages[i + 1].s.padded[1] * tn * 4] if clip_rows else [])

    def chunk(self, cfg: MachineConfig, band: int, i: int, rows: int) -> int:
        """Input channels per K chunk of stage i: the most channel blocks whose weights fit a step's third (a
        depthwise stage: its output tile's own block, 0 if that does not fit)."""
        st = self.chain.stages[i]
        third = min(slot.size for slot in self.step_slots(cfg, band))
        if st.depthwise:
            return min(st.s.c, self.n) if _bytes(self.step_tiles(i, rows, min(st.s.c, self.n))) <= third else 0
        blocks = largest_fitting(
            -(-st.s.c // self.n), lambda b: _bytes(self.step_tiles(i, rows, min(st.s.c, b * self.n))) <= third
        )
        return min(st.s.c, blocks * self.n)

    def band_region(self, cfg: MachineConfig) -> Slot:
        """Where band tiles go: a buffer slot (band b in slot b), or (wide) the first DEPTH - 1 slots at once."""
        slot = TileArena(cfg, 0).spad
        return Slot(0, (DEPTH - 1) * slot.size) if self.wide else slot

    def step_slots(self, cfg: MachineConfig, band: int) -> list[Slot]:
        """Where step s puts its tiles: slot s % DEPTH of these. Rotating bands: thirds of the spare scratchpad
        bank (so a band's input DMAs and the matrix unit's reads of a step's weights do not share a bank), else
        of the bytes of the band's slot its tiles leave free. Wide bands: halves of the last slot and the spare
        bank, alternating, so that the next step's weight DMA writes a bank the matrix unit's preloads of this
        step's weights do not read (two of three step changes; a third of a bank each)."""
        slot, spare = TileArena(cfg, 0).spad, TileArena.spare(cfg)
        if self.wide:
            if spare is None:
                return [Slot(0, 0)] * DEPTH
            last, half = Slot((DEPTH - 1) * slot.size, slot.size), min(slot.size, spare.spad.size) // 2 // ALIGN * ALIGN
            return [Slot(last.base, half), Slot(spare.spad.base, half), Slot(last.base + half, half)]
        used = _bytes(self.band_tiles(band))
        free = Slot(slot.base + used, max(0, slot.size - used))
        region = spare.spad if spare is not None and spare.spad.size >= free.size else free
        third = region.size // DEPTH // ALIGN * ALIGN
        return [Slot(region.base + i * third, third) for i in range(DEPTH)]

    def fits(self, cfg: MachineConfig, band: int) -> bool:
        probe = TileArena(cfg, 0)
        if _bytes(self.band_tiles(band)) > self.band_region(cfg).size:
            return False
        for i, (st, r) in enumerate(zip(self.chain.stages, self.rows(band), strict=True)):
            stream = st.s.stream_rows(r)
            tn = min(self.n, st.s.cout)
            if stream > MAX_ROWS or not probe.fits([], [stream * tn * 4]):
                return False
            if self.chunk(cfg, band, i, r) == 0:
                return False
        return True


def _bytes(sizes: Sequence[int]) -> int:
    return sum(-(-size // ALIGN) * ALIGN for size in sizes)


def band_rows(cfg: MachineConfig, z: Sizes, requested: int = 0) -> int:
    """Output rows of the last stage per band: `requested` (0: the most that fit)."""
    height = z.chain.stages[-1].s.out[0]
    if requested:
        if requested > height or not z.fits(cfg, requested):
            raise CodegenError(f"a band of {requested} output rows does not fit (or exceeds the {height} rows)")
        return requested
    rows = largest_fitting(height, lambda r: z.fits(cfg, r))
    if rows == 0:
        raise CodegenError("one output row of the chain (its stages' halos and tiles) does not fit a buffer slot")
    return rows


def chain_sizes(graph: Graph, cfg: MachineConfig, plan: QuantPlan | None, chain: Chain, wide: bool = False) -> Sizes:
    int8 = plan is not None
    in_dt = storage_dtype(graph, plan, chain.input)
    last = chain.stages[-1]
    dequantized = int8 and plan.matrix[last.conv.name].dequantize  # drained as the int32 accumulator (+ bias)
    out_dt = DType.i32 if dequantized else storage_dtype(graph, plan, last.nodes[-1].outputs[0])
    mm_dt = DType.i8 if int8 else DType.f32
    return Sizes(chain, cfg.array_size, mm_dt, in_dt, out_dt, int8 and in_dt is DType.f32, wide)


def band_heights(
    graph: Graph, cfg: MachineConfig, plan: QuantPlan | None, nodes: Sequence[Node]
) -> tuple[tuple[int, bool], ...]:
    """The schedule space, (band rows, wide): bands rotating over the buffer slots (the next band's loads overlap
    this one's compute) and wide bands filling every slot but the last (fewer, taller bands: less halo recomputed
    and fewer weight re-reads, but bands run one after another), each of the most last-stage rows that fit (fewer
    rows only recompute more halo and re-read the weights more often: half as many measured 1.4x slower on
    resnet18 64x64's layer1 block, and each schedule costs the planner a build). Empty when the chain does not
    run here (the generator then states why)."""
    try:
        chain = parse_chain(graph, nodes, cfg)
    except CodegenError:
        return ()
    space: list[tuple[int, bool]] = []
    for wide in (False, True):
        try:
            space.append((band_rows(cfg, chain_sizes(graph, cfg, plan, chain, wide)), wide))
        except CodegenError:
            continue
    return tuple(space)


def chain_phases(
    cx: LowerContext, nodes: Sequence[Node], requested_rows: int = 0, wide: bool = False
) -> list[list[Step]]:
    """The chain as phases: the tiles' padding cleared, the band steps (every stage of a band, intermediates in
    the scratchpad, the last stage's output into the DRAM scratch; wide bands one phase each), then the
    transposing loads to NCHW (with the residual Add + Relu)."""
    cfg = cx.config
    chain = parse_chain(cx.graph, nodes, cfg)
    z = chain_sizes(cx.graph, cfg, cx.plan, chain, wide)
    rows = band_rows(cfg, z, requested_rows)
    last = chain.stages[-1]
    scales = dequant_scales(cx, last.conv)  # int8: a last Conv read only by the residual Add is dequantized
    clamped = tuple(_clamped(cx, st) for st in chain.stages)
    eps = tuple(
        _accumulator_epilogue(cx, st)
        if st is last and scales is not None
        else conv_epilogue(cx, st.nodes if clamp else st.drained, st.s, dense(0, (1,), cx.dtype(st.conv.outputs[0])))
        for st, clamp in zip(chain.stages, clamped, strict=True)
    )
    scratch = dense(cx.temp(last.conv, SCRATCH), (last.s.n, last.s.out[0] * last.s.cols, last.s.cout), z.out_dt)
    n = cfg.array_size
    taps = tuple(
        dense(
            cx.addresses[const_key(st.conv.inputs[1], CHAIN_TAPS)],
            (-(-st.s.cout // n), st.s.taps, n if st.depthwise else st.s.c, n),
            z.mm_dt,
        )
        for st in chain.stages
    )
    k = _Kernel(cx, chain, z, eps, clamped, taps, scratch, rows)
    bands = [(img, o0, r) for img in range(last.s.n) for o0, r in k_slices(last.s.out[0], rows)]
    phases, done = [k.prologue(len(bands))], 0
    for b, (img, o0, r) in enumerate(bands):
        steps = k.band(b, img, o0, r, done)
        done += len(steps)
        if wide or b == 0:
            phases.append(steps)
        else:
            phases[-1] += steps
    out = cx.view(nodes[-1].outputs[0]).reshape_dense((last.s.n, last.s.cout, last.s.out[0] * last.s.out[1]))
    dequant = cx.scale(last.nodes[-1].outputs[0]) if cx.int8 and chain.residual is not None else None
    dequant = scales if scales is not None else dequant
    if chain.residual is None and scales is None:
        phases.append(to_nchw(cfg, last.s.strides[1], scratch, out, cx.rotation, eps[-1].dequant))
    else:
        if last.s.strides[1] != 1:
            raise CodegenError(f"node {last.conv.name!r}: a residual Add or dequantization after a horizontal stride")
        residual = None if chain.residual is None else cx.view(chain.input).reshape_dense(out.shape)
        x_scale = cx.scale(chain.input) if residual is not None and residual.dtype is DType.i8 else None
        quantize = cx.scale(nodes[-1].outputs[0]) if out.dtype is DType.i8 else None  # an int8 Add
        phases.append(_residual_phase(cx, scratch, residual, out, dequant, chain.relu is not None, x_scale, quantize))
    return phases


@dataclass(frozen=True)
class _Kernel:
    """What every step of one chain kernel shares."""

    cx: LowerContext
    chain: Chain
    z: Sizes
    eps: tuple[Epilogue, ...]
    clamped: tuple[bool, ...]  # per stage: its Clip is the drain's int8 requantization clamp (`_clamped`)
    taps: tuple[View, ...]  # per stage [Cout tiles, taps, C, N] (depthwise: [Cout tiles, taps, N, N], `pack_stage`)
    scratch: View  # [n, OH * cols, Cout]
    rows: int  # last-stage output rows per band

    def band_tiles(self, b: int) -> tuple[list[int], list[list[int]], list[tuple[int, int]]]:
        """Band b's tiles in its slot: the raw float input blocks (when quantizing), every stage's input blocks,
        every stage's (bias, requantizer table) tiles."""
        z, first = self.z, self.chain.stages[0]
        arena = TileArena(self.cx.config, b, self.cx.rotation)
        if z.wide:
            arena.spad = z.band_region(self.cx.config)
        tiles = [arena.tile(size) for size in z.band_tiles(self.rows)]
        n_raw = len(k_slices(first.s.c, z.n)) if z.quantize else 0
        inputs, rest = [], tiles[n_raw:]
        for st in self.chain.stages:
            count = len(k_slices(st.s.c, z.n))
            inputs.append(rest[:count])
            rest = rest[count:]
        return tiles[:n_raw], inputs, list(zip(rest[::2], rest[1::2], strict=True))

    def prologue(self, bands: int) -> list[Step]:
        """Every slot's band tiles cleared once (the padding positions no band writes)."""
        steps = []
        for b in range(1 if self.z.wide else min(DEPTH, bands)):
            raw, inputs, _ = self.band_tiles(b)
            steps.append(Step([], [(Unit.vector, lambda em, raw=raw, inputs=inputs: self.clear(em, inputs, raw))]))
        return steps

    def band(self, b: int, img: int, o0: int, rows: int, first_step: int) -> list[Step]:
        """A band's steps: for every stage, Cout tile and K chunk, one step."""
        cx, chain, z, cfg = self.cx, self.chain, self.z, self.cx.config
        ranges = band_ranges(chain, o0, rows)
        raw, inputs, params = self.band_tiles(b)
        edges = edge_rows(chain, ranges)
        slots = z.step_slots(cfg, self.rows)
        steps: list[Step] = []
        for i, st in enumerate(chain.stages):
            a, bb = ranges[i]
            kc = z.chunk(cfg, self.rows, i, z.rows(self.rows)[i])
            cols = k_slices(st.s.cout, z.n)
            for col, tn in cols:
                acc = TileArena(cfg, first_step + len(steps), cx.rotation).acc_tile(st.s.stream_rows(bb - a) * tn * 4)
                chunks = [(col, tn)] if st.depthwise else k_slices(st.s.c, kc)
                for j, (k0, kb) in enumerate(chunks):
                    index = first_step + len(steps)
                    arena = TileArena(cfg, index)
                    arena.spad = slots[index % DEPTH]
                    closes = j == len(chunks) - 1
                    work = _Work(i, img, o0, rows, a, bb, col, tn, k0, kb, acc, j == 0, closes)
                    clip = closes and st.clip is not None and not self.kept(i)
                    wait = clip and col == cols[-1][0]  # the stage's rows all drained and clipped
                    bring = (edges, params) if not steps else None
                    steps.append(self.step(arena, work, inputs, raw, params[i], bring, clip, wait))
        return steps

    def step(
        self,
        arena: TileArena,
        t: _Work,
        inputs: list[list[int]],
        raw: list[int],
        param: tuple[int, int],
        bring: tuple[list, list[tuple[int, int]]] | None,
        clip: bool = False,
        wait: bool = False,
    ) -> Step:
        """One stage's Cout tile x K chunk of a band (`param`: its stage's bias and requantizer tiles). `bring`
        (the band's first step: the edge rows and every stage's tiles): it also brings the chain input and every
        stage's bias and requantizer table, and zeroes the tile rows past the image edges. `clip` (a Clip stage's
        last K chunk): then the vector unit clips the drained rows in the next stage's tile (`clip_rows`) while
        the matrix unit goes on to the next Cout tile; `wait` (the stage's last one): the matrix unit waits for
        the clipped rows before the next stage reads them."""
        chain, z = self.chain, self.z
        st, ep = chain.stages[t.stage], self.eps[t.stage]
        s, es = st.s, z.mm_dt.size
        final = t.stage == len(chain.stages) - 1
        last_chunk = t.closes
        w_tile = arena.tile(s.taps * t.kc * t.tn * es)
        bias, table = param
        has_bias, has_table = ep.bias is not None, ep.table is not None
        ep_tiles = (bias + t.col * 4 if has_bias else 0, 0, table + t.col * 8 if has_table else 0)
        out_tile = arena.tile(t.rows * s.cols * t.tn * z.out_dt.size) if final and last_chunk else 0
        blocks = k_slices(s.c, z.n)
        count = t.b - t.a
        weights = (
            self.taps[t.stage].index((t.col // z.n,)).slice(1, 0 if st.depthwise else t.k0, t.kc).slice(2, 0, t.tn)
        )

        def load(em: Emitter) -> None:
            if bring is not None:
                self.zero_edges(em, bring[0], inputs, raw)
                self.load_input(em, t.img, t.o0, t.rows, raw or inputs[0])
                self.load_params(em, bring[1])
            em.dma_load(weights, w_tile)

        compute: list = [(Unit.load, load)]
        if bring is not None and raw:
            compute.append((Unit.vector, lambda em: self.quantize(em, raw, inputs[0])))

        # a vertically strided stage streams each output row's positions alone, skipping the input rows between
        # (the band's one stream would compute them too: the stride-2 depthwise of an inverted residual, 2x)
        runs = [(0, s.stream_rows(count))] if s.strides[0] == 1 else [(r * s.pitch, s.valid) for r in range(count)]

        chunk = [(c0, kb, b) for (c0, kb), b in zip(blocks, inputs[t.stage], strict=True) if t.k0 <= c0 < t.k0 + t.kc]
        # the chunk's blocks one run (its items' addresses step evenly): each tap's items are asked as one
        even = len({kb for _, kb, _ in chunk}) == 1 and len({b1 - b0 for (_, _, b0), (_, _, b1) in pairwise(chunk)}) < 2

        def item(kh: int, kw: int, c0: int, kb: int, block: int, mm: str) -> Item:
            """Tap (kh, kw) of channel block [c0, c0 + kb): its weight tile's preload, each run's matmul."""
            at = w_tile + (((kh * s.kernel[1] + kw) * t.kc + c0 - t.k0) * t.tn) * es
            start = block + s.offset(kh, kw) * kb * es
            return (
                ("mx_preload", (at,), (kb, t.tn, z.mm_dt.name)),
                *((mm, (t.acc + p * t.tn * 4, start + p * kb * es), (n,)) for p, n in runs),
            )

        def matmul(em: Emitter) -> None:
            opened = not t.opens
            run_step = None  # a run's step: `even` blocks step alike, and a tap moves them all alike
            for kh in range(s.kernel[0]):
                for kw in range(s.kernel[1]):
                    rest = chunk
                    if not opened:  # the accumulator's first matmul
                        emit_items(em, [item(kh, kw, *chunk[0], "mx_mm")])
                        rest, opened = chunk[1:], True
                    if even and len(rest) > 1:
                        first = item(kh, kw, *rest[0], "mx_mma")
                        if run_step is None:
                            run_step = steps(first, item(kh, kw, *rest[1], "mx_mma"))
                        emit_run(em, first, run_step, len(rest))
                    else:
                        emit_items(em, [item(kh, kw, *block, "mx_mma") for block in rest])
            if not last_chunk:
                return
            if final:
                ep.drain(em, DrainBand(t.acc, count, t.tn, s.pitch, s.valid, s.cols), ep_tiles, out_tile)
            else:
                self.drain_into_next(em, t, ep, ep_tiles, inputs)

        compute.append((Unit.matrix, matmul))
        if clip:
            temp = arena.tile(z.step_tiles(t.stage, z.rows(self.rows)[t.stage], t.kc)[-1]) if self.cx.int8 else 0
            compute.append((Unit.vector, lambda em: self.clip_rows(em, t, inputs, temp)))
        if wait:
            compute.append((Unit.matrix, lambda em: None))  # (its hand-over token from the vector unit)
        stores = []
        if final and last_chunk:
            view = self.scratch.index((t.img,)).slice(0, t.o0 * s.cols, t.rows * s.cols).slice(1, t.col, t.tn)
            stores.append((out_tile, view))
        return Step([], compute, stores)

    def drain_into_next(self, em: Emitter, t: _Work, ep: Epilogue, tiles: tuple, inputs: list[list[int]]) -> None:
        """A stage's output rows [a, b), Cout tile `col`, into the next stage's padded input tile: the tile's
        channel block of the same columns, each row at its padded position."""
        st, nxt = self.chain.stages[t.stage], self.chain.stages[t.stage + 1]
        s, es = st.s, self.z.mm_dt.size
        p0 = band_ranges(self.chain, t.o0, t.rows)[t.stage + 1][0] * nxt.s.strides[0]
        block = inputs[t.stage + 1][t.col // self.z.n]
        pitch = nxt.s.padded[1]

        def at(r: int) -> int:
            return block + ((r + nxt.top - p0) * pitch + nxt.left) * t.tn * es

        if s.strides[1] == 1:
            ep.drain(em, DrainBand(t.acc, t.b - t.a, t.tn, s.pitch, s.valid, pitch), tiles, at(t.a))
            return
        for i, r in enumerate(range(t.a, t.b)):  # every stride_w-th computed position, one drained row each
            band = DrainBand(t.acc + i * s.pitch * t.tn * 4, s.out[1], t.tn, s.strides[1], 1, 1)
            ep.drain(em, band, tiles, at(r))

    def kept(self, i: int) -> bool:
        """int8: stage i's Clip is its drain's requantization clamp and the next Conv's input scale is the Conv's
        output scale: the drained rows already are the next Conv's int8 input (quantizing f32(q) x f32(s) at s
        gives q back), nothing to clip or rescale."""
        st = self.chain.stages[i]
        if not self.clamped[i]:
            return False
        return self.cx.scale(st.conv.outputs[0]) == self.cx.matrix(self.chain.stages[i + 1].conv).input_scale

    def load_params(self, em: Emitter, params: list[tuple[int, int]]) -> None:
        """Every stage's bias and requantizer table (those its drain applies), all its output channels."""
        for ep, (bias, table) in zip(self.eps, params, strict=True):
            if ep.bias is not None:
                em.dma_load(ep.bias, bias)
            if ep.table is not None:
                em.dma_load(ep.table, table)

    def clip_rows(self, em: Emitter, t: _Work, inputs: list[list[int]], temp: int) -> None:
        """A Clip stage's output rows [a, b) of Cout tile `col` in the next stage's tile (whole padded rows: the
        zero padding stays zero), clipped as the unfused Clip: fp32 in place; int8 dequantized at the Conv's
        output scale, clipped (unless the drain's requantization clamp already did, `clip_tail`), and quantized at
        the next Conv's input scale (`temp`: the float32 rows), as the quantized reference's float32 Clip between
        the two Convs."""
        st, nxt, cx = self.chain.stages[t.stage], self.chain.stages[t.stage + 1], self.cx
        es = self.z.mm_dt.size
        lo, hi = f32_bits(float(st.clip.attr("min"))), f32_bits(float(st.clip.attr("max")))
        p0 = band_ranges(self.chain, t.o0, t.rows)[t.stage + 1][0] * nxt.s.strides[0]
        pitch = nxt.s.padded[1]
        block = inputs[t.stage + 1][t.col // self.z.n]
        rows, size = block + (t.a + nxt.top - p0) * pitch * t.tn * es, (t.b - t.a) * pitch * t.tn
        if not cx.int8:
            em.b.v_clip(*em.regs(rows, rows, lo, hi), size, "f32")
            return
        dequantize(em, temp, rows, size, cx.scale(st.conv.outputs[0]))
        if not self.clamped[t.stage]:
            em.b.v_clip(*em.regs(temp, temp, lo, hi), size, "f32")
        quantize_tile(em, rows, temp, size, cx.matrix(nxt.conv).input_scale)

    def load_input(self, em: Emitter, img: int, o0: int, rows: int, tiles: list[int]) -> None:
        """The chain input's rows a band needs, each channel block by transposing loads into its padded tile."""
        st = self.chain.stages[0]
        a, b = band_ranges(self.chain, o0, rows)[0]
        p0 = a * st.s.strides[0]
        lo, hi = max(p0 - st.top, 0), min((b - 1) * st.s.strides[0] + st.s.span - st.top, st.height)
        image = self.cx.view(self.chain.input).reshape_dense((st.s.n, st.s.c, st.height * st.width))
        pitch, es = st.s.padded[1], image.dtype.size
        whole = st.left == 0 and pitch == st.width  # rows contiguous in the tile too: one run
        for (c0, kb), tile in zip(k_slices(st.s.c, self.z.n), tiles, strict=True):
            channels = image.index((img,)).slice(0, c0, kb)
            runs = [(lo, hi - lo)] if whole else [(h, 1) for h in range(lo, hi)]
            for h, count in runs:
                local = tile + ((h + st.top - p0) * pitch + st.left) * kb * es
                load_transposed(em, channels.slice(1, h * st.width, count * st.width), local)

    def clear(self, em: Emitter, inputs: list[list[int]], raw: list[int]) -> None:
        """Zero a slot's padded tiles (the raw float input's when quantizing: zero quantizes to zero)."""
        z = self.z
        for i, (st, r) in enumerate(zip(self.chain.stages, z.rows(self.rows), strict=True)):
            pixels = st.s.in_rows(r) * st.s.padded[1]
            if i == 0 and raw:
                for (_, kb), tile in zip(k_slices(st.s.c, z.n), raw, strict=True):
                    fill(em, tile, pixels * kb, z.in_dt, 0.0)
                continue
            for (_, kb), tile in zip(k_slices(st.s.c, z.n), inputs[i], strict=True):
                fill(em, tile, pixels * kb, z.mm_dt, 0.0)

    def zero_edges(self, em: Emitter, edges: list, inputs: list[list[int]], raw: list[int]) -> None:
        """The band's tile rows past an image edge, zeroed by DMAs from a zero constant (the slot's previous band
        may have left rows of data there)."""
        z = self.z
        for i, (st, runs) in enumerate(zip(self.chain.stages, edges, strict=True)):
            tiles, dt = (raw, z.in_dt) if i == 0 and raw else (inputs[i], z.mm_dt)
            pitch = st.s.padded[1]
            for (_, kb), tile in zip(k_slices(st.s.c, z.n), tiles, strict=True):
                for t0, t1 in runs:
                    em.dma_load(self.zeros(dt, (t1 - t0) * pitch * kb), tile + t0 * pitch * kb * dt.size)

    def zeros(self, dt: DType, count: int) -> View:
        return dense(self.cx.addresses[const_key(self.chain.stages[0].conv.inputs[1], CHAIN_ZEROS)], (count,), dt)

    def quantize(self, em: Emitter, raw: list[int], tiles: list[int]) -> None:
        """The float input tile to int8 at the first Conv's input scale (as the unfused kernel quantizes it)."""
        st = self.chain.stages[0]
        scale = self.cx.matrix(st.conv).input_scale
        pixels = st.s.in_rows(self.z.rows(self.rows)[0]) * st.s.padded[1]
        for (_, kb), src, dst in zip(k_slices(st.s.c, self.z.n), raw, tiles, strict=True):
            quantize_tile(em, dst, src, pixels * kb, scale)


@dataclass(frozen=True)
class _Work:
    """One step: stage, image, the band (last-stage rows [o0, o0 + rows)), the stage's output rows [a, b), its Cout
    tile [col, col + tn) and K chunk [k0, k0 + kc) (depthwise: the tile's own channels), the accumulator tile."""

    stage: int
    img: int
    o0: int
    rows: int
    a: int
    b: int
    col: int
    tn: int
    k0: int
    kc: int
    acc: int
    opens: bool  # the first K chunk: the accumulator starts here
    closes: bool  # the last K chunk: the drain follows


def _clamped(cx: LowerContext, st: Stage) -> bool:
    """int8: the stage's Clip is its drain's requantization clamp (`conv.clip_tail`: ReLU6 above every int8 value
    the Conv's output holds), so `clip_rows` need not clip again."""
    if st.clip is None or not cx.int8:
        return False
    try:
        clip_tail(cx, st.nodes)
    except CodegenError:
        return False
    return True


def _accumulator_epilogue(cx: LowerContext, st: Stage) -> Epilogue:
    """A dequantizing Conv's drain: int32 acc + bias, no requantization (`_residual_phase` scales it per channel)."""
    return Epilogue(bias_view(cx, st.conv), None, None, (0, 0), Activation.none, "i32", DType.i32, st.s.out[1])


def _residual_phase(
    cx: LowerContext,
    scratch: View,
    residual: View | None,
    out: View,
    dequant: float | View | None,
    relu: bool,
    x_scale: float | None = None,
    quantize: float | None = None,
) -> list[Step]:
    """scratch [n, pixels, Cout] -> out [n, Cout, pixels] = (dequantized) scratch^T + residual (then ReLU): runs of
    pixels by transposing loads, the residual's [Cout, run] block (if any) beside them. `dequant`: an int8 scratch's
    scale (f32(q) x f32(scale)), or an int32 accumulator scratch's [Cout] channel scales (f32(acc + bias) x
    f32(s_in x s_w[c]), the quantized reference's dequantizing Conv). `x_scale`: the residual is int8 (the block
    input a requantized Conv's output, MobileNetV2's), dequantized f32(q) x f32(scale) before the Add (loaded into
    the last quarter of its float32 tile, which the in-order dequantization to the tile's start overwrites only
    after reading). `quantize`: the output is int8 (an int8 Add, `fusion.quant.plan.int8_add`): the float32 result
    quantized at that scale in place (element i's int8 at byte i, read from byte 4i: in order, never overwriting a
    float not yet read)."""
    n, cout, pixels = out.shape
    es = scratch.dtype.size
    per_channel = isinstance(dequant, View)

    def sizes(p: int) -> list[int]:
        sizes = [p * cout * es, p * cout * 4 if residual is not None else 0]
        return sizes + ([p * cout * 4] if dequant is not None else []) + [cout * 4] * per_channel

    probe = TileArena(cx.config, 0)
    run = largest_fitting(min(pixels, MAX_ROWS), lambda p: probe.fits(sizes(p)))
    if run == 0:
        raise CodegenError(f"{cout} output channels of one pixel exceed a buffer slot")
    steps = []
    for img in range(n):
        for p0 in range(0, pixels, run):
            count = min(run, pixels - p0)
            arena = TileArena(cx.config, len(steps), cx.rotation)
            raw, res, *deq = [arena.tile(size) for size in sizes(count)]
            total = (deq or [raw])[0]
            channel = deq[1] if per_channel else 0
            address = scratch.index((img,)).address + p0 * cout * es

            def load(
                em: Emitter, raw=raw, res=res, address=address, count=count, img=img, p0=p0, channel=channel
            ) -> None:
                local, dram, stride = em.regs(raw, address, cout * es)
                em.b.dma_ldt(local, dram, stride, count, cout, scratch.dtype.name)
                if residual is not None:
                    em.dma_load(
                        residual.index((img,)).slice(1, p0, count), res + 3 * count * cout * (x_scale is not None)
                    )
                if channel:
                    em.dma_load(dequant, channel)

            def add(em: Emitter, raw=raw, res=res, total=total, size=count * cout, channel=channel, row=count) -> None:
                if channel:
                    em.b.v_cvt(*em.regs(total, raw), size, "i32", "f32")
                    em.b.v_mul_vc(*em.regs(total, total, channel), size, row, "f32")
                elif dequant is not None:
                    dequantize(em, total, raw, size, dequant)
                if residual is not None:
                    if x_scale is not None:
                        dequantize(em, res, res + 3 * size, size, x_scale)
                    em.b.v_add(*em.regs(total, total, res), size, "f32")
                if relu:
                    em.b.v_relu(*em.regs(total, total), size, "f32")
                if quantize is not None:
                    quantize_tile(em, total, total, size, quantize)

            steps.append(
                Step([], [(Unit.load, load), (Unit.vector, add)], [(total, out.index((img,)).slice(1, p0, count))])
            )
    return steps
