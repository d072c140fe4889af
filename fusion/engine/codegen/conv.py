"""Conv as an implicit GEMM with output channels as columns, so bias, residual and ReLU fuse into the drain.

No im2col tensor exists: each band of output rows brings the padded input rows it reads into the scratchpad once,
channel-blocked and pixel-major (`dma.ldt` of `kb` channels x the band's contiguous pixels gives a [pixels, kb]
tile: row = padded pixel). The output is computed over the padded width at a pitch of `stride_h * W'` rows per
output row (the extra rows are computed and dropped), so for every kernel tap (kh, kw) the rows the array needs are
one contiguous run of that tile starting at (kh * dilation_h * W' + kw * dilation_w): each (tap, channel block) is
one preload of a [kb, tn] weight tile and one `mx.mma` streaming the band. A horizontal stride s keeps every s-th
computed row: the drain writes each output row's computed pixels at a pitch of s * OW, and the transposing load
back to NCHW reads every s-th pixel row. Output channels are tiled over the array's columns (tn <= N), input
channels over K (chunks of channel blocks accumulated across steps), and groups run as independent GEMMs over
their channel slices. The input band stays resident in the scratchpad while the weight panels of every column
tile and channel chunk stream past it. The accumulator holds out^T [pixels, Cout tile]; each output row is drained
(bias per column, residual, ReLU, int8 requantize) into a dense tile stored to a DRAM scratch [OH * s * OW, Cout]
and brought back as NCHW by transposing loads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial

import numpy as np

from fusion.engine.codegen.gemm import k_slices
from fusion.engine.codegen.matrix_group import EpilogueOps, epilogue_ops
from fusion.engine.errors import CodegenError
from fusion.graph.ir import Graph, Node
from fusion.graph.ops import OpType
from fusion.lower.context import LowerContext, const_key
from fusion.lower.emitter import Emit, Emitter, Step, f32_bits
from fusion.lower.kernels.conv_geometry import ConvGeometry, conv_geometry
from fusion.lower.kernels.frame import MAX_N
from fusion.lower.kernels.matmul_loops import emit_keyed
from fusion.lower.kernels.matrix import bias_view, dequant_scales, requant, requant_table
from fusion.lower.kernels.movement import copy_steps
from fusion.lower.kernels.vector_ops import dequantize, fill, quantize_tile
from fusion.lower.kernels.windows import Window, window_of
from fusion.lower.local_alloc import ALIGN, DEPTH, Slot, TileArena, largest_fitting
from fusion.lower.views import MAX_COLS, MAX_ROWS, View, dense
from isa.enums import Activation, DType, Unit
from simulator.config import MachineConfig

TAPS = "taps"  # constant-form key of a Conv weight as the band schedule's step tiles (see pack_band_taps)


def matrix_conv_window(graph: Graph, node: Node, kernel: str) -> Window:
    """The window of a Conv a matrix-unit kernel runs: 1-D or 2-D, with a constant weight (packed at compile
    time); CodegenError naming the node and `kernel` otherwise."""
    if node.op != OpType.Conv:
        raise CodegenError(f"node {node.name!r} ({node.op.value}) is not a Conv")
    w = window_of(graph, node)
    if w.s not in (1, 2):
        raise CodegenError(f"node {node.name!r}: {kernel} covers 1-D and 2-D Conv, not {w.s}-D")
    if not graph.is_constant(node.inputs[1]):
        raise CodegenError(f"node {node.name!r}: {kernel} needs a constant weight")
    return w


def conv_shape(graph: Graph, cfg: MachineConfig, node: Node, packed: bool = False) -> ConvGeometry:
    """The geometry; CodegenError for convolutions this generator does not run (`packed`: the taps of a kernel
    row share a preload's K, `codegen.conv_packed`)."""
    w = matrix_conv_window(graph, node, "the implicit GEMM")
    cout, cg = graph.types[node.inputs[1]].shape[:2]
    groups = node.attr("group")
    k = cg * (w.kernel[-1] if packed else 1)  # K rows one preload can carry
    if k * (cout // groups) < cfg.array_size:
        raise CodegenError(
            f"node {node.name!r}: {k} K rows x {cout // groups} output channels per group use under 1/"
            f"{cfg.array_size} of the array (the baseline kernel runs it)"
        )
    return conv_geometry(graph, node, w.padded_shape)


def pack_taps(weights: np.ndarray) -> np.ndarray:
    """W[Cout, C/group, kh, kw] (or a 1-D conv's W[Cout, C/group, kw], kh = 1) as [kh, kw, C/group, Cout]: the
    weights of tap (kh, kw), a run of input channels and a run of output channels are one strided 2-D block."""
    if weights.ndim not in (3, 4):
        raise CodegenError(f"a Conv weight of rank {weights.ndim} has no implicit-GEMM packing (rank 3 or 4)")
    lifted = weights.reshape(*weights.shape[:2], *(1,) * (4 - weights.ndim), *weights.shape[2:])
    return np.ascontiguousarray(lifted.transpose(2, 3, 1, 0))


def pack_band_taps(weights: np.ndarray, s: ConvGeometry, n: int) -> np.ndarray:
    """W[Cout, C/group, kh, kw] (or 1-D) as the weight tiles the band schedule's steps read, flat: per Cout tile
    [col, col + tn) (tn = min(n, Cout/group)), its [taps, C/group, tn] block at offset col * taps * C/group,
    channel block by channel block ([taps, kb, tn] each, kb = min(n, C/group)). A step's K chunk (whole channel
    blocks) is then one contiguous run: one DMA of full bursts, not one burst per tn-wide row (resnet18
    layer3 at 224: 16-byte rows, 4x the DRAM channel time of the bytes)."""
    taps = pack_taps(weights)  # [kh, kw, C/group, Cout]
    flat = taps.reshape(s.taps, s.cg, s.cout)
    tn = min(n, s.coutg)
    blocks = [
        flat[:, c0 : c0 + kb, g * s.coutg + j0 : g * s.coutg + j0 + width].ravel()
        for g in range(s.groups)
        for j0, width in k_slices(s.coutg, tn)
        for c0, kb in k_slices(s.cg, n)
    ]
    return np.ascontiguousarray(np.concatenate(blocks))


def scratch_bytes(graph: Graph, cfg: MachineConfig, node: Node, out_dtype: DType) -> int:
    s = conv_shape(graph, cfg, node)
    return s.n * s.out[0] * s.cols * s.cout * out_dtype.size


QUANTIZED = 3  # the DRAM temp of a float input quantized to int8 up front (when its float bands do not fit)


def quantized_bytes(graph: Graph, node: Node) -> int:
    """Bytes of the int8 copy of a float input on the int8 path (`QUANTIZED`)."""
    return graph.types[node.inputs[0]].size


@dataclass(frozen=True)
class _Tiling:
    """Output rows per band, output channels per column tile, input channels per K chunk (a multiple of the
    array size unless it is all of a group's channels); `spare`: the kernel's one band sits in the scratchpad
    bank no slot uses (`TileArena.spare`) and the steps' tiles rotate over whole slots."""

    rows: int
    tn: int
    chunk: int
    spare: bool = False
    weights: bool = False  # all the weights in the spare bank, loaded by the first band's steps, read by all


@dataclass(frozen=True)
class _Sizes:
    """Tile bytes of one kernel: the resident input band and one step's streamed tiles."""

    s: ConvGeometry
    n: int  # array size
    in_dt: DType  # the padded input's storage dtype
    mm_dt: DType  # what the matrix unit reads
    out_dt: DType
    quantize: bool  # float input on the int8 path: an int8 copy of the band beside the raw one
    residual: bool
    tail: int = 0  # zero positions past a band's last row (`band_geometry`)

    def resident(self, rows: int) -> list[int]:
        pixels = self.s.in_rows(rows) * self.s.padded[1] + self.tail
        raw = [pixels * kb * self.in_dt.size for _, kb in k_slices(self.s.cg, self.n)]
        return raw + ([pixels * kb for _, kb in k_slices(self.s.cg, self.n)] if self.quantize else [])

    def streamed(self, rows: int, tn: int, chunk: int, weights: bool = True) -> list[int]:
        """One step's tiles (`weights` False: all the weights sit in the spare bank)."""
        spad = [tn * 4, tn * 8, rows * self.s.cols * tn * self.out_dt.size]
        spad += [self.s.taps * chunk * tn * self.mm_dt.size] if weights else []
        return spad + ([rows * self.s.out[1] * tn * 4] if self.residual else [])

    @property
    def weight_bytes(self) -> int:
        return self.s.taps * self.s.cg * self.s.cout * self.mm_dt.size

    def fits(self, probe: TileArena, rows: int, tn: int, chunk: int, apart: bool = False, weights: bool = True) -> bool:
        """One step's tiles in a slot: beside the band, or (`apart`: the band in the spare bank) alone."""
        resident = [] if apart else self.resident(rows)
        return self.s.stream_rows(rows) <= MAX_ROWS and probe.fits(
            resident + self.streamed(rows, tn, chunk, weights), [self.s.stream_rows(rows) * tn * 4]
        )


def choose_tiling(cfg: MachineConfig, z: _Sizes, name: str) -> _Tiling:
    """The most output rows per band beside one channel block of weights (every band reads all the weights once,
    so fewer bands move fewer bytes), then the longest K chunk of channel blocks beside them."""
    s, n = z.s, cfg.array_size
    tn = min(n, s.coutg)
    probe, spare = TileArena(cfg, 0), TileArena.spare(cfg)
    # every output row in one band held in the spare bank: the weights are read once, and the DMA filling a
    # step's tiles never writes a bank the matrix unit streams the band from (one image and group: nothing
    # loads into the band while it is read)
    whole = s.out[0]
    if spare is not None and s.n * s.groups == 1 and spare.fits(z.resident(whole)):
        blocks = largest_fitting(-(-s.cg // n), lambda b: z.fits(probe, whole, tn, min(s.cg, b * n), True))
        if blocks:
            return _Tiling(whole, tn, min(s.cg, blocks * n), True)
    # several bands, all the weights in the spare bank: each is read once instead of once per band, and the
    # steps' slots hold only the band and the epilogue's tiles (so bands of more rows fit)
    if spare is not None and spare.fits([z.weight_bytes]):
        rows = largest_fitting(s.out[0], lambda r: z.fits(probe, r, tn, s.cg, weights=False))
        if rows:
            return _Tiling(rows, tn, s.cg, weights=True)
    rows = largest_fitting(s.out[0], lambda r: z.fits(probe, r, tn, min(n, s.cg)))
    if rows == 0:
        raise CodegenError(
            f"node {name!r}: one output row of one channel block does not fit a buffer slot "
            f"({probe.spad.size} scratchpad, {probe.acc.size} accumulator bytes)"
        )
    blocks = largest_fitting(-(-s.cg // n), lambda b: z.fits(probe, rows, tn, min(s.cg, b * n)))
    return _Tiling(rows, tn, min(s.cg, blocks * n))


def _tiling_or_none(cfg: MachineConfig, z: _Sizes, name: str, raises: bool) -> _Tiling | None:
    """`choose_tiling`, or None when nothing fits and `raises` is False."""
    try:
        return choose_tiling(cfg, z, name)
    except CodegenError:
        if raises:
            raise
        return None


def kept_rows(s: ConvGeometry, prev: tuple[int, ...], band: tuple[int, ...]) -> int:
    """Padded input rows band (img, group, oh0, rows) shares with the band before it (none across images or
    groups): the rows its tiles take from the previous band's on chip (`Halo`) instead of from DRAM."""
    if prev[:2] != band[:2]:
        return 0
    return max(0, min(prev[2] * s.strides[0] + s.in_rows(prev[3]) - band[2] * s.strides[0], s.in_rows(band[3]) - 1))


def band_traffic(z: _Sizes, tiling: _Tiling, copied: int = 0) -> int:
    """DRAM bytes the band schedule reads with `tiling`: every band's input rows but those it shares with the
    band before it (`kept_rows`, where `conv_phases` keeps them) and, unless they stay on
    chip (`spare`, `weights`), all its group's weights per band; `copied`: the elements of an input first
    quantized to an int8 copy (read as float32 and written as int8 once more). The output's bytes do not depend
    on it."""
    s = z.s
    spans = [(0, 0, *band) for band in k_slices(s.out[0], tiling.rows)]
    per_band = -(-s.coutg // tiling.tn) * -(-s.cg // tiling.chunk)
    halos = not z.quantize and not tiling.spare and per_band >= 2  # as `conv_phases` keeps them
    kept = [kept_rows(s, a, b) for a, b in zip(spans, spans[1:], strict=False)] if halos else []
    rows = (len(spans) * s.in_rows(tiling.rows) - sum(kept)) * s.padded[1]
    inputs = s.n * s.c * rows * z.in_dt.size
    weights = z.weight_bytes * (1 if tiling.spare or tiling.weights else s.n * len(spans))
    return inputs + weights + copied * (DType.f32.size + DType.i8.size)


def step_region(cfg: MachineConfig, band: Slot, reserved: Sequence[int]) -> Slot:
    """Where a resident schedule's steps put their own tiles: the scratchpad bank no slot uses (`TileArena.spare`),
    else the band's slot past its A tiles. Then the next band's A tiles, loading into another slot, share no bank
    with what the matrix unit reads (measured: 281k of resnet18 conv1's 1.04M cycles were matrix bank stalls with
    step tiles rotating over every slot; 155k with them in the band's slot)."""
    spare = TileArena.spare(cfg)
    if spare is not None:
        return spare.spad
    used = sum(-(-size // ALIGN) * ALIGN for size in reserved)
    return Slot(band.base + used, band.size - used)


def step_arena(cfg: MachineConfig, region: Slot, index: int) -> TileArena:
    """Step `index`'s tiles in the third of `region` numbered index % DEPTH: step index + DEPTH reuses its bytes
    only after step index is done (`run_pipeline`'s credits)."""
    third = region.size // DEPTH // ALIGN * ALIGN
    arena = TileArena(cfg, index)
    arena.spad = Slot(region.base + (index % DEPTH) * third, third)
    return arena


def band_geometry(graph: Graph, node: Node, s: ConvGeometry) -> tuple[ConvGeometry, int]:
    """The geometry the band schedule computes over, and the zero positions a band tile needs past its last row:
    padded rows `W + max(left, right)` wide instead of `left + W + right`. A row's right pads are then the next
    row's left pads (both zeros, adjacent in the tile): a tap past the row's end reads at most min(left, right)
    positions into the next row's left pads (the last row: into the tail), so fewer positions are computed and
    dropped (resnet18 layer4 at 224: 8 of every 7 kept, not 9; layer3 15 of 14, not 16)."""
    w = window_of(graph, node)
    left, width = (w.pads[1], w.in_shape[3]) if w.s == 2 else (w.pads[0], w.in_shape[2])
    pitch = width + max(left, s.padded[1] - left - width)
    return replace(s, padded=(s.padded[0], pitch)), s.padded[1] - pitch


def conv_phases(cx: LowerContext, nodes: Sequence[Node]) -> list[list[Step]]:
    """The Conv `nodes[0]` and the consumers its drain absorbs (bias, residual Add, Relu) as phases: the padded
    input (none without padding), the implicit GEMM into the DRAM scratch, the transposing loads to NCHW."""
    graph, cfg, node = cx.graph, cx.config, nodes[0]
    s, tail = band_geometry(graph, node, conv_shape(graph, cfg, node))
    out = cx.view(nodes[-1].outputs[0])
    ep = conv_epilogue(cx, nodes, s, out)
    if ep.residual is not None and s.strides[1] != 1:
        raise CodegenError(f"node {node.name!r}: a residual Add after a horizontally strided Conv is not absorbed")
    x = cx.view(node.inputs[0])
    mm_dt = DType.i8 if cx.int8 else DType.f32
    quantize = cx.matrix(node).input_scale if cx.int8 and x.dtype is DType.f32 else None
    z = _Sizes(s, cfg.array_size, x.dtype, mm_dt, ep.work_dt, quantize is not None, ep.residual is not None, tail)
    phases: list[list[Step]] = []
    tiling = _tiling_or_none(cfg, z, node.name, raises=quantize is None)
    if quantize is not None:
        # a float input on the int8 path: banded as it is (float rows and their int8 copies on chip), or
        # quantized to an int8 DRAM copy first (one pass, as the quantized reference quantizes the matrix
        # operand) and banded as int8, whichever moves fewer DRAM bytes: int8 bands are 5x smaller, so they can
        # hold every row, or the weights, on chip and read the weights once instead of once per band (resnet18
        # 224 layer3.1.conv1: 9.02 MB as float bands)
        z8 = replace(z, in_dt=DType.i8, quantize=False)
        tiling8 = _tiling_or_none(cfg, z8, node.name, raises=tiling is None)
        if tiling8 is not None and (tiling is None or band_traffic(z8, tiling8, x.size) < band_traffic(z, tiling)):
            copy = dense(cx.temp(node, QUANTIZED), x.shape, DType.i8)
            phases.append(copy_steps(cx, [(x, copy, quantize)]))
            x, quantize, z, tiling = copy, None, z8, tiling8
    source = BandSource.of(graph, node, x, s, tail)
    pixels_out = s.out[0] * s.out[1]
    scratch = dense(cx.temp(node, 2), (s.n, s.out[0] * s.cols, s.cout), ep.out_dt)
    taps = dense(cx.addresses[const_key(node.inputs[1], TAPS)], (s.taps * s.cg * s.cout,), mm_dt)
    k = _Kernel(s, tiling, z, taps, ep, quantize)
    spans = [(img, g, *band) for img in range(s.n) for g in range(s.groups) for band in k_slices(s.out[0], tiling.rows)]
    per_band = len(k_slices(s.coutg, tiling.tn)) * len(k_slices(s.cg, tiling.chunk))
    # halo rows are copied while the previous band's last step runs (its tiles live until then): only when each
    # band's fill runs in the previous band's steps (`ahead` below, two steps or more a band)
    halos = quantize is None and not tiling.spare and per_band >= 2
    fills: list[BandFill] = []
    for b, (img, g, oh0, rows) in enumerate(spans):
        kept = kept_rows(s, spans[b - 1], spans[b]) if b and halos else 0
        parts = [
            source.band(img, g * s.cg + c0, kb, oh0 * s.strides[0] + kept, s.in_rows(rows) - kept)
            for c0, kb in k_slices(s.cg, cfg.array_size)
        ]
        resident = TileArena.spare(cfg) if tiling.spare else TileArena(cfg, b, cx.rotation)
        tiles = [resident.tile(size) for size in z.resident(tiling.rows)]
        # the padded rows it shares with the previous band: copied on chip from that band's tiles, not loaded
        halo = Halo(fills[-1].ready, (oh0 - spans[b - 1][2]) * s.strides[0], kept, s.padded[1]) if kept else None
        fills.append(BandFill(parts, tiles, quantize, halo))
    steps: list[Step] = []
    tiles = 0
    for b, (img, g, oh0, rows) in enumerate(spans):
        # a band's input: brought in by its own first step (the first band, or bands of one step), else spread
        # over the previous band's steps so it loads while that band computes (its slot's last user, three bands
        # back, is done: every step waits for the one `DEPTH` before it, and bands have >= 2 steps)
        own = b == 0 or per_band < 2
        ahead = fills[b + 1] if per_band >= 2 and b + 1 < len(fills) else None
        for j0, tn in k_slices(s.coutg, tiling.tn):
            acc = TileArena(cfg, tiles, cx.rotation).acc_tile(s.stream_rows(rows) * tn * 4)
            for c0, kc in k_slices(s.cg, tiling.chunk):
                arena = TileArena(cfg, len(steps), cx.rotation)
                for size in [] if tiling.spare else z.resident(tiling.rows):  # skip the band's bytes in its slot
                    arena.tile(size)
                i = len(steps) - b * per_band
                dmas = fills[b].dmas() if own and i == 0 else []
                vector = fills[b].vector() if own and i == 0 else []
                if ahead is not None:
                    rest = ahead.dmas()
                    dmas += rest[len(rest) * i // per_band : len(rest) * (i + 1) // per_band]
                    vector += ahead.vector() if i == per_band - 1 else []
                tile = _Tile(img, g * s.coutg + j0, tn, oh0, rows, c0, kc, acc)
                steps.append(k.step(cx, arena, tile, fills[b].ready, (dmas, vector), scratch))
            tiles += 1
    phases.append(steps)
    nchw = out.reshape_dense((s.n, s.cout, pixels_out))
    phases.append(to_nchw(cfg, s.strides[1], scratch, nchw, cx.rotation, ep.dequant))
    return phases


@dataclass(frozen=True)
class _Tile:
    """One step's share of the work: image, output channel columns [col, col + tn), output rows
    [oh0, oh0 + rows), input channels [c0, c0 + kc) of the group, and the accumulator tile."""

    img: int
    col: int
    tn: int
    oh0: int
    rows: int
    c0: int
    kc: int
    acc: int


@dataclass(frozen=True)
class Epilogue:
    """What the drain applies to a conv's output tiles: the absorbed bias, residual, activation and int8
    requantization (per channel from a table, or per tensor)."""

    bias: View | None
    residual: View | None  # [n, Cout, OH * OW]
    table: View | None  # int8 per output channel: [Cout, 2] (mult, shift) pairs, read by the drain per column
    requant: tuple[int, int] | None  # int8 per tensor (fp32: the identity)
    act: Activation
    drain_dtype: str
    out_dt: DType  # of the drained tiles and the DRAM scratch
    out_w: int  # output pixels per output row (the residual's row pitch)
    dequant: float | None = None  # int8 drained, float32 out (an absorbed Clip's output): the scale
    # int8 dequantizing conv (`MatrixQuant.dequantize`, read only by Adds): [Cout] float32 channel scales; the
    # drain writes f32(acc + bias) and the vector unit multiplies each column by its channel's scale, then adds
    # the residual (float32, or int8 dequantized at `residual_scale`) and applies the activation, in float32 as
    # the unfused Add and Relu do
    scales: View | None = None
    residual_scale: float | None = None
    # a dequantizing conv's absorbed int8 Add (`fusion.quant.plan.int8_add`): the float32 sum, after the
    # activation, quantized at this scale (`v.qnt`) into the int8 out tile
    quantize: float | None = None

    @property
    def late(self) -> bool:
        """Residual and activation on the vector unit after the rescale (a dequantizing conv), not in the drain."""
        return self.scales is not None

    @property
    def work_dt(self) -> DType:
        """The out tile's dtype while the epilogue works on it: a dequantizing conv's float32 (narrowed to int8 in
        place by `rescale` when it quantizes), else what it stores."""
        return DType.f32 if self.late else self.out_dt

    def tiles(self, arena: TileArena, rows: int, tn: int) -> tuple[int, int, int]:
        """Local bias, residual and requantizer (or dequantizing scales) tiles of one step's last K chunk (0 =
        none)."""
        bias = arena.tile(tn * 4) if self.bias is not None else 0
        res = arena.tile(rows * self.out_w * tn * 4) if self.residual is not None else 0
        table = arena.tile(tn * 8) if self.table is not None else arena.tile(tn * 4) if self.scales is not None else 0
        return bias, res, table

    def load(self, em: Emitter, tiles: tuple[int, int, int], img: int, col: int, tn: int, oh0: int, rows: int) -> None:
        bias, res, table = tiles
        if bias:
            em.dma_load(self.bias.slice(0, col, tn), bias)
        if table:
            em.dma_load((self.table if self.table is not None else self.scales).slice(0, col, tn), table)
        if res:
            part = self.residual.index((img,)).slice(0, col, tn)
            load_transposed(em, part.slice(1, oh0 * self.out_w, rows * self.out_w), res + self._int8_at(rows, tn))

    def _int8_at(self, rows: int, tn: int) -> int:
        """Where an int8 residual lands in its float32 tile: the last quarter, which its in-order dequantization
        to the tile's start overwrites only after reading."""
        return 3 * rows * self.out_w * tn if self.residual_scale is not None else 0

    def drain(self, em: Emitter, band: DrainBand, tiles: tuple[int, int, int], out_tile: int) -> None:
        """Each output row's `band.valid` accumulator rows through the epilogue into the out tile."""
        bias_tile, res_tile, table_tile = tiles
        res_tile = 0 if self.late else res_tile
        act = Activation.none if self.late else self.act
        per_column = table_tile if self.table is not None else 0
        flags = (
            "_".join(name for name, on in (("bias", bias_tile), ("res", res_tile), ("pc", per_column)) if on) or "none"
        )
        mult, shift = (table_tile, 0) if self.table is not None else self.requant
        for r in range(band.rows):
            if r == 0 or res_tile:
                row_res = res_tile + r * self.out_w * band.tn * 4 if res_tile else 0
                em.b.ep_cfg(*em.regs(bias_tile, row_res, mult), shift, act, flags, self.drain_dtype)
            dst = out_tile + r * band.cols * band.tn * self.work_dt.size
            em.b.mx_drain(*em.regs(dst, band.acc + r * band.pitch * band.tn * 4), band.valid, band.tn)

    def rescale(self, em: Emitter, rows: int, tn: int, tiles: tuple[int, int, int], out_tile: int) -> None:
        """A dequantizing conv's drained f32(acc + bias) tile [rows, tn] times its columns' channel scales (the
        quantized reference's f32(acc) * f32(s_in * s_w[c])), plus the residual, then the activation, then (an
        int8 Add) quantized in place: element i's int8 lands at byte i, read from byte 4i, so in order it never
        overwrites a float not yet read; nothing otherwise."""
        if self.scales is None:
            return
        n, (_, res, scales) = rows * tn, tiles
        em.b.v_mul_vr(*em.regs(out_tile, out_tile, scales), n, tn, "f32")
        if res:
            if self.residual_scale is not None:
                dequantize(em, res, res + self._int8_at(rows // self.out_w, tn), n, self.residual_scale)
            em.b.v_add(*em.regs(out_tile, out_tile, res), n, "f32")
        if self.act is Activation.relu:
            em.b.v_relu(*em.regs(out_tile, out_tile), n, "f32")
        if self.quantize is not None:
            quantize_tile(em, out_tile, out_tile, n, self.quantize)


@dataclass(frozen=True)
class DrainBand:
    """A band's accumulator rows: `rows` output rows of `tn` columns at `acc`, each `pitch` rows apart, `valid`
    drained per row into an out tile `cols` positions per row."""

    acc: int
    rows: int
    tn: int
    pitch: int
    valid: int
    cols: int


def conv_epilogue(cx: LowerContext, nodes: Sequence[Node], s: ConvGeometry, out: View) -> Epilogue:
    """The drain's work for the Conv `nodes[0]` and the consumers it absorbs (a dequantizing conv: `scales`, which
    the generator applies after the drain, `Epilogue.rescale`)."""
    graph, node = cx.graph, nodes[0]
    drained, clip = clip_tail(cx, nodes)
    ops = epilogue_ops_of_conv(graph, drained)
    scales = dequant_scales(cx, node)
    if cx.int8 and ops.residual is not None and scales is None:
        raise CodegenError("int8: a residual Add after the requantization cannot move into the drain")
    table = None if scales is not None else requant_table(cx, node)
    dequant = None if clip is None else cx.scale(drained[-1].outputs[0])
    if scales is not None and clip is not None:
        raise CodegenError(f"node {node.name!r}: a dequantizing conv's epilogue takes no Clip")
    quantize = cx.scale(nodes[-1].outputs[0]) if scales is not None else None  # an absorbed int8 Add
    return Epilogue(
        bias_view(cx, node),
        None if ops.residual is None else cx.view(ops.residual).reshape_dense((s.n, s.cout, s.out[0] * s.out[1])),
        table,
        None if table is not None else _per_tensor(cx, node, scales),
        Activation.relu if ops.relu or clip == "relu" else Activation.none,
        "i8" if cx.int8 and scales is None else "f32",
        DType.i8 if dequant is not None else out.dtype,
        s.out[1],
        dequant,
        scales,
        None if ops.residual is None else cx.scale(ops.residual),
        quantize,
    )


def _per_tensor(cx: LowerContext, node: Node, scales: View | None) -> tuple[int, int]:
    """The drain's (mult, shift) without a per-column table: the int8 requantizer, or f32 x 1.0 (fp32, and a
    dequantizing conv, whose channel scales the vector unit applies after the drain)."""
    return (f32_bits(1.0), 0) if scales is not None else requant(cx, node) or (f32_bits(1.0), 0)


def clip_tail(cx: LowerContext, nodes: Sequence[Node]) -> tuple[Sequence[Node], str | None]:
    """`nodes` without a trailing Clip the int8 drain applies exactly, and what it is there ("relu": Clip(0, hi),
    "none": bounds beyond the int8 range): a Clip whose upper bound is at or beyond the largest value the
    drained int8 output can hold (127 x its scale; ReLU6 in MobileNetV2, whose convs' int8 ranges all end
    below 6) and whose lower bound is 0 or beyond -128 x the scale is the requantization clamp (with the ReLU
    the drain applies). Its output is float32 in the int8 plan: the kernel dequantizes on the way out, as the
    quantized reference does (f32(q) x f32(scale), then the clamp, which then changes nothing)."""
    last = nodes[-1]
    if last.op != OpType.Clip:
        return nodes, None
    if not cx.int8 or len(nodes) < 2:
        raise CodegenError(f"node {last.name!r}: the fp32 drain has no upper clamp (a Clip runs as its own kernel)")
    value = nodes[-2].outputs[0]
    scale, lo, hi = cx.scale(value), float(last.attr("min")), float(last.attr("max"))
    if last.inputs[0] != value or scale is None or cx.scale(last.outputs[0]) is not None:
        raise CodegenError(f"node {last.name!r}: the Clip does not read the drained int8 value {value!r}")
    if hi < 127 * scale or not (lo == 0.0 or lo <= -128 * scale):
        raise CodegenError(
            f"node {last.name!r}: Clip({lo:g}, {hi:g}) binds inside the int8 range of {value!r} "
            f"(+-{127 * scale:.4g}): it is not the requantization clamp"
        )
    return nodes[:-1], "relu" if lo == 0.0 else "none"


@dataclass(frozen=True)
class _Kernel:
    """What every step of one conv kernel shares."""

    s: ConvGeometry
    tiling: _Tiling
    z: _Sizes
    taps: View  # flat, `pack_band_taps`
    ep: Epilogue
    quantize: float | None

    def step(
        self,
        cx: LowerContext,
        arena: TileArena,
        t: _Tile,
        ready: list[int],
        band_work: tuple[list[Emit], list[Emit]],
        scratch: View,
    ) -> Step:
        """One step over the band whose matrix-dtype tiles are `ready`; `band_work`: the DMAs and vector work of
        bringing in a band's input that this step carries (its own band's, or a share of the next one's)."""
        s, z, n = self.s, self.z, cx.config.array_size
        slices = k_slices(s.cg, n)
        dmas, vector = band_work
        last = t.c0 + t.kc == s.cg
        start = (t.col * s.cg + t.c0 * t.tn) * s.taps  # the Cout tile's block, then its channel blocks
        if self.tiling.weights:  # in the spare bank at their packed offset; the first band of image 0 loads them
            weights = TileArena.spare(cx.config).spad.base + start * z.mm_dt.size
            fetch = t.img == 0 and t.oh0 == 0
        else:
            weights, fetch = arena.tile(s.taps * t.kc * t.tn * z.mm_dt.size), True
        tiles = self.ep.tiles(arena, t.rows, t.tn) if last else (0, 0, 0)
        out_tile = arena.tile(t.rows * s.cols * t.tn * z.out_dt.size) if last else 0
        stream = s.stream_rows(t.rows)

        def load(em: Emitter) -> None:
            for dma in dmas:
                dma(em)
            if fetch:
                em.dma_load(self.taps.slice(0, start, s.taps * t.kc * t.tn), weights)
            self.ep.load(em, tiles, t.img, t.col, t.tn, t.oh0, t.rows)

        def band_vector(em: Emitter) -> None:
            for work in vector:
                work(em)

        def matmul(em: Emitter) -> None:
            items, opened = [], t.c0 != 0  # a later K chunk adds to the accumulator the first one opened
            size, preload = z.mm_dt.size, z.mm_dt.name
            chunk = [(c0, kb, block) for (c0, kb), block in zip(slices, ready, strict=True) if t.c0 <= c0 < t.c0 + t.kc]
            for kh in range(s.kernel[0]):
                for kw in range(s.kernel[1]):
                    tap, offset = kh * s.kernel[1] + kw, s.offset(kh, kw)
                    for c0, kb, block in chunk:
                        at = weights + ((c0 - t.c0) * s.taps + tap * kb) * t.tn * size
                        start = block + offset * kb * size
                        mm = "mx_mma" if opened else "mx_mm"
                        items.append(((("mx_preload", 1, (kb, t.tn, preload)), (mm, 2, (stream,))), (at, t.acc, start)))
                        opened = True
            emit_keyed(em, items)
            if last:
                rows = DrainBand(t.acc, t.rows, t.tn, s.pitch, s.valid, s.cols)
                self.ep.drain(em, rows, tiles, out_tile)

        def rescale(em: Emitter) -> None:
            self.ep.rescale(em, t.rows * s.cols, t.tn, tiles, out_tile)

        compute = [(Unit.load, load)]
        if vector:
            compute.append((Unit.vector, band_vector))
        compute.append((Unit.matrix, matmul))
        if last and self.ep.scales is not None:
            compute.append((Unit.vector, rescale))
        stores = []
        if last:
            view = scratch.index((t.img,)).slice(0, t.oh0 * s.cols, t.rows * s.cols).slice(1, t.col, t.tn)
            stores.append((out_tile, view))
        return Step([], compute, stores)


@dataclass(frozen=True)
class Halo:
    """A band's first `rows` padded rows, shared with the previous band: copied on the vector unit from that
    band's tiles (`source`, one per channel block), starting `offset` padded rows into them, `pitch` pixels a
    row. Both bands' tiles are live then: the copy runs with the band's other fill work, in the previous band's
    last step (or the band's own first), before the matrix unit reads either's successor."""

    source: list[int]
    offset: int
    rows: int
    pitch: int


@dataclass(frozen=True)
class BandFill:
    """What brings one band's input into its resident tiles: each channel block's row DMAs into `raw`, the pad
    positions cleared, and (a float input on the int8 path) the quantized copies `ready` the matrix unit reads.
    With a `halo`, the parts start that many padded rows into the tiles and the rows before come from the
    previous band's tiles."""

    parts: list[Band]
    raw: list[int]  # the blocks' tiles as loaded, then (quantize) their int8 copies
    quantize: float | None  # the input scale (a float input on the int8 path), else None
    halo: Halo | None = None

    @property
    def ready(self) -> list[int]:
        return self.raw[len(self.parts) :] if self.quantize is not None else self.raw[: len(self.parts)]

    def _at(self, part: Band, tile: int) -> int:
        """Where the part's first row lands in its block's tile."""
        skip = 0 if self.halo is None else self.halo.rows * self.halo.pitch
        return tile + skip * part.channels.shape[0] * part.channels.dtype.size

    def dmas(self) -> list[Emit]:
        return [
            dma for part, tile in zip(self.parts, self.raw, strict=False) for dma in part.loads(self._at(part, tile))
        ]

    def vector(self) -> list[Emit]:
        """The halo rows copied, the pads cleared (disjoint from the loaded rows: no order between them), then
        the int8 copies."""
        work: list[Emit] = [partial(self._copy_halo, part=part, i=i) for i, part in enumerate(self.parts)]
        pairs = [(part, self._at(part, tile)) for part, tile in zip(self.parts, self.raw, strict=False)]
        work += [partial(part.move, tile=tile) for part, tile in pairs]
        if self.parts[0].padded:
            work += [partial(part.clear, tile=tile) for part, tile in pairs]
        if self.quantize is not None:
            scale = f32_bits(1.0 / self.quantize)
            for part, src, dst in zip(self.parts, self.raw[: len(self.parts)], self.ready, strict=True):

                def to_int8(em: Emitter, src: int = src, dst: int = dst, count: int = part.elements) -> None:
                    em.b.v_qnt(*em.regs(dst, src, scale), count)

                work.append(to_int8)
        return work

    def _copy_halo(self, em: Emitter, part: Band, i: int) -> None:
        if self.halo is None:
            return
        h, kb, dt = self.halo, part.channels.shape[0], part.channels.dtype
        src = h.source[i] + h.offset * h.pitch * kb * dt.size
        total = h.rows * h.pitch * kb
        for start in range(0, total, MAX_N):
            n = min(MAX_N, total - start)
            em.b.v_copy(*em.regs(self.raw[i] + start * dt.size, src + start * dt.size), n, dt.name)


@dataclass(frozen=True)
class BandSource:
    """A Conv's unpadded input [n, C, H * W] and where it sits in the padded frame the band schedule computes
    over: `top` rows and `left` columns of zeros before it, padded rows `pitch` pixels wide."""

    x: View
    height: int
    width: int
    top: int
    left: int
    pitch: int
    padded: bool  # the frame has pad positions (the tiles are cleared before the rows come in)
    tail: int  # zero positions past a band's last row (`band_geometry`)

    @staticmethod
    def of(graph: Graph, node: Node, x: View, s: ConvGeometry, tail: int) -> BandSource:
        w = window_of(graph, node)
        height, width = (w.in_shape[2] if w.s == 2 else 1), w.in_shape[-1]
        top, left = (w.pads[0], w.pads[1]) if w.s == 2 else (0, w.pads[0])
        image = x.reshape_dense((s.n, s.c, height * width))
        return BandSource(image, height, width, top, left, s.padded[1], w.needs_pad, tail)

    def band(self, img: int, c0: int, kb: int, row0: int, rows: int) -> Band:
        """Channels [c0, c0 + kb) of image `img` over padded rows [row0, row0 + rows)."""
        return Band(self, self.x.index((img,)).slice(0, c0, kb), row0, rows)


@dataclass(frozen=True)
class Band:
    """One channel block of a band of padded input rows, brought into a [pixels, kb] tile (row = padded pixel)
    straight from the unpadded input (no padded copy in DRAM): each run of input rows comes in by transposing loads
    at its place (one run when the frame has no side padding), and the vector unit zeros the pad positions."""

    src: BandSource
    channels: View  # [kb, H * W]
    row0: int
    rows: int

    @property
    def padded(self) -> bool:
        return self.src.padded

    @property
    def pixels(self) -> int:
        return self.rows * self.src.pitch + self.src.tail

    def pad_runs(self) -> list[tuple[int, int]]:
        """(first pixel, pixels) of the tile's pad positions, adjacent ones merged: whole rows above and below
        the image, each row's right pads with the next row's left pads, and the tail past the last row."""
        src, runs = self.src, []
        for r, h in enumerate(range(self.row0, self.row0 + self.rows)):
            inside = src.top <= h < src.top + src.height
            parts = [(0, src.left), (src.left + src.width, src.pitch)] if inside else [(0, src.pitch)]
            for a, b in parts:
                if b <= a:
                    continue
                start, end = r * src.pitch + a, r * src.pitch + b
                if runs and runs[-1][0] + runs[-1][1] == start:
                    runs[-1] = (runs[-1][0], end - runs[-1][0])
                else:
                    runs.append((start, end - start))
        if src.tail:  # the tail past the last row
            start = self.rows * src.pitch
            if runs and runs[-1][0] + runs[-1][1] == start:
                runs[-1] = (runs[-1][0], runs[-1][1] + src.tail)
            else:
                runs.append((start, src.tail))
        return runs

    def _image_rows(self) -> tuple[int, int]:
        """The band's padded rows [first, last) that hold input rows."""
        src = self.src
        return max(self.row0, src.top), min(self.row0 + self.rows, src.top + src.height)

    @property
    def staged(self) -> bool:
        """Whether the band's input rows come in by one transposing DMA, densely at the tile's start, and move to
        their padded places by vector copies (`move`), not by one DMA per row (each ~134 cycles on the load unit,
        one at a time: resnet18 224 layer3's band, 224 of them, held the matrix unit back ~30k cycles). Taken
        when the frame has side pads and every row moves at least a row's length: no copy overlaps its own
        source, and copying the last row first overwrites no row not yet moved (the first band of an image,
        with pad rows above it)."""
        src = self.src
        first, last = self._image_rows()
        side = src.pitch != src.width
        return side and last - first > 1 and (first - self.row0) * src.pitch + src.left >= src.width

    def move(self, em: Emitter, tile: int) -> None:
        """A staged band's rows from their dense places to their padded ones, the last row first (before the
        pads are cleared: a dense row may lie where pads are)."""
        if not self.staged:
            return
        src, kb, dt = self.src, self.channels.shape[0], self.channels.dtype
        first, last = self._image_rows()
        for h in reversed(range(last - first)):
            dst = ((first - self.row0 + h) * src.pitch + src.left) * kb
            for start in range(0, src.width * kb, MAX_N):
                n = min(MAX_N, src.width * kb - start)
                em.b.v_copy(
                    *em.regs(tile + (dst + start) * dt.size, tile + (h * src.width * kb + start) * dt.size), n, dt.name
                )

    def clear(self, em: Emitter, tile: int) -> None:
        """Zeros at the pad positions (disjoint from the loaded rows: no order between the two; after `move`)."""
        kb, dt = self.channels.shape[0], self.channels.dtype
        for first, count in self.pad_runs():
            for start in range(first * kb, (first + count) * kb, MAX_N):
                fill(em, tile + start * dt.size, min(MAX_N, (first + count) * kb - start), dt, 0.0)

    @property
    def elements(self) -> int:
        return self.pixels * self.channels.shape[0]

    def loads(self, tile: int) -> list[Emit]:
        """The transposing DMAs of the band's input rows into `tile`, one per run of rows landing together."""
        src, kb, es = self.src, self.channels.shape[0], self.channels.dtype.size
        first = max(self.row0, src.top)
        last = min(self.row0 + self.rows, src.top + src.height)  # padded rows holding input rows
        side = src.pitch != src.width  # left/right pads or a wider frame: each row lands at its own place
        if self.staged:  # densely at the tile's start, `move`d into place
            part = self.channels.slice(1, (first - src.top) * src.width, (last - first) * src.width)
            return [partial(load_transposed, part=part, tile=tile)]
        runs = [(h, 1) for h in range(first, last)] if side else [(first, last - first)] if first < last else []
        return [
            partial(
                load_transposed,
                part=self.channels.slice(1, (h - src.top) * src.width, count * src.width),
                tile=tile + ((h - self.row0) * src.pitch + src.left) * kb * es,
            )
            for h, count in runs
        ]


def load_transposed(em: Emitter, part: View, tile: int) -> None:
    """A [rows, cols] DRAM view (cols contiguous) as a [cols, rows] tile, in transposing loads of at most
    MAX_COLS columns."""
    rows, cols = part.shape
    for p0 in range(0, cols, MAX_COLS):
        count = min(MAX_COLS, cols - p0)
        local, dram, stride = em.regs(
            tile + p0 * rows * part.dtype.size, part.address + p0 * part.dtype.size, part.strides[0]
        )
        em.b.dma_ldt(local, dram, stride, rows, count, part.dtype.name)


def epilogue_ops_of_conv(graph: Graph, nodes: Sequence[Node]) -> EpilogueOps:
    """The drain's work for a Conv and its absorbed consumers (bias: the Conv's own, per output channel)."""
    ops = epilogue_ops(graph, nodes, frozenset({OpType.Conv}))
    if ops.bias is not None and ops.bias != (nodes[0].inputs[2] if len(nodes[0].inputs) > 2 else None):
        raise CodegenError(f"node {nodes[0].name!r}: a second bias after the Conv is not absorbed")
    return ops


def to_nchw(
    cfg: MachineConfig, step: int, scratch: View, out: View, rotation: int, dequant: float | None = None
) -> list[Step]:
    """The DRAM scratch [OH * step * OW, Cout] of each image -> out[img] as [Cout, OH * OW]: transposing loads of
    every `step`-th pixel row, in runs that fit a buffer slot (int8 dequantized to a float32 out at `dequant`)."""
    n, cout, pixels = out.shape
    es = scratch.dtype.size

    def sizes(p: int) -> list[int]:
        return [p * cout * es] + ([p * cout * 4] if dequant is not None else [])

    probe = TileArena(cfg, 0)
    run = largest_fitting(min(pixels, MAX_ROWS), lambda p: probe.fits(sizes(p)))
    if run == 0 or cout > MAX_COLS:
        raise CodegenError(f"{cout} output channels of one pixel exceed a buffer slot or one transposing DMA")
    steps = []
    for img in range(n):
        for p0 in range(0, pixels, run):
            count = min(run, pixels - p0)
            arena = TileArena(cfg, len(steps), rotation)
            tile, *deq = [arena.tile(size) for size in sizes(count)]
            address = scratch.index((img,)).address + p0 * step * cout * es

            def load(em: Emitter, tile=tile, address=address, count=count) -> None:
                local, dram, stride = em.regs(tile, address, step * cout * es)
                em.b.dma_ldt(local, dram, stride, count, cout, scratch.dtype.name)

            compute = [(Unit.load, load)]
            if deq:

                def to_f32(em: Emitter, src=tile, dst=deq[0], n=count * cout) -> None:
                    dequantize(em, dst, src, n, dequant)

                compute.append((Unit.vector, to_f32))
            steps.append(Step([], compute, [((deq or [tile])[0], out.index((img,)).slice(1, p0, count))]))
    return steps
