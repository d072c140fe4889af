"""Two planned groups whose data flows producer -> consumer as ONE program, without a fence between them.

Separately, each group is its own program ending in a fence, so the consumer's first loads (a DMA is ~100
cycles) start only once the producer has finished. Here the consumer's phase follows the producer's last phase
directly: the consumer's loads that do not read the producer's output (its constant weights, inputs from
elsewhere; those up to the first step with a dependent load, into slots no producer step uses, right after the
producer's last loads) are issued while the producer still computes and stores. Ordering, by sync tokens
`st -> ld` pushed after the stores of the producer's last `DEPTH` steps (the store queue runs in order and every
producer step ends with its store, so a token says "every producer step up to this one is done"):

- local memory: the consumer is generated with `LowerContext.rotation` n, so its step j uses the buffer slot the
  producer's step n + j would have; its step j waits (pops) only for the last producer step whose tiles share a
  slot with its own (found from the steps' local addresses; a step whose addresses are unknown shares all);
- DRAM: before the consumer's first load that reads bytes the producer writes, every remaining token is popped,
  so those loads follow all of the producer's stores (a store -> load dependency only where DRAM data flows).

Both programs' values live in one DRAM image (`plan_dram`, whole program), so no buffer of one is reused by the
other. `order_dram=False` leaves out the DRAM dependency (the test proving the checked mode needs it).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from assembler.builder import ProgramBuilder
from fusion.engine.context import ModelContext
from fusion.engine.errors import CodegenError
from fusion.engine.kernel import Kernel, dram_forms, expected_guard, group_phases, identifier, link_program
from fusion.engine.plan import Group
from fusion.engine.strategies import REGISTRY, strategy_of
from fusion.lower import emit_phases, plan_dram
from fusion.lower.context import LowerContext
from fusion.lower.emitter import Emitter, Step, run_pipeline
from fusion.lower.local_alloc import DEPTH, slot
from fusion.lower.views import View, transfers
from isa.enums import Unit
from isa.memory_map import LOCAL_ACC_BASE
from simulator.config import MachineConfig

NOT_PIPELINED = frozenset(name for name, s in REGISTRY.items() if not s.pipelinable)  # `Strategy.pipelinable`
SPARE = DEPTH + 1  # the scratchpad banks no slot uses (`TileArena.spare`): a GEMM's A read by all of its steps
ALL_SLOTS = frozenset(range(SPARE + 1))  # index DEPTH: other local bytes outside the slots, shared with everything


def build_pipelined(mc: ModelContext, producer: Group, consumer: Group, order_dram: bool = True) -> Kernel:
    """The pair as one program (a cacheable kernel: `group` = producer, `pipelined_with` = consumer). Raises
    CodegenError when the pair cannot be pipelined (no data flow, an alias or zero-skip group, a producer step
    that does not end with a store, a consumer step that does not start with loads)."""
    start = time.perf_counter()
    for g in (producer, consumer):
        if not strategy_of(g).pipelinable:
            raise CodegenError(f"a {g.strategy} group is not pipelined")
    sub_p, sub_c = mc.subgraph(producer.nodes), mc.subgraph(consumer.nodes)
    flows = set(sub_p.outputs) & set(sub_c.inputs)
    if not flows:
        raise CodegenError(f"no value of {producer.nodes} flows into {consumer.nodes}")
    nodes = mc.graph.in_order((*producer.nodes, *consumer.nodes))
    sub = mc.subgraph(nodes)
    forms, scratch = dram_forms(mc, sub_p, producer)
    more_forms, more_scratch = dram_forms(mc, sub_c, consumer)
    data, addresses, _ = plan_dram(
        sub, mc.qplan, mc.config, {**forms, **more_forms}, whole_program=True, scratch={**scratch, **more_scratch}
    )
    cx_p = LowerContext(sub_p, mc.config, mc.qplan, mc.params, addresses)
    rc = mc.allow_rounding_change
    p_phases = group_phases(cx_p, sub_p.nodes, producer, rc)
    n_last = len([s for s in p_phases[-1] if s.segments()])
    cx_c = LowerContext(sub_c, mc.config, mc.qplan, mc.params, addresses, rotation=n_last % DEPTH)
    c_phases = group_phases(cx_c, sub_c.nodes, consumer, rc)
    written = [_extent(cx_p.view(v)) for v in sub_p.outputs]
    joint = join_phases(mc.config, list(p_phases[-1]), list(c_phases[0]), written, order_dram)
    guard = expected_guard(mc, sub, producer, "any")

    def body(b: ProgramBuilder, em: Emitter, _: LowerContext) -> None:
        emit_phases(b, em, p_phases[:-1])
        for steps in joint:
            run_pipeline(em, steps)
        b.fence()
        emit_phases(b, em, c_phases[1:])

    name = identifier(f"pipelined_{producer.nodes[0]}_{consumer.nodes[0]}")
    strategy = (f"{producer.strategy}+{consumer.strategy}", pair_schedule(producer, consumer))
    program, names = link_program(mc, sub, guard, (data, addresses), name, strategy, body)
    seconds = time.perf_counter() - start
    return Kernel(producer, program, sub.inputs, sub.outputs, guard, seconds, names, pipelined_with=consumer)


def pair_schedule(producer: Group, consumer: Group) -> str:
    """The pair's schedule string (part of its cache key)."""
    return f"{producer.schedule}|pipelined|{consumer.schedule}"


