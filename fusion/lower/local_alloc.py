"""Scratchpad and accumulator placement for one pipeline step's tiles.

Double buffering splits each memory into two halves by bank: buffers of even steps live in the lower banks,
odd steps in the upper ones, so the DMA filling one step's tiles does not wait on the banks the compute
units are reading for the other (with a single bank both halves share it and only timing suffers).
"""

from __future__ import annotations

from dataclasses import dataclass

from fusion.lower.errors import MemoryPlanError
from isa.memory_map import LOCAL_ACC_BASE
from simulator.config import MachineConfig

ALIGN = 64


def _up(x: int, a: int) -> int:
    return -(-x // a) * a


@dataclass(frozen=True)
class Half:
    """One parity's share of a memory: [base, base + size) in local addresses."""

    base: int
    size: int


def halves(total: int, banks: int, base: int = 0) -> tuple[Half, Half]:
    bank = total // banks
    size = (banks // 2) * bank if banks >= 2 else total // 2
    return Half(base, size), Half(base + size, size)


class TileArena:
    """Bump allocation of named tiles in one parity's scratchpad and accumulator halves."""

    def __init__(self, cfg: MachineConfig, parity: int) -> None:
        self.spad = halves(cfg.spad_bytes, cfg.spad_banks)[parity]
        self.acc = halves(cfg.acc_bytes, cfg.acc_banks, LOCAL_ACC_BASE)[parity]
        self._spad_used = 0
        self._acc_used = 0

    def fits(self, spad_sizes: list[int], acc_sizes: list[int] = ()) -> bool:
        """Whether these tiles (bytes) fit one half each, alignment included."""
        return (
            sum(_up(s, ALIGN) for s in spad_sizes) <= self.spad.size
            and sum(_up(s, ALIGN) for s in acc_sizes) <= self.acc.size
        )

    def tile(self, nbytes: int) -> int:
        addr = self.spad.base + self._spad_used
        self._spad_used += _up(max(nbytes, 1), ALIGN)
        if self._spad_used > self.spad.size:
            raise MemoryPlanError(f"tiles need {self._spad_used} scratchpad bytes, a buffer half has {self.spad.size}")
        return addr

    def acc_tile(self, nbytes: int) -> int:
        addr = self.acc.base + self._acc_used
        self._acc_used += _up(max(nbytes, 1), ALIGN)
        if self._acc_used > self.acc.size:
            raise MemoryPlanError(f"tiles need {self._acc_used} accumulator bytes, a buffer half has {self.acc.size}")
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
