"""A short-and-wide GEMM in the swapped orientation: C^T = B^T A^T, so the few activation rows are stationary.

The systolic array streams the rows of its moving operand; an instruction costs `rows + 2N - 1` cycles and a weight
preload N more. A GEMM with M <= N activation rows (a transformer layer's tokens) therefore spends most of its
matrix time filling and draining the array once per weight tile. Swapped, each k-slice of A^T (one `dma.ldt` of A,
transposed in flight) is preloaded once and the weight's columns stream through as rows: one `mx.mm` of `n_out` rows
per k-slice instead of one preload and one 16-row `mx.mm` per weight tile. The weight is a constant, packed at
compile time as the rows the array streams (`pack_swapped`, one DMA per chunk of output columns). The accumulator
then holds C^T; phase 1 drains it (int8 requantize, ReLU) to a DRAM scratch buffer, phase 2 brings it back
transposed (`dma.ldt`) and stores C. The drain applies only what acts per element or per tensor (requantize, ReLU)
and a Gemm's own bias (per row of C^T: each step broadcasts its chunk of the bias over its rows on the vector unit,
`v.add.vc`, and the drain adds that tile as its residual, before requantizing as the unfused Gemm does). More than N
activation rows are several stationary row blocks, each preloaded per k-slice. Any other epilogue a vector chain can
run (bias, residual, ReLU, GELU, LayerNorm, Softmax: `codegen.chain`) runs in phase 2 instead, on the C tiles the
transposing load brings back, before they are stored: phase 1 then drains the MatMul's own output exactly as the
unfused kernel would (int8: requantized to its scale), so the chain sees the same values and the numerics of the
unfused nodes are kept, int8 included.

A Transpose that only reorders the activation's leading axes (the last axis stays) and feeds the GEMM is absorbed:
the GEMM's rows are independent, so A is read in the Transpose's input order and phase 2 stores each output row
where the Transpose would have put it (a strided store), with no transposed copy of A in DRAM. Likewise on the
way out: a Reshape keeping the last axis and a leading-axis Transpose after the GEMM only move whole output rows,
so phase 2 stores the rows at their final places.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from fusion.engine.codegen.chain import ROWS, emit_chain, operand_views, operands
from fusion.engine.codegen.gemm import k_slices
from fusion.engine.codegen.matrix_group import EPILOGUE_HEADS, EpilogueOps, epilogue_ops, is_dense, packable_weight
from fusion.engine.codegen.transpose import copy_runs, scattered_rows
from fusion.engine.errors import CodegenError
from fusion.graph.ir import Graph, Node
from fusion.graph.ops import OpType
from fusion.lower.context import LowerContext, const_key, temp_key
from fusion.lower.emitter import Emitter, Step, f32_bits
from fusion.lower.kernels.matrix import bias_view, matrix_operand, requant
from fusion.lower.kernels.vector_ops import quantize_tile
from fusion.lower.local_alloc import DEPTH, TileArena, largest_fitting
from fusion.lower.views import MAX_COLS, MAX_ROWS, View, dense
from isa.enums import Activation, DType, Unit
from simulator.config import MachineConfig

SWAPPED = "swapped"  # constant-form key of a weight packed as streamed rows (see pack_swapped)


@dataclass(frozen=True)
class SwappedShape:
    m: int  # activation rows (stationary, in blocks of at most N)
    k: int
    n_out: int  # output columns (streamed as rows)
    chunk: int  # output columns per pipeline step

    def row_blocks(self, n_arr: int) -> list[tuple[int, int]]:
        """(first row, rows) of each stationary tile of A^T: N activation rows at most."""
        return k_slices(self.m, n_arr)


def swapped_shape(graph: Graph, cfg: MachineConfig, head: Node, int8: bool) -> SwappedShape:
    """The GEMM's extents and the chunk of output columns one step handles; CodegenError when it does not apply."""
    if head.op not in EPILOGUE_HEADS or packable_weight(graph, head) is None:
        raise CodegenError(
            f"node {head.name!r}: the swapped orientation needs a MatMul/Gemm with a constant 2-D weight"
        )
    a_shape = graph.types[head.inputs[0]].shape
    k, n_out = graph.types[head.inputs[1]].shape
    m = math.prod(a_shape[:-1])
    if k > MAX_COLS or n_out > MAX_ROWS:
        raise CodegenError(f"node {head.name!r}: a {m} x {k} x {n_out} GEMM exceeds one transposing DMA")
    es = 1 if int8 else 4
    probe = TileArena(cfg, 0)
    blocks = [mb for _, mb in k_slices(m, cfg.array_size)]
    a_t = [size for mb in blocks for size in (mb * k * 4, mb * k)]  # raw and quantized A^T, per row block
    biased = len(head.inputs) > 2  # the Gemm's own bias: per row of C^T, a broadcast tile added in the drain

    def fits(c: int) -> bool:
        per_block = [c * mb * 4 for mb in blocks]  # drained C^T (and the bias tile), accumulator
        return probe.fits([*a_t, c * k * es, *per_block, *([c * 4, *per_block] if biased else [])], per_block)

    chunk = largest_fitting(n_out, fits)
    if chunk == 0:
        raise CodegenError(f"node {head.name!r}: one swapped step does not fit a buffer slot")
    return SwappedShape(m, k, n_out, chunk)