def join_phases(
    cfg: MachineConfig,
    producer: list[Step],
    consumer: list[Step],
    written: Sequence[tuple[int, int]],
    order_dram: bool = True,
) -> tuple[list[Step], list[Step]]:
    """The producer's last phase and the consumer's first, rewritten with the tokens of the module docstring
    (emitted one after the other with no fence between). `written`: DRAM byte ranges [lo, hi) the producer
    stores."""
    producer = [s for s in producer if s.segments()]
    consumer = [s for s in consumer if s.segments()]
    if not producer or not consumer:
        raise CodegenError("an empty phase has nothing to overlap")
    if any(s.segments()[-1][0] is not Unit.store for s in producer):
        raise CodegenError("a producer step does not end with a store: its completion cannot be signalled in order")
    n = len(producer)
    window = list(range(max(0, n - DEPTH), n))  # producer steps that push a token, in store-queue order
    head = consumer[: min(DEPTH, len(consumer))]
    if any(s.segments()[0][0] is not Unit.load for s in head):
        raise CodegenError("a consumer step does not start with loads")
    p_slots = [step_slots(cfg, s) for s in producer]
    needed = [_tokens_needed(p_slots, step_slots(cfg, s), window) for s in head]
    dependent = [j for j, s in enumerate(head) if _reads(s, written)]
    drain_at = (dependent[0] if dependent else len(head) - 1) if order_dram else None
    pushes = len(window) if order_dram else max(needed)
    joined_p = [_with_push(s) if t in window[:pushes] else s for t, s in enumerate(producer)]
    # free loads (up to the drain's step) into slots no producer step uses are issued right after the producer's
    # last loads: in program order before its compute, so a full vector or matrix queue does not hold them back.
    # A later step's loads never move before an earlier step's dependent ones (that would delay the consumer's
    # first compute once the producer is done)
    last = len(head) - 1 if drain_at is None else drain_at
    early = [ld for j in range(last + 1) if needed[j] == 0 for ld in _split(head[j], written)[0]]
    joined_c, popped = [], 0
    for j, step in enumerate(head):
        free, bound = _split(step, written)
        wait = max(0, needed[j] - popped)
        drain = pushes - popped - wait if j == drain_at else 0
        joined_c.append(_with_pops(step, wait, [] if j <= last and needed[j] == 0 else free, drain, bound))
        popped += wait + drain
    if popped != pushes:
        raise CodegenError(f"token imbalance: {pushes} pushed, {popped} popped")  # guards the protocol itself
    return joined_p + ([Step(loads=early)] if early else []), joined_c + consumer[len(head) :]


