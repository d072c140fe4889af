"""Vector chains through last-axis Slice and Concat (rotary embeddings) as one kernel, every value in registers.

Rotary embeddings as exported, x * cos + Concat(-x[..., D/2:], x[..., :D/2]) * sin, move lanes (rotate_half),
which no vector instruction does: run node by node they were six kernels per Q or K (~16k of a 2-layer LLaMA's
75k int8 cycles). Here every value of the region is kept in *segment-major* order: the last axis is cut at
every Slice and Concat boundary (the cuts propagated through the region until every value's agree, `cuts`), and
a register holds a value's segments one after another, each a rows x width block. In that order a Slice is a
contiguous range of its input's register and a Concat its inputs' registers one after another: both are moves
through local memory on the vector unit (`vc.st`, then `vc.ld` at an offset), and every elementwise node is the
chain's recipe (`chain.emit_node`) on whole registers. A non-constant input comes in by one strided DMA per
segment (int8: dequantized in registers as the chain does), every other constant operand packed segment-major
and broadcast to its use at compile time (one DMA), and the output leaves by one strided DMA per segment.

Exact: Slice and Concat copy, the elementwise recipes are the unfused kernels' (fp32 bit-identical; int8 inputs
dequantized at their scale, as the unfused Slice/Concat keep it). Blocks of rows when a register cannot hold
all of them. Refused: a row reduction (Softmax, LayerNorm, ReduceMean: segment-major order breaks rows), a value
broadcast inside a register (other than a constant, packed), an int8 output, more than 8 live registers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fusion.engine.codegen.chain import ELEMENTWISE, Operand, Registers, emit_node, load_register
from fusion.engine.codegen.gemm import coalesced
from fusion.engine.errors import CodegenError
from fusion.graph.ir import Graph, Node
from fusion.graph.ops import OpType
from fusion.lower.context import LowerContext, const_key, const_scalar
from fusion.lower.emitter import Emitter, Step, f32_bits
from fusion.lower.kernels.recipes import RECIPES, refusal
from fusion.lower.local_alloc import ALIGN, TileArena, slot
from fusion.lower.views import View, dense
from isa.enums import DType, Unit
from simulator.config import MachineConfig

SEGMENTS = "segments"  # constant-form prefix: a constant operand packed segment-major, broadcast to its use
MAX_REGION = 12  # nodes in one region (rotary: 7)
MOVES = frozenset({OpType.Slice, OpType.Concat})


def _last_axis_slice(graph: Graph, node: Node) -> tuple[int, int] | None:
    """(start, end) of a Slice of the last axis alone with step 1, else None."""
    rank = len(graph.types[node.inputs[0]].shape)
    axes = tuple(a % rank for a in node.attr("axes")) if rank else ()
    if axes != (rank - 1,) or tuple(node.attr("steps")) != (1,):
        return None
    start, end = node.attr("starts")[0], node.attr("ends")[0]
    return (start, end) if 0 <= start < end <= graph.types[node.inputs[0]].shape[-1] else None


def _concat_axis_last(graph: Graph, node: Node) -> bool:
    rank = len(graph.types[node.outputs[0]].shape)
    return rank > 0 and node.attr("axis") % rank == rank - 1


def _member(graph: Graph, node: Node) -> bool:
    """Whether a node can be part of a region: an elementwise chain op, or a last-axis Slice or Concat."""
    if len(node.outputs) != 1:
        return False
    if node.op == OpType.Slice:
        return _last_axis_slice(graph, node) is not None
    if node.op == OpType.Concat:
        return _concat_axis_last(graph, node)
    return node.op in ELEMENTWISE


def find_segment_chains(graph: Graph) -> list[tuple[str, ...]]:
    """Candidate regions: from every member node (the sink), its producers that are members and read only
    inside, grown to a fixed point (at most `MAX_REGION` nodes), where the region moves lanes (a Slice or
    Concat) and has another node; in graph order, deduplicated."""
    order = {n.name: i for i, n in enumerate(graph.nodes)}
    found: dict[tuple[str, ...], None] = {}
    for sink in graph.nodes:
        if not _member(graph, sink):
            continue
        region = {sink.name}
        grown = True
        while grown and len(region) < MAX_REGION:
            grown = False
            for name in sorted(region, key=order.__getitem__):
                for value in graph.node(name).inputs:
                    p = graph.producers.get(value)
                    if p is None or p.name in region or not _member(graph, p) or value in graph.outputs:
                        continue
                    if all(c.name in region for c in graph.consumers.get(value, ())) and len(region) < MAX_REGION:
                        region.add(p.name)
                        grown = True
        nodes = tuple(sorted(region, key=order.__getitem__))
        if len(nodes) > 1 and any(graph.node(n).op in MOVES for n in nodes):
            found[nodes] = None
    return list(found)


@dataclass(frozen=True)
class Layout:
    """Each register value's cuts of its last axis (segment boundaries, 0 and the width included), the rows
    every value shares and the rows per block."""

    cuts: dict[str, tuple[int, ...]]
    rows_shape: tuple[int, ...]
    block_rows: int

    @property
    def rows(self) -> int:
        return math.prod(self.rows_shape)


def _tensor_reads(graph: Graph, node: Node) -> list[tuple[int, str]]:
    """The (position, value) operands of a node that are tensors in registers (not `.vs` scalars, not 1 / y)."""
    if node.op in MOVES:
        return list(enumerate(node.inputs[:1] if node.op == OpType.Slice else node.inputs))
    recipe = RECIPES[node.op]
    out = []
    for pos, value in enumerate(recipe.reads(graph, node)):
        scalar = const_scalar(graph, value)
        if scalar is not None and (pos in recipe.scalars or (scalar == 1.0 and node.op == OpType.Div and pos == 0)):
            continue
        out.append((pos, value))
    return out


def layout(
    graph: Graph, nodes: Sequence[Node], config: MachineConfig, extra: Mapping[str, Sequence[int]] | None = None
) -> Layout:
    """The region's segment layout, with the `extra` cuts of some values (a producer's tile boundaries) made too;
    CodegenError for a region this kernel cannot run."""
    rows_shape = graph.types[nodes[-1].outputs[0]].shape[:-1]
    width = {v: graph.types[v].shape[-1] for n in nodes for v in (*n.inputs, *n.outputs) if v in graph.types}
    cuts: dict[str, set[int]] = {}

    def reg(value: str) -> None:
        if graph.types[value].shape[:-1] != rows_shape:
            raise CodegenError(f"{value!r}: every register value of the region has the output's rows {rows_shape}")
        cuts.setdefault(value, {0, width[value]})

    links: list[tuple[str, str, int]] = []  # (a, b, offset): position p of b is position p + offset of a
    for node in nodes:
        if not _member(graph, node):
            raise CodegenError(f"node {node.name!r} ({node.op.value}) is no elementwise op or last-axis move")
        if node.op in ELEMENTWISE and (reason := refusal(graph, node)) is not None:
            raise CodegenError(f"node {node.name!r}: {reason}")
        out = node.outputs[0]
        reg(out)
        for pos, value in _tensor_reads(graph, node):
            if value not in graph.types:
                raise CodegenError(f"node {node.name!r}: operand {value!r} is a derived form (no segment form)")
            if graph.is_constant(value) and node.op in ELEMENTWISE:
                continue  # packed at compile time for this use
            if node.op in ELEMENTWISE and graph.types[value].shape != graph.types[out].shape:
                raise CodegenError(f"node {node.name!r}: {value!r} would need a broadcast inside a register")
            reg(value)
            if node.op == OpType.Slice:
                start, end = _last_axis_slice(graph, node)  # type: ignore[misc]
                cuts[value] |= {start, end}
                links.append((value, out, start))
            elif node.op == OpType.Concat:
                links.append((out, value, sum(width[v] for v in node.inputs[:pos])))
            else:
                links.append((out, value, 0))
    for value, more in (extra or {}).items():
        if value not in cuts:
            raise CodegenError(f"{value!r} is no register value of the region")
        cuts[value] |= set(more)
    changed = True
    while changed:  # terminates: cut sets only grow, within each value's width
        changed = False
        for a, b, offset in links:
            into_b = {c - offset for c in cuts[a] if offset <= c <= offset + width[b]}
            into_a = {c + offset for c in cuts[b]}
            if not (into_b <= cuts[b] and into_a <= cuts[a]):
                cuts[b] |= into_b
                cuts[a] |= into_a
                changed = True
    widest = max(width[v] for v in cuts)
    if widest > config.vreg_elems:
        raise CodegenError(f"a row of {widest} elements does not fit a vector register")
    # a block's tiles, at most 4 bytes an element: every register value and packed constant (an upper bound)
    tiles = [width[v] for v in cuts] + [width[nodes[i].outputs[0]] for i, _, _ in _packed_reads(graph, nodes)]
    room = slot(config.spad_bytes, config.spad_banks, 0).size - ALIGN * len(tiles)
    block = min(math.prod(rows_shape), config.vreg_elems // widest, room // (4 * sum(tiles)))
    if block < 1:
        raise CodegenError(f"a row of the region's {len(tiles)} tiles does not fit a buffer slot")
    return Layout({v: tuple(sorted(c)) for v, c in cuts.items()}, rows_shape, block)


def _form_key(value: str, node: Node) -> str:
    """A constant operand's packed form for one node (two groups sharing a constant pack it apart)."""
    return const_key(value, f"{SEGMENTS}@{node.name}")


