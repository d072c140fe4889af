"""Issue order for an attention step whose head blocks run their stages interleaved (`codegen.attention`).

The control core issues in program order into per-unit queues of `queue_depth` entries: a queue that is full
stops the issue of everything behind it. Stages written one after another (all of one unit's work, then the
next unit's) therefore run one after another even when tokens would let them overlap: the matrix unit's next
head waits behind the vector unit's instructions the core cannot issue yet. So each head's part of each stage is
recorded (`record`: instructions with the values their scalar registers hold, not the registers), the parts are
put in per-unit streams with the tokens that order them, and the streams are merged (`merge`) in the order a
small model of the units expects them to start; `replay` then emits the merged list, loading the values into
registers as it goes (the emitter's register cache), so any merge is a correct program.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from assembler.builder import builder_method_name
from fusion.engine.errors import CodegenError
from fusion.lower.emitter import UNIT_NAME, Emitter
from isa import INSTRUCTIONS
from isa.enums import DType, Unit
from isa.fields import Kind
from simulator import timing
from simulator.config import MachineConfig

BY_NAME = {name: unit for unit, name in UNIT_NAME.items()}
SPECS = {builder_method_name(spec): spec for spec in INSTRUCTIONS}  # a recorded call's row of the ISA table
# one latency for every vector instruction in the order's estimate: each row's own (1-3 cycles) ordered ViT's
# interleaved heads worse (int8 attention_proj 19,091 vs 18,969 cycles for the model)
VECTOR_LATENCY = 2
PRIORITY = (Unit.load, Unit.matrix, Unit.vector, Unit.store)  # ties: the unit whose work others wait for first


def _rows_operand(timing_rule: str) -> dict[str, int]:
    """The instructions of a timing rule (with their strided forms) and where their `rows` operand is."""
    return {
        name: [o.field.name for o in spec.operands].index("rows")
        for name, spec in SPECS.items()
        if spec.timing == timing_rule
    }


MATMUL_ROWS = _rows_operand("matmul")  # mx.mm, mx.mma, mx.mm.s, mx.mma.s
DRAIN_ROWS = _rows_operand("drain")  # mx.drain, mx.drain.s


def rows_of(c: Call) -> int:
    return c.args[(MATMUL_ROWS | DRAIN_ROWS)[c.name]]


class Held(int):
    """A recorded scalar operand: the 32-bit value its register holds (loaded again at replay)."""


@dataclass(frozen=True)
class Call:
    """One recorded instruction: the builder method, its arguments (`Held` for scalar registers), its unit."""

    unit: Unit
    name: str
    args: tuple


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []

    def __getattr__(self, name: str) -> Callable[..., None]:
        def record(*args) -> None:
            self.calls.append((name, args))

        return record

    def emitter(self, name: str) -> Callable[..., None]:
        """As `ProgramBuilder.emitter`: its instructions recorded as any other's."""
        return self.__getattr__(name)


class _RecordingEmitter(Emitter):
    def __init__(self) -> None:
        super().__init__(_Recorder())  # type: ignore[arg-type]

    def reg(self, value: int) -> int:
        value &= 0xFFFFFFFF
        return 0 if value == 0 else Held(value)

    def regs(self, *values: int) -> tuple[int, ...]:
        return tuple(map(self.reg, values))

    def local_label(self, prefix: str) -> str:
        raise CodegenError("an interleaved attention stage branches (its instructions cannot be reordered)")


def _unit(name: str, args: tuple) -> Unit:
    if name in ("sync_push", "sync_pop"):
        return BY_NAME[args[0 if name == "sync_push" else 1]]
    if name.startswith(("mx_", "ep_")):
        return Unit.matrix
    if name.startswith(("v_", "vc_")):
        return Unit.vector
    if name in ("dma_ld", "dma_ldt"):
        return Unit.load
    if name == "dma_st":
        return Unit.store
    raise CodegenError(f"an interleaved attention stage emits {name!r}, which is not a unit instruction")


def record(fns: Sequence[Callable[[Emitter], None]]) -> list[Call]:
    """The instructions the emit functions produce, in order."""
    em = _RecordingEmitter()
    for fn in fns:
        fn(em)
    return [Call(_unit(name, args), name, args) for name, args in em.b.calls]


