"""Instruction emission for one kernel: a register cache for constants, view DMAs, and the multi-buffered
token pipeline every kernel generator runs its tiles through.

Pipeline protocol (step s uses buffer slot s % DEPTH): the step's segments run on their units in order
(load -> compute units -> store); consecutive segments on different units hand over with
`sync.push a, b` / `sync.pop a, b`. Before step s reuses the buffers of step s - DEPTH, its first unit waits
for a credit the last unit of that step pushed, so every access of step s is ordered after every access of
step s - DEPTH (vector clocks are transitive along the hand-over chain), while the steps in between, in other
slots, overlap. Every pop follows its push in program order, so the in-order issue never deadlocks, and a
credit is only pushed when a step will pop it, so no token outlives the kernel. A queue's k-th pop takes its k-th
push: the pipeline is planned as a list of actions first and a credit another hand-over on its queue would take
is pushed later, just before its own pop (`_matched`).
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from assembler.builder import ProgramBuilder
from fusion.lower.errors import LoweringError
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
        self._li = builder.emitter("li")  # (a kernel loads hundreds of thousands of constants)
        self._emitters: dict[str, Callable[..., None]] = {"li": self._li}  # builder method -> `emitter`
        # value -> register, least recently used first (a `claim`ed register: ("claimed", register) -> register);
        # a plain dict, a use moving its value to the end by `pop` and re-insertion: cheaper than an OrderedDict's
        # `move_to_end` and `get` (a kernel asks millions of values)
        self._regs: dict[int | tuple[str, int], int] = {}
        self._labels = 0  # local labels made so far (`local_label`)

    def reg(self, value: int) -> int:
        held = self._regs
        r = held.pop(value, None)  # (a held value is already a nonzero 32-bit one)
        if r is None:
            return self._load(value)
        held[value] = r
        return r

    def _load(self, value: int) -> int:
        """A register for a value not held as given: held as its 32-bit pattern, or loaded with `li`."""
        held = self._regs
        if not 0 < value <= 0xFFFFFFFF:
            value &= 0xFFFFFFFF
            if value == 0:
                return 0
            r = held.pop(value, None)
            if r is not None:
                held[value] = r
                return r
        # (`_free` inlined: nearly every load evicts)
        r = SCRATCH_REGS[len(held)] if len(held) < len(SCRATCH_REGS) else held.pop(next(iter(held)))
        held[value] = r
        self._li(r, value)
        return r

    def _free(self) -> int:
        """A register for a new value: an unused one, else the least recently used one's (evicted)."""
        held = self._regs
        return SCRATCH_REGS[len(held)] if len(held) < len(SCRATCH_REGS) else held.pop(next(iter(held)))

    def claim(self, value: int) -> int:
        """A register of the caller's own, set to `value`, that it may change (step it with `addi` in a hardware
        loop): no `reg` hands it out for a value; it is evicted, least recently used, as a cached one."""
        r = self._free()
        self._regs[("claimed", r)] = r
        self._li(r, value & 0xFFFFFFFF)
        return r

    def emitter(self, method: str) -> Callable[..., None]:
        """The builder's `emitter` of builder method `method` (positional operands in field order), one per
        kernel: for a generator's hot loop (`matmul_loops`), whose instructions are then all located here."""
        emit = self._emitters.get(method)
        if emit is None:
            emit = self._emitters[method] = self.b.emitter(method)
        return emit

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
            r = held.pop(value, None)
            if r is None:
                r = self._load(value)
            else:
                held[value] = r
            out.append(r)
        return tuple(out)

    def dma_load(self, view: View, local: int) -> None:
        dma_ld, dtype = self.emitter("dma_ld"), view.dtype
        for t in transfers(view):
            loc, dram, stride = self._operands(local, t, dtype)
            dma_ld(loc, dram, stride, t.rows, t.cols, dtype.name)

    def dma_store(self, local: int, view: View) -> None:
        dma_st, dtype = self.emitter("dma_st"), view.dtype
        for t in transfers(view):
            loc, dram, stride = self._operands(local, t, dtype)
            dma_st(dram, loc, stride, t.rows, t.cols, dtype.name)

    def _operands(self, local: int, t: Transfer, dtype: DType) -> tuple[int, ...]:
        return self.regs(local + t.local * dtype.size, t.dram, t.stride)

    def push(self, src: Unit, dst: Unit) -> None:
        self.emitter("sync_push")(UNIT_NAME[src], UNIT_NAME[dst])

    def pop(self, src: Unit, dst: Unit) -> None:
        self.emitter("sync_pop")(UNIT_NAME[src], UNIT_NAME[dst])


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
    push, pop = em.emitter("sync_push"), em.emitter("sync_pop")  # (a kernel's tokens: tens of thousands)
    for action in _matched(_actions([[unit for unit, _ in segs] for segs in plans], _streamed_sets(plans), depth)):
        if type(action) is Token:
            (push if action.push else pop)(UNIT_NAME[action.src], UNIT_NAME[action.dst])
        else:
            s, i = action
            plans[s][i][1](em)


class Token(NamedTuple):
    """A `sync.push` or `sync.pop` of the pipeline; `key` names the hand-over or credit, the same for the push
    and the pop meant to take it. (A named tuple: a kernel's pipeline plans tens of thousands, and a frozen
    dataclass's `__init__` costs several times a tuple's.)"""

    push: bool
    src: Unit
    dst: Unit
    key: tuple[str, int, int]


Action = tuple[int, int] | Token  # (step, segment): emit that segment; or a token


def _streamed_sets(plans: list) -> list[set[int]]:
    return [set(_streamed(segs)) for segs in plans]


def _actions(units: list[list[Unit]], streamed: list[set[int]], depth: int) -> list[Action]:
    """The pipeline in program order: each step's loads (its head) ahead of the previous step's compute."""
    out: list[Action] = []
    if units:
        out += _head(units, streamed, 0, depth)
    for s in range(len(units)):
        if s + 1 < len(units):
            out += _head(units, streamed, s + 1, depth)
        out += _rest(units, streamed, s, depth)
    return out


def _credit_pop(units: list[list[Unit]], s: int, depth: int) -> list[Token]:
    if s >= depth and units[s - depth][-1] != units[s][0]:
        return [Token(False, units[s - depth][-1], units[s][0], ("credit", s, 0))]
    return []


def _head(units: list[list[Unit]], streamed: list[set[int]], s: int, depth: int) -> list[Action]:
    """The step's load segment with its credit wait and hand-over pushes; nothing for a step that does not start
    with loads."""
    segs = units[s]
    if segs[0] is not Unit.load:
        return []
    out: list[Action] = [*_credit_pop(units, s, depth), (s, 0)]
    if len(segs) > 1 and segs[1] is not Unit.load:
        out.append(Token(True, Unit.load, segs[1], ("hand", s, 1)))
    for i in sorted(streamed[s]):  # its own hand-over from the loads (it skips the previous unit's)
        out.append(Token(True, Unit.load, segs[i], ("stream", s, i)))
    return out


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


def _rest(units: list[list[Unit]], streamed: list[set[int]], s: int, depth: int) -> list[Action]:
    segs = units[s]
    loaded = segs[0] is Unit.load
    last = segs[-1]
    out: list[Action] = [] if loaded else [*_credit_pop(units, s, depth)]
    prev, pushed = (Unit.load, True) if loaded else (None, False)  # _head pushed the loads' hand-over tokens
    deferred: list[tuple[Unit, int]] = []  # producers whose completion the last unit waits for (see Streamed)
    for i in range(1 if loaded else 0, len(segs)):
        unit = segs[i]
        if i in streamed[s]:
            out.append(Token(True, prev, last, ("defer", s, i)))
            deferred.append((prev, i))
            if loaded:
                out.append(Token(False, Unit.load, unit, ("stream", s, i)))
        elif prev is not None and prev != unit:
            if not pushed:
                out.append(Token(True, prev, unit, ("hand", s, i)))
            out.append(Token(False, prev, unit, ("hand", s, i)))
        if i == len(segs) - 1:
            out += [Token(False, producer, last, ("defer", s, j)) for producer, j in deferred]
        pushed = False
        out.append((s, i))
        prev = unit
    if s + depth < len(units) and units[s + depth][0] != last:
        out.append(Token(True, last, units[s + depth][0], ("credit", s + depth, 0)))
    return out


def _matched(actions: list[Action]) -> list[Action]:
    """The actions with every pop taking the push meant for it. A queue (src, dst) is FIFO: its k-th pop takes its
    k-th push, whatever the push was for. A credit pushed at the end of step s and popped by step s + depth is
    taken by the wrong pop when a step in between hands over on the same queue (a step whose last unit is a
    compute unit, e.g. matrix -> vector): that pop would take the credit and run unordered. Such a credit is
    pushed just before its own pop instead (later, so still after every access of its step)."""
    for _ in range(len(actions) + 1):
        stolen = _first_stolen(actions)
        if stolen is None:
            return actions
        if stolen.key[0] != "credit":
            raise LoweringError(f"pipeline tokens: {stolen.key} would be taken by another pop (a generator bug)")
        actions = [a for a in actions if a != stolen]
        pop = next(k for k, a in enumerate(actions) if isinstance(a, Token) and not a.push and a.key == stolen.key)
        actions.insert(pop, stolen)
    raise LoweringError("pipeline tokens: credits could not be ordered")


def _first_stolen(actions: list[Action]) -> Token | None:
    """The first push whose token a pop meant for another push would take, or None."""
    queues: dict[tuple[Unit, Unit], deque[Token]] = {}
    for a in actions:
        if not isinstance(a, Token):
            continue
        queue = queues.setdefault((a.src, a.dst), deque())
        if a.push:
            queue.append(a)
        elif not queue or queue[0].key != a.key:
            if not queue:
                raise LoweringError(f"pipeline tokens: {a.key} popped before any push (a generator bug)")
            return queue[0]
        else:
            queue.popleft()
    return None
