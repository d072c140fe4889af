"""A layout-transforming load (`dma.ldt`) instead of an element-strided transpose.

When a Transpose's output rows run down a column of its input (the output's last axis is strided in the input
while its second-to-last is contiguous), the baseline moves one element per DMA row. The transposing load reads
each J x I input block with contiguous I-element rows and transposes it in flight into the dense I x J output
block, so a whole block costs one DMA instead of I*J single-element rows.
"""

from __future__ import annotations

import math

import numpy as np

from fusion.engine.errors import CodegenError
from fusion.graph.ir import Node
from fusion.graph.ops import OpType
from fusion.lower.context import LowerContext
from fusion.lower.emitter import Emitter, Step
from fusion.lower.local_alloc import TileArena, largest_fitting
from fusion.lower.views import MAX_COLS, MAX_ROWS, View
from isa.enums import Unit


def transposed_source(cx: LowerContext, node: Node) -> View:
    """The input seen in output order; raises CodegenError unless a transposing load fits it."""
    if node.op != OpType.Transpose:
        raise CodegenError(f"node {node.name!r} ({node.op.value}) is not a Transpose")
    src = cx.view(node.inputs[0]).permute(node.attr("perm"))
    es = src.dtype.size
    if len(src.shape) < 2 or src.strides[-2] != es or src.strides[-1] == es:
        raise CodegenError(f"node {node.name!r}: the output's rows are not input columns (no transposing load)")
    if src.shape[-1] > MAX_ROWS or src.shape[-2] > MAX_COLS:
        raise CodegenError(f"node {node.name!r}: a {src.shape[-1]} x {src.shape[-2]} block exceeds one DMA")
    return src


def transpose_steps(cx: LowerContext, node: Node) -> list[Step]:
    src = transposed_source(cx, node)
    out = cx.view(node.outputs[0])
    i_len, j_len = src.shape[-2], src.shape[-1]
    block = i_len * j_len
    lead = math.prod(src.shape[:-2])
    es = src.dtype.size
    probe = TileArena(cx.config, 0)
    per_step = largest_fitting(min(lead, MAX_ROWS), lambda b: probe.fits([b * block * es]))
    if per_step == 0:
        raise CodegenError(f"node {node.name!r}: one {i_len} x {j_len} block does not fit a buffer half")
    flat_out = out.reshape_dense((lead, block))
    steps = []
    for l0 in range(0, lead, per_step):
        count = min(per_step, lead - l0)
        tile = TileArena(cx.config, len(steps)).tile(count * block * es)

        def load(em: Emitter, l0=l0, count=count, tile=tile) -> None:
            for k in range(count):
                index = _unravel(l0 + k, src.shape[:-2])
                part = src.index(index)
                local, dram, stride = em.regs(tile + k * block * es, part.address, part.strides[-1])
                em.b.dma_ldt(local, dram, stride, j_len, i_len, src.dtype.name)

        steps.append(Step([], [(Unit.load, load)], [(tile, flat_out.slice(0, l0, count))]))
    return steps


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()
