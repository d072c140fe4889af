"""Checked mode: find data races the program left unsynchronised, using vector clocks.

Each unit (scalar core included) has a vector clock. Every instruction ticks its unit's own entry;
a unit instruction also inherits the scalar core's clock at issue (issue order is real ordering);
`sync.pop` joins the clock its matching `sync.push` carried; `fence`/`halt` join all clocks. A shadow of
each memory keeps, per byte, the last writer (unit, epoch) and each unit's last read epoch. An access
races with an earlier one by another unit when that one's epoch is not covered by the accessing
instruction's clock and at least one of them writes; both instructions are reported.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from isa.enums import Unit
from simulator.errors import Fault

NUNITS = len(Unit)
Index = slice | np.ndarray


def epoch_dtype(max_cycles: int) -> np.dtype:
    """The narrowest type holding every epoch of a run (a unit's instruction count: each instruction issues in a
    cycle of its own, and the watchdog stops a run soon after `max_cycles`): int32 halves a checked run's shadow
    memory (NUNITS read epochs per DRAM byte)."""
    return np.dtype(np.int32 if max_cycles < 1 << 30 else np.int64)


class Shadow:
    """Per-byte access history of one memory; `growable` spaces (DRAM) grow to the highest byte touched."""

    def __init__(self, name: str, size: int, growable: bool, epochs: np.dtype) -> None:
        self.name = name
        self.growable = growable
        self.epochs = epochs
        self.writer = np.full(size, -1, dtype=np.int8)
        self.wepoch = np.zeros(size, dtype=epochs)
        self.reads = np.zeros((NUNITS, size), dtype=epochs)

    def ensure(self, end: int) -> None:
        size = self.writer.size
        if not self.growable or end <= size:
            return
        new = max(end, 2 * size, 4096)
        self.writer = np.concatenate([self.writer, np.full(new - size, -1, dtype=np.int8)])
        self.wepoch = np.concatenate([self.wepoch, np.zeros(new - size, dtype=self.epochs)])
        self.reads = np.concatenate([self.reads, np.zeros((NUNITS, new - size), dtype=self.epochs)], axis=1)

    def conflict(self, idx: Index, unit: int, clock: np.ndarray, write: bool) -> tuple[int, int, str, int] | None:
        """The first unordered earlier access (unit, epoch, 'writes'/'reads', byte offset), recording this one."""
        writers = self.writer[idx]
        epochs = self.wepoch[idx]
        others = (writers >= 0) & (writers != unit)
        if others.any():
            safe_writers = np.where(others, writers, 0)
            bad = others & (epochs > clock[safe_writers])
            if bad.any():
                j = int(np.argmax(bad))
                return int(writers[j]), int(epochs[j]), "writes", j
        if write:
            for other in range(NUNITS):
                if other != unit:
                    bad = self.reads[other][idx] > clock[other]
                    if bad.any():
                        j = int(np.argmax(bad))
                        return other, int(self.reads[other][idx][j]), "reads", j
            self.writer[idx] = unit
            self.wepoch[idx] = clock[unit]
        else:
            self.reads[unit][idx] = clock[unit]
        return None


class RaceChecker:
    def __init__(self, local_bytes: int, describe: Callable[[int], str], max_cycles: int) -> None:
        self.vc = np.zeros((NUNITS, NUNITS), dtype=np.int64)
        self.pcs: list[list[int]] = [[-1] for _ in range(NUNITS)]
        epochs = epoch_dtype(max_cycles)
        self.local = Shadow("local memory", local_bytes, growable=False, epochs=epochs)
        self.dram = Shadow("DRAM", 0, growable=True, epochs=epochs)
        self.describe = describe
        self.unit = 0
        self.pc = -1

    def begin(self, unit: int, pc: int) -> None:
        """A new instruction on `unit` (called before its accesses)."""
        vc = self.vc
        if unit != Unit.scalar:
            np.maximum(vc[unit], vc[Unit.scalar], out=vc[unit])
        vc[unit, unit] += 1
        self.pcs[unit].append(pc)
        self.unit, self.pc = unit, pc

    def token(self, src: int) -> np.ndarray:
        return self.vc[src].copy()

    def join(self, dst: int, clock: np.ndarray) -> None:
        np.maximum(self.vc[dst], clock, out=self.vc[dst])

    def fence(self) -> None:
        self.vc[:] = self.vc.max(axis=0)

    def access(self, shadow: Shadow, idx: Index, first_byte: int, write: bool) -> None:
        if isinstance(idx, slice):
            shadow.ensure(idx.stop)
        else:
            shadow.ensure(int(idx.max()) + 1 if idx.size else 0)
        found = shadow.conflict(idx, self.unit, self.vc[self.unit], write)
        if found is None:
            return
        other, epoch, how, j = found
        other_pc = self.pcs[other][epoch]
        verb = "writes" if write else "reads"
        raise Fault(
            f"data race on {shadow.name} (byte {first_byte + j if isinstance(idx, slice) else int(idx[j])}): "
            f"{Unit(self.unit).name} unit {verb} it here while '{self.describe(other_pc)}' (pc {other_pc}, "
            f"{Unit(other).name} unit) {how} it, and no sync token or fence orders the two"
        )