LOADS = ("dma_ld", "dma_ldt")
WIDEST = max(d.size for d in DType)


def written(c: Call, bank: int = 1) -> tuple[int, int]:
    """The scratchpad bytes [lo, hi) a load writes (its local rows are dense), widened to whole `bank`-byte banks:
    the simulator holds a load's banks, so no other unit uses any byte of them meanwhile."""
    rd, rows, cols, dtype = c.args[0], c.args[3], c.args[4], c.args[5]
    return rd // bank * bank, -(-(rd + rows * cols * DType[dtype].size) // bank) * bank


def touches(c: Call, lo: int, hi: int) -> bool:
    """Whether the instruction may read or write scratchpad bytes [lo, hi): a scalar register operand from within
    `WIDEST`-byte elements times its element count before hi (or anywhere from its value when it has no count: a
    matmul's, a drain's); an over-estimate, never an under-one (a stride or a scale taken as an address too)."""
    names = [o.field.name for o in SPECS[c.name].operands]
    count = c.args[names.index("n")] * WIDEST if "n" in names else None
    for o, a in zip(SPECS[c.name].operands, c.args, strict=True):
        if o.field.kind is Kind.xreg and a < hi and (count is None or a + count > lo):
            return True
    return False


def token(src: Unit, dst: Unit, push: bool) -> Call:
    name = "sync_push" if push else "sync_pop"
    return Call(src if push else dst, name, (UNIT_NAME[src], UNIT_NAME[dst]))


def _cost(cfg: MachineConfig, c: Call) -> int:
    """Cycles a unit is busy with the instruction by the simulator's timing rules (an estimate where a rule needs
    what runs before it: a vector instruction without an element count is taken as one beat, every vector
    instruction as `VECTOR_LATENCY`; a matmul holds the array at least the next preload's N cycles); the merge
    needs the order, not the cycles."""
    if c.name == "mx_preload":
        return 0  # its N cycles are the weight port's: counted on the matmul after it
    if c.name in ("sync_push", "sync_pop"):
        return timing.sync_cycles(cfg)
    if c.unit in (Unit.load, Unit.store):
        rows, cols, dtype = c.args[3], c.args[4], c.args[5]
        return timing.dma_cycles(cfg, rows, cols * DType[dtype].size, 0)
    if c.name in MATMUL_ROWS:
        return max(timing.matmul_input_cycles(cfg, rows_of(c)), timing.preload_cycles(cfg))
    if c.name in DRAIN_ROWS:
        return timing.drain_cycles(cfg, rows_of(c), SPECS[c.name].latency)
    counts = [a for a in c.args[2:] if type(a) is int]  # v.* and vc.ld: the element count
    n = counts[0] if counts and c.name.startswith(("v_", "vc_ld")) else cfg.vector_lanes
    return timing.vector_cycles(cfg, n, VECTOR_LATENCY)


def merge(cfg: MachineConfig, streams: dict[Unit, list[Call]]) -> tuple[list[Call], int]:
    """One program order of the per-unit streams, and the cycles the model expects it to take: repeatedly the
    instruction expected to start first (a unit runs its stream in order; a pop starts once its push has
    finished; a matrix drain or push once the matmuls before it have their results). Every pop comes after its
    push."""
    at = {u: 0 for u in streams}
    cursor = {u: 0 for u in streams}
    pushed: dict[tuple, list[int]] = {}
    popped: dict[tuple, int] = {}
    results = 0  # when the matrix unit's issued matmuls have their results
    out: list[Call] = []
    total = sum(len(s) for s in streams.values())
    while len(out) < total:
        best = None
        for u in PRIORITY:
            if u not in streams or cursor[u] == len(streams[u]):
                continue
            c = streams[u][cursor[u]]
            start = at[u]
            if c.name == "sync_pop":
                done = pushed.get(c.args, [])
                if popped.get(c.args, 0) >= len(done):
                    continue
                start = max(start, done[popped.get(c.args, 0)])
            elif u is Unit.matrix and (c.name in DRAIN_ROWS or c.name == "sync_push"):
                start = max(start, results)
            if best is None or start < best[0]:
                best = (start, u, c)
        if best is None:
            raise CodegenError("the interleaved attention stages wait on each other (no token can be pushed)")
        start, u, c = best
        cursor[u] += 1
        at[u] = start + _cost(cfg, c)
        if c.name in MATMUL_ROWS:
            results = max(results, start + timing.matmul_cycles(cfg, rows_of(c)))
        if c.name == "sync_push":
            pushed.setdefault(c.args, []).append(start)
        elif c.name == "sync_pop":
            popped[c.args] = popped.get(c.args, 0) + 1
        out.append(c)
    return out, max([*at.values(), results])


