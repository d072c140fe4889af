"""A whole transformer MLP as ONE kernel: [prologue chain] -> GEMM1 (+ own bias) -> activation chain -> GEMM2 (+ own
bias) -> [epilogue chain], the hidden activation (rows x hidden) never leaving the chip.

Per block of `tile` rows the steps are:
- P (prologue): the block's activations (each rows x D, one DMA each) and, in the first block, the row parameters
  (own biases, LayerNorm gamma/beta) packed in one constant (`pack_params`: one DMA) are loaded; the prologue chain
  (e.g. residual Add + LayerNorm, or RMSNorm) runs on whole rows (`chain.emit_chain`, the unfused recipes) and its
  result (int8: quantized at GEMM1's input scale, as the unfused MatMul does) is GEMM1's A, rows x D in the spare
  scratchpad bank, where every later step of the block reads it: GEMM1 reads its array-wide k-slices in place
  (`mx.mm.s`, row stride D), so it is written by the chain itself or one pass, not cut by a copy per row and slice.
  Values the epilogue reads (the pre-norm residual sum) are kept there too.
- H_g (hidden groups of `panels` array-wide panels of the hidden dimension): one DMA loads the group's slice of
  both weights (packed at compile time, `pack_weights`: per hidden panel, W1's K x N column panel, W2's N x D
  row slice as array tiles and the activation chain's row operands), GEMM1 computes the group's hidden panels
  and drains them (int8: requantized as GEMM1's drain does), the activation chain runs on each drained panel
  and (int8) quantizes it at GEMM2's input scale, exactly as the unfused kernels do, and GEMM2 accumulates the
  panel as its K slice into an accumulator that persists in the accumulator's spare bank. The next group's
  weights load while this group computes. Where a group's matrix work outlasts its weight DMA, the steps are
  software pipelined: GEMM2 of group g runs in step g + 1, after GEMM1 of group g + 1, while the vector unit
  runs group g + 1's activation chain (group 0's beside GEMM1 of group 1) (`_Kernel.steps`).
- E (epilogue): GEMM2's accumulator is drained (requantized), each array-wide column panel straight into its
  columns of one dense rows x D tile (`mx.drain.s`, row stride D: no copy per row and panel stitches them; only a
  partial last panel, D not a multiple of N, is drained whole and its columns copied per row), and the
  epilogue chain (bias, residual Add, a following LayerNorm) runs on them; its result (and every value read outside
  the group, e.g. the residual sum a following LayerNorm also feeds) is stored, such a value as soon as the chain
  has it (its DMA overlapping the rest of the chain). The chain's operands already on chip (kept residuals,
  parameter rows) are loaded into vector registers after the block's last activation chain, while the matrix unit
  runs the last GEMM2: the chain starts on the drained rows at once.

DRAM traffic is the compulsory: the activations in, the weights (with the activation chain's rows) once per row
block, the outputs out. Refused with
a reason: weights that are not constant 2-D, a Gemm with transposes or scaling, an activation chain needing
whole rows (a row reduction of the hidden activation), a chain reading other tensors than listed above, int8
per-channel requantization (`requant` says so), tiles that do not fit the buffer slots or the spare banks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from fusion.engine.codegen.chain import (
    CHAIN_OPS,
    ROWS,
    Registers,
    emit_chain,
    load_register,
    operands,
    table_kind,
)
from fusion.engine.codegen.gemm import _nothing, _quantizer, k_slices, pack_panels
from fusion.engine.codegen.matrix_group import EPILOGUE_HEADS, own_bias, packable_weight
from fusion.engine.codegen.stream import GEMM_DEFAULTS
from fusion.engine.errors import CodegenError
from fusion.engine.mlp_match import is_row_view
from fusion.graph.ir import Graph, Node
from fusion.graph.ops import OpType
from fusion.lower.context import CONST_F32, CONST_I8, LowerContext, bias_form, const_key
from fusion.lower.emitter import Emitter, Step, f32_bits
from fusion.lower.errors import MemoryPlanError
from fusion.lower.kernels.matrix import matrix_operand, requant
from fusion.lower.local_alloc import DEPTH, Slot, TileArena, largest_fitting, slot
from fusion.lower.views import MAX_ROWS, View, dense
from isa.enums import Activation, DType, Unit
from isa.memory_map import LOCAL_ACC_BASE
from simulator.timing import dma_cycles, matrix_lower_bound

MLP_WEIGHTS = "mlp_weights"  # constant-form key (on GEMM1's weight) of both weights packed per hidden panel
MLP_PARAMS = "mlp_params"  # constant-form key (on GEMM1's weight) of every row parameter, one block


@dataclass(frozen=True)
class MlpParts:
    """A group's nodes by role, each chain in graph order."""

    pre: tuple[Node, ...]  # whole-row chain producing GEMM1's input (may be empty)
    first: Node
    mid: tuple[Node, ...]  # elementwise chain from GEMM1's output to GEMM2's input (may be empty)
    second: Node
    post: tuple[Node, ...]  # whole-row chain after GEMM2 (may be empty)
    views: dict[str, str]  # the output of a Reshape keeping the last axis (no node of a chain) -> the value it shows

    def value(self, name: str) -> str:
        """The value a name stands for (a view's: the one it shows)."""
        return self.views.get(name, name)


def _without_views(graph: Graph, chain: Sequence[Node], views: dict[str, str]) -> tuple[Node, ...]:
    """The chain's nodes but its views (Reshapes keeping the last axis: the same rows in memory), which `views`
    records."""
    for node in chain:
        if is_row_view(graph, node):
            views[node.outputs[0]] = views.get(node.inputs[0], node.inputs[0])
    return tuple(node for node in chain if not is_row_view(graph, node))


