"""DRAM placement: constants in the program's data section, activations in an arena after it.

Each activation lives from the node that writes it to the last node that reads it (graph inputs from the
start, graph outputs to the end); a buffer is reused once its value is dead. Placement is greedy first-fit
over the address range, largest buffers first, every buffer aligned to the DMA burst.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from fusion.lower.errors import MemoryPlanError

ALIGN = 64


def align(x: int, a: int = ALIGN) -> int:
    return -(-x // a) * a


@dataclass(frozen=True)
class Interval:
    """A buffer of `nbytes` live over node indices [start, end] (inclusive)."""

    name: str
    nbytes: int
    start: int
    end: int


@dataclass(frozen=True)
class MemoryPlan:
    """DRAM byte address of every buffer; `arena_base`/`arena_bytes` the activation region (after the data)."""

    addresses: Mapping[str, int]
    arena_base: int
    arena_bytes: int
    naive_bytes: int  # what the arena would take without reuse

    @property
    def end(self) -> int:
        return self.arena_base + self.arena_bytes


def plan_arena(intervals: list[Interval], arena_base: int, dram_bytes: int) -> MemoryPlan:
    """First-fit placement; two buffers share bytes only if their live ranges are disjoint."""
    placed: list[tuple[int, int, Interval]] = []  # (offset, size, interval)
    addresses: dict[str, int] = {}
    for iv in sorted(intervals, key=lambda i: (-i.nbytes, i.start, i.name)):
        size = align(max(iv.nbytes, 1))
        busy = sorted(
            (off, off + sz) for off, sz, other in placed if not (other.end < iv.start or iv.end < other.start)
        )
        offset = 0
        for lo, hi in busy:
            if offset + size <= lo:
                break
            offset = max(offset, hi)
        placed.append((offset, size, iv))
        addresses[iv.name] = arena_base + offset
    arena = max((off + sz for off, sz, _ in placed), default=0)
    if arena_base + arena > dram_bytes:
        raise MemoryPlanError(
            f"activations need {arena} DRAM bytes after {arena_base} bytes of constants; the machine has {dram_bytes}"
        )
    naive = sum(align(max(iv.nbytes, 1)) for iv in intervals)
    return MemoryPlan(MappingProxyType(addresses), arena_base, arena, naive)
