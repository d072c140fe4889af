"""Layout transforms absorbed by their consumer: Transpose (-> Reshapes) -> a vector chain or a MatMul, one kernel.

The attention's head split is a Transpose, a Reshape (a view) and a scaling Mul: three kernels' worth of DRAM
round trips and access latencies for one pass over a few KiB. Here the Transpose's output is assembled in local
memory (`transpose.LocalTranspose`: one DMA of the input, `v.copy` runs), the Reshapes are nothing (they keep the
element order), and the chain (`chain.emit_chain`) reads it from there, so the transposed tensor never reaches
DRAM: one load, the chain, one store. The whole tensor is one block (it must fit a vector register).

A MatMul reads its operands tile by tile, each tile a strided DMA anyway, so it reads a transposed operand in
place: the operand is the Transpose's input seen through the permutation and the Reshapes (`View.reshaped`), the
baseline MatMul kernel runs on that view (`layout_load_phases`), and the transposed copy is never made.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from fusion.engine.codegen.chain import emit_chain, operand_views, operands, stored_intermediates
from fusion.engine.codegen.matrix_group import is_dense
from fusion.engine.codegen.transpose import local_transpose
from fusion.engine.errors import CodegenError
from fusion.graph.ir import Graph, Node
from fusion.graph.ops import OpType
from fusion.lower import LOWERINGS
from fusion.lower.context import LowerContext
from fusion.lower.emitter import Emitter, Step
from fusion.lower.local_alloc import TileArena
from fusion.lower.views import View
from isa.enums import Unit


def layout_prefix(nodes: Sequence[Node]) -> int:
    """How many leading nodes form the layout transform: a Transpose, then Reshapes keeping the last axis."""
    if not nodes or nodes[0].op != OpType.Transpose:
        return 0
    k = 1
    while k < len(nodes) and nodes[k].op == OpType.Reshape:
        k += 1
    return k


def layout_view(cx: LowerContext, layout: Sequence[Node]) -> View:
    """The layout nodes' output as a view of the Transpose's input; CodegenError when a Reshape would need a copy
    or the nodes are not a Transpose followed by Reshapes of its output."""
    transpose = layout[0]
    view = cx.view(transpose.inputs[0]).permute(transpose.attr("perm"))
    for prev, node in zip(layout, layout[1:], strict=False):
        shaped = view.reshaped(cx.graph.types[node.outputs[0]].shape) if node.inputs[0] == prev.outputs[0] else None
        if shaped is None:
            raise CodegenError(f"node {node.name!r}: the transposed tensor cannot be reshaped in place")
        view = shaped
    return view


def loads_in_place(graph: Graph, consumer: Node) -> bool:
    """Whether a layout load applies: an activation x activation MatMul (attention). A GEMM with a constant
    weight has better kernels (the swapped orientation absorbs a leading Transpose itself)."""
    return consumer.op == OpType.MatMul and not any(graph.is_constant(v) for v in consumer.inputs)


def layout_load_phases(cx: LowerContext, nodes: Sequence[Node]) -> list[list[Step]]:
    """Transpose (-> Reshapes) -> MatMul: the baseline MatMul kernel reading the transposed operand in place."""
    k = layout_prefix(nodes)
    if k != len(nodes) - 1:
        raise CodegenError("a layout load is a Transpose, optional Reshapes, then the MatMul reading them")
    consumer, value = nodes[-1], nodes[k - 1].outputs[0]
    if not loads_in_place(cx.graph, consumer):
        raise CodegenError(
            f"node {consumer.name!r}: only a MatMul of two activations reads a transposed operand; a "
            "GEMM with a constant weight absorbs a Transpose when swapped"
        )
    if value not in consumer.inputs:
        raise CodegenError(f"node {consumer.name!r} does not read the layout transform's output")
    absorbed = replace(cx, views={**cx.views, value: layout_view(cx, nodes[:k])})
    return LOWERINGS[consumer.op](absorbed, consumer)


def layout_chain_steps(cx: LowerContext, nodes: Sequence[Node]) -> list[Step]:
    k = layout_prefix(nodes)
    layout, chain = list(nodes[:k]), list(nodes[k:])
    if k == 0 or not chain:
        raise CodegenError("a layout chain is a Transpose, optional Reshapes, then at least one chain node")
    for prev, node in zip(layout, layout[1:], strict=False):
        shapes = [cx.graph.types[v].shape for v in (node.inputs[0], node.outputs[0])]
        if node.inputs[0] != prev.outputs[0] or shapes[0][-1:] != shapes[1][-1:]:
            raise CodegenError(f"node {node.name!r}: only Reshapes keeping the last axis follow the Transpose")
    lt = local_transpose(cx, layout[0])
    if lt is None:
        raise CodegenError(f"node {layout[0].name!r}: its output cannot be assembled locally")
    value = layout[-1].outputs[0]
    if value not in chain[0].inputs:
        raise CodegenError(f"node {chain[0].name!r} does not read the layout transform's output")
    if stored_intermediates(cx, chain):
        raise CodegenError("a layout chain stores its last value only")
    table = operands(cx, chain, frozenset({value}))
    out = cx.view(chain[-1].outputs[0])
    shape = out.shape
    period = shape[-1] if shape else 1
    tile_views, row_views = operand_views(cx, table, shape)
    views = tile_views | row_views
    if not all(is_dense(view) for view in views.values()):
        raise CodegenError("a layout chain's other operands must be dense (one block, loaded whole)")
    n = out.size
    sizes = [lt.nbytes, lt.nbytes, n * 4, *(view.size * view.dtype.size for view in views.values())]
    if n > cx.config.vreg_elems or not TileArena(cx.config, 0).fits(sizes):
        raise CodegenError(f"a {n}-element layout chain does not fit a vector register or a buffer slot")
    arena = TileArena(cx.config, 0, cx.rotation)
    staging = arena.tile(lt.nbytes)
    ordered = arena.tile(lt.nbytes) if lt.runs else staging
    addr = {value: ordered} | {v: arena.tile(view.size * view.dtype.size) for v, view in views.items()}
    out_addr = arena.tile(n * 4)

    def load(em: Emitter) -> None:
        lt.load(em, staging)
        for v, view in views.items():
            em.dma_load(view, addr[v])

    def compute(em: Emitter) -> None:
        if lt.runs:
            lt.permute(em, ordered, staging)
        emit_chain(cx, em, chain, table, addr, out_addr, n, period)

    return [Step([], [(Unit.load, load), (Unit.vector, compute)], [(out_addr, out.reshape_dense((n,)))])]