def mlp_parts(graph: Graph, nodes: Sequence[Node]) -> MlpParts:
    """Split a group into its roles; CodegenError naming what does not fit the pattern."""
    heads = [i for i, n in enumerate(nodes) if n.op in EPILOGUE_HEADS]
    if len(heads) != 2:
        raise CodegenError(f"an MLP kernel has two matrix nodes, this group {len(heads)}")
    i, j = heads
    views: dict[str, str] = {}
    pre, mid, post = (_without_views(graph, c, views) for c in (nodes[:i], nodes[i + 1 : j], nodes[j + 1 :]))
    parts = MlpParts(pre, nodes[i], mid, nodes[j], post, views)
    for head in (parts.first, parts.second):
        if packable_weight(graph, head) is None:
            raise CodegenError(f"node {head.name!r}: an MLP kernel needs constant 2-D weights")
        if head.op == OpType.Gemm and any(head.attr(a, d) != d for a, d in GEMM_DEFAULTS.items()):
            raise CodegenError(f"node {head.name!r}: a Gemm with transposes or scaling is not an MLP layer")
    for node in (*parts.pre, *parts.mid, *parts.post):
        if node.op not in CHAIN_OPS:
            raise CodegenError(f"node {node.name!r} ({node.op.value}) has no vector-chain form")
    if any(n.op in ROWS for n in parts.mid):
        raise CodegenError("an MLP's activation chain runs on hidden panels: it cannot reduce whole hidden rows")
    feeds = parts.mid[-1].outputs[0] if parts.mid else parts.first.outputs[0]
    if parts.value(parts.second.inputs[0]) != feeds:
        raise CodegenError(f"node {parts.second.name!r} does not read the activation chain's output")
    if parts.pre and parts.value(parts.first.inputs[0]) != parts.pre[-1].outputs[0]:
        raise CodegenError(f"node {parts.first.name!r} does not read the prologue chain's output")
    if parts.post and parts.second.outputs[0] not in map(parts.value, parts.post[0].inputs):
        raise CodegenError(f"node {parts.post[0].name!r} does not read {parts.second.name!r}")
    d, h = graph.types[parts.first.inputs[1]].shape
    if graph.types[parts.second.inputs[1]].shape != (h, d):
        raise CodegenError(f"weights {d} x {h} and {graph.types[parts.second.inputs[1]].shape} are not an MLP's")
    inner = {
        parts.first.outputs[0],
        *(n.outputs[0] for n in parts.mid),
        *([parts.second.outputs[0]] * bool(parts.post)),
    }
    inner |= {v for v, shown in views.items() if shown in inner}
    if inner & set(graph.outputs):
        raise CodegenError(
            f"{sorted(inner & set(graph.outputs))[0]!r} is read outside the group: the hidden "
            "activation never leaves the kernel"
        )
    return parts


# --- constant forms -------------------------------------------------------------------------------------------


