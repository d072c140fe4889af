"""The co-simulation corpus: every program in examples/ plus seeded random programs.

Programs run on the simulator with transaction recording; kernel inputs they
declare get seeded random values (so the units see real data, extremes
included) unless the caller supplies them.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

from assembler.objfile import ObjectFile
from assembler.source import assemble
from isa import DType, Unit
from rtl.cosim import Recorded
from rtl.programs import random_program
from simulator.config import MachineConfig
from simulator.run import RunResult, load_program, simulate

EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "examples"


def example_programs() -> list[Path]:
    return sorted(EXAMPLES_DIR.glob("*.s"))


def random_inputs(obj: ObjectFile, seed: int) -> dict[str, np.ndarray]:
    """Seeded values for every declared kernel input (i8/i32 across their range, f32 in [-2, 2))."""
    rng = np.random.default_rng(seed)
    inputs = {}
    for decl in (t for k in obj.kernels for t in k.inputs):
        if decl.dtype is DType.f32:
            inputs[decl.name] = rng.uniform(-2, 2, decl.shape).astype(np.float32)
        else:
            info = np.iinfo(decl.dtype.numpy)
            inputs[decl.name] = rng.integers(info.min, info.max, decl.shape, endpoint=True).astype(decl.dtype.numpy)
    return inputs


def transaction_starts(result: RunResult) -> tuple[int, ...]:
    """Start cycle of each recorded transaction, from the trace (a unit runs one pc's instances in order).

    The trace has a scalar-core slice (the issue) and a unit slice (the execution) per unit instruction.
    """
    by_pc: dict[int, list[int]] = {}
    for event in result.trace_events():
        if event["ph"] == "X" and event["tid"] != Unit.scalar:
            by_pc.setdefault(event["args"]["pc"], []).append(event["args"]["start_cycle"])
    for starts in by_pc.values():
        starts.sort()
    seen: Counter = Counter()
    out = []
    for txn in result.transactions:
        out.append(by_pc[txn.pc][seen[txn.pc]])
        seen[txn.pc] += 1
    return tuple(out)


def record(
    name: str, obj: ObjectFile, cfg: MachineConfig, inputs: dict[str, np.ndarray] | None = None, seed: int = 0
) -> Recorded:
    """Simulate with transaction recording and a trace; inputs not given are seeded random."""
    given = {**random_inputs(obj, seed), **(inputs or {})}
    result = simulate(obj, cfg, given, trace=True, record_transactions=True)
    return Recorded(name, obj, result.transactions, transaction_starts(result))


def record_file(path: Path, cfg: MachineConfig, inputs: dict[str, np.ndarray] | None = None, seed: int = 0) -> Recorded:
    return record(path.name, load_program(path), cfg, inputs, seed)


def record_random(seed: int, cfg: MachineConfig) -> Recorded:
    return record(f"random-{seed}", assemble(random_program(seed, cfg), f"<random {seed}>"), cfg, seed=seed)
