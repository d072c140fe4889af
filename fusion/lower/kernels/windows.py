"""Sliding-window nodes: Conv (im2col + GEMM), MaxPool and AveragePool.

Padding is a phase of its own: a DRAM scratch tensor is filled with the pad value (0, or -inf / -128 for max)
from one vector-filled tile, then the input is copied into its interior. A window position (k_1, ..., k_s)
is then just a strided view of the padded tensor, so:
- Conv builds the transposed im2col matrix colT[n, c, k..., out...] with strided DMA copies and runs
  W[M, C*K] @ colT[C*K, P] per image and group, the bias added per row (output channel);
- MaxPool takes v.max over the window views of each output tile;
- AveragePool sums the window views and divides by the same window sum over a tensor of ones padded like the
  input, which counts each window's valid positions (explicit pads included with count_include_pad).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import product

from fusion.graph.ir import Graph, Node
from fusion.graph.ops import OpType
from fusion.lower.context import LowerContext, storage_dtype
from fusion.lower.emitter import Emitter, Step
from fusion.lower.kernels.gemm import Gemm, Operand, gemm_steps
from fusion.lower.kernels.matrix import bias_view, matrix_operand, requant
from fusion.lower.kernels.movement import copy_steps
from fusion.lower.kernels.vector_ops import dequantize, fill
from fusion.lower.local_alloc import TileArena, largest_fitting
from fusion.lower.views import View, blocks, dense
from fusion.quant.plan import QuantPlan
from isa.enums import DType, Unit


@dataclass(frozen=True)
class Window:
    """Geometry of one windowed node over s spatial dims."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[int, ...]  # begins then ends
    in_shape: tuple[int, ...]  # N, C, spatial...
    out_spatial: tuple[int, ...]

    @property
    def s(self) -> int:
        return len(self.kernel)

    @property
    def padded_shape(self) -> tuple[int, ...]:
        dims = []
        for i in range(self.s):
            need = (self.out_spatial[i] - 1) * self.strides[i] + (self.kernel[i] - 1) * self.dilations[i] + 1
            size, begin = self.in_shape[2 + i], self.pads[i]
            dims.append(begin + size + max(self.pads[self.s + i], need - size - begin))
        return (*self.in_shape[:2], *dims)

    @property
    def needs_pad(self) -> bool:
        return self.padded_shape != self.in_shape


def window_of(graph: Graph, node: Node) -> Window:
    x = graph.types[node.inputs[0]].shape
    kernel = tuple(graph.types[node.inputs[1]].shape[2:]) if node.op == OpType.Conv else tuple(node.attr("kernel"))
    return Window(
        kernel,
        tuple(node.attr("strides")),
        tuple(node.attr("dilations")),
        tuple(node.attr("pads")),
        tuple(x),
        tuple(graph.types[node.outputs[0]].shape[2:]),
    )


def _scratch(graph: Graph, node: Node, plan: QuantPlan | None) -> list[int]:
    w = window_of(graph, node)
    es = storage_dtype(graph, plan, node.inputs[0]).size
    padded = math.prod(w.padded_shape)
    sizes = [padded * es]  # padded input (unused without padding)
    if node.op == OpType.Conv:
        sizes.append(w.in_shape[0] * w.in_shape[1] * math.prod(w.kernel) * math.prod(w.out_spatial) * es)
    if node.op == OpType.AveragePool:
        sizes.append(padded * 4)  # padded ones
    return sizes


def _fill_steps(cx: LowerContext, target: View, value: float, start: int = 0) -> list[Step]:
    """One tile filled with `value`, stored over every block of `target`."""
    probe = TileArena(cx.config, 0)
    budget = min(target.size, largest_fitting(1 << 15, lambda e: probe.fits([e * target.dtype.size])))
    arena = TileArena(cx.config, start % 2)
    tile = arena.tile(budget * target.dtype.size)

    def body(em: Emitter) -> None:
        fill(em, tile, budget, target.dtype, value)

    stores = [(tile, block.of(target)) for block in blocks(target.shape, budget)]
    return [Step([], [(Unit.vector, body)], stores)]


def _padded(cx: LowerContext, node: Node, w: Window, value: float) -> tuple[View, list[list[Step]]]:
    """The padded input view and the phases that build it (none without padding)."""
    x = cx.view(node.inputs[0])
    if not w.needs_pad:
        return x, []
    padded = dense(cx.temp(node, 0), w.padded_shape, x.dtype)
    interior = padded
    for i in range(w.s):
        interior = interior.slice(2 + i, w.pads[i], w.in_shape[2 + i])
    return padded, [_fill_steps(cx, padded, value), copy_steps(cx, [(x, interior, None)])]


def _window_view(padded: View, w: Window, offset: tuple[int, ...]) -> View:
    """Elements [n, c, o...] = padded[n, c, o_i * stride_i + offset_i * dilation_i]."""
    sp = padded.strides[2:]
    address = padded.address + sum(k * d * s for k, d, s in zip(offset, w.dilations, sp, strict=True))
    strides = (*padded.strides[:2], *(st * s for st, s in zip(w.strides, sp, strict=True)))
    return View(address, (*padded.shape[:2], *w.out_spatial), strides, padded.dtype)