def _pad(n: int, n_arr: int) -> int:
    return -(-n // n_arr) * n_arr


def pack_weights(w1: np.ndarray, w2: np.ndarray, n_arr: int, rows: np.ndarray) -> np.ndarray:
    """W1 (D x H), W2 (H x D) and the activation chain's row operands (R x H float32) as one block per hidden panel
    j: W1[:, j-th panel] (D x n_arr), then W2's rows of that panel as D / n_arr array tiles (n_arr x n_arr each,
    output-panel order), then the panel's slice of each row operand (n_arr float32 each: read by the activation
    chain from the panel's own buffer slot, no bank shared with the GEMMs of other panels). Hidden and output
    columns are zero-padded to the array size, so any run of consecutive panels is one contiguous DMA."""
    d, h = w1.shape
    hp, dp = _pad(h, n_arr), _pad(d, n_arr)
    b = np.zeros((hp, dp), w2.dtype)
    b[:h, :d] = w2
    first = pack_panels(w1, n_arr).reshape(hp // n_arr, -1)
    second = b.reshape(hp // n_arr, n_arr, dp // n_arr, n_arr).transpose(0, 2, 1, 3).reshape(hp // n_arr, -1)
    r = np.zeros((len(rows), hp), np.float32)
    r[:, :h] = rows
    third = r.reshape(len(rows), hp // n_arr, n_arr).transpose(1, 0, 2).reshape(hp // n_arr, -1)
    parts = [np.ascontiguousarray(x).view(np.uint8) for x in (first, second, third)]
    return np.ascontiguousarray(np.concatenate(parts, axis=1).reshape(-1)).view(w1.dtype)


def mid_rows(cx: LowerContext, p: MlpParts) -> list[str]:
    """The activation chain's row operands (constants, one value per hidden column), packed with the weights."""
    found = list(dict.fromkeys(o.value for o in (operands(cx, p.mid) if p.mid else {}).values() if o.kind == "row"))
    for value in found:
        if not cx.graph.is_constant(value):
            raise CodegenError(f"{value!r}: an MLP kernel's row operands must be constants")
    return found


def _tables(cx: LowerContext, p: MlpParts) -> tuple[dict, dict, dict]:
    return tuple(operands(cx, chain) if chain else {} for chain in (p.pre, p.mid, p.post))  # type: ignore[return-value]


def param_layout(cx: LowerContext, p: MlpParts) -> dict[str, tuple[int, int]]:
    """Byte offset and element count (padded to the array size) in the packed parameters of every row operand of
    the prologue and epilogue chains (by value) and each matrix node's own bias (by `bias_form` key)."""
    n_arr = cx.config.array_size
    d, h = cx.graph.types[p.first.inputs[1]].shape
    layout: dict[str, tuple[int, int]] = {}
    at = 0
    tables = _tables(cx, p)
    for table in (tables[0], tables[2]):
        for o in table.values():
            if o.kind == "row" and o.value not in layout:
                if not cx.graph.is_constant(o.value):
                    raise CodegenError(f"{o.value!r}: an MLP kernel's row operands must be constants")
                layout[o.value] = (at, _pad(d, n_arr))
                at += 4 * _pad(d, n_arr)
    for head, width in ((p.first, h), (p.second, d)):
        if own_bias(head) is not None:
            layout[bias_form(head.name)] = (at, _pad(width, n_arr))
            at += 4 * _pad(width, n_arr)
    return layout


def params_bytes(layout: dict[str, tuple[int, int]]) -> int:
    """Bytes of the packed parameters of `param_layout` (one word when there are none)."""
    return max((at + 4 * n for at, n in layout.values()), default=4)


def pack_params(cx: LowerContext, p: MlpParts, forms: dict) -> np.ndarray:
    """The parameters of `param_layout` as one byte block: rows as float32, own biases as the drain adds them
    (int8: int32 accumulator units)."""
    layout = param_layout(cx, p)
    out = np.zeros(params_bytes(layout), np.uint8)
    for key, (at, n) in layout.items():
        if key.startswith("bias@"):
            head = p.first if key == bias_form(p.first.name) else p.second
            value = own_bias(head)
            data = forms[const_key(value, key)] if cx.int8 else np.asarray(cx.graph.constants[value], np.float32)
        else:
            data = np.asarray(cx.graph.constants[key], np.float32)
        flat = np.asarray(data).reshape(-1)
        if flat.size > n:
            raise CodegenError(f"{key!r}: {flat.size} values where a row holds {n}")
        row = np.zeros(n, flat.dtype)
        row[: flat.size] = flat
        out[at : at + 4 * n] = row.view(np.uint8)
    return out


def mlp_forms(cx: LowerContext, forms: dict) -> dict[str, np.ndarray]:
    """The kernel's two constant blocks: both weights (and the activation chain's rows) packed per hidden panel,
    and the other row parameters."""
    p = mlp_parts(cx.graph, cx.graph.nodes)
    form = CONST_I8 if cx.int8 else CONST_F32
    w1, w2 = (np.asarray(forms[const_key(h.inputs[1], form)]) for h in (p.first, p.second))
    key = p.first.inputs[1]
    h = w1.shape[1]
    rows = [np.asarray(cx.graph.constants[v], np.float32).reshape(-1) for v in mid_rows(cx, p)]
    for value, row in zip(mid_rows(cx, p), rows, strict=True):
        if row.size != h:
            raise CodegenError(f"{value!r}: {row.size} values where a hidden row holds {h}")
    return {
        const_key(key, MLP_WEIGHTS): pack_weights(w1, w2, cx.config.array_size, np.asarray(rows).reshape(len(rows), h)),
        const_key(key, MLP_PARAMS): pack_params(cx, p, forms),
    }


# --- the program ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Shape:
    rows: int  # all rows (tokens, batches flattened)
    d: int
    h: int
    es_a: int  # bytes per element of an array operand (1 int8, 4 fp32)
    es_in: int  # GEMM1's input as it sits in DRAM (no prologue)


def _spare(cx: LowerContext) -> TileArena:
    """The scratchpad and accumulator banks outside the buffer slots (what every step of a block shares)."""
    cfg = cx.config
    arena = TileArena.spare(cfg)
    acc_used = DEPTH * slot(cfg.acc_bytes, cfg.acc_banks, 0).size
    if arena is None or acc_used >= cfg.acc_bytes:
        raise CodegenError("an MLP kernel needs a scratchpad and an accumulator bank outside the buffer slots")
    arena.acc = Slot(LOCAL_ACC_BASE + acc_used, cfg.acc_bytes - acc_used)
    return arena


class _Kernel:
    """The parts, views and decisions of one MLP program (built once per group, then asked for steps)."""

    def __init__(self, cx: LowerContext, nodes: Sequence[Node], panels: int, tile_rows: int) -> None:
        self.cx, cfg = cx, cx.config
        self.p = p = mlp_parts(cx.graph, nodes)
        self.pre_t, self.mid_t, self.post_t = _tables(cx, p)
        self.n = cfg.array_size
        d, h = cx.graph.types[p.first.inputs[1]].shape
        q1, q2 = (cx.matrix(x) if cx.int8 else None for x in (p.first, p.second))
        self.a1 = matrix_operand(cx, p.first, p.first.inputs[0], q1.input_scale if q1 else None)
        self.a2 = matrix_operand(cx, p.second, p.second.inputs[0], q2.input_scale if q2 else None)
        rows = math.prod(self.a1.view.shape[:-1])
        self.dt = DType.i8 if cx.int8 else DType.f32  # the array operands', the weights' and GEMM2's drain's
        self.s = _Shape(rows, d, h, self.dt.size, self.a1.view.dtype.size)
        self.mids = mid_rows(cx, p)
        self.rows_at = d * self.n + self.n * _pad(d, self.n)  # elements before a panel's rows in its block
        self.chunk = self.rows_at + len(self.mids) * self.n * 4 // self.dt.size  # elements of one hidden panel
        self.rq = (requant(cx, p.first), requant(cx, p.second))
        self.layout = param_layout(cx, p)
        self.params_bytes = params_bytes(self.layout)
        key = p.first.inputs[1]
        self.all_panels = _pad(h, self.n) // self.n
        self.weights = dense(cx.addresses[const_key(key, MLP_WEIGHTS)], (self.chunk * self.all_panels,), self.dt)
        self.params = dense(cx.addresses[const_key(key, MLP_PARAMS)], (self.params_bytes,), DType.i8)
        self.flat = {v: self._rows_view(v) for v in self._external_tiles()}
        self.kept = [v for n in (*p.pre[:-1], *p.post[:-1]) for v in n.outputs if v in cx.graph.outputs]
        self.out_value = p.post[-1].outputs[0] if p.post else p.second.outputs[0]
        self.needed = self._residuals()
        limit = min(rows, MAX_ROWS, cfg.vreg_elems // d if p.pre or p.post else MAX_ROWS)
        if tile_rows:
            limit = min(limit, tile_rows)
        want = min(panels or self.all_panels, self.all_panels)
        self.tile = largest_fitting(limit, lambda t: self._fits(t, 1))
        if self.tile == 0:
            raise CodegenError(f"an MLP of D={d}, hidden {h} does not fit the buffer slots and spare banks")
        self.panels = largest_fitting(want, lambda g: self._fits(self.tile, g))
        self.alloc = self._allocate(self.tile, self.panels)  # every step's, before its slot's shift

    # - views and operands

    def _rows_view(self, value: str) -> View:
        view = self.cx.view(value).reshaped((self.s.rows, self.cx.graph.types[value].shape[-1]))
        if view is None:
            raise CodegenError(f"{value!r} must flatten to rows x features")
        return view

    def _external_tiles(self) -> list[str]:
        """DRAM tensors the chains read (GEMM1's input when there is no prologue), first use first."""
        p, produced = self.p, {v for n in self.cx.graph.nodes for v in n.outputs}
        values = [] if p.pre else [p.first.inputs[0]]
        for table in (self.pre_t, self.post_t):
            values += [o.value for o in table.values() if o.kind == "tile" and o.value not in produced]
        for o in self.mid_t.values():
            if o.kind == "tile" and p.value(o.value) != p.first.outputs[0]:
                raise CodegenError(f"the MLP's activation chain reads {o.value!r}: only GEMM1's output")
        for table, width in ((self.pre_t, self.s.d), (self.post_t, self.s.d)):
            for o in table.values():
                if o.kind == "tile" and self.cx.graph.types[o.value].shape[-1] != width:
                    raise CodegenError(f"{o.value!r} is not a rows x {width} tensor")
        return list(dict.fromkeys(values))

    def _residuals(self) -> list[str]:
        """Values of the prologue (its inputs, GEMM1's input) the epilogue reads: kept in the spare bank."""
        p = self.p
        early = {*(n.outputs[0] for n in p.pre), *(v for v in self.flat if self._in_pre(v))}
        tiles = [p.value(o.value) for o in self.post_t.values() if o.kind == "tile"]
        return list(dict.fromkeys(v for v in tiles if v in early))

    def _named(self, table: dict, located: dict[str, int]) -> dict[str, int]:
        """The local address of every value a chain reads, under the name it reads it by (a view: the address of
        the value it shows)."""
        return {o.value: located[self.p.value(o.value)] for o in table.values() if self.p.value(o.value) in located}

    # - memory

    def _allocate(self, tile: int, panels: int) -> dict:
        """Every tile of every step kind, as addresses (raises MemoryPlanError when something does not fit)."""
        s, n, cx = self.s, self.n, self.cx
        spare = _spare(cx)
        out: dict = {"params": spare.tile(self.params_bytes)}
        whole = spare.tile(tile * s.d * s.es_a)  # A as dense rows, each k-slice at its offset (`_gemm1`)
        out["a1"] = [(k0, kb, whole + k0 * s.es_a) for k0, kb in k_slices(s.d, n)]
        out["keep"] = {v: spare.tile(tile * s.d * 4) for v in self.needed}
        out["acc2"] = [spare.acc_tile(tile * n * 4) for _ in range(_pad(s.d, n) // n)]
        pre = TileArena(cx.config, 0)
        pre_tiles = {v: pre.tile(tile * s.d * self.flat[v].dtype.size) for v in self.flat if self._in_pre(v)}
        pre_out = pre.tile(tile * s.d * 4) if self.p.pre else None
        pre_kept = {v: pre.tile(tile * s.d * 4) for v in self.kept if v in {n.outputs[0] for n in self.p.pre}}
        out["pre"] = (pre_tiles, pre_out, pre_kept)
        hid = TileArena(cx.config, 0)
        w = hid.tile(panels * self.chunk * s.es_a)
        panel_tiles = [(hid.tile(tile * n * s.es_a), hid.tile(tile * n * s.es_a)) for _ in range(panels)]
        out["hid"] = (w, panel_tiles, [hid.acc_tile(tile * n * 4) for _ in range(panels)])
        post = hid  # the epilogue runs in the last hidden step, after its tiles
        whole = post.tile(tile * s.d * s.es_a)  # GEMM2's output rows, each whole panel drained into its columns
        tail = post.tile(tile * n * s.es_a) if s.d % n else None  # a partial last panel, drained dense (`_epilogue`)
        post_tiles = {v: post.tile(tile * s.d * self.flat[v].dtype.size) for v in self.flat if not self._in_pre(v)}
        post_out = post.tile(tile * s.d * 4) if self.p.post else None
        post_kept = {v: post.tile(tile * s.d * 4) for v in self.kept if v not in pre_kept}
        out["post"] = (whole, tail, post_tiles, post_out, post_kept)
        return out

    def _in_pre(self, value: str) -> bool:
        return not self.p.pre and value == self.p.first.inputs[0] or any(o.value == value for o in self.pre_t.values())

    def _fits(self, tile: int, panels: int) -> bool:
        try:
            self._allocate(tile, panels)
        except MemoryPlanError:
            return False
        return True

    # - steps

    def steps(self) -> list[Step]:
        """Per block: the prologue, then one step per hidden group. Where the matrix work of a group outlasts its
        weight DMA (`_matrix_bound`), GEMM2 of group g runs in step g + 1, after GEMM1 of group g + 1, so the
        vector unit's activation chain of group g overlaps the matrix unit (software pipelining), and a final
        step runs the last group's GEMM2 and the epilogue; otherwise (the matrix waits for the weights anyway)
        each group's step runs its GEMM1, activation chain and GEMM2 in turn, the last one the epilogue too."""
        lag = self._matrix_bound(self.panels, self.tile)
        kinds: list[tuple] = []
        groups = range(0, self.all_panels, self.panels)
        for i0 in range(0, self.s.rows, self.tile):
            rows = min(self.tile, self.s.rows - i0)
            held: dict[str, Registers] = {}  # the block's epilogue operands preloaded into vector registers
            kinds.append(("prologue", i0, rows, i0 == 0))
            kinds += [("hidden", i0, rows, j, g, lag, not lag and j == groups[-1], held) for g, j in enumerate(groups)]
            kinds += [("final", i0, rows, groups[-1], held)] if lag else []
        # a step holding a lagged GEMM2 reads the previous step's slot: the step two on, which reuses that slot
        # (DEPTH = 3), waits for it with an `mx -> ld` token (the pipeline's credit covers only the step three back)
        lags = [k[0] == "final" or (k[0] == "hidden" and k[5] and k[4] > 0) for k in kinds]
        waits = [s >= 2 and lags[s - 2] for s in range(len(kinds))]
        out: list[Step] = []
        for index, kind in enumerate(kinds):
            push = index + 2 < len(kinds) and waits[index + 2]
            if kind[0] == "prologue":
                step = self._prologue(index, *kind[1:])
            elif kind[0] == "hidden":
                step = self._hidden(index, *kind[1:-1], push, kind[-1])
            else:
                step = self._final(index, *kind[1:-1], push, kind[-1])
            out.append(_waiting(step, waits[index]) if waits[index] or kind[0] == "final" else step)
        return out

    def _local(self, index: int) -> dict:
        """The allocation with this step's slot: every slot address shifted by its base."""
        base = TileArena(self.cx.config, index, self.cx.rotation)
        zero = TileArena(self.cx.config, 0)
        ds, da = base.spad.base - zero.spad.base, base.acc.base - zero.acc.base
        return {"ds": ds, "da": da, **self.alloc}

    def _prologue(self, index: int, i0: int, rows: int, first_block: bool) -> Step:
        cx, s, p, a = self.cx, self.s, self.p, self._local(index)
        ds = a["ds"]
        tiles, pre_out, kept = a["pre"]
        tiles = {v: t + ds for v, t in tiles.items()}
        kept = {v: t + ds for v, t in kept.items()}
        pre_out = None if pre_out is None else pre_out + ds
        loads = [(self.params, a["params"])] if first_block else []
        loads += [(self.flat[v].slice(0, i0, rows), t) for v, t in tiles.items()]
        src = pre_out if pre_out is not None else tiles[p.first.inputs[0]]
        src_dt = DType.f32 if p.pre else self.flat[p.first.inputs[0]].dtype
        inv = None if self.a1.quantize_scale is None else 1.0 / self.a1.quantize_scale
        last_pre = p.pre[-1].outputs[0] if p.pre else None
        whole = a["a1"][0][2]  # GEMM1's A, rows x D: the matmuls read its k-slices in place (`_gemm1`)
        # after a prologue read by nothing else, the chain writes A itself (int8: quantized); otherwise A is one
        # pass over the rows (a copy, or the quantization)
        direct = last_pre not in (None, *cx.graph.outputs, *self.needed)
        cuts = [] if direct else [(whole, src, rows * s.d, inv, src_dt)]
        # a prologue intermediate the epilogue reads goes straight to the spare bank, unless it is stored too
        stored = kept | {v: a["keep"][v] for v in self.needed if v not in kept and v in self._inner_pre()}
        local = tiles | kept | ({p.pre[-1].outputs[0]: pre_out} if p.pre else {})
        copies = [(a["keep"][v], local[v]) for v in self.needed if stored.get(v) != a["keep"][v]]
        for v in self.needed:
            if v in tiles and self.flat[v].dtype is not DType.f32:
                raise CodegenError(f"{v!r}: the epilogue reads an int8 tensor as its residual (kept as float32 only)")
        rows_at = {v: a["params"] + self.layout[v][0] for v in self._row_values(self.pre_t)}

        def vector(em: Emitter) -> None:
            if p.pre:
                addr = {v: t for v, t in tiles.items() if any(o.value == v for o in self.pre_t.values())} | rows_at
                out, q = (whole, inv) if direct else (pre_out, None)
                emit_chain(cx, em, p.pre, self.pre_t, addr, out, rows * s.d, s.d, stored=stored, quantize=q)
            _quantizer(cuts)(em)
            for dst, at in copies:
                em.b.v_copy(*em.regs(dst, at), rows * s.d, "f32")

        stores = [(t, self._rows_view(v).slice(0, i0, rows)) for v, t in kept.items()]
        if p.pre and p.pre[-1].outputs[0] in cx.graph.outputs:
            stores.append((pre_out, self._rows_view(p.pre[-1].outputs[0]).slice(0, i0, rows)))
        return Step(loads, [(Unit.vector, vector)], stores)

    def _inner_pre(self) -> set[str]:
        return {n.outputs[0] for n in self.p.pre[:-1]}

    def _row_values(self, table: dict) -> list[str]:
        return list(dict.fromkeys(o.value for o in table.values() if o.kind == "row"))

    def _hidden(
        self, index: int, i0: int, rows: int, j: int, g: int, lag: bool, last: bool, push: bool, held: dict
    ) -> Step:
        """Hidden panels j.. of the block (group g), one matrix segment: GEMM1 of the group and its drains, the
        group's activation chain on the vector unit, and a GEMM2. `lag` (software pipelined, `steps`): the GEMM2
        is the previous group's, run while the vector unit does this group's chain (their instructions
        interleaved, so the in-order issue feeds both queues; no bank is shared: the chain works in this step's
        slot, GEMM2 reads the previous step's), and this group's drained and activated panels and weights stay
        in this step's slot until the next step's GEMM2 has read them; `push`: this step's end is signalled to
        the load of the step two on. Otherwise the GEMM2 is this group's, after its chain, and the `last` step
        also runs the epilogue. Tokens `mx -> vx` (drains done) and `vx -> mx` (chain done) order the units.
        The block's last group's chain is followed by the epilogue's preloads into `held` (`_preload`)."""
        a = self._local(index)
        ds, da = a["ds"], a["da"]
        w, panel_tiles, accs = a["hid"]
        count = min(self.panels, self.all_panels - j)
        loads = [(self.weights.slice(0, j * self.chunk, count * self.chunk), w + ds)]
        tiles = [(d + ds, q + ds) for d, q in panel_tiles[:count]]
        accs = [acc + da for acc in accs[:count]]
        # software pipelined over several groups, the first group's chain runs beside the second group's GEMM1
        defer = lag and self.panels < self.all_panels
        before = []
        if defer and g == 1:
            prev = self._local(index - 1)
            pw, ptiles, _ = prev["hid"]
            before = self._activations(
                pw + prev["ds"], [(d + prev["ds"], q + prev["ds"]) for d, q in ptiles[: self.panels]], rows
            )
        gemm1 = self._gemm1(w + ds, tiles, accs, rows, j, before)
        act = [] if defer and g == 0 else self._activations(w + ds, tiles, rows)
        if act and j + self.panels >= self.all_panels:
            act[-1] = _then(act[-1], self._preload(held, rows))
        if lag:
            gemm2 = self._gemm2(index - 1, j - self.panels, rows, act) if g > 0 else None
        else:
            gemm2 = self._gemm2(index, j, rows, [])

        def matrix(em: Emitter) -> None:
            gemm1(em)
            if self.p.mid:
                em.push(Unit.matrix, Unit.vector)
            if not lag or gemm2 is None:
                for emit in act:
                    emit(em)
            if gemm2 is not None:
                gemm2(em)
            if push:
                em.push(Unit.matrix, Unit.load)

        compute = [(Unit.vector, _nothing)] if g == 0 else []  # after the prologue's cut (vector) of this block
        compute.append((Unit.matrix, matrix))
        if not last:
            return Step(loads, compute, [])
        more, drain, vector, stores = self._epilogue(a, i0, rows, held)
        return Step(loads + more, [*compute, (Unit.matrix, drain), (Unit.vector, vector)], stores)

    def _matrix_bound(self, count: int, rows: int) -> bool:
        """Whether a step of `count` hidden panels computes longer (GEMM1's and GEMM2's tiles) than its weight DMA
        takes (`simulator.timing`)."""
        cfg = self.cx.config
        tiles = count * (len(self.alloc["a1"]) + len(self.alloc["acc2"]))
        nbytes = count * self.chunk * self.s.es_a
        return matrix_lower_bound(cfg, tiles, tiles * rows) > dma_cycles(cfg, 1, nbytes, nbytes)

    def _activations(self, w: int, tiles: list, rows: int) -> list[Callable[[Emitter], None]]:
        """The activation chain of a group's hidden panels (weights block at `w`; one emitter per panel; none
        without a chain), after the drains' token (`mx -> vx`, popped by the first) and followed by its own
        (`vx -> mx`, pushed by the last)."""
        if not self.p.mid:
            return []
        at = [w + (c * self.chunk + self.rows_at) * self.s.es_a for c in range(len(tiles))]
        panels = [self._activation(t, rows, a) for t, a in zip(tiles, at, strict=True)]

        def act(c: int) -> Callable[[Emitter], None]:
            def emit(em: Emitter) -> None:
                if c == 0:
                    em.pop(Unit.matrix, Unit.vector)
                panels[c](em)
                if c == len(panels) - 1:
                    em.push(Unit.vector, Unit.matrix)

            return emit

        return [act(c) for c in range(len(panels))]

    def _gemm2(self, index: int, j: int, rows: int, between: list) -> Callable[[Emitter], None]:
        """GEMM2 of the group of step `index` (hidden panels j..), reading that step's slot after its activation
        chain's token; the `between` emitters (vector work) spread over its tiles."""
        s, n, a = self.s, self.n, self._local(index)
        w, panel_tiles, _ = a["hid"]
        w += a["ds"]
        count = min(self.panels, self.all_panels - j)
        tiles = [(d + a["ds"], q + a["ds"]) for d, q in panel_tiles[:count]]
        chunk, dt, mid = self.chunk, self.dt, bool(self.p.mid)
        order = [(o, c) for o in range(len(a["acc2"])) for c in range(count)]
        after = _spread(len(order), len(between))

        def gemm2(em: Emitter) -> None:
            if mid:
                em.pop(Unit.vector, Unit.matrix)
            for t, (o, c) in enumerate(order):
                drained, q = tiles[c]
                em.b.mx_preload(em.reg(w + (c * chunk + s.d * n + o * n * n) * s.es_a), n, n, dt.name)
                (em.b.mx_mm if j == 0 and c == 0 else em.b.mx_mma)(*em.regs(a["acc2"][o], q if mid else drained), rows)
                for i in after.get(t, []):
                    between[i](em)

        return gemm2

    def _gemm1(self, w: int, tiles: list, accs: list, rows: int, j: int, between: list) -> Callable[[Emitter], None]:
        """GEMM1 of hidden panels j.. and its drains; the `between` emitters (vector work) spread over its tiles.
        A's k-slices are read in place from its dense rows (`mx.mm.s`, row stride D elements) when D > N."""
        s, n, a, chunk, dt = self.s, self.n, self.alloc, self.chunk, self.dt
        stride = (s.d * s.es_a,) if len(a["a1"]) > 1 else ()
        bias1 = self.layout.get(bias_form(self.p.first.name))
        order = [(index_k, c) for index_k in range(len(a["a1"])) for c in range(len(accs))]
        after = _spread(len(order), len(between))

        def gemm1(em: Emitter) -> None:
            mm, mma = (em.b.mx_mm_s, em.b.mx_mma_s) if stride else (em.b.mx_mm, em.b.mx_mma)
            for t, (index_k, c) in enumerate(order):
                k0, kb, a_addr = a["a1"][index_k]
                em.b.mx_preload(em.reg(w + (c * chunk + k0 * n) * s.es_a), kb, n, dt.name)
                (mm if index_k == 0 else mma)(*em.regs(accs[c], a_addr, *stride), rows)
                for i in after.get(t, []):
                    between[i](em)
            for c, (acc, (drained, _)) in enumerate(zip(accs, tiles, strict=True)):
                bias = 0 if bias1 is None else a["params"] + bias1[0] + (j + c) * n * 4
                self._drain(em, drained, acc, rows, n, bias, self.rq[0])

        return gemm1

    def _activation(self, tile: tuple[int, int], rows: int, at: int) -> Callable[[Emitter], None]:
        """The activation chain on one drained hidden panel (int8: quantized at GEMM2's input scale), its row
        operands at `at` (the panel's weights block)."""
        n, p, cx = self.n, self.p, self.cx
        inv = None if self.a2.quantize_scale is None else 1.0 / self.a2.quantize_scale
        drained, q = tile

        def activation(em: Emitter) -> None:
            located = {p.first.outputs[0]: drained} | {v: at + r * n * 4 for r, v in enumerate(self.mids)}
            emit_chain(cx, em, p.mid, self.mid_t, self._named(self.mid_t, located), q, rows * n, n, quantize=inv)

        return activation

    def _final(self, index: int, i0: int, rows: int, j: int, push: bool, held: dict) -> Step:
        """The last group's GEMM2 (from the previous step's slot), then the epilogue; `push` as `_hidden`."""
        gemm2 = self._gemm2(index - 1, j, rows, [])
        loads, drain, vector, stores = self._epilogue(self._local(index), i0, rows, held)

        def matrix(em: Emitter) -> None:
            gemm2(em)
            if push:
                em.push(Unit.matrix, Unit.load)
            drain(em)

        return Step(loads, [(Unit.matrix, matrix), (Unit.vector, vector)], stores)

    def _drain(self, em: Emitter, out: int, acc: int, rows: int, cols: int, bias: int, rq, stride: int = 0) -> None:
        """Drain rows x cols of `acc` to `out`, dense or (`stride` bytes: `mx.drain.s`) rows that far apart."""
        flags = "bias" if bias else "none"
        mult, shift = rq if rq is not None else (f32_bits(1.0), 0)
        em.b.ep_cfg(*em.regs(bias, 0, mult), shift, Activation.none, flags, "i8" if rq is not None else "f32")
        if stride:
            em.b.mx_drain_s(*em.regs(out, acc, stride), rows, cols)
        else:
            em.b.mx_drain(*em.regs(out, acc), rows, cols)

    def _epilogue(self, a: dict, i0: int, rows: int, held: dict) -> tuple[list, Callable, Callable, list]:
        """GEMM2's drains (each panel into its columns of the whole rows) and the epilogue chain: (loads, the matrix
        unit's and the vector unit's emitters, stores). The vector part always exists: the next block's prologue
        (vector) then writes the spare bank after this block's last matrix read of it. Operands `held` in vector
        registers (`_preload`) are not loaded again."""
        cx, s, p, n = self.cx, self.s, self.p, self.n
        ds = a["ds"]
        whole, tail, tiles, post_out, kept = a["post"]
        whole += ds
        tail = None if tail is None else tail + ds
        tiles = {v: t + ds for v, t in tiles.items()}
        kept = {v: t + ds for v, t in kept.items()}
        loads = [(self.flat[v].slice(0, i0, rows), t) for v, t in tiles.items()]
        bias2 = self.layout.get(bias_form(p.second.name))
        size, dt = self.dt.size, self.dt
        stride = s.d * size if s.d > n else 0
        # a partial last panel's accumulator rows are N wide: drained whole into `tail`, its columns copied per row
        partial = len(a["acc2"]) - 1 if tail is not None else None

        def drain(em: Emitter) -> None:
            for o, acc in enumerate(a["acc2"]):
                bias = 0 if bias2 is None else a["params"] + bias2[0] + o * n * 4
                if o == partial:
                    self._drain(em, tail, acc, rows, n, bias, self.rq[1])
                else:
                    self._drain(em, whole + o * n * size, acc, rows, n, bias, self.rq[1], stride)

        post_rows = {v: a["params"] + self.layout[v][0] for v in self._row_values(self.post_t)}
        located = {p.second.outputs[0]: whole} | a["keep"] | tiles | post_rows
        views = {v: self._rows_view(v).slice(0, i0, rows) for v in kept}
        split = self._early_stores(kept, located)
        early = [v for v in kept if split and v in {x.outputs[0] for x in split[0][0]}]

        def vector(em: Emitter) -> None:
            if partial is not None:
                at = whole + partial * n * size
                for r in range(rows):
                    em.b.v_copy(*em.regs(at + r * s.d * size, tail + r * n * size), s.d - partial * n, dt.name)
            if not p.post:
                return
            count = rows * s.d
            regs = held.get("regs") or Registers()
            if split is None:
                addr = {v: t for v, t in self._named(self.post_t, located).items() if v not in regs.of}
                emit_chain(cx, em, p.post, self.post_t, addr, post_out + ds, count, s.d, regs=regs, stored=kept)
                return
            (first, t1), (second, t2) = split
            last = first[-1].outputs[0]
            stored = {v: t for v, t in kept.items() if v != last}
            addr = {v: t for v, t in self._named(t1, located).items() if v not in regs.of}
            emit_chain(cx, em, first, t1, addr, kept[last], count, s.d, regs=regs, stored=stored)
            em.push(Unit.vector, Unit.store)  # the stored values leave while the rest of the chain runs
            em.pop(Unit.vector, Unit.store)
            for v in early:
                em.dma_store(kept[v], views[v])
            rest = {v: t for v, t in kept.items() if v not in early}
            emit_chain(cx, em, second, t2, self._named(t2, located), post_out + ds, count, s.d, regs=regs, stored=rest)

        final = post_out + ds if p.post else whole
        stores = [(final, self._rows_view(self.out_value).slice(0, i0, rows))]
        stores += [(t, views[v]) for v, t in kept.items() if v not in early]
        return loads, drain, vector, stores

    def _preload(self, held: dict, rows: int) -> Callable[[Emitter], None]:
        """The epilogue's operands on chip before GEMM2 ends (kept residuals, parameter rows) that the part of its
        chain before its first store reads (`_early_stores`), loaded into vector registers after the block's last
        activation chain: the vector unit idles while the matrix unit runs the last GEMM2, and the epilogue then
        starts on the drained rows at once (no more registers than the chain's own loads of them at its start)."""
        p, count = self.p, rows * self.s.d
        rows_at = {v: self.alloc["params"] + self.layout[v][0] for v in self._row_values(self.post_t)}
        ready = self.alloc["keep"] | rows_at
        # (the epilogue's cut: its located values and kept ones, at any address)
        loaded = {v: 0 for v in self.flat if not self._in_pre(v)}
        located = {p.second.outputs[0]: 0} | ready | loaded
        post = {n.outputs[0] for n in p.post}
        split = self._early_stores({v: 0 for v in self.kept if v in post}, located)
        table = split[0][1] if split else self.post_t
        named = {v: ready[p.value(v)] for v in self._named(table, located) if p.value(v) in ready}
        tiles = {v for v in named if table_kind(table, v) == "tile"}

        def emit(em: Emitter) -> None:
            regs = held["regs"] = Registers()
            for v in named:
                load_register(self.cx, em, regs.new(v), v, named[v], count if v in tiles else self.s.d)

        return emit

    def _early_stores(self, kept: dict[str, int], located: dict[str, int]) -> tuple | None:
        """The epilogue chain cut after its last stored value that is not its result, as ((nodes, table) before,
        (nodes, table) after), when the part after reads nothing but that value (kept in its register) and
        operands it can load; None when there is no such cut (the chain then runs whole)."""
        post = self.p.post
        cuts = [i for i, node in enumerate(post[:-1]) if node.outputs[0] in kept]
        if not cuts:
            return None
        first, second = post[: cuts[-1] + 1], post[cuts[-1] + 1 :]
        try:
            t2 = operands(self.cx, second, frozenset({first[-1].outputs[0]}))
        except CodegenError:
            return None
        if any(self.p.value(o.value) not in located for o in t2.values() if o.kind in ("tile", "row")):
            return None
        return (first, operands(self.cx, first)), (second, t2)


def _spread(tiles: int, works: int) -> dict[int, list[int]]:
    """After which of `tiles` matrix tiles each of `works` vector emitters goes: the first after the first tile
    (the vector unit starts at once), the rest evenly, so neither queue runs dry while the other fills."""
    out: dict[int, list[int]] = {}
    for i in range(works):
        out.setdefault(min(tiles - 1, (i * tiles) // works), []).append(i)
    return out


def _then(first: Callable[[Emitter], None], then: Callable[[Emitter], None]) -> Callable[[Emitter], None]:
    def emit(em: Emitter) -> None:
        first(em)
        then(em)

    return emit


def _waiting(step: Step, wait: bool) -> Step:
    """The step with its loads as a load segment of its own that first pops (`wait`) the `mx -> ld` token of the
    step two back (`_Kernel.steps`); a step without loads gets one too: every step then starts with the load
    unit, so the pipeline's credits never share a token pair with the segments' hand-overs."""
    loads = step.loads

    def emit(em: Emitter) -> None:
        if wait:
            em.pop(Unit.matrix, Unit.load)
        for view, at in loads:
            em.dma_load(view, at)

    return Step([], [(Unit.load, emit), *step.compute], step.stores)


def mlp_steps(cx: LowerContext, nodes: Sequence[Node], panels: int = 0, tile_rows: int = 0) -> list[Step]:
    """The group's program (see the module docstring): `panels` hidden panels per step (0: as many as fit),
    `tile_rows` rows per block (0: as many as fit)."""
    return _Kernel(cx, nodes, panels, tile_rows).steps()