def pack_swapped(weights: np.ndarray, chunk: int, n_arr: int) -> np.ndarray:
    """A K x N weight as the rows the array streams: per chunk of `chunk` output columns, per k-slice, the slice's
    columns as rows (kb elements each). Flat, so one chunk is one contiguous DMA."""
    k, n = weights.shape
    parts = [
        weights[k0 : k0 + kb, c0 : c0 + chunk].T.ravel() for c0 in range(0, n, chunk) for k0, kb in k_slices(k, n_arr)
    ]
    return np.ascontiguousarray(np.concatenate(parts))


def scratch_bytes(graph: Graph, cfg: MachineConfig, head: Node, int8: bool) -> int:
    """DRAM bytes of the C^T buffer between the two phases."""
    shape = swapped_shape(graph, cfg, head, int8)
    return shape.n_out * shape.m * (1 if int8 else 4)


def row_permutation(graph: Graph, nodes: Sequence[Node]) -> tuple[int, ...] | None:
    """The leading-axis permutation of an absorbed Transpose heading the group (None: no Transpose); CodegenError
    when the Transpose moves the last axis or does not feed the GEMM's activation."""
    first = nodes[0]
    if first.op != OpType.Transpose:
        return None
    perm = tuple(first.attr("perm"))
    if len(nodes) < 2 or nodes[1].inputs[0] != first.outputs[0] or perm[-1] != len(perm) - 1:
        raise CodegenError(f"node {first.name!r}: only a Transpose of leading axes feeding the activation is absorbed")
    return perm


def matrix_head(nodes: Sequence[Node]) -> Node:
    """The group's MatMul/Gemm (after an absorbed Transpose, if any)."""
    return nodes[1] if nodes[0].op == OpType.Transpose and len(nodes) > 1 else nodes[0]


def _row_moves(graph: Graph, nodes: Sequence[Node]) -> tuple[list[Node], tuple[int, ...] | None, int]:
    """Split off trailing layout nodes (a Reshape keeping the last axis, or splitting it into (heads, D), then a
    Transpose keeping the last axis): the epilogue nodes, the Transpose's permutation (None when the group ends with
    its epilogue) and the split's D (0: no split; each block of D columns of C is then one head's rows)."""
    last = nodes[-1]
    if last.op != OpType.Transpose:
        return list(nodes), None, 0
    perm = tuple(last.attr("perm"))
    body = list(nodes[:-1])
    chained = all(b.outputs[0] in a.inputs[:1] for a, b in zip(nodes[1:], nodes[:-1], strict=False))
    if not chained:
        raise CodegenError(f"node {last.name!r}: the group is not a chain of producers and consumers")
    split = 0
    if body and body[-1].op == OpType.Reshape:
        shape_in, shape_out = (graph.types[v].shape for v in (body[-1].inputs[0], body[-1].outputs[0]))
        heads = shape_out[:-2] == shape_in[:-1] and len(shape_out) >= 2
        if heads and shape_out[-2] * shape_out[-1] == shape_in[-1] and shape_in[-1:] != shape_out[-1:]:
            split = shape_out[-1]
        elif shape_in[-1:] != shape_out[-1:]:
            raise CodegenError(f"node {body[-1].name!r}: a Reshape that splits rows cannot be absorbed")
        body.pop()
    if perm[-1] != len(perm) - 1:
        raise CodegenError(f"node {last.name!r}: only a Transpose of leading axes is absorbed after the GEMM")
    return body, perm, split


