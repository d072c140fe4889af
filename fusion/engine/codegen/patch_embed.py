"""A patchify Conv (kernel == stride, no padding: a ViT / DeiT patch embedding) and the Reshape + Transpose that
turn its NCHW output into tokens, as one patch-matrix GEMM (`patch_embed`).

Non-overlapping patches need no im2col and no gather: the kw run of patch (oh, ow) at kernel row kh of channel c is
the p_w elements x[c, oh * p_h + kh, ow * p_w : (ow + 1) * p_w], and the runs of one image row's patches lie side
by side. So the input rows of one (kernel row, channel), placed one after another, are already a dense A tile
[patches, p_w] whose K is the patch's kw: each (channel, kernel row) is one preload of the weights W[co, c, kh, :]
as a [p_w, Cout tile] tile and one `mx.mma` streaming every patch of the band (acc[patch, co], token-major). A band
of patch rows comes in with one DMA per channel (one for the whole image when it is contiguous); one vector pass
per input row puts it kernel-row major (`v.qnt` on the int8 path, quantizing at once; `v.copy` in fp32), the
unused columns past the last patch dropped. The weights are packed at compile time as the steps read them (Cout
tile major, then channel, kernel row, kw: one contiguous DMA per step). The drain (bias per column, int8
per-channel requantization) writes the rows of [B, patches, Cout], which the Reshape + Transpose after the Conv ask
for: no NCHW tensor, no transposing copy.

K per preload is p_w (at most N): a patch narrower than the array uses p_w / N of its rows (one preload per
(channel, kernel row) instead of per N of them), which the gather-free layout pays for; p_w above N is refused
(a kw run would span preloads).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fusion.engine.codegen.conv import Epilogue, conv_epilogue
from fusion.engine.codegen.gemm import k_slices
from fusion.engine.errors import CodegenError
from fusion.graph.ir import Graph, Node
from fusion.graph.ops import OpType
from fusion.lower.context import LowerContext, const_key
from fusion.lower.emitter import Emitter, Step, f32_bits
from fusion.lower.kernels.conv_geometry import conv_geometry
from fusion.lower.kernels.windows import window_of
from fusion.lower.local_alloc import TileArena, largest_fitting
from fusion.lower.views import MAX_ROWS, View, dense
from isa.enums import Activation, DType, Unit
from simulator.config import MachineConfig

PATCHES = "patches"  # constant-form key of a patchify Conv's weight packed as the steps read it


@dataclass(frozen=True)
class Patchify:
    """A patchify Conv's shape: input [n, c, h, w], patches ph x pw, output patches oh x ow, cout channels."""

    n: int
    c: int
    h: int
    w: int
    cout: int
    ph: int
    pw: int
    oh: int
    ow: int


def patchify(graph: Graph, cfg: MachineConfig, conv: Node) -> Patchify:
    """The shape of a Conv this kernel runs; CodegenError naming the node and the reason otherwise."""
    if conv.op != OpType.Conv:
        raise CodegenError(f"node {conv.name!r} ({conv.op.value}) is not a Conv")
    win = window_of(graph, conv)
    if win.s not in (1, 2):
        raise CodegenError(f"node {conv.name!r}: a patch embedding is a 1-D or 2-D Conv, not {win.s}-D")
    if not graph.is_constant(conv.inputs[1]):
        raise CodegenError(f"node {conv.name!r}: the patch GEMM packs a constant weight")
    if conv.attr("group") != 1:
        raise CodegenError(f"node {conv.name!r}: a grouped Conv is not a patch embedding")
    if win.needs_pad or any(d != 1 for d in win.dilations) or tuple(win.kernel) != tuple(win.strides):
        raise CodegenError(
            f"node {conv.name!r}: not non-overlapping patches (kernel {win.kernel}, strides {win.strides}, "
            f"dilations {win.dilations}, pads {win.pads})"
        )
    g = conv_geometry(graph, conv, win.padded_shape)
    if g.kernel[1] > cfg.array_size:
        raise CodegenError(f"node {conv.name!r}: patch width {g.kernel[1]} exceeds the array's {cfg.array_size} K rows")
    return Patchify(g.n, g.c, *g.padded, g.cout, *g.kernel, *g.out)


def _sole_reader(graph: Graph, node: Node) -> Node | None:
    value = node.outputs[0]
    readers = graph.consumers.get(value, ())
    return readers[0] if len(readers) == 1 and value not in graph.outputs else None


def find_patch_embeds(graph: Graph) -> list[tuple[str, ...]]:
    """Conv (patchify) -> [Reshape merging the spatial axes] -> Transpose(0, 2, 1): [n, Cout, ...] to tokens."""
    found = []
    for conv in graph.nodes:
        if conv.op != OpType.Conv or len(graph.types[conv.outputs[0]].shape) not in (3, 4):
            continue
        n, cout, *spatial = graph.types[conv.outputs[0]].shape
        run, nxt = [conv], _sole_reader(graph, conv)
        if nxt is not None and nxt.op == OpType.Reshape and len(spatial) == 2:
            if tuple(graph.types[nxt.outputs[0]].shape) != (n, cout, spatial[0] * spatial[1]):
                continue
            run, nxt = [*run, nxt], _sole_reader(graph, nxt)
        if len(graph.types[run[-1].outputs[0]].shape) != 3:
            continue
        if nxt is not None and nxt.op == OpType.Transpose and tuple(nxt.attr("perm")) == (0, 2, 1):
            found.append(tuple(x.name for x in (*run, nxt)))
    return found


