"""A whole plan as ONE accelerator program: a scalar-core driver runs every kernel in plan order.

Host-dispatched execution (`execute.run_kernel` per group) launches each kernel on its own and pays
`MachineConfig.launch_cycles` per launch; every kernel also ends in a fence, so the next kernel's first loads
start only when it has finished. Here the plan is linked into one binary:

- one DRAM image for the whole graph (`plan_dram`, whole program: every value at its own address, so a kernel's
  stores never overwrite bytes a kernel still in flight reads), with the constants every kernel variant reads;
- the scalar core drives the kernels in plan order: the blocks are laid out in that order, so a call is a
  fall-through (no jump: every register is the generators' scratch, none could hold a return address); only an
  on-chip dispatch jumps (through its table to the zero-skip variant, or past it after the dense one);
- per-kernel counters as in any program: each kernel is its own `.kernel` block (`RunResult.kernel_counters`),
  plus a `program_io` block (the final `halt`) declaring the graph's inputs, outputs and views (so every value
  can be read back);
- kernel boundaries ordered by tokens, not by a fence (`pipelined.join_phases`: `st -> ld` tokens after the
  previous kernel's last stores; the next kernel's loads that read no byte written since the last fence, into
  local slots the previous kernel's last steps do not use, are issued while it still computes; the next kernel
  is generated in the buffer slots that follow the previous one's last step, and a kernel after a fence exactly
  as it runs alone, so a fenced boundary costs what the host path's does). The previous
  kernel's last phase and the next one's first are rewritten; a boundary the join refuses, one next to a
  zero-tile test (`bz.tile` reads local memory at issue) or after a kernel that was itself joined at its start
  within a single phase keeps the fence (joining both ends is race-free too, but its rewritten first steps no
  longer describe their tiles, so the next kernel must wait for all of it: measured slower on every bundled
  encoder, e.g. encoder_pre_d64 int8 17552 -> 17659 cycles). Every joined boundary's tokens are all popped by
  the next kernel's first steps, so the load queue (in order) holds any later load behind every earlier
  kernel's stores;
- on-chip dispatch: for a group with dense and zero-skip variants the program counts the live operand's all-zero
  N x N tiles on chip (the tiles of `profile.zero_tile_fraction`) and jumps through a `dispatch` table to the
  variant: the zero-skip one from `threshold` zero tiles up (the cost model's break-even at the live fraction),
  else the dense one. The choice is made per call by the accelerator, without the host. The count comes from the
  store path where a kernel of the program writes the operand (`_count`: its stores of the operand are
  `dma.stz`, which add the stored block's zero tiles to the zero-tile counter, cleared by `zc.clr` before it;
  the dispatcher is `zc.rd`, `slti`, `dispatch`); else (a graph input, stores not on the tile grid) the operand
  is measured (`_measure`: one DMA into the scratchpad, then `bnz.tile` over each tile's rows).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from assembler.builder import ProgramBuilder
from assembler.objfile import ObjectFile
from fusion.cost.interface import CostModel
from fusion.engine.context import ModelContext
from fusion.engine.errors import CodegenError
from fusion.engine.features import kernel_features
from fusion.engine.kernel import Kernel, build_kernel, dram_forms, group_phases, identifier
from fusion.engine.pipelined import join_phases
from fusion.engine.plan import Group, GroupChoice
from fusion.engine.profile import SPARSE_TILE_FRACTION
from fusion.engine.strategies import strategy_of
from fusion.engine.views import is_view, slab_offset
from fusion.lower import declare, plan_dram, symbol_names
from fusion.lower.context import LowerContext, storage_dtype
from fusion.lower.emitter import Emitter, Step, run_pipeline
from fusion.lower.local_alloc import DEPTH
from fusion.lower.views import MAX_COLS, MAX_ROWS, Transfer, View
from isa.enums import Unit
from simulator.config import MachineConfig
from simulator.run import simulate
from simulator.timing import branch_cycles, scalar_cycles

MAX_TILE_TESTS = 1 << 16  # unrolled `bnz.tile` tests of one dispatcher (bounds the program's size)
TABLE = "dispatch_table"  # data-section key prefix of a dispatch table (two words: zero-skip, dense)


@dataclass(frozen=True)
class Dispatch:
    """A group dispatched on chip: which operand is measured and where the zero-skip variant starts to pay."""

    index: int  # the choice's position in the plan
    operand: str  # the GEMM's left operand (graph value)
    tiles: int  # N x N tiles of its matrix view
    threshold: int  # all-zero tiles from which the zero-skip variant runs
    kernel: str  # the measuring code's `.kernel` name
    dense: str  # the variants' `.kernel` names
    zero_skip: str
    dense_group: Group
    zero_skip_group: Group
    producer: int | None = None  # plan position of the kernel whose counting stores give the count (None: measured)
    measurable: bool = True  # the operand fits the scratchpad and the tile tests' bound (`_measure`)
    dense_cycles: float = 0.0  # the dense kernel's prediction (the budget's base)
    forgone: float = 0.0  # the predicted overlap its fences forgo (`_Forgone`)


@dataclass(frozen=True)
class ProgramKernel:
    name: str  # `.kernel` block name
    index: int  # the choice's position in the plan
    group: Group
    phases: int  # fenced phases of its generator


@dataclass(frozen=True)
class Boundary:
    """Between the kernel of plan position `before` and the next kernel in the program."""

    before: int
    after: int
    joined: bool  # token-ordered (True) or a fence
    reason: str  # why a fence ("" when joined)


@dataclass(frozen=True)
class LinkedProgram:
    program: ObjectFile
    symbols: dict[str, str]  # graph value -> tensor name in the program
    kernels: tuple[ProgramKernel, ...]
    dispatches: tuple[Dispatch, ...]
    boundaries: tuple[Boundary, ...]
    # what `program_run.link_for_call` measured when it chose this program on a call's inputs: the same plan fenced
    # at every boundary with no on-chip dispatch (the kernels one after another: what they cost run one by one),
    # and each token-ordered boundary's gain over it ((plan position before, after, cycles))
    fenced_cycles: int = 0
    gains: tuple[tuple[int, int, int], ...] = ()
    dropped: tuple[str, ...] = ()  # operands of the dispatches it left out: they did not pay on that call's data


class PhaseCache:
    """Generated phases of one model context's groups, so the several links of one plan (`program_run.
    link_for_call`: the chosen joins, the fenced reference) generate each kernel once. Keyed by what determines the
    steps besides the context: the group, its buffer-slot rotation and the DRAM image (every address); a link
    copies what it takes (joining rewrites a block's first and last phases)."""

    def __init__(self, mc: ModelContext) -> None:
        self.mc = mc
        self._phases: dict[tuple[tuple, Group, int], tuple[tuple[tuple[Step, ...], ...], LowerContext]] = {}

    def get(
        self, image: tuple, addresses: Mapping[str, int], group: Group, rotation: int
    ) -> tuple[list[list[Step]], LowerContext]:
        """The group's phases generated at `rotation` over `addresses` (`image`: their sorted items, the key)."""
        key = (image, group, rotation)
        if key not in self._phases:
            mc = self.mc
            sub = mc.subgraph(group.nodes)
            cx = LowerContext(sub, mc.config, mc.qplan, mc.params, dict(addresses), rotation=rotation)
            made = group_phases(cx, sub.nodes, group, mc.allow_rounding_change)
            self._phases[key] = tuple(tuple(p) for p in made), cx
        phases, cx = self._phases[key]
        return [list(p) for p in phases], cx


@dataclass(frozen=True)
class ProgramRun:
    outputs: dict[str, np.ndarray]  # every value a kernel writes, and the graph outputs (storage dtype)
    cycles: int
    kernel_cycles: dict[str, int]  # `.kernel` name -> its share of the timeline
    kernel_counters: dict[str, Any]  # `.kernel` name -> its counters (`RunResult.kernel_counters`)
    decisions: tuple[tuple[int, Group], ...]  # (plan position, the variant that ran) per on-chip dispatch
    dispatch_cycles: int  # cycles of the counting and measuring code (the on-chip dispatch overhead)
    dram_bytes: int
    energy_pj: float
    counters: object


# (choice, zero-tile fraction) -> predicted cycles of its (dense, zero-skip) variants at that fraction
Prefer = Callable[[GroupChoice, float], tuple[float, float]]
DISPATCH_BUDGET = 0.01  # the on-chip measurement may cost at most this fraction of the dense kernel's cycles


def variants(choice: GroupChoice) -> tuple[Group, Group] | None:
    """(dense, zero-skip) of a choice with a dispatch table, else None."""
    if choice.zero_skip is None:
        return None
    dense = choice.dense or choice.group
    return None if dense == choice.zero_skip else (dense, choice.zero_skip)


def data_class_of(group: Group) -> str:
    """The data class a group's kernel is built and keyed for: "sparse" for a zero-tile-skipping strategy."""
    return "sparse" if strategy_of(group).skips_zero_tiles else "any"


def threshold(choice: GroupChoice, tiles: int, prefer: Prefer) -> int | None:
    """The fewest all-zero tiles from which the zero-skip variant pays at every higher count (the host's dispatch
    table: the sparse class, then the cost model), or None when it never does."""
    first = math.ceil(SPARSE_TILE_FRACTION * tiles - 1e-9)
    found = None
    for count in range(tiles, max(first, 0) - 1, -1):
        dense, zero_skip = prefer(choice, count / tiles)
        if zero_skip >= dense:
            break
        found = count
    return found


def link_plan(
    mc: ModelContext,
    choices: Sequence[GroupChoice],
    prefer: Prefer | None = None,
    join: bool = True,
    fenced: frozenset[int] = frozenset(),
    dispatch_budget: float = DISPATCH_BUDGET,
    counter: bool = True,
    phases: PhaseCache | None = None,
) -> LinkedProgram:
    """The plan's kernels linked into one program (module docstring). `prefer`: the variants' predictions for
    on-chip dispatch (None: every group runs its planned variant; `dispatch_budget`: see `_table`);
    `join=False` or plan positions in `fenced` keep a fence after those kernels (the overlap's measurement);
    `counter=False`: every dispatch measures its operand (`_measure`), none reads the store-side counter;
    `phases`: kernels generated by an earlier link of the same plan (the DRAM image is the same whatever is
    dispatched or joined: every variant's constants and a table word per choice with variants)."""
    cfg, graph = mc.config, mc.graph
    cache = phases if phases is not None else PhaseCache(mc)
    if cache.mc is not mc:
        raise ValueError("a PhaseCache holds one model context's kernels")
    # the dispatch tables first: `dispatch` holds a table's address in 24 bits, the constants may pass 16 MiB
    forms: dict[str, np.ndarray] = {f"{TABLE}{i}": np.zeros(1, np.int32) for i, c in enumerate(choices) if variants(c)}
    scratch: dict[str, int] = {}
    imaged: set[int] = set()  # plan positions whose variants' constants are in the image (a dispatch may pick them)
    for i, choice in enumerate(choices):
        if strategy_of(choice.group).host_view:
            continue
        pair = variants(choice)
        _add_forms(mc, forms, scratch, choice.group, strict=True)
        if pair is not None and all(_add_forms(mc, forms, scratch, g, strict=False) for g in pair):
            imaged.add(i)
    entries: list[tuple[int, Group | Dispatch]] = []
    forgone = _Forgone(mc, choices)
    for i, choice in enumerate(choices):
        if not strategy_of(choice.group).host_view:
            writer = _writer(mc, choices, i) if counter else None
            dispatchable = prefer is not None and i in imaged
            table = _table(mc, i, choice, prefer, dispatch_budget, writer, forgone) if dispatchable else None
            entries.append((i, table if table is not None else choice.group))

    def groups_of(e: Group | Dispatch) -> tuple[Group, ...]:
        return (e.dense_group, e.zero_skip_group) if isinstance(e, Dispatch) else (e,)

    data, addresses, _ = plan_dram(graph, mc.qplan, cfg, forms, whole_program=True, scratch=scratch)
    _place_views(mc, addresses)
    image = tuple(sorted(addresses.items()))
    names = symbol_names(_values(mc))
    gcx = LowerContext(graph, cfg, mc.qplan, mc.params, addresses)
    entries = _counted(
        mc, gcx, choices, entries, dispatch_budget, groups_of, lambda g: cache.get(image, addresses, g, 0)[0]
    )
    blocks_groups = [(i, g) for i, e in entries for g in groups_of(e)]
    tables = {i: e for i, e in entries if isinstance(e, Dispatch)}
    counted = {gcx.view(d.operand) for d in tables.values() if d.producer is not None}
    counted_at = {d.producer for d in tables.values() if d.producer is not None}
    kernel_names = symbol_names([_kernel_name(g) for _, g in blocks_groups], reserved=("program_io",))

    def generate(g: Group, rotation: int) -> tuple[list[list[Step]], LowerContext]:
        return cache.get(image, addresses, g, rotation)

    # every kernel's phases as it runs alone; consecutive ones joined where the tokens allow, the next kernel then
    # generated again in the buffer slots that follow the previous one's last step
    blocks = [(i, g, *generate(g, 0)) for i, g in blocks_groups]
    rotations = [0] * len(blocks)
    boundaries: list[Boundary] = []
    joined_at_start = False
    written: list[tuple[int, int]] = []
    for k in range(len(blocks) - 1):
        i, g, phases, cx = blocks[k]
        j, nxt, _, _ = blocks[k + 1]
        written += [value_extent(cx, v) for v in mc.subgraph(g.nodes).outputs]
        chained = joined_at_start and len(phases) == 1
        reason = _fence_reason(i, j, g, nxt, tables, fenced if join else None, chained)
        if not reason:
            rotation = (rotations[k] + len([s for s in phases[-1] if s.segments()])) % DEPTH
            nphases, ncx = generate(nxt, rotation)
            try:
                phases[-1], nphases[0] = join_phases(cfg, phases[-1], nphases[0], written)
                blocks[k + 1], rotations[k + 1] = (j, nxt, nphases, ncx), rotation
            except CodegenError as err:
                reason = str(err)
        boundaries.append(Boundary(i, j, not reason, reason))
        joined_at_start = not reason
        if reason:
            written = []

    b = ProgramBuilder(data_base=0)
    views = [n.outputs[0] for n in graph.nodes if is_view(graph, n)]  # (read back as any value: validation)
    outs = [declare(gcx, names, v) for v in dict.fromkeys([*graph.outputs, *views]) if not graph.is_constant(v)]
    dispatches = [replace(d, dense=kernel_names[d.dense], zero_skip=kernel_names[d.zero_skip]) for d in tables.values()]
    by_index = {d.index: d for d in dispatches}

    numbers = itertools.count(1)

    def emit(k: int) -> None:
        _, g, phases, cx = blocks[k]
        sub = mc.subgraph(g.nodes)
        attrs = {"strategy": g.strategy, "schedule": g.schedule, "ops": " ".join(n.op.value for n in sub.nodes)}
        ins = [declare(cx, names, v) for v in sub.inputs]
        kouts = [declare(cx, names, v) for v in sub.outputs]
        name = kernel_names[_kernel_name(g)]
        with b.kernel(name, inputs=ins, outputs=kouts, attrs=attrs):
            b.label(f"{name}__entry")
            em = _KernelEmitter(b, numbers, frozenset(counted), cfg.array_size)
            for p, steps in enumerate(phases):
                run_pipeline(em, steps)
                if p < len(phases) - 1 or k == len(blocks) - 1 or not boundaries[k].joined:
                    b.fence()

    k = 0
    for i, _ in entries:
        if i not in by_index:
            if i in counted_at:
                _clear(b, kernel_names[_kernel_name(blocks[k][1])])
            emit(k)
            k += 1
            continue
        d = by_index[i]
        if d.producer is None:
            _measure(b, mc, gcx.view(d.operand), d, clear=i in counted_at)
        else:
            _count(b, d, clear=i in counted_at)
        emit(k)  # dense: the fall-through
        b.jal(0, f".Ljoin{i}")
        emit(k + 1)  # zero-skip: the table's target
        b.label(f".Ljoin{i}")
        k += 2
    with b.kernel("program_io", inputs=[declare(gcx, names, v) for v in graph.inputs], outputs=outs):
        b.halt()  # (the block's one instruction is the program's end: no cycle more than the kernels')
    _data(b, data, {f"{TABLE}{d.index}": d.zero_skip for d in dispatches}, addresses)
    kernels = tuple(ProgramKernel(kernel_names[_kernel_name(g)], i, g, len(p)) for i, g, p, _ in blocks)
    return LinkedProgram(b.build(), names, kernels, tuple(dispatches), tuple(boundaries))


def _add_forms(
    mc: ModelContext, forms: dict[str, np.ndarray], scratch: dict[str, int], group: Group, strict: bool
) -> bool:
    """Add a group's constant forms and DRAM scratch to the program's image. A form differing from one already
    there refuses the link (`strict`: a group the plan runs) or leaves the group out (False returned: a dispatch
    variant, which then is never dispatched to)."""
    more, extra = dram_forms(mc, mc.subgraph(group.nodes), group)
    try:
        _check_one_image(forms, more, group)
    except CodegenError:
        if strict:
            raise
        return False
    forms.update(more)
    scratch.update(extra)
    return True


def _check_one_image(forms: Mapping[str, np.ndarray], more: Mapping[str, np.ndarray], group: Group) -> None:
    """One DRAM image holds each constant form once: refuse a group whose form of a key differs from another
    group's (e.g. one bias initializer shared by two convolutions whose int8 biases are corrected differently),
    instead of linking a program in which one of them reads the other's constant."""
    for key, data in more.items():
        known = forms.get(key)
        if known is not None and not (known.shape == data.shape and np.array_equal(known, data)):
            raise CodegenError(
                f"constant form {key!r} of group {list(group.nodes)} differs from another group's: one program "
                "image cannot hold both"
            )


class _KernelEmitter(Emitter):
    """A kernel's emitter in the linked program: a fresh register cache (control flow joins at dispatches), local
    labels numbered program-wide (several kernels' generators use the same label prefixes); stores into a counted
    operand are `dma.stz` (`_counted` checked that they lie on its tile grid)."""

    def __init__(
        self, builder: ProgramBuilder, numbers: Iterator[int], counted: frozenset[View] = frozenset(), n: int = 0
    ) -> None:
        super().__init__(builder)
        self._numbers = numbers
        self._counted = [_extent(v) for v in counted]
        self._n = n

    def local_label(self, prefix: str) -> str:
        return f".L{prefix}{next(self._numbers)}"

    def dma_store(self, local: int, view: View) -> None:
        lo, hi = _extent(view)
        grid = _grid_transfers(view, self._n) if any(lo < b and a < hi for a, b in self._counted) else None
        if grid is None:
            super().dma_store(local, view)
            return
        for t in grid:
            loc, dram, stride = self._operands(local, t, view.dtype)
            self.b.dma_stz(dram, loc, stride, t.rows, t.cols, view.dtype.name)


@dataclass(frozen=True)
class PlannedKernel:
    """A plan kernel as `overlap.BoundaryOverlap` prices a boundary (its group and predicted cycles)."""

    group: Group
    features: object
    cycles: float


class _Forgone:
    """The predicted overlap a dispatched group's two boundaries would have gained had they been token-ordered
    (`overlap.BoundaryOverlap`): a dispatch fences both, so on dense data it costs this on every call too. (Whether
    the link then joins them is not asked: the dispatches, and so the program's kernels, must not depend on the
    fences, which `program_run.best_fences` chooses per kernel.)"""

    def __init__(self, mc: ModelContext, choices: Sequence[GroupChoice]) -> None:
        self.mc, self.choices = mc, choices
        self.kernels = [i for i, c in enumerate(choices) if not strategy_of(c.group).host_view]
        self._overlap = None

    def __call__(self, index: int, dense: Group, dense_cycles: float) -> float:
        if self._overlap is None:
            from fusion.engine.overlap import BoundaryOverlap  # (it generates kernels with this module's extents)

            self._overlap = BoundaryOverlap(self.mc)
        k = self.kernels.index(index)
        here = PlannedKernel(dense, None, dense_cycles)
        total = 0.0
        if k > 0:
            before = self.choices[self.kernels[k - 1]]
            total += self._overlap(PlannedKernel(before.group, None, before.predicted_cycles), here)
        if k + 1 < len(self.kernels):
            after = self.choices[self.kernels[k + 1]]
            total += self._overlap(here, PlannedKernel(after.group, None, after.predicted_cycles))
        return total


def _table(
    mc: ModelContext,
    index: int,
    choice: GroupChoice,
    prefer: Prefer,
    budget: float,
    writer: int | None,
    forgone: Callable[[int, Group, float], float],
) -> Dispatch | None:
    """The on-chip dispatch of a choice with dense and zero-skip variants; None when it has none, when the
    zero-skip variant never pays (the dense one runs), when the count (`count_cycles` if a kernel at plan position
    `writer` writes the operand, else `measure_cycles`) plus the overlap its fences forgo (`forgone`), both paid on
    every call, exceed `budget` x the dense kernel's predicted cycles, or when the operand cannot be measured on
    chip. `_counted` then keeps a dispatch whose writer's stores cannot count only if its measurement fits the
    budget."""
    pair = variants(choice)
    if pair is None:
        return None
    dense, zero_skip = pair
    operand = mc.graph.node(dense.nodes[0]).inputs[0]
    if mc.graph.is_constant(operand):
        return None  # a constant operand's class never changes: the planned variant is the right one
    rows, cols = _matrix(mc.graph.types[operand].shape)
    n = mc.config.array_size
    es = storage_dtype(mc.graph, mc.qplan, operand).size  # (an int8 model's graph inputs stay float32)
    measurable = rows * cols * es <= mc.config.spad_bytes and rows * -(-cols // n) <= MAX_TILE_TESTS
    if writer is None and not measurable:
        return None
    tiles = -(-rows // n) * -(-cols // n)
    at = threshold(choice, tiles, prefer)
    if at is None:
        return None  # the zero-skip variant never pays
    dense_cycles = prefer(choice, 1.0)[0]
    cost = count_cycles(mc.config) if writer is not None else measure_cycles(mc.config, rows, cols, es)
    if cost > budget * dense_cycles:
        return None  # counting on every call would cost more than the budget on dense data
    lost = forgone(index, dense, dense_cycles)
    if cost + lost > budget * dense_cycles:
        return None
    name = identifier(f"dispatch_{dense.nodes[0]}")
    d = Dispatch(index, operand, tiles, at, name, _kernel_name(dense), _kernel_name(zero_skip), dense, zero_skip)
    return replace(d, producer=writer, measurable=measurable, dense_cycles=dense_cycles, forgone=lost)


def _writer(mc: ModelContext, choices: Sequence[GroupChoice], index: int) -> int | None:
    """The plan position (before `index`) of the kernel that writes the GEMM operand of choice `index` (through
    views: a view's bytes are its input's), or None (a graph input, a constant, no dispatch)."""
    pair = variants(choices[index])
    if pair is None:
        return None
    value = mc.graph.node(pair[0].nodes[0]).inputs[0]
    for p in range(index - 1, -1, -1):
        group = choices[p].group
        if value not in mc.subgraph(group.nodes).outputs:
            continue
        if not strategy_of(group).host_view:
            return p
        value = mc.graph.node(group.nodes[0]).inputs[0]
    return None


def count_cycles(cfg: MachineConfig) -> int:
    """The counting dispatcher's cycles when the counter is complete (`zc.rd`, `slti`, a taken `dispatch`), plus
    the `zc.clr` before its operand's writer."""
    return 3 * scalar_cycles(cfg) + branch_cycles(cfg, True)


def _counted(
    mc: ModelContext,
    cx: LowerContext,
    choices: Sequence[GroupChoice],
    entries: list[tuple[int, Group | Dispatch]],
    budget: float,
    groups_of: Callable[[Group | Dispatch], tuple[Group, ...]],
    generated: Callable[[Group], list[list[Step]]],
) -> list[tuple[int, Group | Dispatch]]:
    """Settle which dispatches read the store-side counter. One counter: a dispatch may read it when every store
    of its operand by its writer's kernels lies on the operand's N x N tile grid (each tile stored whole, once:
    the counts then add up to the operand's zero tiles) and no other counted writer runs between its writer and
    it (`zc.clr` before each counted writer). The others measure their operand (`producer` None) if that fits the
    budget and the scratchpad, else run the planned variant."""
    by_index = dict(entries)
    out, spans = [], []  # spans: (writer, dispatch) of the counting dispatches so far
    for i, e in entries:
        if not isinstance(e, Dispatch) or e.producer is None:
            out.append((i, e))
            continue
        p = e.producer
        writers = {q for q, _ in spans}
        free = not any(p < q < i for q in writers - {p}) and not any(q < p < j for q, j in spans)
        view = cx.view(e.operand)
        if free and all(_on_tile_grid(mc, generated(g), view) for g in groups_of(by_index[p])):
            spans.append((p, i))
            out.append((i, e))
            continue
        rows, cols = _matrix(view.shape)
        cost = measure_cycles(mc.config, rows, cols, view.dtype.size) + e.forgone
        fits = e.measurable and cost <= budget * e.dense_cycles
        out.append((i, replace(e, producer=None) if fits else choices[i].group))
    return out


def _extent(view: View) -> tuple[int, int]:
    return view.address, view.address + int(np.prod(view.shape, dtype=np.int64)) * view.dtype.size


def _grid_transfers(view: View, n: int) -> list[Transfer] | None:
    """A store of `view` as `dma.stz` transfers in its own matrix geometry (leading dims as rows, the last as
    columns: the counter tiles each transfer from its first row and column), rows split at multiples of N; None
    when the view is not such a matrix (its last dim strided or too long, leading dims that do not merge)."""
    es = view.dtype.size
    shape, strides = list(view.shape) or [1], list(view.strides) or [es]
    cols = shape[-1]
    lead = [(d, s) for d, s in zip(shape[:-1], strides[:-1], strict=True) if d != 1]
    if (strides[-1] != es and cols > 1) or cols > MAX_COLS or n <= 0:
        return None
    if any(s != d2 * s2 for (_, s), (d2, s2) in itertools.pairwise(lead)):
        return None
    rows = int(np.prod([d for d, _ in lead], dtype=np.int64)) if lead else 1
    stride = lead[-1][1] if lead else cols * es
    chunk = MAX_ROWS // n * n
    return [
        Transfer(view.address + r0 * stride, min(chunk, rows - r0), cols, stride, r0 * cols)
        for r0 in range(0, rows, chunk)
    ]


def _on_tile_grid(mc: ModelContext, phases: Sequence[Sequence[Step]], operand: View) -> bool:
    """Whether every store of a kernel (its `phases`, generated over the program's image) into the operand's bytes
    is a block of its matrix view (rows x last dim) that starts on the N x N tile grid and ends on it or at the
    matrix's edge, and every tile is stored exactly once: then the `dma.stz` counts add up to the operand's
    all-zero tiles."""
    n, es = mc.config.array_size, operand.dtype.size
    rows, cols = _matrix(operand.shape)
    lo, hi = _extent(operand)
    covered = np.zeros((-(-rows // n), -(-cols // n)), dtype=np.int64)
    for phase in phases:
        for step in phase:
            for _, view in step.stores:
                start, end = _extent(view)
                if not (start < hi and lo < end):
                    continue
                grid = _grid_transfers(view, n)
                if grid is None or view.dtype != operand.dtype:
                    return False
                for t in grid:
                    r, c = divmod((t.dram - lo) // es, cols)
                    aligned = (t.dram - lo) % es == 0 and r % n == 0 and c % n == 0
                    shaped = (t.rows == 1 or t.stride == cols * es) and c + t.cols <= cols and r + t.rows <= rows
                    edges = (t.rows % n == 0 or r + t.rows == rows) and (t.cols % n == 0 or c + t.cols == cols)
                    if not (aligned and shaped and edges):
                        return False
                    covered[r // n : -(-(r + t.rows) // n), c // n : -(-(c + t.cols) // n)] += 1
    return bool((covered == 1).all())


def measure_cycles(cfg: MachineConfig, rows: int, cols: int, es: int) -> int:
    """An estimate of the on-chip measurement on dense data (every tile's first row non-zero): the operand's DMA
    (latency + bytes at the channel's rate) and a `li` + taken `bnz.tile` per tile."""
    n = cfg.array_size
    tiles = -(-rows // n) * -(-cols // n)
    return cfg.dram_latency + -(-rows * cols * es // cfg.dram_bytes_per_cycle) + tiles * (2 + cfg.branch_penalty)


def _place_views(mc: ModelContext, addresses: dict[str, int]) -> None:
    """Every view's output at its input's bytes (the host applies views to arrays; in one program they are pointer
    offsets): a slab Gather/Slice at its slab, a Reshape/Identity at its input, in graph order (chains of views)."""
    graph = mc.graph
    probe = LowerContext(graph, mc.config, mc.qplan, mc.params, addresses)
    for node in graph.nodes:
        src = node.inputs[0] if node.inputs else ""
        if not is_view(graph, node) or graph.is_constant(src):
            continue
        addresses[node.outputs[0]] = addresses[src] + (slab_offset(graph, node) or 0) * probe.dtype(src).size


def _values(mc: ModelContext) -> list[str]:
    graph = mc.graph
    found = [*graph.inputs, *(v for n in graph.nodes for v in n.outputs)]
    return [v for v in dict.fromkeys(found) if not graph.is_constant(v)]


def _kernel_name(g: Group) -> str:
    return identifier(f"{g.strategy}_{g.nodes[0]}")


def value_extent(cx: LowerContext, value: str) -> tuple[int, int]:
    """DRAM bytes [lo, hi) of a value in the whole-program image."""
    view = cx.view(value)
    return view.address, view.address + int(np.prod(view.shape, dtype=np.int64)) * view.dtype.size


def _fence_reason(
    i: int, j: int, g: Group, nxt: Group, tables: Mapping[int, Dispatch], fenced: frozenset[int] | None, chained: bool
) -> str:
    """Why the boundary after plan position `i` keeps a fence ("" when it may be token-ordered). `fenced`: plan
    positions to fence (None: all)."""
    if fenced is None or i in fenced:
        return "fenced on request"
    if i in tables or j in tables:
        return "on-chip dispatch (the measurement reads the operand after every store)"
    unpipelined = [s.name for s in (strategy_of(g), strategy_of(nxt)) if not s.pipelinable]
    if unpipelined:
        return f"a {unpipelined[0]} kernel (not pipelinable: zero-tile tests at issue)"
    if chained:
        return "single-phase kernel already joined at its start (joining both ends measured slower)"
    return ""


def _matrix(shape: Sequence[int]) -> tuple[int, int]:
    """The tensor as rows x last dim (`profile.as_matrix`)."""
    if not shape:
        return 1, 1
    return int(np.prod(shape[:-1], dtype=np.int64)), int(shape[-1])


def _clear(b: ProgramBuilder, kernel: str) -> None:
    """`zc.clr` before a counted operand's writer (its own block: its cycle is the count's, not the kernel's)."""
    with b.kernel(identifier(f"count_{kernel}"), attrs={"strategy": "dispatch"}):
        b.zc_clr()


def _count(b: ProgramBuilder, d: Dispatch, clear: bool) -> None:
    """Read the zero tiles the operand's writer counted as it stored them; from `d.threshold` of them jump through
    the table to the zero-skip variant, else fall through to the dense one. `clear`: this group's variants write a
    counted operand (the counter restarts after the read)."""
    attrs = {"strategy": "dispatch", "tiles": str(d.tiles), "threshold": str(d.threshold), "count": "store"}
    with b.kernel(d.kernel, attrs=attrs):
        b.zc_rd(30)  # waits for the writer's last counting store
        if clear:
            b.zc_clr()
        b.slti(30, 30, d.threshold)  # 0: at least `threshold` zero tiles
        b.dispatch(30, f"{TABLE}{d.index}", 1)  # key 0 -> the zero-skip variant; 1 falls through to dense


def _measure(b: ProgramBuilder, mc: ModelContext, view: View, d: Dispatch, clear: bool) -> None:
    """Count the operand's all-zero N x N tiles on chip; from `d.threshold` of them jump through the table to the
    zero-skip variant, else fall through to the dense one. `clear`: as in `_count`."""
    rows, cols = _matrix(view.shape)
    n, es = mc.config.array_size, view.dtype.size
    with b.kernel(d.kernel, attrs={"strategy": "dispatch", "tiles": str(d.tiles), "threshold": str(d.threshold)}):
        b.fence()  # the operand's producer has stored it, and no kernel uses the scratchpad any more
        if clear:
            b.zc_clr()
        em = Emitter(b)
        em.dma_load(view, 0)
        em.push(Unit.load, Unit.scalar)
        em.pop(Unit.load, Unit.scalar)
        count, addr = 30, 31  # this block's registers (the variants start with fresh emitters)
        b.li(count, 0)
        label = 0
        for r0 in range(0, rows, n):
            for c0 in range(0, cols, n):
                nonzero = f".L{d.kernel}_{label}"
                label += 1
                for r in range(r0, min(rows, r0 + n)):
                    b.li(addr, (r * cols + c0) * es)
                    b.bnz_tile(addr, min(n, cols - c0), view.dtype.name, nonzero)
                b.addi(count, count, 1)
                b.label(nonzero)
        b.slti(count, count, d.threshold)  # 0: at least `threshold` zero tiles
        b.dispatch(count, f"{TABLE}{d.index}", 1)  # key 0 -> the zero-skip variant; 1 falls through to dense


def _data(b: ProgramBuilder, data: bytes, tables: Mapping[str, str], addresses: Mapping[str, int]) -> None:
    """The constants at DRAM address 0, each dispatch table's word (the zero-skip variant) at its address."""
    if not data:
        return
    b.data()
    b.label("constants")
    at = 0
    for key, zero_skip in sorted(tables.items(), key=lambda t: addresses[t[0]]):
        start = addresses[key]
        if start > at:
            b.i8(np.frombuffer(data[at:start], dtype=np.uint8))
        b.label(key)
        b.word(f"{zero_skip}__entry")
        at = start + 4
    if at < len(data):
        b.i8(np.frombuffer(data[at:], dtype=np.uint8))


def run_program(
    mc: ModelContext,
    linked: LinkedProgram,
    inputs: Mapping[str, np.ndarray],
    checked: bool = False,
    max_cycles: int | None = None,
) -> ProgramRun:
    """One simulation of the whole program on the graph inputs: every value's bytes, the model's cycles, each
    kernel's share, and the variant each on-chip dispatch took (the kernel whose instructions ran).
    `max_cycles`: a tighter watchdog than the machine's (a SimulatorTrap past it)."""
    names = linked.symbols
    config = mc.config if max_cycles is None else replace(mc.config, max_cycles=max_cycles)
    result = simulate(linked.program, config, {names[v]: inputs[v] for v in mc.graph.inputs}, checked=checked)
    per = result.kernel_counters
    outputs = {v: result.outputs[t] for v, t in names.items() if t in result.outputs}
    decisions = tuple(
        (d.index, d.zero_skip_group if int(per[d.zero_skip].instret) else d.dense_group) for d in linked.dispatches
    )
    c = result.counters
    return ProgramRun(
        outputs,
        int(c.cycle),
        {k: int(v.cycle) for k, v in per.items()},
        per,
        decisions,
        sum(int(per[k.name].cycle) for k in linked.program.kernels if k.attr("strategy") == "dispatch"),
        int(c.dram_read_bytes) + int(c.dram_write_bytes),
        float(c.energy_total_pj),
        c,
    )


def kernel_at(linked: LinkedProgram, pc: int) -> ProgramKernel | None:
    """The plan kernel whose instructions hold `pc` (None: the driver, `program_io` or a dispatch measurement)."""
    block = next((k.name for k in linked.program.kernels if k.start <= pc < k.end), None)
    return next((k for k in linked.kernels if k.name == block), None)


def model_prefers(mc: ModelContext, cost_model: CostModel, kernels: Callable[[Group], Kernel] | None = None) -> Prefer:
    """The host dispatch table's predictions: the dense kernel's and the zero-skip kernel's at the zero-tile
    fraction (what `FusionEngine._variant` compares). The fraction is a feature to two decimals, so each group has
    at most 101 distinct predictions: they are kept (`threshold` asks a counted operand's every tile count, 3136
    of them for a 224 x 224 ResNet layer's, ~5 ms each). `kernels`: a group's kernel as already built (the
    engine's cache); None: built here, once per group."""
    built: dict[Group, Kernel] = {}
    known: dict[tuple[Group, Group, float], tuple[float, float]] = {}

    def kernel(g: Group) -> Kernel:
        if g not in built:
            built[g] = kernels(g) if kernels is not None else build_kernel(mc, g, data_class_of(g))
        return built[g]

    def prefer(choice: GroupChoice, fraction: float) -> tuple[float, float]:
        pair = variants(choice)
        if pair is None:
            raise CodegenError(f"group {choice.group.nodes} has no dense and zero-skip variants")
        dense, zero_skip = pair
        key = (dense, zero_skip, round(fraction, 2))
        if key not in known:
            try:
                cost = cost_model.predict(kernel_features(mc, kernel(zero_skip), key[2]), mc.config).cycles
                known[key] = cost_model.predict(kernel_features(mc, kernel(dense), 0.0), mc.config).cycles, cost
            except CodegenError:  # a variant its generator refuses (e.g. K past a buffer half) is never dispatched to
                known[key] = 0.0, math.inf
        return known[key]

    return prefer
