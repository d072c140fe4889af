"""Thin a recorded program to the first few executions of each transaction form, for replay within a budget.

A kernel the fusion engine generates is straight-line code: a GEMM over a 128 x 128 weight on `tiny` executes
~1,000 preloads and ~1,000 matmuls of one shape, which the RTL replays at a few hundred transactions a second.
What can differ between them on the RTL is the values; the datapath and timing exercised are set by the form:
mnemonic, every non-register field of the word (sizes, dtypes, modes, activation), each operand's shape and dtype
(scalars: their value), and the cycles charged. `thin` keeps the first `keep` transactions of every form, with
their real values, so a replay still covers every instruction form the program executes. It keeps the replay
consistent with what `rtl.cosim.plan` needs:

- the matrix unit keeps its weights between items, so its transactions are kept in whole segments (a preload
  and the matmuls up to the next preload), the first `keep` segments of each sequence of forms;
- a stream (`mx.mms` and the `vc.lds` consuming it) depends on the stream before it (the FIFO's occupancy),
  so every `vc.lds` and every matrix segment holding an `mx.mms` is kept;
- vector, chain and epilogue transactions are independent items (the unit is reset between them).

Transactions no RTL unit replays (configuration writes) are kept: `plan` counts them as skipped, as before.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

import numpy as np

from isa import Instruction, decode
from isa.fields import Kind
from rtl.cosim import ROUTES, Recorded

MATRIX_TIMINGS = frozenset({"preload", "matmul", "matmul_stream"})
REPLAYED = frozenset(ROUTES) | {"chain_stream"}  # timing rules some RTL unit replays


@dataclass(frozen=True)
class Thinned:
    run: Recorded  # the kept transactions, in program order
    dropped: Counter  # mnemonic -> transactions left out


def _operand(value: object) -> object:
    if isinstance(value, np.ndarray):
        return (value.shape, value.dtype.str)
    return value.item() if isinstance(value, np.generic) else value


def form(ins: Instruction, txn) -> tuple:
    """What sets the datapath and timing a transaction exercises (everything but its array values, registers and
    scratchpad addresses). An address the simulator records for the RTL's address generators (an operand named
    `*_addr`: a matmul's A rows, a drain's output) is a register's value like any other: the generator's datapath
    is set by the stride, which stays in the form. Keeping addresses would make every transaction its own form and
    leave nothing to thin."""
    fields = ins.by_name()
    words = tuple((op.field.name, fields[op.field.name]) for op in ins.spec.operands if op.field.kind is not Kind.xreg)
    operands = tuple((k, _operand(v)) for k, v in sorted(txn.operands.items()) if not k.endswith("_addr"))
    return ins.mnemonic, words, operands, _operand(txn.result), txn.cycles


def thin(run: Recorded, keep: int, seen: Counter | None = None) -> Thinned:
    """The first `keep` transactions of each form (matrix: segments; streams: all) of `run`, and what was left out.
    `seen` counts the forms replayed so far: pass one Counter to thin several programs as one (a form another
    program already replayed `keep` times is left out); it is updated."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    decoded = [decode(run.obj.text[t.pc]) for t in run.transactions]
    kept, dropped = [], Counter()
    seen = Counter() if seen is None else seen
    segment: list[int] = []  # indices of the current matrix segment

    def close_segment() -> None:
        key = tuple(form(decoded[i], run.transactions[i]) for i in segment)
        streams = any(decoded[i].spec.timing == "matmul_stream" for i in segment)
        if streams or seen[key] < keep:
            kept.extend(segment)
        else:
            dropped.update(decoded[i].mnemonic for i in segment)
        seen[key] += 1
        segment.clear()

    for i, (ins, txn) in enumerate(zip(decoded, run.transactions, strict=True)):
        timing = ins.spec.timing
        if timing in MATRIX_TIMINGS:
            if timing == "preload" and segment:
                close_segment()
            segment.append(i)
            continue
        key = form(ins, txn)
        if timing == "chain_stream" or seen[key] < keep or timing not in REPLAYED:
            if segment and timing == "chain_stream":
                close_segment()  # its mx.mms must be decided (kept) before the vc.lds that consumes it
            kept.append(i)
        else:
            dropped[ins.mnemonic] += 1
        seen[key] += 1
    if segment:
        close_segment()
    kept.sort()
    return Thinned(replace(run, transactions=tuple(run.transactions[i] for i in kept)), dropped)
