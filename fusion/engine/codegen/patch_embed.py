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
(a kw run would span preloads). Packing two kernel rows into one preload needs A rows holding 2 p_w elements of one
patch: no DMA (dense locally) or vector op (contiguous) makes them but one instruction per patch and kernel row,
and one matmul per patch row over the input in place breaks the preload / matmul overlap (a preload follows every
matmul of the weights before it): on ViT the first costs more scalar issue (3 cycles an instruction, 384 of them)
than the 768 matrix cycles it saves, the second measured 4,230 cycles against 3,225 (int8).

Overlap: with one channel group each channel's rows are regrouped in its own step's slot (another bank than the
matmuls of the channel before); with one band, channel 0 is regrouped by a step of its own into the spare bank
while the first weights load, and the tokens tiles sit there too (the class rows' DMA never holds a regrouping
back). The class-token tail of the last image runs apart in two steps where a value read outside (a pre-LN sum)
splits its chain: its store overlaps the rest, which takes it in its vector register; the tail's loaded operands
(position embeddings) go into vector registers before the drains' token, so its chain starts on the tokens alone;
int8, with the tokens tiles in the spare bank, the Concat is built in a register: the int8 tile (class rows cleared
by channel 0's step) dequantized plus the preloaded class rows, no store and reload of the dequantized tokens.
Regrouping channel c + 1 between channel c's matmuls instead (its rows loaded after channel c's weights, handed to
the vector unit alone) measured 3,035 cycles against 2,976 (ViT int8): the vector passes, waiting for that DMA,
fill their queue and hold the in-order issue of the matmuls and of the next loads back; its rows loaded before the
weights, the passes wait for the DMA into their bank (3,063).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from fusion.engine.codegen.chain import (
    CHAIN_OPS,
    Registers,
    emit_chain,
    load_register,
    operand_views,
    operands,
)
from fusion.engine.codegen.conv import Epilogue, conv_epilogue, matrix_conv_window
from fusion.engine.codegen.gemm import k_slices
from fusion.engine.errors import CodegenError
from fusion.graph.ir import Graph, Node
from fusion.graph.ops import OpType
from fusion.lower.context import LowerContext, const_key
from fusion.lower.emitter import Emitter, Step, f32_bits
from fusion.lower.kernels.conv_geometry import conv_geometry
from fusion.lower.kernels.vector_ops import fill
from fusion.lower.kernels.windows import window_of
from fusion.lower.local_alloc import TileArena, largest_fitting
from fusion.lower.views import MAX_ROWS, View, dense
from isa.enums import Activation, DType, Unit
from isa.fields import NUM_VREGS
from simulator.config import MachineConfig

PATCHES = "patches"  # constant-form key of a patchify Conv's weight packed as the steps read it


_CLASSES = "classes"  # the tail's register holding the class rows (zero patch rows)
MAX_TAIL = 4  # vector-chain nodes after the class-token Concat (position embedding Add, LayerNorm, ...)


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
    win = matrix_conv_window(graph, conv, "the patch GEMM")
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


def _token_layout(graph: Graph, conv: Node) -> list[Node] | None:
    """Conv -> [Reshape merging the spatial axes] -> Transpose(0, 2, 1): [n, Cout, ...] to [n, patches, Cout]."""
    if conv.op != OpType.Conv or len(graph.types[conv.outputs[0]].shape) not in (3, 4):
        return None
    n, cout, *spatial = graph.types[conv.outputs[0]].shape
    run, nxt = [conv], _sole_reader(graph, conv)
    if nxt is not None and nxt.op == OpType.Reshape and len(spatial) == 2:
        if tuple(graph.types[nxt.outputs[0]].shape) != (n, cout, spatial[0] * spatial[1]):
            return None
        run, nxt = [*run, nxt], _sole_reader(graph, nxt)
    if len(graph.types[run[-1].outputs[0]].shape) != 3 or nxt is None or nxt.op != OpType.Transpose:
        return None
    return [*run, nxt] if tuple(nxt.attr("perm")) == (0, 2, 1) else None


def _class_tokens(graph: Graph, node: Node | None, tokens: str) -> bool:
    """A Concat of the tokens with constant rows (class / distillation tokens) along the token axis."""
    if node is None or node.op != OpType.Concat or node.attr("axis") not in (1, -2):
        return False
    return all(v == tokens or graph.is_constant(v) for v in node.inputs) and node.inputs.count(tokens) == 1