def swapped_phases(cx: LowerContext, nodes: Sequence[Node]) -> list[list[Step]]:
    graph, cfg = cx.graph, cx.config
    perm = row_permutation(graph, nodes)
    source = nodes[0].inputs[0]
    if perm is not None:
        nodes = nodes[1:]
    head = nodes[0]
    out = cx.view(nodes[-1].outputs[0])
    nodes, out_perm, split = _row_moves(graph, nodes)
    if perm is not None and out_perm is not None:
        raise CodegenError(f"node {head.name!r}: absorbs a Transpose before or after it, not both")
    ops, chain = _epilogue_split(cx, nodes)
    shape = swapped_shape(graph, cfg, head, cx.int8)
    q = cx.matrix(head) if cx.int8 else None
    a = matrix_operand(cx, head, head.inputs[0], q.input_scale if q else None)
    if perm is not None:  # read the Transpose's input; store each row where the Transpose would have put it
        if cx.dtype(source) != a.view.dtype or cx.scale(source) != cx.scale(head.inputs[0]):
            raise CodegenError(f"node {head.name!r}: the absorbed Transpose changes the activation's storage")
        a = replace(a, view=cx.view(source))
    # C's rows in the order the kernel computes them: the output (a trailing Transpose moves whole rows) and, for
    # a phase-2 chain, its operands (in C's layout, which a leading Transpose reorders too)
    out_rows = _row_order(perm if perm is not None else out_perm)(out)
    value_rows = _row_order(perm)
    if not is_dense(a.view):
        raise CodegenError(f"node {head.name!r}: the swapped orientation needs a dense activation")
    a_view = a.view.reshape_dense((shape.m, shape.k))
    out_dt = out.dtype
    w_dt = DType.i8 if cx.int8 else DType.f32
    packed = cx.addresses[const_key(packable_weight(graph, head), SWAPPED)]
    c_dt = cx.dtype(head.outputs[0]) if chain else out_dt  # what phase 1 drains: C, or C with its drained epilogue
    scratch = dense(cx.addresses[temp_key(head, 0)], (shape.n_out, shape.m), c_dt)
    mult, shift = requant(cx, head) or (f32_bits(1.0), 0)
    act = Activation.relu if ops.relu else Activation.none
    bias = None if ops.bias is None else bias_view(cx, head)  # the Gemm's own: the only bias the drain applies
    slices = k_slices(shape.k, cfg.array_size)
    blocks = shape.row_blocks(cfg.array_size)
    chunks = range(0, shape.n_out, shape.chunk)
    arenas = [TileArena(cfg, s, cx.rotation) for s in range(len(chunks))]
    # A^T (per stationary row block), loaded (and quantized) once by step 0 so A is read from DRAM once however many
    # chunks there are: in the spare scratchpad banks every step reads (`TileArena.spare`) when it fits there, else
    # at the same place in every slot, each of the next steps using another slot copying it there (on the vector
    # unit, under the matrix work of the steps before it)
    a_bytes = [(mb * shape.k * a_view.dtype.size, mb * shape.k) for _, mb in blocks]
    quantized = a.quantize_scale is not None
    spare = TileArena.spare(cfg)
    shared = spare is not None and spare.fits([b for pair in a_bytes for b in pair[: 1 + quantized]])

    def place(t: TileArena) -> list[tuple[int, int]]:
        return [(raw, t.tile(size) if quantized else raw) for raw, size in ((t.tile(r), q) for r, q in a_bytes)]

    a_tiles = [place(spare)] * len(arenas) if shared else [place(t) for t in arenas]
    # phase 2's first block of a chain gets its other operands (residual, LayerNorm rows) from a last phase-1 step
    # of loads only, in the buffer slot that block then uses (phase 2's blocks continue phase 1's slot rotation),
    # while the matrix unit finishes: that block then waits only for C to come back
    first = len(chunks)
    back, prefetch = (
        _chain_back(cx, scratch, chain, head.outputs[0], value_rows, out_rows, first) if chain else ([], [])
    )
    steps = []
    for step, c0 in enumerate(chunks):
        rows = min(shape.chunk, shape.n_out - c0)
        arena = arenas[step]
        w = arena.tile(rows * shape.k * w_dt.size)
        accs = [arena.acc_tile(rows * mb * 4) for _, mb in blocks]
        outs = [arena.tile(rows * mb * c_dt.size) for _, mb in blocks]
        bias_t = 0 if bias is None else arena.tile(rows * 4)
        res = [0 if bias is None else arena.tile(rows * mb * 4) for _, mb in blocks]  # bias[c0 + j] along row j
        w_part = dense(packed + c0 * shape.k * w_dt.size, (rows * shape.k,), w_dt)

        def load(em: Emitter, w=w, w_part=w_part, bias_t=bias_t, c0=c0, rows=rows, first=step == 0) -> None:
            if first:
                for (r0, mb), (a_raw, _) in zip(blocks, a_tiles[0], strict=True):
                    local, dram, stride = em.regs(a_raw, a_view.address + r0 * a_view.strides[0], a_view.strides[0])
                    em.b.dma_ldt(local, dram, stride, mb, shape.k, a_view.dtype.name)
            em.dma_load(w_part, w)
            if bias is not None:
                em.dma_load(bias.slice(0, c0, rows), bias_t)

        quantize = step == 0 and a.quantize_scale is not None
        copy = 0 < step < DEPTH and not shared  # this step's slot gets step 0's A^T (the vector unit keeps order)

        def prepare(em: Emitter, bias_t=bias_t, res=res, rows=rows, quantize=quantize, copy=copy, step=step) -> None:
            for (_, mb), r in zip(blocks, res, strict=True):
                if bias is not None:  # zero bits (i32 x - x) are f32 zeros too, then each row its column's bias
                    em.b.v_sub(*em.regs(r, r, r), rows * mb, "i32")
                    em.b.v_add_vc(*em.regs(r, r, bias_t), rows * mb, mb, bias.dtype.name)
            for (_, mb), (a_raw, a_t) in zip(blocks, a_tiles[0], strict=True):
                if quantize:
                    quantize_tile(em, a_t, a_raw, mb * shape.k, a.quantize_scale)
            for (_, mb), (_, a_t), (_, dst) in zip(blocks, a_tiles[0], a_tiles[step], strict=True) if copy else ():
                em.b.v_copy(*em.regs(dst, a_t), mb * shape.k, w_dt.name)

        def matmul(em: Emitter, w=w, accs=accs, outs=outs, res=res, rows=rows, a_here=a_tiles[step]) -> None:
            for (_, mb), (_, a_t), acc, out_t, r in zip(blocks, a_here, accs, outs, res, strict=True):
                for index, (k0, kb) in enumerate(slices):
                    em.b.mx_preload(em.reg(a_t + k0 * mb * w_dt.size), kb, mb, w_dt.name)
                    mm = em.b.mx_mm if index == 0 else em.b.mx_mma
                    mm(*em.regs(acc, w + k0 * rows * w_dt.size), rows)
                flags = "none" if bias is None else "res"
                em.b.ep_cfg(*em.regs(0, r, mult), shift, act, flags, "i8" if cx.int8 else "f32")
                em.b.mx_drain(*em.regs(out_t, acc), rows, mb)

        compute = [(Unit.load, load)]
        if quantize or copy or bias is not None:
            compute.append((Unit.vector, prepare))
        compute.append((Unit.matrix, matmul))
        stores = [(o, scratch.slice(0, c0, rows).slice(1, r0, mb)) for (r0, mb), o in zip(blocks, outs, strict=True)]
        steps.append(Step([], compute, stores))
    if prefetch:
        steps.append(Step([], [(Unit.load, lambda em: [em.dma_load(view, at) for view, at in prefetch])], []))
    if chain:
        if split:
            raise CodegenError(f"node {head.name!r}: a head split after the GEMM is absorbed without a chain only")
        return [steps, back]
    return [steps, _transpose_back(cfg, scratch, out_rows, cx.rotation, split)]