def _packed_reads(graph: Graph, nodes: Sequence[Node]) -> list[tuple[int, str, str]]:
    """(node index, constant, form key) of every constant tensor operand of an elementwise node."""
    out = []
    for i, node in enumerate(nodes):
        if node.op in ELEMENTWISE:
            out += [(i, v, _form_key(v, node)) for _, v in _tensor_reads(graph, node) if graph.is_constant(v)]
    return list(dict.fromkeys(out))  # a constant read twice by one node is one register


def _region_form(nodes: Sequence[Node]) -> str:
    """The DRAM form holding all the region's packed constants (keyed by its output: one group per program)."""
    return const_key(nodes[-1].outputs[0], f"{SEGMENTS}@{len(nodes)}")


def segment_forms(graph: Graph, config: MachineConfig) -> dict[str, np.ndarray]:
    """Every constant tensor operand broadcast to its node's output and packed segment-major, all of them in one
    float32 form, block by block (block b's part starts at its first row times their summed widths; inside it,
    one constant after another), so a block's constants are one DMA."""
    nodes = graph.nodes
    lay = layout(graph, nodes, config)
    packed = _packed_reads(graph, nodes)
    if not packed:
        return {}
    flats = []
    for i, value, _ in packed:
        out = nodes[i].outputs[0]
        data = np.broadcast_to(np.asarray(graph.constants[value], np.float32), graph.types[out].shape)
        flats.append((data.reshape(lay.rows, -1), lay.cuts[out]))
    parts = [
        flat[r0 : r0 + lay.block_rows, c0:c1].ravel()
        for r0 in range(0, lay.rows, lay.block_rows)
        for flat, cuts in flats
        for c0, c1 in zip(cuts, cuts[1:], strict=False)
    ]
    return {_region_form(nodes): np.concatenate(parts).astype(np.float32)}