def _chain_runs(graph: Graph, node: Node, limit: int) -> list[list[Node]]:
    """Every path of chain nodes from `node`'s readers, each node reading the previous one, up to `limit` long
    (a value several chain nodes read branches: the pre-LN residual sum feeds the LayerNorm and a later Add)."""
    runs = []
    for reader in graph.consumers.get(node.outputs[0], ()):
        if reader.op in CHAIN_OPS and len(reader.outputs) == 1:
            runs.append([reader])
            if limit > 1:
                runs += [[reader, *rest] for rest in _chain_runs(graph, reader, limit - 1)]
    return runs


def find_patch_embeds(graph: Graph) -> list[tuple[str, ...]]:
    """Each patchify Conv with its token Reshape + Transpose, then optionally a class-token Concat and a run of
    chain nodes after it (every prefix a candidate: the planner prices each)."""
    found = []
    for conv in graph.nodes:
        base = _token_layout(graph, conv)
        if base is None:
            continue
        found.append(base)
        cat = _sole_reader(graph, base[-1])
        if _class_tokens(graph, cat, base[-1].outputs[0]):
            found += [[*base, cat]] + [[*base, cat, *run] for run in _chain_runs(graph, cat, MAX_TAIL)]
    return [tuple(n.name for n in nodes) for nodes in found]


def pack_patch_weights(weights: np.ndarray, n: int) -> np.ndarray:
    """W[Cout, C, ph, pw] (or a 1-D conv's [Cout, C, pw]) as [C][ph][Cout tile][pw][tile width], flat: a (c, kh)
    row's weights for a run of Cout tiles are one contiguous run, each tile a dense [pw, width] preload."""
    w = weights.reshape(weights.shape[0], weights.shape[1], -1, weights.shape[-1])  # [Cout, C, ph, pw]
    tiles = [w[c0 : c0 + width].transpose(1, 2, 3, 0) for c0, width in k_slices(w.shape[0], n)]  # [C, ph, pw, nc]
    flat = np.concatenate([t.reshape(*t.shape[:2], -1) for t in tiles], axis=2)  # [C, ph, Cout * pw]
    return np.ascontiguousarray(flat.ravel())


@dataclass(frozen=True)
class _Tail:
    """The class-token Concat and the chain after it, run on one image's tokens [T, Cout] in a vector register."""

    rows: int  # T
    first: int  # the first patch token's row
    consts: tuple[tuple[View, int], ...]  # each constant input [n, k, Cout] and its first row
    chain: tuple[Node, ...]
    table: dict
    tiles: dict[str, View]  # the chain's other operands, [n, T, Cout] (broadcast)
    rows_in: dict[str, View]  # its row operands (LayerNorm's weight and bias), [Cout]
    out: View  # the group's last value [n, T, Cout]
    kept: tuple[tuple[str, View], ...]  # values read outside the group, stored besides
    value: str  # the Concat's output (the chain's input)

    def sizes(self, cout: int) -> list[int]:
        """Bytes of one image's tail tiles in a step: operands, rows, output and kept values (float32)."""
        n = self.rows * cout * 4
        return [n] * (len(self.tiles) + 1 + len(self.kept)) + [cout * 4] * len(self.rows_in)


def _tail(cx: LowerContext, p: Patchify, tokens: str, nodes: Sequence[Node]) -> _Tail | None:
    if not nodes:
        return None
    cat, chain = nodes[0], tuple(nodes[1:])
    if tokens in cx.graph.outputs:
        raise CodegenError(f"{tokens!r} is read outside the group: the tokens are never stored alone")
    if cx.dtype(cat.outputs[0]) is not DType.f32:
        raise CodegenError(f"node {cat.name!r}: the class-token Concat runs in float32 (its output is int8)")
    consts, row = [], 0
    for value in cat.inputs:
        k = cx.graph.types[value].shape[1]
        if value != tokens:
            if cx.dtype(value) is not DType.f32:
                raise CodegenError(f"node {cat.name!r}: constant {value!r} is not float32")
            consts.append((cx.view(value), row))
        else:
            first = row
        row += k
    if row * p.cout > cx.config.vreg_elems:
        raise CodegenError(f"{row} tokens x {p.cout} channels exceed a vector register ({cx.config.vreg_elems})")
    last = (chain or (cat,))[-1].outputs[0]
    table = operands(cx, chain) if chain else {}
    tiles, rows_in = operand_views(cx, table, cx.view(last).shape) if chain else ({}, {})
    tiles.pop(cat.outputs[0], None)  # the chain's input: the tokens tile itself
    values = (cat.outputs[0], *(n.outputs[0] for n in chain))
    kept = tuple((v, cx.view(v)) for v in values[:-1] if v in cx.graph.outputs)
    return _Tail(row, first, tuple(consts), chain, table, tiles, rows_in, cx.view(last), kept, cat.outputs[0])