def _epilogue_split(cx: LowerContext, nodes: Sequence[Node]) -> tuple[EpilogueOps, list[Node]]:
    """What the drain applies, and the nodes a vector chain applies in phase 2 instead (all of the epilogue as
    soon as one node is beyond the drain: a chain keeps the unfused order of operations)."""
    own = nodes[0].inputs[2] if len(nodes[0].inputs) > 2 else None  # a Gemm's bias: a broadcast tile in the drain
    try:
        ops = epilogue_ops(cx.graph, nodes)
    except CodegenError as err:
        drain_refusal = str(err)
    else:
        if ops.bias == own and ops.residual is None:
            return ops, []
        drain_refusal = ""
    chain = list(nodes[1:])
    try:
        operands(cx, chain, frozenset({nodes[0].outputs[0]}))
    except CodegenError as err:
        raise CodegenError(f"{drain_refusal or err}; as a vector chain: {err}") from None
    return EpilogueOps(own, None, False), chain


def _row_order(perm: tuple[int, ...] | None) -> Callable[[View], View]:
    """A view of a C-shaped value with its leading axes put back in the order the GEMM computes C's rows (the last
    axis, C's columns, stays): the inverse of a leading-axis Transpose the group absorbs."""
    if perm is None:
        return lambda view: view
    order = (*np.argsort(perm[:-1]).tolist(), len(perm) - 1)
    return lambda view: view.permute(order)