def _matrix_view(cx: LowerContext, value: str) -> View:
    """A register value's DRAM view as (rows, width), for strided per-segment transfers."""
    shape = cx.graph.types[value].shape
    view = cx.view(value).reshaped((math.prod(shape[:-1]), shape[-1]))
    if view is None:
        raise CodegenError(f"{value!r} is read through a view that is not rows x width")
    return view


def _check_dtypes(cx: LowerContext, nodes: Sequence[Node]) -> None:
    """Registers hold float32: elementwise nodes and the region's output are float32; an int8 move (a Slice or
    Concat the quantization plan keeps int8) copies its inputs at its own scale."""
    for node in nodes:
        out = node.outputs[0]
        if cx.dtype(out) is DType.f32:
            continue
        if node.op not in MOVES or node is nodes[-1]:
            raise CodegenError(f"node {node.name!r}: an int8 value cannot end inside an f32 chain")
        ins = node.inputs[:1] if node.op == OpType.Slice else node.inputs
        if any(cx.dtype(v) is not DType.i8 or cx.scale(v) != cx.scale(out) for v in ins):
            raise CodegenError(f"node {node.name!r}: an int8 move changing the scale")


@dataclass(frozen=True)
class Region:
    """What a region's blocks load, pack, spill and store (the same for every block of rows)."""

    nodes: tuple[Node, ...]
    layout: Layout
    externals: tuple[str, ...]  # values read from outside the region, each one register
    packed: tuple[tuple[int, str, str], ...]  # (node index, constant, form key): see `_packed_reads`
    packed_width: dict[str, int]  # form key -> its node's output width
    spills: tuple[str, ...]  # values moved through local memory (Slice sources not already f32 there, Concats)
    f32_local: frozenset[str]  # externals whose loaded tile is their f32 form (a Slice reads it in place)
    uses: dict[str, int]

    @property
    def output(self) -> str:
        return self.nodes[-1].outputs[0]

    def width(self, value: str) -> int:
        return self.layout.cuts[value][-1]

    def emit(self, cx: LowerContext, em: Emitter, r: int, addr: dict[str, int], spill: dict[str, int]) -> int:
        """The region on a block of `r` rows whose externals and packed constants are at `addr` (segment-major);
        returns the output's register."""
        regs = _emit_region(cx, em, self.nodes, r, addr, spill, self.f32_local, self.packed_width, self.uses)
        return regs.of[self.output]


