"""Instruction emission for one kernel: a register cache for constants, view DMAs, and the double-buffered
token pipeline every kernel generator runs its tiles through.

Pipeline protocol (per step s, buffers of parity s % 2): the step's segments run on their units in order
(load -> compute units -> store); consecutive segments on different units hand over with
`sync.push a, b` / `sync.pop a, b`. Before step s reuses the buffers of step s - 2, its first unit waits for a
credit the last unit of step s - 2 pushed, so every access of step s is ordered after every access of step
s - 2, while step s - 1 (other parity, other banks) overlaps. Every pop follows its push in program order, so
the in-order issue never deadlocks; the last credits are popped before the kernel's closing fence.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from assembler.builder import ProgramBuilder
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

    def reg(self, value: int) -> int:
        value &= 0xFFFFFFFF
        if value == 0:
            return 0
        if value in self._regs:
            self._regs.move_to_end(value)
            return self._regs[value]
        if len(self._regs) < len(SCRATCH_REGS):
            r = SCRATCH_REGS[len(self._regs)]
        else:
            _, r = self._regs.popitem(last=False)
        self._regs[value] = r
        self.b.li(r, value)
        return r

    def regs(self, *values: int) -> tuple[int, ...]:
        """Registers for several values at once (none evicts another of the same call)."""
        out = tuple(self.reg(v) for v in values)
        if len(set(v & 0xFFFFFFFF for v in values)) == len(set(out)) or 0 in out:
            return out
        raise AssertionError("register cache evicted a value it just loaded")

    def f32(self, value: float) -> int:
        return self.reg(f32_bits(value))

    def dma_load(self, view: View, local: int) -> None:
        for t in transfers(view):
            self._dma(self.b.dma_ld, local, t, view.dtype)

    def dma_store(self, local: int, view: View) -> None:
        for t in transfers(view):
            self._dma(self.b.dma_st, local, t, view.dtype)

    def _dma(self, op: Callable, local: int, t: Transfer, dtype: DType) -> None:
        loc, dram, stride = self.regs(local + t.local * dtype.size, t.dram, t.stride)
        if op == self.b.dma_ld:
            op(loc, dram, stride, t.rows, t.cols, dtype.name)
        else:
            op(dram, loc, stride, t.rows, t.cols, dtype.name)

    def push(self, src: Unit, dst: Unit) -> None:
        self.b.sync_push(UNIT_NAME[src], UNIT_NAME[dst])

    def pop(self, src: Unit, dst: Unit) -> None:
        self.b.sync_pop(UNIT_NAME[src], UNIT_NAME[dst])


Emit = Callable[[Emitter], None]


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


def run_pipeline(em: Emitter, steps: Sequence[Step], depth: int = 2) -> None:
    """Emit the steps with the token protocol of the module docstring (`depth` buffer sets in rotation).

    The credit of step s goes from its last unit to the first unit of step s + depth, and only if that step
    exists, so no token is left over when the kernel ends."""
    plans = [segs for segs in (step.segments() for step in steps) if segs]
    for s, segs in enumerate(plans):
        if s >= depth and plans[s - depth][-1][0] != segs[0][0]:
            em.pop(plans[s - depth][-1][0], segs[0][0])
        prev = None
        for unit, emit in segs:
            if prev is not None and prev != unit:
                em.push(prev, unit)
                em.pop(prev, unit)
            emit(em)
            prev = unit
        if s + depth < len(plans) and plans[s + depth][0][0] != segs[-1][0]:
            em.push(segs[-1][0], plans[s + depth][0][0])