def _tokens_needed(p_slots: list[frozenset[int]], mine: frozenset[int], window: list[int]) -> int:
    """How many window tokens (cumulative, in store order) a consumer step must have popped before its loads: up
    to the last producer step sharing a slot with it (0 when none does)."""
    if SPARE in mine and any(SPARE in s for s in p_slots):
        return len(window)  # the producer's spare-bank tile is read by all of its steps, not only the one loading it
    shared = [t for t, s in enumerate(p_slots) if s & mine or DEPTH in s or DEPTH in mine]
    if not shared:
        return 0
    return max(1, sum(1 for t in window if t <= shared[-1]))


def step_slots(cfg: MachineConfig, step: Step) -> frozenset[int]:
    """Buffer slots a step's tiles lie in (from its load and store local addresses; all when it has none)."""
    addrs = [a for _, a in step.loads] + [a for a, _ in step.stores]
    if not addrs:
        return ALL_SLOTS
    spad = slot(cfg.spad_bytes, cfg.spad_banks, 0).size
    acc = slot(cfg.acc_bytes, cfg.acc_banks, 0, LOCAL_ACC_BASE).size
    found = {
        (SPARE if a // spad >= DEPTH else a // spad) if a < LOCAL_ACC_BASE else min(DEPTH, (a - LOCAL_ACC_BASE) // acc)
        for a in addrs
    }
    return ALL_SLOTS if DEPTH in found else frozenset(found)


def _extent(view: View) -> tuple[int, int]:
    """DRAM bytes [lo, hi) a view covers."""
    spans = [(t.dram, t.dram + (t.rows - 1) * t.stride + t.cols * view.dtype.size) for t in transfers(view)]
    return min(lo for lo, _ in spans), max(hi for _, hi in spans)


def _overlaps(view: View, ranges: Sequence[tuple[int, int]]) -> bool:
    lo, hi = _extent(view)
    return any(lo < r_hi and r_lo < hi for r_lo, r_hi in ranges)


def _reads(step: Step, written: Sequence[tuple[int, int]]) -> bool:
    """Whether a step's loads read producer-written bytes (a load segment the step does not describe as data
    counts as reading them)."""
    if not step.loads:
        return True
    return any(_overlaps(v, written) for v, _ in step.loads)


def _with_push(step: Step) -> Step:
    """The step with a `st -> ld` token pushed after its stores."""
    return Step(compute=[*step.segments(), (Unit.store, lambda em: em.push(Unit.store, Unit.load))])


def _split(step: Step, written: Sequence[tuple[int, int]]) -> tuple[list, list]:
    """A step's loads as (those not reading producer-written bytes, those that do)."""
    free = [(v, a) for v, a in step.loads if not _overlaps(v, written)]
    return free, [(v, a) for v, a in step.loads if _overlaps(v, written)]


def _with_pops(step: Step, wait: int, free: list, drain: int, bound: list) -> Step:
    """The step with its load segment replaced: pop `wait` tokens, load `free` (its loads not reading producer
    bytes and not issued early), pop `drain` more, load `bound` (a load segment the step does not describe as data
    runs here)."""
    segs = step.segments()
    first = segs[0][1]

    def emit(em: Emitter) -> None:
        for _ in range(wait):
            em.pop(Unit.store, Unit.load)
        for v, a in free:
            em.dma_load(v, a)
        for _ in range(drain):
            em.pop(Unit.store, Unit.load)
        if step.loads:
            for v, a in bound:
                em.dma_load(v, a)
        else:
            first(em)

    return Step(compute=[(Unit.load, emit), *segs[1:]])