def pack_patch_weights(weights: np.ndarray, n: int) -> np.ndarray:
    """W[Cout, C, ph, pw] (or a 1-D conv's [Cout, C, pw]) as [Cout tile][C][ph][pw][tile width], flat: a step's
    weights (one Cout tile, a run of channels) are one contiguous run, each (c, kh) tile a dense [pw, width]."""
    w = weights.reshape(weights.shape[0], weights.shape[1], -1, weights.shape[-1])
    blocks = [w[c0 : c0 + width].transpose(1, 2, 3, 0).ravel() for c0, width in k_slices(w.shape[0], n)]
    return np.ascontiguousarray(np.concatenate(blocks))


@dataclass(frozen=True)
class _Tiling:
    rows: int  # patch rows per band
    nc: int  # output channels per Cout tile
    channels: int  # input channels per step (the step's K: channels x ph preloads)


def _tiling(cfg: MachineConfig, p: Patchify, in_dt: DType, mm_dt: DType, out_dt: DType) -> _Tiling:
    """The most patch rows per band, then the most channels per step, whose tiles fit one buffer slot."""
    probe, nc = TileArena(cfg, 0), min(cfg.array_size, p.cout)

    def fits(rows: int, channels: int) -> bool:
        raw, band = p.c * rows * p.ph * p.w, p.c * rows * p.ph * p.ow * p.pw
        spad = [raw * in_dt.size, band * mm_dt.size]
        spad += [channels * p.ph * p.pw * nc * mm_dt.size, nc * 4, nc * 8, rows * p.ow * nc * out_dt.size]
        return rows * p.ow <= MAX_ROWS and probe.fits(spad, [rows * p.ow * nc * 4])

    rows = largest_fitting(p.oh, lambda r: fits(r, 1))
    if rows == 0:
        raise CodegenError(f"one patch row of the input ({p.c} x {p.ph} x {p.w}) does not fit a buffer slot")
    return _Tiling(rows, nc, largest_fitting(p.c, lambda c: fits(rows, c)))


def patch_embed_steps(cx: LowerContext, nodes: Sequence[Node]) -> list[Step]:
    """The group Conv [+ Reshape] + Transpose(0, 2, 1) as pipeline steps: per band of patch rows, Cout tile and
    channel run, one step (the band's input loaded, and quantized, by its first step)."""
    graph, cfg, conv = cx.graph, cx.config, nodes[0]
    if [n.name for n in nodes] not in [list(m) for m in find_patch_embeds(graph)]:
        raise CodegenError(f"node {conv.name!r}: not a patchify Conv followed by its token Reshape + Transpose")
    p = patchify(graph, cfg, conv)
    out = cx.view(nodes[-1].outputs[0])  # [n, patches, Cout]
    if cx.dtype(conv.outputs[0]) is not out.dtype:
        raise CodegenError(f"node {conv.name!r}: the token layout changes the dtype of its output")
    ep = conv_epilogue(cx, nodes[:1], conv_geometry(graph, conv, window_of(graph, conv).padded_shape), out)
    if ep.scales is not None or ep.residual is not None or ep.dequant is not None:
        raise CodegenError(f"node {conv.name!r}: the patch GEMM drains a bias and a requantization only")
    image = cx.view(conv.inputs[0]).reshape_dense((p.n, p.c, p.h, p.w))
    mm_dt = DType.i8 if cx.int8 else DType.f32
    quantize = cx.matrix(conv).input_scale if cx.int8 and image.dtype is DType.f32 else None
    tiling = _tiling(cfg, p, image.dtype, mm_dt, out.dtype)
    weights = dense(cx.addresses[const_key(conv.inputs[1], PATCHES)], (p.cout * p.c * p.ph * p.pw,), mm_dt)
    k = _Kernel(p, tiling, ep, weights, mm_dt, quantize)
    steps: list[Step] = []
    accs = 0  # accumulator tiles rotate by their own count: one lives through its Cout tile's channel steps
    bands = [(img, *band) for img in range(p.n) for band in k_slices(p.oh, tiling.rows)]
    for b, (img, oh0, rows) in enumerate(bands):
        sizes = [p.c * rows * p.ph * p.w * image.dtype.size, p.c * rows * p.ph * p.ow * p.pw * mm_dt.size]
        # a kernel's only band goes to the scratchpad bank no slot uses: the matrix unit's reads of it then never
        # wait for a preload reading the step's weights from the same bank; bands after bands rotate with the slots
        spare = TileArena.spare(cfg) if len(bands) == 1 else None
        spare = spare if spare is not None and spare.fits(sizes) else None
        arena = spare or TileArena(cfg, b, cx.rotation)
        raw, band = arena.tile(sizes[0]), arena.tile(sizes[1])
        reserved = [] if spare else sizes
        part = image.index((img,)).slice(1, oh0 * p.ph, rows * p.ph)
        first = True
        for co0, nc in k_slices(p.cout, tiling.nc):
            acc = TileArena(cfg, accs, cx.rotation).acc_tile(rows * p.ow * nc * 4)
            accs += 1
            for c0, channels in k_slices(p.c, tiling.channels):
                step = TileArena(cfg, len(steps), cx.rotation)
                for nbytes in reserved:  # the band's input stays put while its steps run
                    step.tile(nbytes)
                t = _Tile(img, oh0, rows, co0, nc, c0, channels, band, acc)
                dest = out.index((img,)).slice(0, oh0 * p.ow, rows * p.ow).slice(1, co0, nc)
                steps.append(k.step(step, t, (part, raw) if first else None, dest))
                first = False
    return steps