def estimate(cfg: MachineConfig, calls: Sequence[Call]) -> int:
    """Cycles the model expects the program order to take with in-order issue: an instruction issues after the
    previous one (and the `li`s of its values) once its unit's queue has room (the instruction `queue_depth`
    earlier on that unit has started), and starts as `merge` has it."""
    issue, results = 0, 0
    at: dict[Unit, int] = {}
    started: dict[Unit, list[int]] = {}
    pushed: dict[tuple, list[int]] = {}
    popped: dict[tuple, int] = {}
    for c in calls:
        issue += 1 + sum(isinstance(a, Held) for a in c.args)
        queue = started.setdefault(c.unit, [])
        if len(queue) >= cfg.queue_depth:
            issue = max(issue, queue[-cfg.queue_depth])
        start = max(issue, at.get(c.unit, 0))
        if c.name == "sync_pop":
            k = popped.get(c.args, 0)
            if k >= len(pushed.get(c.args, [])):  # a pop before its push: this order cannot run (a head's loads
                return INF  # of K^T, waiting for its K's store, all issued before its compute)
            start = max(start, pushed[c.args][k])
            popped[c.args] = k + 1
        elif c.unit is Unit.matrix and (c.name in DRAIN_ROWS or c.name == "sync_push"):
            start = max(start, results)
        if c.name in MATMUL_ROWS:
            results = max(results, start + timing.matmul_cycles(cfg, rows_of(c)))
        if c.name == "sync_push":
            pushed.setdefault(c.args, []).append(start)
        queue.append(start)
        at[c.unit] = start + _cost(cfg, c)
    return max([*at.values(), results])


def replay(em: Emitter, calls: Sequence[Call]) -> None:
    """Emit the calls, each recorded value loaded into a register (re-using the emitter's earlier loads)."""
    for c in calls:
        getattr(em.b, c.name)(*(em.reg(int(a)) if isinstance(a, Held) else a for a in c.args))


INF = 1 << 62
HOISTABLE = ("mx_drain", "mx_drain_s", "ep_cfg", "sync_push", "sync_pop")


def _preload_reads(c: Call) -> tuple[int, int]:
    rs1, rows, cols, dtype = c.args
    return int(rs1), int(rs1) + rows * cols * DType[dtype].size


def _spad_writes(calls: Sequence[Call]) -> list[tuple[int, int] | None]:
    """Per instruction the scratchpad bytes [lo, hi) it may write (an over-estimate: widest elements; a chain
    store as many as its register was loaded with); None: none (an accumulator, registers, DRAM)."""
    held: dict[int, int] = {}  # vector register -> elements (a chain's length, from its load)
    out: list[tuple[int, int] | None] = []
    for c in calls:
        names = [o.field.name for o in SPECS[c.name].operands]
        w = None
        if c.name in LOADS:
            w = written(c)
        elif c.name == "mx_drain":
            rd, _, rows, cols = c.args
            w = int(rd), int(rd) + rows * cols * WIDEST
        elif c.name == "mx_drain_s":
            rd, _, stride, rows, cols = c.args
            w = int(rd), int(rd) + rows * int(stride) + cols * WIDEST
        elif c.name in ("vc_ld", "vc_lds"):
            held[c.args[0]] = c.args[names.index("n")]
        elif c.name == "vc_st":
            rd = int(c.args[0])
            w = rd, rd + held.get(c.args[1], INF) * WIDEST
        elif c.name.startswith("vc_"):
            held[c.args[0]] = held.get(c.args[1], INF)
        elif c.unit is Unit.vector and names and names[0] == "rd":
            rd = int(c.args[0])
            w = rd, rd + c.args[names.index("n")] * WIDEST if "n" in names else INF
        out.append(w)
    return out


