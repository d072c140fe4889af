"""Scratchpad and accumulator placement for one pipeline step's tiles.

Multi-buffering splits each memory into DEPTH equal slots (whole banks when the bank count allows):
step s uses slot s % DEPTH, so the DMA filling one step's tiles works beside the compute units reading
another step's and the store draining a third. With three slots a step's load waits only for the store of
the step three back, so loading, computing and storing overlap instead of alternating.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from fusion.lower.errors import MemoryPlanError
from isa.memory_map import LOCAL_ACC_BASE
from simulator.config import MachineConfig

ALIGN = 64


def aligned(nbytes: int) -> int:
    """Bytes a tile of `nbytes` takes in local memory (every tile starts ALIGN-aligned)."""
    return -(-nbytes // ALIGN) * ALIGN


DEPTH = 3


@dataclass(frozen=True)
class Slot:
    """One buffer set's share of a memory: [base, base + size) in local addresses."""

    base: int
    size: int


@cache  # (a pure function of a few ints: planning makes tens of thousands of arenas, each asking two)
def slot(total: int, banks: int, index: int, base: int = 0, rotation: int = 0) -> Slot:
    """Step (or block) `index`'s slot: (index + rotation) % DEPTH. A generator whose steps follow another
    program's `rotation` steps in one pipeline (`fusion.engine.pipelined`; `LowerContext.rotation`) then starts in
    the slot the other's next step would use, so its first steps' tiles do not share bytes with the other's last."""
    bank = total // banks
    size = (banks // DEPTH) * bank if banks >= DEPTH else total // DEPTH // ALIGN * ALIGN
    return Slot(base + ((index + rotation) % DEPTH) * size, size)


class TileArena:
    """Bump allocation of tiles in the scratchpad and accumulator slots of step (or block) `index`, the slots
    rotated by `rotation` (see `slot`)."""

    def __init__(self, cfg: MachineConfig, index: int, rotation: int = 0) -> None:
        self.spad = slot(cfg.spad_bytes, cfg.spad_banks, index, rotation=rotation)
        self.acc = slot(cfg.acc_bytes, cfg.acc_banks, index, LOCAL_ACC_BASE, rotation)
        self._spad_used = 0
        self._acc_used = 0

    @classmethod
    def spare(cls, cfg: MachineConfig) -> TileArena | None:
        """The scratchpad banks no slot uses (4 banks, 3 slots: the last bank), as one arena: a tile every step
        reads (a GEMM's A for all its weight panels) placed there is never in a bank that a later step's DMA
        fills. None when the slots take every byte. No accumulator space."""
        used = DEPTH * slot(cfg.spad_bytes, cfg.spad_banks, 0).size
        if used >= cfg.spad_bytes:
            return None
        arena = cls(cfg, 0)
        arena.spad = Slot(used, cfg.spad_bytes - used)
        arena.acc = Slot(LOCAL_ACC_BASE, 0)
        return arena

    def fits(self, spad_sizes: list[int], acc_sizes: list[int] = ()) -> bool:
        """Whether these tiles (bytes) fit one slot each, alignment included."""
        return sum(map(aligned, spad_sizes)) <= self.spad.size and sum(map(aligned, acc_sizes)) <= self.acc.size

    def tile(self, nbytes: int) -> int:
        addr = self.spad.base + self._spad_used
        self._spad_used += aligned(max(nbytes, 1))
        if self._spad_used > self.spad.size:
            raise MemoryPlanError(f"tiles need {self._spad_used} scratchpad bytes, a buffer slot has {self.spad.size}")
        return addr

    def acc_tile(self, nbytes: int) -> int:
        addr = self.acc.base + self._acc_used
        self._acc_used += aligned(max(nbytes, 1))
        if self._acc_used > self.acc.size:
            raise MemoryPlanError(f"tiles need {self._acc_used} accumulator bytes, a buffer slot has {self.acc.size}")
        return addr


def largest_fitting(limit: int, fits) -> int:
    """The largest n in [1, limit] with fits(n) (fits is monotone), or 0 when even 1 does not fit."""
    lo, hi = 0, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo
