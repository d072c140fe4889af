"""Run small programs on a Machine whose local memory the test fills and inspects directly."""

from __future__ import annotations

import numpy as np

from assembler.source import assemble
from isa.memory_map import LOCAL_ACC_BASE
from simulator import PRESETS, RunResult, simulate
from simulator.machine import Machine


def run_asm(source: str, config: str = "tiny", inputs: dict[str, np.ndarray] | None = None, **options) -> RunResult:
    return simulate(assemble(source), config, inputs, **options)


def machine(source: str, config: str = "tiny", local: dict[int, np.ndarray] | None = None, **options) -> Machine:
    """Assemble, place `local` arrays at local addresses, run to halt; returns the machine."""
    m = Machine(assemble(source), PRESETS[config], record_transactions=True, trace=True, **options)
    for addr, value in (local or {}).items():
        raw = np.ascontiguousarray(value).view(np.uint8).reshape(-1)
        if addr >= LOCAL_ACC_BASE:
            m.mem.acc[addr - LOCAL_ACC_BASE : addr - LOCAL_ACC_BASE + raw.size] = raw
        else:
            m.mem.spad[addr : addr + raw.size] = raw
    m.run()
    return m


def local(m: Machine, addr: int, count: int, dtype: np.dtype) -> np.ndarray:
    return m.mem.local(addr, count, np.dtype(dtype))[0].copy()


def unit_slices(m: Machine, unit: int) -> list[tuple[int, int, int]]:
    """(pc, start, finish) of every instruction the unit ran, from the trace."""
    return [(pc, start, finish) for u, pc, start, finish in m.trace if u == unit]


def py_alu(name: str, a: int, b: int) -> int:
    """The scalar ALU by Python integers: C-style division toward zero, shifts by the low 5 bits, 32-bit wrap."""
    ua, ub, sh = a % 2**32, b % 2**32, b & 31
    quotient = abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1) if b else 0
    value = {
        "add": a + b,
        "sub": a - b,
        "and": a & b,
        "or": a | b,
        "xor": a ^ b,
        "sll": a << sh,
        "srl": ua >> sh,
        "sra": a >> sh,
        "mul": a * b,
        "div": quotient,
        "rem": a - quotient * b,
        "slt": int(a < b),
        "sltu": int(ua < ub),
    }[name]
    return (value + 2**31) % 2**32 - 2**31