def plan_region(cx: LowerContext, nodes: Sequence[Node], extra: Mapping[str, Sequence[int]] | None = None) -> Region:
    """The region's plan (`extra`: see `layout`); CodegenError for a region this kernel cannot run."""
    graph = cx.graph
    lay = layout(graph, nodes, cx.config, extra)
    _check_dtypes(cx, nodes)
    produced = {n.outputs[0] for n in nodes}
    externals = tuple(v for v in lay.cuts if v not in produced)
    packed = tuple(_packed_reads(graph, nodes))
    sources = dict.fromkeys(n.inputs[0] for n in nodes if n.op == OpType.Slice)
    f32_local = frozenset(v for v in externals if cx.dtype(v) is DType.f32)
    concats = tuple(n.outputs[0] for n in nodes if n.op == OpType.Concat)
    spills = tuple(v for v in sources if v not in f32_local) + concats
    packed_width = {key: graph.types[nodes[i].outputs[0]].shape[-1] for i, _, key in packed}
    return Region(tuple(nodes), lay, externals, packed, packed_width, spills, f32_local, _last_uses(graph, nodes))


def segment_chain_steps(cx: LowerContext, nodes: Sequence[Node]) -> list[Step]:
    region = plan_region(cx, nodes)
    lay, out_value, width = region.layout, region.output, region.width
    views = {v: _matrix_view(cx, v) for v in (*region.externals, out_value)}
    offsets = np.cumsum([0, *region.packed_width.values()]).tolist()[:-1]  # each constant's place in a block
    total = sum(region.packed_width.values())
    steps = []
    for r0 in range(0, lay.rows, lay.block_rows):
        r = min(lay.block_rows, lay.rows - r0)
        arena = TileArena(cx.config, len(steps), cx.rotation)
        sizes = [r * width(v) * cx.dtype(v).size for v in region.externals]
        sizes += [r * w * 4 for w in (*region.packed_width.values(), *map(width, (*region.spills, out_value)))]
        if not arena.fits(sizes):
            raise CodegenError(f"a block of {r} rows does not fit a buffer slot ({sum(sizes)} bytes)")
        addr = {v: arena.tile(r * width(v) * cx.dtype(v).size) for v in region.externals}
        addr |= {key: arena.tile(r * w * 4) for key, w in region.packed_width.items()}
        spill = {v: arena.tile(r * width(v) * 4) for v in region.spills}
        out_addr = arena.tile(r * width(out_value) * 4)
        loads = []
        for v in region.externals:
            loads += segment_views(views[v].slice(0, r0, r), lay.cuts[v], addr[v], cx.dtype(v).size)
        base = cx.addresses[_region_form(nodes)] + r0 * total * 4 if region.packed else 0
        for (key, w), offset in zip(region.packed_width.items(), offsets, strict=True):
            loads.append((dense(base + r * offset * 4, (r * w,), DType.f32), addr[key]))
        stores = [(a, v) for v, a in segment_views(views[out_value].slice(0, r0, r), lay.cuts[out_value], out_addr, 4)]

        def compute(em: Emitter, r=r, addr=addr, spill=spill, out_addr=out_addr) -> None:
            em.b.vc_st(em.reg(out_addr), region.emit(cx, em, r, addr, spill))

        steps.append(Step(coalesced(loads), [(Unit.vector, compute)], stores))
    return steps


