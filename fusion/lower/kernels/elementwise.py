"""Elementwise unary and broadcasting binary nodes: dma.ld -> v.* -> dma.st over tiles of the output.

Broadcasting happens in the DMA: each input is read through a view broadcast to the output shape (stride 0 on
broadcast dims), so the vector unit always sees dense, equally long tiles. A one-element constant second
operand becomes a scalar register operand (`.vs`) instead. On the int8 path Relu of int8 data stays int8;
everything else dequantizes its int8 inputs and computes in float32, as the quantized reference does, and an
int8 output (an int8 Add, `fusion.quant.plan.int8_add`) is that float32 result quantized at its scale (`v.qnt`).
"""

from __future__ import annotations

from dataclasses import replace

from fusion.graph.ir import Node
from fusion.graph.ops import OpType
from fusion.lower.context import LowerContext, const_scalar
from fusion.lower.emitter import Emitter, Step, f32_bits
from fusion.lower.errors import UnsupportedOpError
from fusion.lower.kernels.recipes import RECIPES, MemoryForm, Recipe, Scalar, refusal
from fusion.lower.kernels.vector_ops import dequantize, quantize_tile
from fusion.lower.local_alloc import TileArena, largest_fitting
from fusion.lower.views import View, blocks
from isa.enums import DType, Unit


def _channel_views(cx: LowerContext, node: Node) -> list[View]:
    """BatchNorm's per-channel parameters seen as [1, C, 1, ...] so they broadcast like the reference."""
    rank = len(cx.graph.types[node.inputs[0]].shape)
    views = []
    for value in node.inputs[1:]:
        v = cx.view(value)
        views.append(replace(v, shape=(1, *v.shape, *(1,) * (rank - 2)), strides=(0, *v.strides, *(0,) * (rank - 2))))
    return views


def recipe_operands(cx: LowerContext, node: Node) -> tuple[Recipe, list[str | Scalar]]:
    """The node's recipe and what it reads: a value (or constant form) read as a tile, or a scalar."""
    recipe = RECIPES.get(node.op)
    reason = refusal(cx.graph, node)
    if recipe is None or reason is not None:
        raise UnsupportedOpError(node.name, node.op.value, reason or "no vector recipe")
    reads: list[str | Scalar] = []
    for pos, value in enumerate(recipe.reads(cx.graph, node)):
        scalar = const_scalar(cx.graph, value) if pos in recipe.scalars else None
        reads.append(value if scalar is None else Scalar(f32_bits(scalar)))
    return recipe, reads


def lower_elementwise(cx: LowerContext, node: Node) -> list[list[Step]]:
    out_value = node.outputs[0]
    out_view = cx.view(out_value)
    shape = out_view.shape
    int8_relu = node.op == OpType.Relu and cx.dtype(node.inputs[0]) is DType.i8
    recipe, reads = recipe_operands(cx, node)
    if int8_relu:
        reads = [node.inputs[0]]
    tiles_in = [v for v in reads if isinstance(v, str)]
    in_views = [cx.view(v) for v in tiles_in]
    if node.op == OpType.BatchNorm:
        in_views[1:] = _channel_views(cx, node)
    in_views = [v.broadcast_to(shape) for v in in_views]
    deq = [cx.dtype(v) is DType.i8 and not int8_relu for v in tiles_in]
    out_dt = out_view.dtype
    quantize = cx.scale(out_value) if out_dt is DType.i8 and not int8_relu else None
    temps = max(1, recipe.temps)
    # bytes per output element: raw inputs, their float copies, the output (and its float32 value before
    # quantization), the scratch tiles
    per_elem = sum(v.dtype.size for v in in_views) + 4 * sum(deq) + out_dt.size + 4 * (temps + (quantize is not None))
    probe = TileArena(cx.config, 0)
    budget = largest_fitting(1 << 15, lambda e: probe.fits([e * per_elem + 64 * 8]))
    steps = []
    for block in blocks(shape, budget):
        arena = TileArena(cx.config, len(steps), cx.rotation)
        parts = [block.of(v) for v in in_views]
        n = parts[0].size if parts else block.of(out_view).size
        raw = [arena.tile(p.size * p.dtype.size) for p in parts]
        f32_tiles = [arena.tile(n * 4) if d else r for r, d in zip(raw, deq, strict=True)]
        out = arena.tile(n * out_dt.size)
        tmps = [arena.tile(n * 4) for _ in range(temps)]
        total = arena.tile(n * 4) if quantize is not None else out
        scales = [cx.scale(v) for v in tiles_in]

        def compute(
            em: Emitter, raw=raw, f32_tiles=f32_tiles, out=out, total=total, tmps=tmps, n=n, scales=scales
        ) -> None:
            if int8_relu:
                em.b.v_relu(*em.regs(out, raw[0]), n, "i8")
                return
            for r, f, d, s in zip(raw, f32_tiles, deq, scales, strict=True):
                if d:
                    dequantize(em, f, r, n, s)
            tiles = iter(f32_tiles)
            ins = [v if isinstance(v, Scalar) else next(tiles) for v in reads]
            recipe.emit(MemoryForm(em, n, list(tmps)), node, total, ins)
            if quantize is not None:
                quantize_tile(em, out, total, n, quantize)

        loads = list(zip(parts, raw, strict=True))
        steps.append(Step(loads, [(Unit.vector, compute)], [(out, block.of(out_view))]))
    return [steps]


LOWERINGS = {op: lower_elementwise for op in RECIPES if op not in (OpType.Identity, OpType.Expand)}
