"""Elementwise and row-reduction chains in one vector pass (`vc.*`): every intermediate stays in a vector register.

A tile of the group's output is produced by loading each external input once (`vc.ld`, dequantized in registers
on the int8 path), applying the nodes' operations register to register, and storing once (`vc.st`). Softmax and
LayerNorm over the last axis are chains too (row reductions `vc.rmax`/`vc.rsum` with per-row `.vc` broadcasts),
so "Add -> LayerNorm" or "Mul -> Softmax" is one kernel and one DRAM round trip. Every op emits the same recipe
as the unfused kernels (`fusion.lower.kernels.recipes`, in register form), so float32 results are bit-identical
to the unfused path.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fusion.engine.errors import CodegenError
from fusion.graph.ir import Node
from fusion.graph.ops import OpType
from fusion.lower.context import LowerContext, const_scalar
from fusion.lower.emitter import Emitter, Step, f32_bits
from fusion.lower.kernels.recipes import (
    BINARY_INSTRUCTION,
    RECIPES,
    REDUCE_RECIPES,
    ROW_RECIPES,
    Col,
    RegisterForm,
    Row,
    Scalar,
    refusal,
)
from fusion.lower.local_alloc import TileArena, largest_fitting
from fusion.lower.views import View, blocks
from isa.enums import DType, Unit
from isa.fields import NUM_VREGS

REDUCTIONS = frozenset(REDUCE_RECIPES)  # last-axis reductions keeping the axis: one value per row, in a register
ROWS = frozenset({*ROW_RECIPES, *REDUCTIONS})  # nodes that need whole rows in a register
ELEMENTWISE = frozenset(RECIPES) - {OpType.BatchNorm}  # per-channel parameters need a [1, C, 1, 1] broadcast
CHAIN_OPS = frozenset({*ELEMENTWISE, *ROWS})
COMMUTATIVE = frozenset({OpType.Add, OpType.Mul})  # a broadcast first operand is swapped second (IEEE a+b == b+a)


@dataclass(frozen=True)
class Operand:
    """How a node input enters the chain: a register value, a scalar (fp32 bits), or a row vector (`.vr`)."""

    value: str
    kind: str  # "tile", "row", "scalar", "chain", "col" (a per-row chain value), "unit" (Div's numerator 1)
    bits: int = 0


class Registers:
    """v0..v7 as a free list: a value's register is released after its last use in the tile."""

    def __init__(self) -> None:
        self.free = list(range(NUM_VREGS))
        self.of: dict[str, int] = {}

    def new(self, value: str) -> int:
        if not self.free:
            raise CodegenError("vector chain needs more than 8 live vector registers")
        self.of[value] = self.free.pop(0)
        return self.of[value]

    def temp(self) -> int:
        return self.new(f"tmp{len(self.of)}")

    def release(self, reg: int) -> None:
        self.free.insert(0, reg)
        self.of = {k: r for k, r in self.of.items() if r != reg}


def _last_axis(cx: LowerContext, node: Node) -> bool:
    """A row recipe over the last axis, or a reduction of the last axis alone keeping it (one value per row)."""
    rank = len(cx.graph.types[node.inputs[0]].shape)
    if node.op in REDUCTIONS:
        axes = tuple(a % rank for a in node.attr("axes")) if rank else ()
        return axes == (rank - 1,) and bool(node.attr("keepdims"))
    return node.attr("axis") in (-1, rank - 1)


def operands(
    cx: LowerContext, nodes: Sequence[Node], seeded: frozenset = frozenset()
) -> dict[tuple[str, int], Operand]:
    """Classify every input of every node (`seeded`: values already in registers when the chain starts);
    raises CodegenError for what the chain cannot express.

    A node has the chain output's shape, or is per-row: a last-axis reduction of an output-shaped value keeping
    the axis, or an elementwise node of per-row values and scalars (e.g. RMSNorm's mean + eps, sqrt, 1 / that).
    A per-row value is a register of one value per row; an output-shaped node reads it broadcast over its rows
    (`.vc`)."""
    produced = {n.outputs[0] for n in nodes} | seeded
    out_shape = cx.graph.types[nodes[-1].outputs[0]].shape
    rows_shape = (*out_shape[:-1], 1)
    per_row: set[str] = set()
    table: dict[tuple[str, int], Operand] = {}
    for node in nodes:
        if node.op not in CHAIN_OPS or len(node.outputs) != 1:
            raise CodegenError(f"node {node.name!r} ({node.op.value}) has no vector-chain form")
        if node.op in ROWS and not _last_axis(cx, node):
            raise CodegenError(f"node {node.name!r}: a chain reduces over the last axis only (keeping it)")
        shape = cx.graph.types[node.outputs[0]].shape
        chain_ins = [v for v in node.inputs if v in produced]
        if node.op in REDUCTIONS:
            if cx.graph.types[node.inputs[0]].shape != out_shape:
                raise CodegenError(f"node {node.name!r}: a chain reduces values of its output's shape only")
            per_row.add(node.outputs[0])
        elif shape != out_shape:
            if shape != rows_shape or not chain_ins or not set(chain_ins) <= per_row:
                raise CodegenError(f"node {node.name!r}: every node of a chain must have the output's shape")
            per_row.add(node.outputs[0])
        if cx.dtype(node.outputs[0]) is not DType.f32:
            raise CodegenError(f"node {node.name!r}: an int8-preserving op cannot end inside an f32 chain")
        if node.op in RECIPES and (reason := refusal(cx.graph, node)) is not None:
            raise CodegenError(f"node {node.name!r}: {reason}")
        reads = RECIPES[node.op].reads(cx.graph, node) if node.op in RECIPES else node.inputs
        if node.op in COMMUTATIVE and _smaller(cx, reads[0], reads[1]):
            reads = reads[::-1]
        for pos, value in enumerate(reads):
            o = _classify(cx, node, pos, value, produced, out_shape, per_row)
            if pos == 0 and o.kind in ("row", "col"):
                raise CodegenError(f"node {node.name!r}: a broadcast first operand has no chain form")
            table[(node.name, pos)] = o
    return table