def _rows_cols(view: View, m: int, r0: int, rows: int, c0: int, cols: int) -> View:
    """Rows [r0, r0 + rows) and columns [c0, c0 + cols) of a C-shaped view in kernel row order."""
    if rows == m:
        return view.slice(len(view.shape) - 1, c0, cols)
    if not is_dense(view):
        raise CodegenError("a block of C's rows needs a dense view (reordered rows are stored all at once)")
    return view.reshape_dense((m, view.shape[-1])).slice(0, r0, rows).slice(1, c0, cols)


def _chain_back(
    cx: LowerContext,
    scratch: View,
    chain: Sequence[Node],
    c_value: str,
    value_rows: Callable[[View], View],
    out: View,
    first: int = 0,
) -> tuple[list[Step], list[tuple[View, int]]]:
    """Phase 2 with a vector-chain epilogue: blocks of C come back through transposing loads of C^T, the chain
    runs on them with its other operands (per-column rows, C-shaped tiles), and the result is stored. A chain with
    a row reduction (LayerNorm, Softmax) takes whole rows; otherwise blocks span all rows and split the columns.
    Block j uses the buffer slot of step `first + j`; the first block's other operands are returned as loads
    ((view, local address) pairs) for a step `first` of phase 1 to issue, and that block loads only C."""
    n_out, m = scratch.shape
    table = operands(cx, chain, frozenset({c_value}))
    in_c_layout, row_views = operand_views(cx, table, cx.graph.types[c_value].shape)
    tile_views = {v: value_rows(view) for v, view in in_c_layout.items()}
    whole_rows = any(n.op in ROWS for n in chain)
    scatter = scattered_rows(out, cx.config)  # rows placed by an absorbed Transpose: a second tile to permute into
    per_elem = scratch.dtype.size + sum(v.dtype.size for v in tile_views.values()) + (8 if scatter else 4)
    probe = TileArena(cx.config, 0)

    def fits(rows: int, cols: int) -> bool:
        sizes = [rows * cols * per_elem + 64 * (len(tile_views) + 2), *(cols * 4 for _ in row_views)]
        return rows * cols <= cx.config.vreg_elems and cols <= MAX_ROWS and rows <= MAX_COLS and probe.fits(sizes)

    if whole_rows:
        cols, rows = n_out, largest_fitting(m, lambda r: fits(r, n_out))
    else:
        rows, cols = m, largest_fitting(n_out, lambda c: fits(m, c))
    if rows == 0 or cols == 0:
        raise CodegenError(f"a {m} x {n_out} block of C does not fit a vector register or the scratchpad")
    blocks = [
        (r0, min(rows, m - r0), c0, min(cols, n_out - c0)) for r0 in range(0, m, rows) for c0 in range(0, n_out, cols)
    ]

    def others_of(r0: int, rb: int, c0: int, cb: int) -> list[tuple[str, View, int]]:
        """The block's other operands: (value, view, local bytes)."""
        parts = [(v, _rows_cols(view, m, r0, rb, c0, cb)) for v, view in tile_views.items()]
        rows_part = [(v, view.slice(0, c0, cb)) for v, view in row_views.items()]
        return [(v, p, rb * cb * p.dtype.size) for v, p in parts] + [(v, p, cb * 4) for v, p in rows_part]

    steps: list[Step] = []
    prefetch: list[tuple[View, int]] = []
    for r0, rb, c0, cb in blocks:
        arena = TileArena(cx.config, first + len(steps), cx.rotation)
        addr = {c_value: arena.tile(rb * cb * scratch.dtype.size)}
        others_here = others_of(r0, rb, c0, cb)
        addr |= {v: arena.tile(size) for v, _, size in others_here}
        out_addr = arena.tile(rb * cb * 4)
        part = scratch.slice(0, c0, cb).slice(1, r0, rb)

        others = tuple((view, addr[v]) for v, view, _ in others_here)
        if not steps:  # loaded ahead, by phase 1
            prefetch, others = list(others), ()

        def load(em: Emitter, part=part, local=addr[c_value], rb=rb, cb=cb, others=others) -> None:
            for view, at in others:
                em.dma_load(view, at)
            at, dram, stride = em.regs(local, part.address, part.strides[0])
            em.b.dma_ldt(at, dram, stride, cb, rb, part.dtype.name)

        def compute(em: Emitter, a=addr, out_addr=out_addr, n=rb * cb, period=cb) -> None:
            emit_chain(cx, em, chain, table, a, out_addr, n, period)

        scattered = scatter if rb == m and cb == n_out else None
        if scattered is None:
            store = _rows_cols(out, m, r0, rb, c0, cb)
            steps.append(Step([], [(Unit.load, load), (Unit.vector, compute)], [(out_addr, store)]))
            continue
        flat, runs = scattered  # whole rows in kernel order: put in the output's order locally, one store
        placed = arena.tile(rb * cb * 4)

        def compute_placed(em: Emitter, compute=compute, out_addr=out_addr, placed=placed, runs=runs) -> None:
            compute(em)
            copy_runs(em, runs, placed, out_addr, n_out, DType.f32)

        steps.append(Step([], [(Unit.load, load), (Unit.vector, compute_placed)], [(placed, flat)]))
    return steps, prefetch