def _tokens(calls: Sequence[Call]) -> tuple[dict[int, int], dict[tuple, list[int]]]:
    """Per pop's index the index of the push it takes; per (src, dst) the indices of its pushes."""
    pushes: dict[tuple, list[int]] = {}
    taken: dict[tuple, int] = {}
    match: dict[int, int] = {}
    for i, c in enumerate(calls):
        if c.name == "sync_push":
            pushes.setdefault(c.args, []).append(i)
        elif c.name == "sync_pop":
            k = taken.get(c.args, 0)
            match[i], taken[c.args] = pushes[c.args][k], k + 1
    return match, pushes


def _ordered_writes(calls: Sequence[Call], writes: list, pop: int, lo: int, hi: int, match: dict, pushes: dict) -> bool:
    """Whether the pop at index `pop` orders a write of bytes [lo, hi): one by its source unit since the push the
    previous pop of the same pair took, or (recursively) one ordered by a pop that unit made meanwhile (not the
    matrix unit's own: a preload starts after the drains before it)."""
    push = match[pop]
    pair = calls[pop].args
    if calls[push].unit is Unit.matrix:
        return False
    earlier = [i for i in pushes[pair] if i < push]
    start = earlier[-1] + 1 if earlier else 0
    src = calls[push].unit
    for i in range(start, push):
        c, w = calls[i], writes[i]
        if c.unit is not src:
            continue
        if w is not None and w[0] < hi and lo < w[1]:
            return True
        if c.name == "sync_pop" and _ordered_writes(calls, writes, i, lo, hi, match, pushes):
            return True
    return False


def hoist_preloads(calls: Sequence[Call]) -> list[Call]:
    """The order with each matrix preload that follows drains (and the configuration and tokens around them) moved
    in front of them, where the bytes it reads are not written by those drains: its N weight-port cycles then run
    under the last matmuls' latency, which the drains wait out anyway, instead of after the drains (which hold the
    whole unit). A crossed pop that waits for a write of those bytes moves with it, if its push comes earlier in
    the order (so the pop never waits on what the drains or the tokens after them release) and no other pop of
    its pair is crossed (pops of a pair take their tokens in order)."""
    out = list(calls)
    analysed = None  # (tokens, writes) of `out` as it is: recomputed only after a move
    i = 0
    while i < len(out):
        if out[i].name != "mx_preload" or not _after_hoistable(out, i):
            i += 1
            continue
        lo, hi = _preload_reads(out[i])
        if analysed is None:
            analysed = _tokens(out), _spad_writes(out)
        (match, pushes), writes = analysed
        to, carried, moved = i, [], []
        for j in range(i - 1, -1, -1):
            x = out[j]
            if x.unit is not Unit.matrix:
                continue
            w = writes[j]
            if x.name not in HOISTABLE or (w is not None and w[0] < hi and lo < w[1]):
                break
            if x.name == "sync_pop":
                if any(out[k].args == x.args for k in carried):
                    break
                if _ordered_writes(out, writes, j, lo, hi, match, pushes):
                    carried.append(j)
            if x.name.startswith("mx_drain") and all(match[k] < j for k in carried):
                to, moved = j, list(carried)
        if to < i:
            block = [out[k] for k in sorted(moved)] + [out[i]]
            rest = [c for k, c in enumerate(out) if k not in moved and k != i]
            out = rest[:to] + block + rest[to:]
            analysed = None
        i += 1
    return out


def _after_hoistable(calls: Sequence[Call], i: int) -> bool:
    """Whether the matrix unit's instruction before index `i` could be crossed (a drain, configuration or token)."""
    for j in range(i - 1, -1, -1):
        if calls[j].unit is Unit.matrix:
            return calls[j].name in HOISTABLE
    return False
