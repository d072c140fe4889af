"""Run small programs on a Machine whose local memory the test fills and inspects directly."""

from __future__ import annotations

import numpy as np

from assembler.source import assemble
from isa.memory_map import LOCAL_ACC_BASE
from simulator import MachineConfig, RunResult, load_config, simulate
from simulator.machine import Machine

# C = relu(A @ W) on tiny: DMA in, preload, mm, token, vector relu, DMA out
GEMM = """.kernel k
.input a: i8[8, 4] @ A
.input w: i8[4, 4] @ W
.output c: i32[8, 4] @ C
li x1, 0
li x2, A
li x3, 4
dma.ld x1, x2, x3, 8, 4, i8
li x4, 64
li x5, W
dma.ld x4, x5, x3, 4, 4, i8
sync.push ld, mx
sync.pop ld, mx
mx.preload x4, 4, 4, i8
li x6, 0x1000000
mx.mm x6, x1, 8
sync.push mx, vx
sync.pop mx, vx
li x9, 128
v.relu x9, x6, 32, i32
sync.push vx, st
sync.pop vx, st
li x7, C
li x8, 16
dma.st x7, x9, x8, 8, 4, i32
halt
.endkernel
.data
A: .zero 32
W: .zero 16
C: .zero 128
"""


def run_asm(source: str, config: str = "tiny", inputs: dict[str, np.ndarray] | None = None, **options) -> RunResult:
    return simulate(assemble(source), config, inputs, **options)


def machine(
    source: str, config: str | MachineConfig = "tiny", local: dict[int, np.ndarray] | None = None, **options
) -> Machine:
    """Assemble, place `local` arrays at local addresses, run to halt; returns the machine."""
    m = Machine(assemble(source), load_config(config), record_transactions=True, trace=True, **options)
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