def _smaller(cx: LowerContext, a: str, b: str) -> bool:
    """Whether graph value a has fewer elements than b (a broadcast operand that goes second)."""
    sizes = [math.prod(cx.graph.types[v].shape) if v in cx.graph.types else 0 for v in (a, b)]
    return 0 < sizes[0] < sizes[1]


def _classify(
    cx: LowerContext, node: Node, pos: int, value: str, produced: set, out_shape: tuple, per_row: set[str]
) -> Operand:
    node_per_row = node.outputs[0] in per_row and node.op not in REDUCTIONS  # a reduction reads whole rows
    if value in produced:
        if value in per_row:
            return Operand(value, "chain" if node_per_row else "col")
        if value in cx.graph.types and math.prod(cx.graph.types[value].shape) != math.prod(out_shape):
            raise CodegenError(f"node {node.name!r}: {value!r} would need a broadcast inside a vector register")
        return Operand(value, "chain")
    scalar = const_scalar(cx.graph, value)
    if scalar is not None and node.op in RECIPES and pos in RECIPES[node.op].scalars:
        return Operand(value, "scalar", f32_bits(scalar))
    if scalar == 1.0 and node.op == OpType.Div and pos == 0:
        return Operand(value, "unit")  # 1 / y: the reciprocal (IEEE division, as the reference)
    if node_per_row:
        raise CodegenError(f"node {node.name!r}: a per-row value's other operand must be a scalar constant")
    shape = cx.graph.types[value].shape if value in cx.graph.types else cx.view(value).shape  # or a form key
    leading = next((i for i, d in enumerate(shape) if d != 1), len(shape))
    binary = node.op in BINARY_INSTRUCTION
    is_row = pos == 1 and binary and len(out_shape) > 1 and shape[leading:] == out_shape[-1:]
    if pos >= 1 and (node.op == OpType.LayerNorm or is_row):
        return Operand(value, "row")
    return Operand(value, "tile")


def operand_views(
    cx: LowerContext, table: dict[tuple[str, int], Operand], shape: tuple[int, ...]
) -> tuple[dict[str, View], dict[str, View]]:
    """The chain's operands from DRAM, each value once in first-use order: tiles as views of the chain's `shape`,
    row vectors as views of one row (its last axis)."""
    period = shape[-1] if shape else 1
    tiles = dict.fromkeys(o.value for o in table.values() if o.kind == "tile")
    rows = dict.fromkeys(o.value for o in table.values() if o.kind == "row")
    return {v: cx.view(v).broadcast_to(shape) for v in tiles}, {v: cx.view(v).broadcast_to((period,)) for v in rows}


def chain_steps(cx: LowerContext, nodes: Sequence[Node], start: int = 0) -> list[Step]:
    table = operands(cx, nodes)
    out_value = nodes[-1].outputs[0]
    out_view = cx.view(out_value)
    shape = out_view.shape
    period = shape[-1] if shape else 1
    in_views, row_views = operand_views(cx, table, shape)
    kept = stored_intermediates(cx, nodes)
    per_elem = sum(v.dtype.size for v in in_views.values()) + 4 * (1 + len(kept))
    probe = TileArena(cx.config, 0)
    rows_fixed = [period * 4] * len(row_views)
    budget = largest_fitting(
        cx.config.vreg_elems, lambda e: probe.fits([e * per_elem + 64 * len(in_views), *rows_fixed])
    )
    whole_rows = bool(row_views) or any(n.op in ROWS for n in nodes)
    if budget < period and whole_rows:
        raise CodegenError(f"a row of {period} elements does not fit a vector register or the scratchpad")
    steps = []
    whole = period if whole_rows else 1
    for block in blocks(shape, max(budget, 1), whole=whole):
        arena = TileArena(cx.config, start + len(steps), cx.rotation)
        parts = {v: block.of(view) for v, view in in_views.items()}
        n = block.of(out_view).size
        addr = {v: arena.tile(p.size * p.dtype.size) for v, p in parts.items()}
        addr |= {v: arena.tile(period * 4) for v in row_views}
        out_addr = arena.tile(n * 4)
        kept_addr = {v: arena.tile(n * 4) for v in kept}
        loads = [(parts[v], addr[v]) for v in parts] + [(row_views[v], addr[v]) for v in row_views]
        stores = [(out_addr, block.of(out_view))] + [(a, block.of(cx.view(v))) for v, a in kept_addr.items()]

        def compute(em: Emitter, addr=addr, out_addr=out_addr, n=n, kept_addr=kept_addr) -> None:
            emit_chain(cx, em, nodes, table, addr, out_addr, n, period, stored=kept_addr)

        steps.append(Step(loads, [(Unit.vector, compute)], stores))
    return steps