def lower_conv(cx: LowerContext, node: Node) -> list[list[Step]]:
    w = window_of(cx.graph, node)
    padded, phases = _padded(cx, node, w, 0.0)
    n_img, c = w.in_shape[:2]
    kk, p = math.prod(w.kernel), math.prod(w.out_spatial)
    sp = padded.strides[2:]
    col_src = View(
        padded.address,
        (n_img, c, *w.kernel, *w.out_spatial),
        (
            *padded.strides[:2],
            *(d * st for d, st in zip(w.dilations, sp, strict=True)),
            *(t * st for t, st in zip(w.strides, sp, strict=True)),
        ),
        padded.dtype,
    )
    col = dense(cx.temp(node, 1), col_src.shape, padded.dtype)
    phases.append(copy_steps(cx, [(col_src, col, None)]))
    groups = node.attr("group")
    weight = cx.graph.types[node.inputs[1]].shape
    m, cg = weight[0], weight[1]
    mg = m // groups
    q = cx.matrix(node) if cx.int8 else None
    a = matrix_operand(cx, node, node.inputs[1], q.weight_scale if q else None)
    b_scale = q.input_scale if q and padded.dtype is DType.f32 else None
    a2 = a.view.reshape_dense((m, cg * kk))
    col2 = col.reshape_dense((n_img, groups, cg * kk, p))
    out = cx.view(node.outputs[0]).reshape_dense((n_img, m, p))
    bias = bias_view(cx, node)
    steps: list[Step] = []
    for img, g in product(range(n_img), range(groups)):
        bias_g = None
        if bias is not None:
            bias_g = View(bias.address + g * mg * bias.dtype.size, (mg, p), (bias.dtype.size, 0), bias.dtype)
        gemm = Gemm(
            Operand(a2.slice(0, g * mg, mg), a.quantize_scale),
            Operand(col2.index((img, g)), b_scale),
            out.index((img,)).slice(0, g * mg, mg),
            bias_g,
            requant(cx, node),
        )
        steps.extend(gemm_steps(cx.config, gemm, len(steps)))
    phases.append(steps)
    return phases


def lower_pool(cx: LowerContext, node: Node) -> list[list[Step]]:
    w = window_of(cx.graph, node)
    x_dt = cx.dtype(node.inputs[0])
    is_max = node.op == OpType.MaxPool
    pad_value = (-128.0 if x_dt is DType.i8 else -math.inf) if is_max else 0.0
    padded, phases = _padded(cx, node, w, pad_value)
    offsets = list(product(*(range(k) for k in w.kernel)))
    sources = [_window_view(padded, w, o) for o in offsets]
    if not is_max:
        ones = dense(cx.temp(node, 1), w.padded_shape, DType.f32)
        valid = ones
        for i in range(w.s):
            size = w.in_shape[2 + i] + (w.pads[i] + w.pads[w.s + i] if node.attr("count_include_pad") else 0)
            valid = valid.slice(2 + i, 0 if node.attr("count_include_pad") else w.pads[i], size)
        phases += [_fill_steps(cx, ones, 0.0), _fill_steps(cx, valid, 1.0)]
        counts = [_window_view(ones, w, o) for o in offsets]
    out = cx.view(node.outputs[0])
    deq = not is_max and x_dt is DType.i8
    scale = cx.scale(node.inputs[0])
    per_elem = len(offsets) * (x_dt.size + (0 if is_max else 8)) + 8
    probe = TileArena(cx.config, 0)
    budget = largest_fitting(1 << 15, lambda e: probe.fits([e * per_elem + 64 * (2 * len(offsets) + 4)]))
    steps = []
    for block in blocks(out.shape, budget):
        arena = TileArena(cx.config, len(steps) % 2)
        parts = [block.of(v) for v in sources]
        n = parts[0].size
        tiles = [arena.tile(n * x_dt.size) for _ in parts]
        loads = list(zip(parts, tiles, strict=True))
        acc = arena.tile(n * out.dtype.size)
        if is_max:

            def compute(em: Emitter, tiles=tiles, acc=acc, n=n) -> None:
                em.b.v_copy(*em.regs(acc, tiles[0]), n, x_dt.name)
                for t in tiles[1:]:
                    em.b.v_max(*em.regs(acc, acc, t), n, x_dt.name)

        else:
            ctiles = [arena.tile(n * 4) for _ in counts]
            loads += [(block.of(v), t) for v, t in zip(counts, ctiles, strict=True)]
            tmp = arena.tile(n * 4)
            cnt = arena.tile(n * 4)

            def compute(em: Emitter, tiles=tiles, ctiles=ctiles, acc=acc, tmp=tmp, cnt=cnt, n=n) -> None:
                for i, (t, ct) in enumerate(zip(tiles, ctiles, strict=True)):
                    src = t
                    if deq:
                        dequantize(em, tmp, t, n, scale)
                        src = tmp
                    if i == 0:
                        em.b.v_copy(*em.regs(acc, src), n, "f32")
                        em.b.v_copy(*em.regs(cnt, ct), n, "f32")
                    else:
                        em.b.v_add(*em.regs(acc, acc, src), n, "f32")
                        em.b.v_add(*em.regs(cnt, cnt, ct), n, "f32")
                em.b.v_div(*em.regs(acc, acc, cnt), n, "f32")

        steps.append(Step(loads, [(Unit.vector, compute)], [(acc, block.of(out))]))
    phases.append(steps)
    return phases


LOWERINGS = {OpType.Conv: lower_conv, OpType.MaxPool: lower_pool, OpType.AveragePool: lower_pool}
SCRATCH = dict.fromkeys(LOWERINGS, _scratch)
