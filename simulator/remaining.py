"""A lower bound on the cycles a program still needs from each pc, so that a run with a cycle budget stops as
soon as it cannot finish within it instead of running on to the budget.

The planner measures rival kernels only as far as they could still win (`max_cycles`: the cycles to beat), and a
rival that loses by a third used to run two thirds of its program before the watchdog saw the budget passed. From
any pc outside hardware loops of a program without branches (a straight line and `loopi`s, whose trips are in
their words, up to its first `halt`) every later instruction issues as often as its loops repeat it, no earlier
than now: the run ends no earlier than now plus the busiest unit's time for them by `simulator.timing`'s rules:
an issue cycle each; the load and store units' DMAs one at a time (the DRAM latency and the transfer, as if
contiguous); the DRAM channel the bursts of both; the matrix unit its drains (which hold the whole unit) and,
between them, the weight port's preloads or the input's rows, whichever is more, and the last result's skew.
Work already queued only adds to that. A program with a branch, a register-counted `loop` or a `loopi` of zero
trips gets no bound (the watchdog then sees the budget only once it is passed)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from isa import INSTRUCTIONS, Instruction
from isa.enums import Unit
from simulator.config import MachineConfig
from simulator.memory import NUMPY_DTYPES
from simulator.timing import (
    dma_cycles,
    dma_transfer_cycles,
    drain_cycles,
    matmul_cycles,
    matmul_input_cycles,
    preload_cycles,
    scalar_cycles,
)

# what each timing rule adds to: (load unit, store unit, DRAM channel, weight port, array input, whole matrix unit)
LOAD, STORE, CHANNEL, WEIGHTS, ROWS, DRAINS = range(6)
_DMA = {"dma_load": LOAD, "dma_load_transposed": LOAD, "dma_store": STORE}
_BRANCHING = frozenset({"branch", "zero_test", "dispatch"})  # control flow a straight line does not have
_TIMED = frozenset({*_DMA, "preload", "matmul", "matmul_stream", "drain", *_BRANCHING})
# the specs that matter here (a word of any other costs nothing beyond its issue cycle)
_MNEMONICS = frozenset(
    s.mnemonic for s in INSTRUCTIONS if s.timing in _TIMED or s.mnemonic in ("loop", "loopi", "halt")
)


def remaining_bounds(
    cfg: MachineConfig, text: Sequence[int], table: Mapping[int, tuple[Instruction | None, Unit]]
) -> np.ndarray | None:
    """Per pc, cycles the run needs at least from issuing that pc to its end (see the module docstring), 0 inside
    a loop body (the iterations left are not known there); None for a program that may skip instructions."""
    words, inverse = np.unique(np.asarray(text, dtype=np.uint64), return_inverse=True)
    costs = np.zeros((len(words), 6), dtype=np.int64)
    halts = np.zeros(len(words), dtype=bool)
    trips: dict[int, tuple[int, int]] = {}  # a loopi word: (its body's length, its trips)
    for i, word in enumerate(words.tolist()):
        ins = table[word][0]
        if ins is None or ins.spec.mnemonic not in _MNEMONICS:
            continue
        spec = ins.spec
        if spec.timing in _BRANCHING or spec.mnemonic == "loop":
            return None
        if spec.mnemonic == "loopi":
            if ins.field("n") == 0:
                return None
            trips[word] = (ins.field("lend") - 1, ins.field("n"))
        halts[i] = spec.mnemonic == "halt"
        _cost(cfg, ins, costs[i])
    times = np.ones(len(text), dtype=np.int64)  # how often each pc issues
    for pc in np.flatnonzero(np.isin(words[inverse], list(trips))).tolist() if trips else ():
        body, count = trips[int(text[pc])]
        times[pc + 1 : pc + 1 + body] *= count
    per_pc = costs[inverse] * times[:, None]
    first_halt = np.flatnonzero(halts[inverse])
    if first_halt.size:  # never reached
        per_pc[first_halt[0] + 1 :] = 0
        times[first_halt[0] + 1 :] = 0
    rest = np.cumsum(per_pc[::-1], axis=0)[::-1]
    issued = np.cumsum(times[::-1])[::-1] * scalar_cycles(cfg)
    skew = np.where(rest[:, ROWS] > 0, matmul_cycles(cfg, 0), 0)
    matrix = rest[:, DRAINS] + np.maximum(rest[:, WEIGHTS], rest[:, ROWS]) + skew
    bound = np.max(np.stack([issued, rest[:, LOAD], rest[:, STORE], rest[:, CHANNEL], matrix]), axis=0)
    bound[times > 1] = 0  # in a loop body (of more than one trip)
    return bound


def _cost(cfg: MachineConfig, ins: Instruction, into: np.ndarray) -> None:
    """One instruction's least time on each of the units it occupies."""
    timing = ins.spec.timing
    if timing in _DMA:
        rows, row_bytes = ins.field("rows"), ins.field("cols") * NUMPY_DTYPES[ins.field("dtype")].itemsize
        into[_DMA[timing]] = dma_cycles(cfg, rows, row_bytes, row_bytes)  # contiguous: fewest bursts
        into[CHANNEL] = dma_transfer_cycles(cfg, rows, row_bytes, row_bytes)
    elif timing == "preload":
        into[WEIGHTS] = preload_cycles(cfg)
    elif timing in ("matmul", "matmul_stream"):
        into[ROWS] = matmul_input_cycles(cfg, ins.field("rows"))
    elif timing == "drain":
        into[DRAINS] = drain_cycles(cfg, ins.field("rows"), ins.spec.latency)