@dataclass(frozen=True)
class _Tile:
    img: int
    oh0: int
    rows: int  # patch rows of the band
    co0: int
    nc: int
    c0: int  # first input channel of the step
    channels: int
    band: int  # local address of the band's matrix-dtype input, kernel-row major [ph, C, rows, OW * pw]
    acc: int  # accumulator tile [rows * OW, nc]


@dataclass(frozen=True)
class _Kernel:
    p: Patchify
    tiling: _Tiling
    ep: Epilogue  # bias, per-channel table or per-tensor requantizer (`codegen.conv`)
    weights: View  # flat, `pack_patch_weights`
    mm_dt: DType
    quantize: float | None  # the input scale of a float input on the int8 path

    def step(self, arena: TileArena, t: _Tile, band_load: tuple[View, int] | None, dest: View) -> Step:
        p, es = self.p, self.mm_dt.size
        last = t.c0 + t.channels == p.c
        w_tile = arena.tile(t.channels * p.ph * p.pw * t.nc * es)
        bias = arena.tile(t.nc * 4) if last and self.ep.bias is not None else 0
        table = arena.tile(t.nc * 8) if last and self.ep.table is not None else 0
        out_tile = arena.tile(t.rows * p.ow * t.nc * self.ep.out_dt.size) if last else 0
        tile_start = (t.co0 * p.c + t.c0 * t.nc) * p.ph * p.pw  # `pack_patch_weights`: the Cout tile, its channels
        loads = [(band_load[0], band_load[1])] if band_load else []
        loads.append((self.weights.slice(0, tile_start, t.channels * p.ph * p.pw * t.nc), w_tile))
        if bias:
            loads.append((self.ep.bias.slice(0, t.co0, t.nc), bias))
        if table:
            loads.append((self.ep.table.slice(0, t.co0, t.nc), table))

        def regroup(em: Emitter) -> None:
            self.regroup(em, t, band_load[1])

        def matmul(em: Emitter) -> None:
            run = p.ow * p.pw * es  # one input row's patches
            local = w_tile
            for c in range(t.c0, t.c0 + t.channels):
                for kh in range(p.ph):
                    em.b.mx_preload(em.reg(local), p.pw, t.nc, self.mm_dt.name)
                    a = t.band + (kh * p.c + c) * t.rows * run
                    (em.b.mx_mm if c == 0 and kh == 0 else em.b.mx_mma)(*em.regs(t.acc, a), t.rows * p.ow)
                    local += p.pw * t.nc * es
            if last:
                self.drain(em, t, bias, table, out_tile)

        compute = [(Unit.vector, regroup)] if band_load else []
        compute.append((Unit.matrix, matmul))
        return Step(loads, compute, [(out_tile, dest)] if last else [])

    def regroup(self, em: Emitter, t: _Tile, raw: int) -> None:
        """The band's input rows [C, rows, ph, W] as [ph, C, rows, OW * pw] in the matrix dtype, one vector pass per
        input row (the int8 path's quantization of a float input is that pass)."""
        p, in_es = self.p, 4 if self.quantize is not None else self.mm_dt.size
        n, es = p.ow * p.pw, self.mm_dt.size
        inv = f32_bits(1.0 / self.quantize) if self.quantize is not None else 0
        for c in range(p.c):
            for r in range(t.rows):
                for kh in range(p.ph):
                    src = raw + ((c * t.rows + r) * p.ph + kh) * p.w * in_es
                    dst = t.band + ((kh * p.c + c) * t.rows + r) * n * es
                    if self.quantize is not None:
                        em.b.v_qnt(*em.regs(dst, src, inv), n)
                    else:
                        em.b.v_copy(*em.regs(dst, src), n, self.mm_dt.name)

    def drain(self, em: Emitter, t: _Tile, bias: int, table: int, out_tile: int) -> None:
        """acc [patches, nc] through bias and requantization into the token-major out tile."""
        flags = "_".join(name for name, on in (("bias", bias), ("pc", table)) if on) or "none"
        mult, shift = (table, 0) if table else self.ep.requant
        em.b.ep_cfg(*em.regs(bias, 0, mult), shift, Activation.none, flags, self.ep.drain_dtype)
        em.b.mx_drain(*em.regs(out_tile, t.acc), t.rows * self.p.ow, t.nc)