def stored_intermediates(cx: LowerContext, nodes: Sequence[Node]) -> list[str]:
    """Values produced before the chain's last node that its program must store too (`cx.graph` is the group's
    subgraph: its outputs are the values read outside the group): e.g. a pre-LN block's residual sum, read by
    the LayerNorm in the chain and by the next residual Add. Each must have the chain's output shape."""
    out_shape = cx.graph.types[nodes[-1].outputs[0]].shape
    kept = [n.outputs[0] for n in nodes[:-1] if n.outputs[0] in cx.graph.outputs]
    for value in kept:
        if cx.graph.types[value].shape != out_shape:
            raise CodegenError(f"{value!r} is read outside the chain but is not of the chain's output shape")
    return kept


def emit_chain(
    cx: LowerContext,
    em: Emitter,
    nodes: Sequence[Node],
    table: dict,
    addr: dict,
    out_addr: int,
    n: int,
    period: int,
    regs: Registers | None = None,
    stored: Mapping[str, int] | None = None,
    quantize: float | None = None,
) -> None:
    """Load the external operands at `addr`, apply the nodes register to register, store the last one (and each
    value in `stored` at its local address, as soon as it is computed). `quantize`: the last one is stored as int8,
    `vc.qnt` by this multiplier (what a `v.qnt` pass over the float32 result would give, without the pass)."""
    regs = regs or Registers()
    last_use = {o.value: node.name for node in nodes for (name, _), o in table.items() if name == node.name}
    for value in addr:  # load external operands once
        view_len = period if table_kind(table, value) == "row" else n
        load_register(cx, em, regs.new(value), value, addr[value], view_len)
    for node in nodes:
        ins = [o for (name, _), o in table.items() if name == node.name]
        out = emit_node(em, node, ins, regs, period)
        for o in ins:
            if o.kind not in ("scalar", "unit") and last_use.get(o.value) == node.name and o.value in regs.of:
                regs.release(regs.of[o.value])
        regs.of[node.outputs[0]] = out
        if stored and node.outputs[0] in stored:
            em.b.vc_st(em.reg(stored[node.outputs[0]]), out)
    last = regs.of[nodes[-1].outputs[0]]
    if quantize is not None:
        em.b.vc_qnt(last, last, em.reg(f32_bits(quantize)))
    em.b.vc_st(em.reg(out_addr), last)


def load_register(cx: LowerContext, em: Emitter, reg: int, value: str, local: int, n: int) -> None:
    """`n` elements of a value at a local address into a register as float32 (int8: dequantized at its scale)."""
    if cx.dtype(value) is DType.i8:
        em.b.vc_ld(reg, em.reg(local), n, "i8")
        em.b.vc_cvt(reg, reg, "f32")
        em.b.vc_mul_vs(reg, reg, em.reg(f32_bits(cx.scale(value))))
    else:
        em.b.vc_ld(reg, em.reg(local), n, "f32")


def table_kind(table: dict, value: str) -> str:
    return next(o.kind for o in table.values() if o.value == value)


def emit_node(em: Emitter, node: Node, ins: list[Operand], regs: Registers, period: int) -> int:
    """One node register to register (its recipe); returns the result's register."""
    if ins[0].kind == "unit":  # Div(1, y)
        out = regs.temp()
        RegisterForm(em, regs).op("recip", out, regs.of[ins[1].value])
        return out
    x = regs.of[ins[0].value]
    out = regs.temp()
    if node.op in RECIPES:
        RECIPES[node.op].emit(RegisterForm(em, regs), node, out, [_register_operand(o, regs) for o in ins])
    elif node.op in REDUCE_RECIPES:
        REDUCE_RECIPES[node.op](RegisterForm(em, regs, period), node, out, [x])
    else:
        params = [Row(regs.of[o.value]) for o in ins[1:]]
        ROW_RECIPES[node.op](RegisterForm(em, regs, period), node, out, [x, *params])
    return out


def _register_operand(o: Operand, regs: Registers) -> int | Scalar | Row | Col:
    if o.kind == "scalar":
        return Scalar(o.bits)
    if o.kind == "row":
        return Row(regs.of[o.value])
    if o.kind == "col":
        return Col(regs.of[o.value])
    return regs.of[o.value]