def _transpose_back(cfg: MachineConfig, scratch: View, out: View, rotation: int, split: int = 0) -> list[Step]:
    """C^T (n_out x m, dense in DRAM) -> C (m rows of n_out, `out` lists them in C's row order, possibly strided):
    transposing loads of column chunks, plain stores. With a head split (`split` = D: `out` is C's rows x heads x
    D) each chunk lies within one head and is stored as that head's rows."""
    n_out, m = scratch.shape
    es = scratch.dtype.size
    probe = TileArena(cfg, 0)
    chunk = largest_fitting(split or n_out, lambda c: probe.fits([c * m * es]))
    if split:
        chunk = max(d for d in range(1, chunk + 1) if split % d == 0)
    whole = chunk == n_out and probe.fits([n_out * m * es] * 2)
    scattered = scattered_rows(out, cfg) if whole and not split else None
    steps = []
    for c0 in range(0, n_out, chunk):
        cols = min(chunk, n_out - c0)
        arena = TileArena(cfg, len(steps), rotation)
        tile = arena.tile(cols * m * es)
        part = scratch.slice(0, c0, cols)
        last = len(out.shape) - 1  # with a head split: head c0 // D, its columns from c0 % D
        target = _head_columns(out, c0 // split, c0 % split, cols) if split else out.slice(last, c0, cols)

        def load(em: Emitter, tile=tile, part=part, cols=cols) -> None:
            local, dram, stride = em.regs(tile, part.address, part.strides[0])
            em.b.dma_ldt(local, dram, stride, cols, m, part.dtype.name)

        if scattered is None:
            steps.append(Step([], [(Unit.load, load)], [(tile, target)]))
            continue
        flat, runs = scattered  # rows stored where a trailing Transpose puts them: permuted locally, one store
        placed = arena.tile(cols * m * es)

        def permute(em: Emitter, tile=tile, placed=placed, runs=runs) -> None:
            copy_runs(em, runs, placed, tile, n_out, scratch.dtype)

        steps.append(Step([], [(Unit.load, load), (Unit.vector, permute)], [(placed, flat)]))
    return steps


def _head_columns(out: View, head: int, j0: int, cols: int) -> View:
    """Columns [j0, j0 + cols) of one head of C's rows x heads x D view: C's rows in order (the leading axes)."""
    axis = len(out.shape) - 2
    one = out.slice(axis, head, 1)
    view = replace(
        one, shape=one.shape[:axis] + one.shape[axis + 1 :], strides=one.strides[:axis] + one.strides[axis + 1 :]
    )
    return view.slice(len(view.shape) - 1, j0, cols)