def segment_views(rows: View, cuts: Sequence[int], local: int, size: int) -> list[tuple[View, int]]:
    """A (rows x width) view's segments with their places in a segment-major tile at `local` (`size` bytes an
    element): one strided transfer each."""
    r = rows.shape[0]
    return [(rows.slice(1, c0, c1 - c0), local + r * c0 * size) for c0, c1 in zip(cuts, cuts[1:], strict=False)]


def _operands(graph: Graph, node: Node) -> list[Operand]:
    """An elementwise node's operands as the chain emits them: registers (values, packed constants by their
    form key), `.vs` scalars, or the unit numerator of 1 / y."""
    recipe = RECIPES[node.op]
    ins = []
    for pos, value in enumerate(recipe.reads(graph, node)):
        scalar = const_scalar(graph, value)
        if scalar is not None and pos in recipe.scalars:
            ins.append(Operand(value, "scalar", f32_bits(scalar)))
        elif scalar == 1.0 and node.op == OpType.Div and pos == 0:
            ins.append(Operand(value, "unit"))
        elif graph.is_constant(value):
            ins.append(Operand(_form_key(value, node), "tile"))
        else:
            ins.append(Operand(value, "chain"))
    return ins


def _reads(graph: Graph, node: Node) -> list[str]:
    """The register keys a node reads."""
    if node.op in MOVES:
        return list(node.inputs[:1] if node.op == OpType.Slice else node.inputs)
    return [o.value for o in _operands(graph, node) if o.kind in ("tile", "chain")]


def _last_uses(graph: Graph, nodes: Sequence[Node]) -> dict[str, int]:
    """Register key -> index of the last node reading it (its register is free after that node)."""
    return {key: i for i, node in enumerate(nodes) for key in _reads(graph, node)}


def _emit_region(
    cx: LowerContext,
    em: Emitter,
    nodes: Sequence[Node],
    r: int,
    addr: dict[str, int],
    spill: dict[str, int],
    f32_local: set[str],
    packed_width: dict[str, int],
    uses: dict[str, int],
) -> Registers:
    """Load the block's operands into registers, then every node in order (moves through local memory)."""
    graph, regs = cx.graph, Registers()
    width = {v: graph.types[v].shape[-1] for n in nodes for v in (*n.inputs, *n.outputs) if v in graph.types}
    local = {v: addr[v] for v in f32_local}
    for key, a in addr.items():
        if key in width:  # a graph value (int8: dequantized)
            load_register(cx, em, regs.new(key), key, a, r * width[key])
        else:  # a packed constant
            em.b.vc_ld(regs.new(key), em.reg(a), r * packed_width[key], "f32")
    for i, node in enumerate(nodes):
        out = node.outputs[0]
        if node.op == OpType.Slice:
            src = node.inputs[0]
            if src not in local:
                local[src] = spill[src]
                em.b.vc_st(em.reg(spill[src]), regs.of[src])
            start, end = _last_axis_slice(graph, node)  # type: ignore[misc]
            em.b.vc_ld(regs.new(out), em.reg(local[src] + r * start * 4), r * (end - start), "f32")
        elif node.op == OpType.Concat:
            offset = 0
            for value in node.inputs:
                em.b.vc_st(em.reg(spill[out] + r * offset * 4), regs.of[value])
                offset += width[value]
            em.b.vc_ld(regs.new(out), em.reg(spill[out]), r * width[out], "f32")
        else:
            regs.of[out] = emit_node(em, node, _operands(graph, node), regs, r * width[out])
        for key in dict.fromkeys(_reads(graph, node)):
            if uses.get(key) == i and key in regs.of:
                regs.release(regs.of[key])
    return regs
