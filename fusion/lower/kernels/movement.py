"""Data movement as DMA copies through the scratchpad: Transpose, Slice, Concat, Split, Gather (constant
indices), Expand (a stride-0 source), Cast (of a constant). Each is a list of (source view, destination view)
pairs of equal shape; a transpose is a permuted source view, so the strided DMA does the work. On the int8
path an int8 source feeding a float32 destination (Concat of inputs at different scales) is dequantized on the
vector unit in between, and a float32 source feeding an int8 destination quantized (a Conv's float input).
"""

from __future__ import annotations

from fusion.graph.ir import Node
from fusion.graph.ops import OpType
from fusion.lower.context import LowerContext
from fusion.lower.emitter import Emitter, Step
from fusion.lower.errors import UnsupportedOpError
from fusion.lower.kernels.vector_ops import dequantize, quantize_tile
from fusion.lower.local_alloc import TileArena, largest_fitting
from fusion.lower.views import View, blocks, merge_dims, transfers
from isa.enums import DType, Unit

Copy = tuple[View, View, float | None]  # source, destination, the int8 side's scale (None: same dtype)


def copy_steps(cx: LowerContext, copies: list[Copy], start: int = 0) -> list[Step]:
    """Tiles of every copy, double-buffered; the source and destination of each tile have equal shapes."""
    probe = TileArena(cx.config, 0)
    budget = largest_fitting(1 << 15, lambda e: probe.fits([e * 4, e * 4]))
    steps: list[Step] = []
    for src, dst, scale in copies:
        if any(s < 0 for s in (*src.strides, *dst.strides)):
            raise UnsupportedOpError("copy", "DMA", "negative strides (reversed slices) are not supported")
        if src.size == 0:
            continue
        src, dst = merge_dims(_dma_order(src, dst))
        for block in blocks(src.shape, budget):
            arena = TileArena(cx.config, start + len(steps), cx.rotation)
            part = block.of(src)
            raw = arena.tile(part.size * src.dtype.size)
            compute = []
            out = raw
            if scale is not None:
                out = arena.tile(part.size * dst.dtype.size)

                def convert(em: Emitter, out=out, raw=raw, n=part.size, scale=scale, to_int8=dst.dtype is DType.i8):
                    if to_int8:
                        quantize_tile(em, out, raw, n, scale)
                    else:
                        dequantize(em, out, raw, n, scale)

                compute = [(Unit.vector, convert)]
            steps.append(Step([(part, raw)], compute, [(out, block.of(dst))]))
    return steps


def _dma_order(src: View, dst: View) -> tuple[View, View]:
    """Both views under one common permutation (the tile layout is free): the destination's order, or the
    source's memory order, whichever needs fewer DMA transfers (a transpose reads or writes one column per
    transfer, so walking the longer side contiguously halves the count when the shapes are lopsided)."""
    memory_order = sorted(range(len(src.shape)), key=lambda i: -src.strides[i])
    options = [(src, dst), (src.permute(memory_order), dst.permute(memory_order))]
    return min(options, key=lambda pair: len(transfers(pair[0])) + len(transfers(pair[1])))


def _copy(cx: LowerContext, src_value: str, src: View, dst: View) -> Copy:
    scale = cx.scale(src_value) if src.dtype is DType.i8 and dst.dtype is DType.f32 else None
    return src, dst, scale


def transpose_copies(cx: LowerContext, node: Node) -> list[Copy]:
    x = node.inputs[0]
    return [_copy(cx, x, cx.view(x).permute(node.attr("perm")), cx.view(node.outputs[0]))]


def slice_copies(cx: LowerContext, node: Node) -> list[Copy]:
    """A strided view per slice; an axis walked backwards (negative step, which DMA strides cannot express)
    becomes one copy per index along it."""
    x = node.inputs[0]
    pieces = [(cx.view(x), cx.view(node.outputs[0]))]
    for axis, start, end, step in zip(
        node.attr("axes"), node.attr("starts"), node.attr("ends"), node.attr("steps"), strict=True
    ):
        picked = range(start, end, step)
        if step > 0 or len(picked) <= 1:
            first = picked[0] if len(picked) else 0
            pieces = [(src.slice(axis, first, len(picked), max(step, 1)), dst) for src, dst in pieces]
        else:
            pieces = [
                (src.slice(axis, i, 1), dst.slice(axis, j, 1)) for src, dst in pieces for j, i in enumerate(picked)
            ]
    return [_copy(cx, x, src, dst) for src, dst in pieces]


def concat_copies(cx: LowerContext, node: Node) -> list[Copy]:
    axis, out, offset, copies = node.attr("axis"), cx.view(node.outputs[0]), 0, []
    for value in node.inputs:
        view = cx.view(value)
        size = view.shape[axis]
        if size:
            copies.append(_copy(cx, value, view, out.slice(axis, offset, size)))
        offset += size
    return copies


def split_copies(cx: LowerContext, node: Node) -> list[Copy]:
    x, axis, offset, copies = node.inputs[0], node.attr("axis"), 0, []
    view = cx.view(x)
    for value, size in zip(node.outputs, node.attr("sizes"), strict=True):
        if size:
            copies.append(_copy(cx, x, view.slice(axis, offset, size), cx.view(value)))
        offset += size
    return copies


def gather_copies(cx: LowerContext, node: Node) -> list[Copy]:
    data, indices = node.inputs
    if not cx.graph.is_constant(indices):
        raise UnsupportedOpError(node.name, node.op.value, "indices must be a constant (known at compile time)")
    axis = node.attr("axis")
    view = cx.view(data)
    idx = cx.graph.constants[indices].reshape(-1)
    length = view.shape[axis]
    out = cx.view(node.outputs[0])
    pre = view.shape[:axis]
    out3 = out.reshape_dense((*pre, idx.size, *view.shape[axis + 1 :]))
    copies = []
    for j, i in enumerate(idx.tolist()):
        i = i + length if i < 0 else i
        if not 0 <= i < length:
            raise UnsupportedOpError(node.name, node.op.value, f"index {i} is out of range for axis of {length}")
        copies.append(_copy(cx, data, view.slice(axis, i, 1), out3.slice(axis, j, 1)))
    return copies


def expand_copies(cx: LowerContext, node: Node) -> list[Copy]:
    """Broadcast by the DMA: the source read with stride 0 along every broadcast dim."""
    x, out = node.inputs[0], cx.view(node.outputs[0])
    return [_copy(cx, x, cx.view(x).broadcast_to(out.shape), out)]


def reshape_copies(cx: LowerContext, node: Node) -> list[Copy]:
    """Reshape / Identity / Cast of a constant (of an activation: a DRAM alias instead, with no kernel)."""
    x = node.inputs[0]
    out = cx.view(node.outputs[0])
    return [_copy(cx, x, cx.view(x).reshape_dense(out.shape), out)]


COPIES = {
    OpType.Reshape: reshape_copies,
    OpType.Identity: reshape_copies,
    OpType.Cast: reshape_copies,
    OpType.Expand: expand_copies,
    OpType.Transpose: transpose_copies,
    OpType.Slice: slice_copies,
    OpType.Concat: concat_copies,
    OpType.Split: split_copies,
    OpType.Gather: gather_copies,
}


def lower_movement(cx: LowerContext, node: Node) -> list[list[Step]]:
    return [copy_steps(cx, COPIES[node.op](cx, node))]


LOWERINGS = dict.fromkeys(COPIES, lower_movement)