@dataclass(frozen=True)
class _Tiling:
    rows: int  # patch rows per band
    nc: int  # output channels per Cout tile
    group: int  # output channels per step (whole tiles): the accumulators that live through the channel steps
    by_row: bool  # drained into one token-major tile, row stride Cout (one store), else tile by tile (one store each)
    # one band per image and one channel group: every weight in the spare scratchpad bank (loaded once, the
    # preloads never wait for a bank the matrix unit streams from); else each step loads its weights
    resident: bool
    # each channel's regrouped rows (and the last channel's tokens) in its own step's slot, so its regrouping
    # overlaps the previous channel's matmuls in another bank: resident, or one channel group (no later step reads
    # them); else a band's rows stay put (in the spare bank or rotating) while its channel groups' steps run
    own_band: bool
    # the tail as its own step after the image's last drain (an empty matrix segment: the matrix unit's token),
    # unless resident with several images (its tokens sit in the last channel step's slot, which the next image's
    # steps reuse)
    tail_apart: bool


def _tiling(
    cfg: MachineConfig, p: Patchify, dts: tuple[DType, DType, DType], tail: _Tail | None, resident: bool
) -> _Tiling:
    """`resident` (refused when it does not fit), else the most patch rows per band (all of an image's with a
    tail), then the most output channels per step, whose tiles fit one buffer slot (the band's input and tokens
    beside them)."""
    in_dt, mm_dt, out_dt = dts
    probe, nc, spare = TileArena(cfg, 0), min(cfg.array_size, p.cout), TileArena.spare(cfg)

    def channel(rows: int) -> list[int]:
        return [rows * p.ph * p.w * in_dt.size, p.ph * rows * p.ow * p.pw * mm_dt.size]

    def tokens(rows: int) -> list[int]:
        return [tail.rows * p.cout * 4] + ([tail.rows * p.cout] if mm_dt is DType.i8 else []) if tail else []

    def outputs(rows: int, group: int) -> list[int]:
        return tail.sizes(p.cout) if tail else [rows * p.ow * group * out_dt.size]

    m, weights = p.oh * p.ow, p.c * p.ph * p.pw * p.cout * mm_dt.size
    if resident:
        tiles = [*channel(p.oh), p.cout * 4, p.cout * 8, *tokens(p.oh), *outputs(p.oh, p.cout)]
        if spare is None or not spare.fits([weights]) or m > MAX_ROWS or not probe.fits(tiles, [m * p.cout * 4]):
            raise CodegenError(f"the weights ({weights} bytes) or one image's channel and tokens do not fit resident")
        return _Tiling(p.oh, nc, p.cout, tail is not None or m <= cfg.array_size, True, True, p.n == 1)

    def fits(rows: int, group: int) -> bool:
        """One group of every channel (its step holds its channel's rows alone), or a band's rows of every
        channel beside a step's tiles."""
        raw, band = channel(rows)
        step = [raw, p.ph * p.pw * group * mm_dt.size, group * 4, group * 8, *outputs(rows, group)]
        band = [band if group == p.cout else p.c * band, *tokens(rows)]
        return rows * p.ow <= MAX_ROWS and probe.fits(band + step, [rows * p.ow * group * 4])

    def some_group(rows: int) -> bool:  # (each of the two monotone in rows)
        return fits(rows, p.cout) or fits(rows, nc)

    rows = p.oh if tail is not None else largest_fitting(p.oh, some_group)
    if rows == 0 or not some_group(rows):
        raise CodegenError(f"one patch row band of the input ({p.c} x {p.ph} x {p.w}) does not fit a buffer slot")
    # (a step holding its channel's rows alone needs less: where it fails, the shared layout fails too)
    group = p.cout
    if not fits(rows, p.cout):
        group = min(p.cout, nc * largest_fitting(-(-p.cout // nc), lambda t: fits(rows, min(p.cout, t * nc))))
    own, by_row = group == p.cout, tail is not None or rows * p.ow <= cfg.array_size
    return _Tiling(rows, nc, group, by_row, False, own, not own or (p.n == 1 and rows == p.oh))


def patch_embed_steps(cx: LowerContext, nodes: Sequence[Node], resident: bool = False) -> list[Step]:
    """The group as pipeline steps: per band of patch rows, group of output channels and input channel, one step
    (the first group's steps load and regroup their channel of the band; the last channel's drain). `resident`:
    every weight loaded once into the spare bank (one band per image, one channel group), else per step."""
    graph, cfg, conv = cx.graph, cx.config, nodes[0]
    if tuple(n.name for n in nodes) not in find_patch_embeds(graph):
        raise CodegenError(f"node {conv.name!r}: not a patchify Conv followed by its token Reshape + Transpose")
    p = patchify(graph, cfg, conv)
    layout = 3 if nodes[1].op == OpType.Reshape else 2
    tokens = cx.view(nodes[layout - 1].outputs[0])  # [n, patches, Cout]
    tail = _tail(cx, p, nodes[layout - 1].outputs[0], nodes[layout:])
    if cx.dtype(conv.outputs[0]) is not tokens.dtype:
        raise CodegenError(f"node {conv.name!r}: the token layout changes the dtype of its output")
    ep = conv_epilogue(cx, nodes[:1], conv_geometry(graph, conv, window_of(graph, conv).padded_shape), tokens)
    if ep.scales is not None or ep.residual is not None or ep.dequant is not None:
        raise CodegenError(f"node {conv.name!r}: the patch GEMM drains a bias and a requantization only")
    image = cx.view(conv.inputs[0]).reshape_dense((p.n, p.c, p.h, p.w))
    mm_dt = DType.i8 if cx.int8 else DType.f32
    quantize = cx.matrix(conv).input_scale if cx.int8 and image.dtype is DType.f32 else None
    tiling = _tiling(cfg, p, (image.dtype, mm_dt, tokens.dtype), tail, resident)
    weights = dense(cx.addresses[const_key(conv.inputs[1], PATCHES)], (p.c * p.ph, p.cout * p.pw), mm_dt)
    scale = cx.scale(nodes[layout - 1].outputs[0]) if tail is not None and cx.int8 else None
    k = _Kernel(cx, p, tiling, ep, image.dtype, mm_dt, quantize, tail, scale)
    resident = TileArena.spare(cfg).tile(weights.size * mm_dt.size) if tiling.resident else 0
    steps: list[Step] = []
    accs = 0  # accumulator tiles rotate by their own count: one lives through its channel steps
    bands = [(img, *band) for img in range(p.n) for band in k_slices(p.oh, tiling.rows)]
    spare_tokens, lead = _spare_tiles(cfg, p, tiling, tail, mm_dt, len(bands) == 1)
    # int8 with the tokens tiles in the spare bank: the tail's Concat merged in a register (`_Kernel.tail_step`), the
    # tiles' rows it leaves to the other side cleared by channel 0's regrouping step, long before
    merged = bool(spare_tokens) and k.scale is not None
    clear = (lambda em: k.clear(em, *spare_tokens)) if merged else None
    for b, (img, oh0, rows) in enumerate(bands):
        m = rows * p.ow
        chan = [rows * p.ph * p.w * image.dtype.size, p.ph * m * p.pw * mm_dt.size]
        toks = ([tail.rows * p.cout * 4] + ([tail.rows * p.cout] if cx.int8 else [])) if tail else []
        shared, reserved = [], []
        if not tiling.own_band:  # the band's regrouped input (and tokens) stay put while its steps run
            sizes = [p.c * chan[1], *toks]
            # a kernel's only band goes to the scratchpad bank no slot uses: the matrix unit's reads of it never
            # wait for a preload of the step's weights from the same bank; bands after bands rotate with the slots
            spare = TileArena.spare(cfg) if len(bands) == 1 else None
            spare = spare if spare is not None and spare.fits(sizes) else None
            arena = spare or TileArena(cfg, b, cx.rotation)
            shared, reserved = [arena.tile(size) for size in sizes], [] if spare else sizes
        groups = k_slices(p.cout, tiling.group)
        for g, (co0, width) in enumerate(groups):
            acc = TileArena(cfg, accs, cx.rotation).acc_tile(m * width * 4)
            accs += 1
            for c in range(p.c):
                step = TileArena(cfg, len(steps), cx.rotation)
                for nbytes in reserved:
                    step.tile(nbytes)
                loads, first = [], bool(lead) and c == 0
                if first:  # channel 0 regrouped by a step of its own while this one loads the first weights
                    prologue = TileArena(cfg, len(steps), cx.rotation)
                    at = _Where(img, rows, prologue.tile(chan[0]), lead, 0, 0, 0, 0)
                    view = image.index((img, c)).slice(0, oh0 * p.ph, rows * p.ph)
                    # (the matrix unit last: it waits for the rows, and the step's credit token is the matrix
                    # unit's, never one a later step's vector -> matrix hand-over could pop instead of its own)
                    regroup = [(Unit.vector, _then(k.regroup, at, clear)), (Unit.matrix, lambda em: None)]
                    steps.append(Step([(view, at.raw)], regroup, []))
                    step = TileArena(cfg, len(steps), cx.rotation)
                if tiling.own_band:
                    raw, band = (0, lead) if first else (step.tile(chan[0]), step.tile(chan[1]))
                    ends = (spare_tokens or [step.tile(size) for size in toks]) if c == p.c - 1 else []
                else:
                    raw, band, ends = step.tile(chan[0]), shared[0] + c * chan[1], shared[1:]
                if tiling.resident:
                    w, pitch = resident + c * p.ph * p.cout * p.pw * mm_dt.size, p.cout * p.pw
                    if not steps:
                        loads.append((weights, resident))
                else:
                    w, pitch = step.tile(p.ph * p.pw * width * mm_dt.size), width * p.pw
                    loads.append((weights.slice(0, c * p.ph, p.ph).slice(1, co0 * p.pw, width * p.pw), w))
                if g == 0 and not first:
                    loads.insert(0, (image.index((img, c)).slice(0, oh0 * p.ph, rows * p.ph), raw))
                where = _Where(img, rows, raw, band, w, pitch, *ends, *[0] * (2 - len(ends)))
                t = _Tile(co0, width, c, acc, g == len(groups) - 1)
                dest = tokens.index((img,)).slice(0, oh0 * p.ow, m)
                steps.append(k.step(step, where, t, loads, g == 0 and not first, dest))
        if tail is not None and tiling.tail_apart:  # its loads never hold back the last channel's regrouping
            own = TileArena(cfg, len(steps), cx.rotation)
            for nbytes in reserved:
                own.tile(nbytes)
            # the last image's tail in two steps where a value stored for outside readers splits its chain: that
            # store overlaps the rest of the chain (no later step reuses the first part's tiles)
            # (each part led by the matrix unit: a credit token to the vector unit from three steps back would
            # otherwise be the one a part's vector hand-over pops)
            for tail_loads, emit, stores, preload in k.tail_step(own, where, img == p.n - 1, True, merged):
                # (its loaded operands into vector registers first, while the matrix unit finishes the image)
                first = [(Unit.vector, preload)] if preload else []
                steps.append(Step(tail_loads, [*first, (Unit.matrix, lambda em: None), (Unit.vector, emit)], stores))
    return steps


def _spare_tiles(
    cfg: MachineConfig, p: Patchify, tiling: _Tiling, tail: _Tail | None, mm_dt: DType, one_band: bool
) -> tuple[list[int], int]:
    """What goes to the spare bank when the weights do not (loaded per step) and each channel's rows sit in its
    step's slot: with one image whose tail runs apart, the tokens tiles (in the last
    channel's slot, the tail's DMA of the class rows into them held that channel's regrouping back); with one
    band, channel 0's regrouped rows (its own step regroups them while the first weights load). ([], 0) when they
    do not fit."""
    spare = TileArena.spare(cfg)
    if spare is None or tiling.resident or not tiling.own_band:
        return [], 0
    apart = tail is not None and tiling.tail_apart and p.n == 1  # (one image: no later drains into them)
    tokens = [tail.rows * p.cout * 4] + ([tail.rows * p.cout] if mm_dt is DType.i8 else []) if apart else []
    lead = [p.ph * p.oh * p.ow * p.pw * mm_dt.size] if one_band else []
    if not spare.fits(tokens + lead):
        return [], 0
    return [spare.tile(size) for size in tokens], (spare.tile(lead[0]) if lead else 0)


@dataclass(frozen=True)
class _Where:
    """One step's local addresses."""

    img: int
    rows: int  # patch rows of the band
    raw: int  # the channel's input rows [rows * ph, W] as loaded
    band: int  # the channel's rows regrouped kernel-row major [ph, rows, OW * pw], in the matrix dtype
    weights: int  # its weights for kernel row 0 and the step's first output channel: [pw, nc] per Cout tile
    pitch: int  # elements between its kernel rows' weights
    tokens: int  # with a tail: the Concat's output [T, Cout] (float32)
    drained: int  # with a tail on the int8 path: the requantized patch tokens in their rows of [T, Cout] (int8)


@dataclass(frozen=True)
class _Tile:
    co0: int
    width: int  # output channels of the step (whole Cout tiles)
    c: int  # the step's input channel
    acc: int  # accumulator tiles [patches, nc], one per Cout tile of the group
    last_group: bool


@dataclass(frozen=True)
class _Kernel:
    cx: LowerContext
    p: Patchify
    tiling: _Tiling
    ep: Epilogue  # bias, per-channel table or per-tensor requantizer (`codegen.conv`)
    in_dt: DType
    mm_dt: DType
    quantize: float | None  # the input scale of a float input on the int8 path
    tail: _Tail | None
    scale: float | None  # int8 with a tail: the tokens' scale (dequantized into the Concat's float32 tile)

    def step(self, arena: TileArena, at: _Where, t: _Tile, loads: list, regroup: bool, dest: View) -> Step:
        """Channel t.c of the band for the step's output channels: (regroup it,) preload and stream every kernel
        row per Cout tile, and after the last channel drain (and run the tail)."""
        p, es, m = self.p, self.mm_dt.size, at.rows * self.p.ow
        last = t.c == p.c - 1
        tiles = k_slices(t.width, self.tiling.nc)  # (first column in the group, width) of each Cout tile
        bias = arena.tile(t.width * 4) if last and self.ep.bias is not None else 0
        table = arena.tile(t.width * 8) if last and self.ep.table is not None else 0
        out_es = self.ep.out_dt.size
        out = arena.tile(m * t.width * out_es) if last and self.tail is None else 0
        if bias:
            loads.append((self.ep.bias.slice(0, t.co0, t.width), bias))
        if table:
            loads.append((self.ep.table.slice(0, t.co0, t.width), table))
        stores = []
        if out and self.tiling.by_row:
            stores.append((out, dest.slice(1, t.co0, t.width)))
        elif out:
            stores += [(out + j * m * out_es, dest.slice(1, t.co0 + j, nc)) for j, nc in tiles]

        def target(r: int, j: int) -> int:
            """Where row r of the group's column j drains."""
            if self.tail is None:
                return out + ((r * t.width + j) if self.tiling.by_row else j * m) * out_es
            if self.scale is not None:
                return at.drained + (self.tail.first + r) * p.cout + t.co0 + j
            return at.tokens + ((self.tail.first + r) * p.cout + t.co0 + j) * 4

        def matmul(em: Emitter) -> None:
            for kh in range(p.ph):
                a = at.band + kh * m * p.pw * es
                for j, nc in tiles:
                    w = at.weights + (kh * at.pitch + j * p.pw) * es
                    em.b.mx_preload(em.reg(w), p.pw, nc, self.mm_dt.name)
                    (em.b.mx_mm if t.c == 0 and kh == 0 else em.b.mx_mma)(*em.regs(t.acc + j * m * 4, a), m)
            if not last:
                return
            flags = "_".join(name for name, on in (("bias", bias), ("pc", table)) if on) or "none"
            for j, nc in tiles:
                mult, shift = (table + j * 8, 0) if table else self.ep.requant
                regs = em.regs(bias + j * 4 if bias else 0, 0, mult)
                em.b.ep_cfg(*regs, shift, Activation.none, flags, self.ep.drain_dtype)
                acc = t.acc + j * m * 4
                if self.tail is None and not self.tiling.by_row:
                    em.b.mx_drain(*em.regs(target(0, j), acc), m, nc)
                    continue
                # the tile's rows straight to their token-major places (`mx.drain.s`: one drain, not one a row)
                em.b.mx_drain_s(*em.regs(target(0, j), acc, target(1, j) - target(0, j)), m, nc)

        compute = [(Unit.vector, lambda em: self.regroup(em, at))] if regroup else []
        compute.append((Unit.matrix, matmul))
        if self.tail is not None and last and t.last_group and not self.tiling.tail_apart:
            ((tail_loads, tail_emit, tail_stores, _),) = self.tail_step(arena, at, False, False, False)
            loads += tail_loads
            compute.append((Unit.vector, tail_emit))
            stores += tail_stores
        return Step(loads, compute, stores)

    def clear(self, em: Emitter, tokens: int, drained: int) -> None:
        """Zero the rows of the tail's tiles a merged Concat (`tail_step`) takes from the other: the class rows of the
        int8 tokens tile, the patch rows of the float32 one."""
        tail, cout = self.tail, self.p.cout
        for view, row in tail.consts:
            fill(em, drained + row * cout, view.shape[1] * cout, DType.i8, 0.0)
        fill(em, tokens + tail.first * cout * 4, self.p.oh * self.p.ow * cout, DType.f32, 0.0)

    def regroup(self, em: Emitter, at: _Where) -> None:
        """The channel's input rows [rows, ph, W] as [ph, rows, OW * pw] in the matrix dtype, one vector pass per
        input row (the int8 path's quantization of a float input is that pass)."""
        p, n, es = self.p, self.p.ow * self.p.pw, self.mm_dt.size
        inv = f32_bits(1.0 / self.quantize) if self.quantize is not None else 0
        for r in range(at.rows):
            for kh in range(p.ph):
                src = at.raw + (r * p.ph + kh) * p.w * self.in_dt.size
                dst = at.band + (kh * at.rows + r) * n * es
                if self.quantize is not None:
                    em.b.v_qnt(*em.regs(dst, src, inv), n)
                else:
                    em.b.v_copy(*em.regs(dst, src), n, self.mm_dt.name)

    def tail_step(self, arena: TileArena, at: _Where, split: bool, ahead: bool, merged: bool) -> list[tuple]:
        """The image's Concat (constant rows loaded beside the tokens; int8: the requantized tokens dequantized as
        the reference does) and the chain after it, on the whole [T, Cout] tile: (loads, vector emitter, stores,
        preload), and with `split` a second part after the first value stored for outside readers that the rest of
        the chain reads alone (its store overlaps the rest). With `ahead`, `preload` (the first part's, else None)
        loads that part's loaded operands into vector registers: run before the drains' token, the part then starts
        on the tokens alone. `merged` (int8, ahead, the tiles cleared by `clear`): the Concat is built in a register,
        the int8 tile (class rows zero) dequantized plus the preloaded class rows (patch rows zero), with no store of
        the dequantized tokens and load of the whole tile after the drains."""
        tail, cx, cout = self.tail, self.cx, self.p.cout
        n = tail.rows * cout
        addr = {v: arena.tile(n * 4) for v in tail.tiles} | {v: arena.tile(cout * 4) for v in tail.rows_in}
        out = arena.tile(n * 4) if tail.chain else at.tokens
        kept = {v: (at.tokens if v == tail.value else arena.tile(n * 4)) for v, _ in tail.kept}
        loads = [(view.index((at.img,)), at.tokens + row * cout * 4) for view, row in tail.consts]
        loads += [(view.index((at.img,)), addr[v]) for v, view in tail.tiles.items()]
        loads += [(view, addr[v]) for v, view in tail.rows_in.items()]
        cut = _split(tail, set(kept)) if split else len(tail.chain)
        parts = [tail.chain[:cut], tail.chain[cut:]] if cut < len(tail.chain) else [tail.chain]
        made = [{n.outputs[0] for n in part} for part in parts]
        views = dict(tail.kept)

        def dequantize(em: Emitter, regs: Registers) -> None:
            """The int8 patch tokens as float32 into their rows of the tokens tile, through a vector register (one
            load of the int8 tile: no memory-to-memory passes); `merged`, into the Concat's register."""
            if merged:
                r = regs.new(tail.value)
                em.b.vc_ld(r, em.reg(at.drained), n, "i8")
                em.b.vc_cvt(r, r, "f32")
                em.b.vc_mul_vs(r, r, em.reg(f32_bits(self.scale)))
                em.b.vc_add(r, r, regs.of[_CLASSES])
                regs.release(regs.of[_CLASSES])
                if tail.value in kept or out == at.tokens:  # (read there: stored for outside readers)
                    em.b.vc_st(em.reg(at.tokens), r)
            elif self.scale is not None:
                r, count = regs.temp(), self.p.oh * self.p.ow * cout
                em.b.vc_ld(r, em.reg(at.drained + tail.first * cout), count, "i8")
                em.b.vc_cvt(r, r, "f32")
                em.b.vc_mul_vs(r, r, em.reg(f32_bits(self.scale)))
                em.b.vc_st(em.reg(at.tokens + tail.first * cout * 4), r)
                regs.release(r)

        held: dict[str, Registers] = {}  # the split value stays in its vector register for the second part
        # (at most all but one register: the dequantization's temporary comes first; merged, the class rows too)
        early = {v: a for v, a in addr.items() if ahead and _reads(tail.table, parts[0], v)}
        early = dict(list(early.items())[: NUM_VREGS - 1 - merged])

        def preload(em: Emitter) -> None:
            regs = held["regs"] = Registers()
            if merged:
                em.b.vc_ld(regs.new(_CLASSES), em.reg(at.tokens), n, "f32")
            for v, a in early.items():
                load_register(cx, em, regs.new(v), v, a, cout if v in tail.rows_in else n)

        def part(i: int) -> tuple[list, Callable[[Emitter], None], list, Callable[[Emitter], None] | None]:
            chain, last = parts[i], parts[i][-1].outputs[0] if parts[i] else tail.value
            target = out if i == len(parts) - 1 else kept[last]
            stored = {v: a for v, a in kept.items() if v in made[i] and v != last}
            ins = {tail.value: at.tokens} if i == 0 and not merged else {}
            ins |= {v: a for v, a in addr.items() if _reads(tail.table, chain, v) and not (i == 0 and v in early)}
            saved = [v for v in kept if v in made[i] or (i == 0 and v == tail.value)]
            stores = [(kept[v], views[v].index((at.img,))) for v in saved if not (i == len(parts) - 1 and v == last)]
            if i == len(parts) - 1:
                stores.insert(0, (out, tail.out.index((at.img,))))

            def emit(em: Emitter) -> None:
                if i == 0:
                    if not (early or merged):
                        held["regs"] = Registers()
                    dequantize(em, held["regs"])
                if chain:
                    emit_chain(cx, em, chain, tail.table, ins, target, n, cout, held["regs"], stored)

            return (loads if i == 0 else []), emit, stores, (preload if i == 0 and (early or merged) else None)

        return [part(i) for i in range(len(parts))]


def _then(
    first: Callable[[Emitter, _Where], None], at: _Where, then: Callable[[Emitter], None] | None
) -> Callable[[Emitter], None]:
    """`first` on `at`, then `then` (if any), as one segment's emitter."""

    def emit(em: Emitter) -> None:
        first(em, at)
        if then is not None:
            then(em)

    return emit


def _reads(table: dict, chain: Sequence[Node], value: str) -> bool:
    names = {n.name for n in chain}
    return any(o.value == value for (name, _), o in table.items() if name in names)


def _split(tail: _Tail, kept: set[str]) -> int:
    """The length of the tail chain's first part: through the first node whose value is stored for outside readers
    and is the only value of the first part the rest reads; the whole chain when there is none."""
    for i, node in enumerate(tail.chain[:-1]):
        value, before = node.outputs[0], {tail.value, *(n.outputs[0] for n in tail.chain[: i + 1])}
        reads = {v for n in tail.chain[i + 1 :] for v in n.inputs if v in before}
        if value in kept and reads == {value}:
            return i + 1
    return len(tail.chain)
