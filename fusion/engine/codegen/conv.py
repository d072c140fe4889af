"""Conv as an implicit GEMM with output channels as columns, so bias, residual and ReLU fuse into the drain.

The baseline lowers Conv through a DRAM im2col matrix (one strided DMA per channel and kernel offset) and a GEMM
W[Cout, C*K] @ colT whose output channels are rows: its bias is per row, which the drain cannot apply. Here the
padded input is brought into the scratchpad once, channel-blocked and pixel-major (`dma.ldt` of each block of
`kb` channels gives a [H' * W', kb] tile: row = padded pixel). For a stride-1 convolution the rows that kernel
offset (kh, kw) needs for every output pixel are then one contiguous run of that tile, if the output is computed
over the padded width W' (the extra W' - OW columns per output row are computed and dropped): each (kh, kw,
channel block) is one preload of a [kb, Cout] weight tile and one `mx.mma` streaming OH * W' rows, with no im2col.
The accumulator holds out^T [pixels, Cout]; each output row is drained (bias per column, residual, ReLU, int8
requantize) into a dense [OH * OW, Cout] tile, stored to a DRAM scratch buffer and brought back as NCHW by one
transposing load per image.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fusion.engine.codegen.gemm import k_slices
from fusion.engine.codegen.matrix_group import epilogue_ops
from fusion.engine.errors import CodegenError
from fusion.graph.ir import Graph, Node
from fusion.graph.ops import OpType
from fusion.lower.context import LowerContext, const_key, temp_key
from fusion.lower.emitter import Emitter, Step, f32_bits
from fusion.lower.errors import MemoryPlanError
from fusion.lower.kernels.matrix import bias_view, requant
from fusion.lower.kernels.windows import padded_input, window_of
from fusion.lower.local_alloc import TileArena
from fusion.lower.views import MAX_COLS, MAX_ROWS, View, dense
from isa.enums import Activation, DType, Unit
from simulator.config import MachineConfig

TAPS = "taps"  # constant-form key of a Conv weight as per-tap [C, Cout] tiles (see pack_taps)


@dataclass(frozen=True)
class ConvShape:
    n: int
    c: int
    cout: int
    kernel: tuple[int, int]
    padded: tuple[int, int]  # H', W'
    out: tuple[int, int]  # OH, OW

    @property
    def stream_rows(self) -> int:
        """Padded-width output rows the array computes per (tap, channel block): the last one ends at OW."""
        return (self.out[0] - 1) * self.padded[1] + self.out[1]


def conv_shape(graph: Graph, cfg: MachineConfig, node: Node) -> ConvShape:
    """The geometry (a 1-D conv is a 2-D one of height 1); CodegenError for convolutions this generator does not
    cover."""
    if node.op != OpType.Conv:
        raise CodegenError(f"node {node.name!r} ({node.op.value}) is not a Conv")
    w = window_of(graph, node)
    if w.s not in (1, 2) or node.attr("group") != 1 or set(w.strides) != {1} or set(w.dilations) != {1}:
        raise CodegenError(
            f"node {node.name!r}: the implicit GEMM covers 1-D and 2-D, stride-1, undilated, ungrouped Conv"
        )
    if not graph.is_constant(node.inputs[1]):
        raise CodegenError(f"node {node.name!r}: the implicit GEMM needs a constant weight")
    cout = graph.types[node.inputs[1]].shape[0]
    if cout > cfg.array_size:
        raise CodegenError(f"node {node.name!r}: {cout} output channels exceed one drain ({cfg.array_size} columns)")
    lift = (1,) * (2 - w.s)
    padded = (*lift, *w.padded_shape[2:])
    shape = ConvShape(w.in_shape[0], w.in_shape[1], cout, (*lift, *w.kernel), padded, (*lift, *w.out_spatial))
    if shape.stream_rows > MAX_ROWS or math.prod(padded) > MAX_COLS:
        raise CodegenError(f"node {node.name!r}: a {padded} image exceeds one transposing DMA")
    return shape


def pack_taps(weights: np.ndarray) -> np.ndarray:
    """W[Cout, C, kh, kw] (or a 1-D conv's W[Cout, C, kw], kh = 1) as [kh, kw, C, Cout]: the tile of tap
    (kh, kw) and channels c0..c0+kb is contiguous."""
    if weights.ndim not in (3, 4):
        raise CodegenError(f"a Conv weight of rank {weights.ndim} has no implicit-GEMM packing (rank 3 or 4)")
    lifted = weights.reshape(*weights.shape[:2], *(1,) * (4 - weights.ndim), *weights.shape[2:])
    return np.ascontiguousarray(lifted.transpose(2, 3, 1, 0))


def scratch_bytes(graph: Graph, cfg: MachineConfig, node: Node, out_dtype: DType) -> int:
    s = conv_shape(graph, cfg, node)
    return s.n * math.prod(s.out) * s.cout * out_dtype.size


def conv_phases(cx: LowerContext, nodes: Sequence[Node]) -> list[list[Step]]:
    graph, cfg, node = cx.graph, cx.config, nodes[0]
    s = conv_shape(graph, cfg, node)
    ops = epilogue_ops_of_conv(graph, nodes)
    if cx.int8 and ops.residual is not None:
        raise CodegenError("int8: a residual Add after the requantization cannot move into the drain")
    w = window_of(graph, node)
    padded, phases = padded_input(cx, node, w, 0.0)
    out = cx.view(nodes[-1].outputs[0])
    mm_dt = DType.i8 if cx.int8 else DType.f32
    q = cx.matrix(node) if cx.int8 else None
    quantize = q.input_scale if q is not None and padded.dtype is DType.f32 else None
    bias = bias_view(cx, node)
    taps = cx.addresses[const_key(node.inputs[1], TAPS)]
    scratch = dense(cx.addresses[temp_key(node, 2)], (s.n, math.prod(s.out), s.cout), out.dtype)
    res = None if ops.residual is None else cx.view(ops.residual)
    mult, shift = requant(cx, node) or (f32_bits(1.0), 0)
    flags = {(False, False): "none", (True, False): "bias", (False, True): "res", (True, True): "bias_res"}[
        (bias is not None, res is not None)
    ]
    act = Activation.relu if ops.relu else Activation.none
    slices = k_slices(s.c, cfg.array_size)
    pixels_in, pixels_out = math.prod(s.padded), math.prod(s.out)
    steps = []
    for img in range(s.n):
        arena = TileArena(cfg, img)
        try:
            raw = [arena.tile(pixels_in * kb * padded.dtype.size) for _, kb in slices]
            blocks = [arena.tile(pixels_in * kb) for _, kb in slices] if quantize else raw
            weights = arena.tile(math.prod(s.kernel) * s.c * s.cout * mm_dt.size)
            bias_tile = arena.tile(s.cout * 4) if bias is not None else 0
            res_tile = arena.tile(pixels_out * s.cout * 4) if res is not None else 0
            acc = arena.acc_tile(s.stream_rows * s.cout * 4)
            out_tile = arena.tile(pixels_out * s.cout * out.dtype.size)
        except MemoryPlanError as err:
            raise CodegenError(f"node {node.name!r}: one image's tiles do not fit a buffer slot ({err})") from err
        image = padded.index((img,)).reshape_dense((s.c, pixels_in))

        def load(
            em: Emitter, raw=raw, weights=weights, bias_tile=bias_tile, res_tile=res_tile, img=img, image=image
        ) -> None:
            for (c0, kb), tile in zip(slices, raw, strict=True):
                part = image.slice(0, c0, kb)
                local, dram, stride = em.regs(tile, part.address, part.strides[0])
                em.b.dma_ldt(local, dram, stride, kb, pixels_in, part.dtype.name)
            em.dma_load(dense(taps, (math.prod(s.kernel) * s.c * s.cout,), mm_dt), weights)
            if bias is not None:
                em.dma_load(bias, bias_tile)
            if res is not None:
                part = res.index((img,)).reshape_dense((s.cout, pixels_out))
                local, dram, stride = em.regs(res_tile, part.address, part.strides[0])
                em.b.dma_ldt(local, dram, stride, s.cout, pixels_out, part.dtype.name)

        def to_int8(em: Emitter, raw=raw, blocks=blocks) -> None:
            for (_, kb), src, dst in zip(slices, raw, blocks, strict=True):
                em.b.v_qnt(*em.regs(dst, src, f32_bits(1.0 / quantize)), pixels_in * kb)

        def matmul(
            em: Emitter,
            blocks=blocks,
            weights=weights,
            acc=acc,
            out_tile=out_tile,
            res_tile=res_tile,
            bias_tile=bias_tile,
        ) -> None:
            first = True
            for kh in range(s.kernel[0]):
                for kw in range(s.kernel[1]):
                    for (c0, kb), block in zip(slices, blocks, strict=True):
                        tap = weights + ((kh * s.kernel[1] + kw) * s.c + c0) * s.cout * mm_dt.size
                        em.b.mx_preload(em.reg(tap), kb, s.cout, mm_dt.name)
                        start = block + (kh * s.padded[1] + kw) * kb * mm_dt.size
                        (em.b.mx_mm if first else em.b.mx_mma)(*em.regs(acc, start), s.stream_rows)
                        first = False
            for oh in range(s.out[0]):
                row_res = res_tile + oh * s.out[1] * s.cout * 4 if res is not None else 0
                em.b.ep_cfg(*em.regs(bias_tile, row_res, mult), shift, act, flags, "i8" if cx.int8 else "f32")
                dst = out_tile + oh * s.out[1] * s.cout * out.dtype.size
                em.b.mx_drain(*em.regs(dst, acc + oh * s.padded[1] * s.cout * 4), s.out[1], s.cout)

        compute = [(Unit.load, load)]
        if quantize:
            compute.append((Unit.vector, to_int8))
        compute.append((Unit.matrix, matmul))
        steps.append(Step([], compute, [(out_tile, scratch.index((img,)))]))
    phases.append(steps)
    phases.append(_to_nchw(cfg, scratch, out.reshape_dense((s.n, s.cout, pixels_out))))
    return phases


def epilogue_ops_of_conv(graph: Graph, nodes: Sequence[Node]):
    """The drain's work for a Conv and its absorbed consumers (bias: the Conv's own, per output channel)."""
    ops = epilogue_ops(graph, nodes, frozenset({OpType.Conv}))
    if ops.bias is not None and ops.bias != (nodes[0].inputs[2] if len(nodes[0].inputs) > 2 else None):
        raise CodegenError(f"node {nodes[0].name!r}: a second bias after the Conv is not absorbed")
    return ops


def _to_nchw(cfg: MachineConfig, scratch: View, out: View) -> list[Step]:
    """[pixels, Cout] per image (DRAM scratch) -> out[img] as [Cout, pixels]: one transposing load per image."""
    n, pixels, cout = scratch.shape
    steps = []
    for img in range(n):
        tile = TileArena(cfg, img).tile(pixels * cout * scratch.dtype.size)
        part = scratch.index((img,))

        def load(em: Emitter, tile=tile, part=part) -> None:
            local, dram, stride = em.regs(tile, part.address, part.strides[0])
            em.b.dma_ldt(local, dram, stride, pixels, cout, part.dtype.name)

        steps.append(Step([], [(Unit.load, load)], [(tile, out.index((img,)))]))
    return steps
