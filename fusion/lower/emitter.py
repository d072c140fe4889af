"""Instruction emission for one kernel: a register cache for constants, view DMAs, and the multi-buffered
token pipeline every kernel generator runs its tiles through.

Pipeline protocol (step s uses buffer slot s % DEPTH): the step's segments run on their units in order
(load -> compute units -> store); consecutive segments on different units hand over with
`sync.push a, b` / `sync.pop a, b`. Before step s reuses the buffers of step s - DEPTH, its first unit waits
for a credit the last unit of that step pushed, so every access of step s is ordered after every access of
step s - DEPTH (vector clocks are transitive along the hand-over chain), while the steps in between, in other
slots, overlap. Every pop follows its push in program order, so the in-order issue never deadlocks, and a
credit is only pushed when a step will pop it, so no token outlives the kernel.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from assembler.builder import ProgramBuilder
from fusion.lower.local_alloc import DEPTH
from fusion.lower.views import Transfer, View, transfers
from isa.enums import DType, Unit

SCRATCH_REGS = tuple(range(1, 32))
UNIT_NAME = {Unit.load: "ld", Unit.matrix: "mx", Unit.vector: "vx", Unit.store: "st", Unit.scalar: "sc"}


def f32_bits(value: float) -> int:
    """The bit pattern of float32(value) as an unsigned 32-bit int (a `li` immediate)."""
    return struct.unpack("<I", struct.pack("<f", float(value)))[0]


class Emitter:
    """Wraps a ProgramBuilder; `reg(v)` gives a register holding the 32-bit value v (re-using earlier `li`s)."""

    def __init__(self, builder: ProgramBuilder) -> None:
        self.b = builder
        self._regs: OrderedDict[int, int] = OrderedDict()  # value -> register, least recently used first
        self._labels = 0  # local labels made so far (`local_label`)

    def reg(self, value: int) -> int:
        held = self._regs
        r = held.get(value)  # (a held value is already a nonzero 32-bit one)
        if r is not None:
            held.move_to_end(value)
            return r
        value &= 0xFFFFFFFF
        if value == 0:
            return 0
        r = held.get(value)
        if r is not None:
            held.move_to_end(value)
            return r
        if len(held) < len(SCRATCH_REGS):
            r = SCRATCH_REGS[len(held)]
        else:
            _, r = held.popitem(last=False)
        held[value] = r
        self.b.li(r, value)
        return r

    def local_label(self, prefix: str) -> str:
        """A new local label (`.L`, not kept in the binary), unique in this program: numbered by this emitter, so
        a program's text depends only on what was emitted into it, not on other programs built before."""
        self._labels += 1
        return f".L{prefix}{self._labels}"

    def regs(self, *values: int) -> tuple[int, ...]:
        """Registers for a few values at once (least-recently-used eviction over 31 registers never evicts a
        value of the same call). A held value is found here without a `reg` call (a kernel asks millions)."""
        held, out = self._regs, []
        for value in values:
            r = held.get(value)
            if r is None:
                r = self.reg(value)
            else:
                held.move_to_end(value)
            out.append(r)
        return tuple(out)

    def dma_load(self, view: View, local: int) -> None:
        for t in transfers(view):
            loc, dram, stride = self._operands(local, t, view.dtype)
            self.b.dma_ld(loc, dram, stride, t.rows, t.cols, view.dtype.name)

    def dma_store(self, local: int, view: View) -> None:
        for t in transfers(view):
            loc, dram, stride = self._operands(local, t, view.dtype)
            self.b.dma_st(dram, loc, stride, t.rows, t.cols, view.dtype.name)

    def _operands(self, local: int, t: Transfer, dtype: DType) -> tuple[int, ...]:
        return self.regs(local + t.local * dtype.size, t.dram, t.stride)

    def push(self, src: Unit, dst: Unit) -> None:
        self.b.sync_push(UNIT_NAME[src], UNIT_NAME[dst])

    def pop(self, src: Unit, dst: Unit) -> None:
        self.b.sync_pop(UNIT_NAME[src], UNIT_NAME[dst])


Emit = Callable[[Emitter], None]


@dataclass(frozen=True)
class Streamed:
    """A compute segment that takes the previous segment's results through the matrix -> vector stream FIFO as
    they are produced (`vc.lds` after `mx.mms`): it does not wait for the previous unit to finish (the FIFO
    orders the data), only for the step's loads; the previous unit's completion is handed to the step's last
    unit instead, so the buffer credit still covers every access of the step."""

    emit: Emit

    def __call__(self, em: Emitter) -> None:
        self.emit(em)


@dataclass
class Step:
    """One tile's work: DRAM views loaded to local addresses, compute segments (unit, emit), stores."""

    loads: list[tuple[View, int]] = field(default_factory=list)
    compute: list[tuple[Unit, Emit]] = field(default_factory=list)
    stores: list[tuple[int, View]] = field(default_factory=list)

    def segments(self) -> list[tuple[Unit, Emit]]:
        segs: list[tuple[Unit, Emit]] = []
        if self.loads:
            segs.append((Unit.load, lambda em: [em.dma_load(v, a) for v, a in self.loads]))
        segs.extend(self.compute)
        if self.stores:
            segs.append((Unit.store, lambda em: [em.dma_store(a, v) for a, v in self.stores]))
        return segs


def run_pipeline(em: Emitter, steps: Sequence[Step], depth: int = DEPTH) -> None:
    """Emit the steps with the token protocol of the module docstring (`depth` buffer sets in rotation).

    Software pipelining: the loads of step s + 1 are issued before the compute of step s, so a compute queue
    waiting for its data never blocks the in-order issue of the next loads. The credit of step s goes from
    its last unit to the first unit of step s + depth, and only if that step exists, so no token is left
    over when the kernel ends."""
    plans = [segs for segs in (step.segments() for step in steps) if segs]
    heads = [_head(em, plans, s, depth) for s in range(len(plans))]
    if heads:
        heads[0]()
    for s in range(len(plans)):
        if s + 1 < len(plans):
            heads[s + 1]()
        _rest(em, plans, s, depth)


def _credit_pop(em: Emitter, plans: list, s: int, depth: int) -> None:
    if s >= depth and plans[s - depth][-1][0] != plans[s][0][0]:
        em.pop(plans[s - depth][-1][0], plans[s][0][0])


def _head(em: Emitter, plans: list, s: int, depth: int) -> Callable[[], None]:
    """The step's load segment (with its credit wait and hand-over push), emitted ahead of the previous
    step's compute; a no-op for a step that does not start with loads."""
    segs = plans[s]

    def emit() -> None:
        if segs[0][0] is not Unit.load:
            return
        _credit_pop(em, plans, s, depth)
        segs[0][1](em)
        if len(segs) > 1 and segs[1][0] is not Unit.load:
            em.push(Unit.load, segs[1][0])
        for i in _streamed(segs):  # its own hand-over from the loads (it skips the previous unit's)
            em.push(Unit.load, segs[i][0])

    return emit


def _streamed(segs: list) -> list[int]:
    """Indices of Streamed segments that skip their hand-over: after a compute unit other than their own, and
    before a different last unit that can take the producer's completion instead."""
    last = segs[-1][0]
    return [
        i
        for i in range(1, len(segs) - 1)
        if isinstance(segs[i][1], Streamed)
        and segs[i - 1][0] not in (Unit.load, segs[i][0], last)
        and segs[i][0] != last
    ]


def _rest(em: Emitter, plans: list, s: int, depth: int) -> None:
    segs, prev, pushed = plans[s], None, False
    streamed = set(_streamed(segs))
    loaded = segs[0][0] is Unit.load
    last = segs[-1][0]
    deferred: list[Unit] = []  # producers whose completion the last unit waits for (see Streamed)
    first = 1 if loaded else 0
    if loaded:  # emitted by _head, which also pushed the hand-over tokens
        prev, pushed = Unit.load, True
    else:
        _credit_pop(em, plans, s, depth)
    for i in range(first, len(segs)):
        unit, emit = segs[i]
        if i in streamed:
            em.push(prev, last)
            deferred.append(prev)
            if loaded:
                em.pop(Unit.load, unit)
        elif prev is not None and prev != unit:
            if not pushed:
                em.push(prev, unit)
            em.pop(prev, unit)
        if i == len(segs) - 1:
            for producer in deferred:
                em.pop(producer, last)
        pushed = False
        emit(em)
        prev = unit
    if s + depth < len(plans) and plans[s + depth][0][0] != last:
        em.push(last, plans[s + depth][0][0])
