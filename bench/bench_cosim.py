"""RTL (Icarus + cocotb) versus the Python simulator on the same matrix/vector unit work.

Workload: an int8 GEMM (M x K x C, tiled for the array) whose tiles drain through the fused epilogue
(bias -> relu -> requantize), followed by integer vector ops over the result, on `base` (16x16, 16 lanes)
and `tiny`. The simulator runs the program with transaction recording; the RTL replays every matrix,
epilogue and vector transaction. "unit cycles" = the cycles the simulator charges those transactions
(the work both sides simulate). Python: unit cycles / simulate() wall time. RTL: unit cycles / replay wall
time (one simulation per unit, builds cached, cocotb start-up included). Also checks 0 value and 0 cycle
mismatches. Run: python bench/bench_cosim.py
"""

from __future__ import annotations

import platform
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from assembler.source import assemble
from isa.memory_map import LOCAL_ACC_BASE
from rtl import build as rtl_build
from rtl.cosim import Recorded, cosimulate, plan
from rtl.units import UNITS
from simulator.config import PRESETS, MachineConfig
from simulator.inputs import random_inputs
from simulator.run import simulate

RESULTS = Path(__file__).parent / "results" / "cosim.md"
TARGET_RATIO = 1000


def workload(cfg: MachineConfig, m: int, k: int, c: int, vec: int) -> str:
    """GEMM out = requant(relu(A @ W + bias)) tile by tile, then integer vector ops over `vec` elements."""
    n = cfg.array_size
    a_slice = [kt * m * n for kt in range(k // n)]  # A[:, kt-slice] dense, m x n each
    w_tile = {(kt, nt): (k // n) * m * n + (kt * (c // n) + nt) * n * n for kt in range(k // n) for nt in range(c // n)}
    bias_addr = max(w_tile.values()) + n * n
    out_addr, v_addr = bias_addr + 4 * c, 0
    lines = [
        ".kernel bench",
        f".input a: i8[{m}, {k}] @ A",
        f".input w: i8[{k}, {c}] @ W",
        f".input bias: i32[{c}] @ B",
        f".input v: i32[{vec}] @ V",
        f"    li x3, {k}",
    ]
    for kt, addr in enumerate(a_slice):
        lines += [f"    li x1, {addr}", f"    li x2, A + {kt * n}", f"    dma.ld x1, x2, x3, {m}, {n}, i8"]
    lines.append(f"    li x3, {c}")
    for (kt, nt), addr in w_tile.items():
        lines += [f"    li x1, {addr}", f"    li x2, W + {kt * n * c + nt * n}", f"    dma.ld x1, x2, x3, {n}, {n}, i8"]
    lines += [
        f"    li x1, {bias_addr}",
        "    li x2, B",
        f"    li x3, {4 * c}",
        f"    dma.ld x1, x2, x3, 1, {c}, i32",
        "    fence",
        "    li x9, 1234567",
        f"    li x5, {LOCAL_ACC_BASE}",
    ]
    for nt in range(c // n):
        lines += [f"    li x7, {bias_addr + 4 * nt * n}", "    ep.cfg x7, x0, x9, 20, relu, bias, i8"]
        for kt in range(k // n):
            op = "mx.mm" if kt == 0 else "mx.mma"
            lines += [
                f"    li x6, {w_tile[kt, nt]}",
                f"    mx.preload x6, {n}, {n}, i8",
                f"    li x6, {a_slice[kt]}",
                f"    {op} x5, x6, {m}",
            ]
        lines += [f"    li x8, {out_addr + nt * m * n}", f"    mx.drain x8, x5, {m}, {n}"]
    lines += [
        "    fence",
        f"    li x1, {v_addr}",
        "    li x2, V",
        f"    li x3, {4 * vec}",
        f"    dma.ld x1, x2, x3, 1, {vec}, i32",
        "    fence",
        f"    li x8, {4 * vec}",
        f"    v.add x8, x1, x1, {vec}, i32",
        f"    v.mul x8, x8, x1, {vec}, i32",
        f"    v.relu x8, x8, {vec}, i32",
        f"    v.rsum x8, x8, {vec}, {n}, i32",
        f"    v.rqnt x8, x1, x9, 24, {vec}",
        "    fence",
        "    halt",
        ".endkernel",
        ".data",
        f"A: .zero {m * k}",
        f"W: .zero {k * c}",
        f"B: .zero {4 * c}",
        f"V: .zero {4 * vec}",
    ]
    return "\n".join(lines) + "\n"


def measure(cfg: MachineConfig, m: int, k: int, c: int, vec: int) -> dict[str, float | int | str]:
    obj = assemble(workload(cfg, m, k, c, vec))
    inputs = random_inputs(obj, seed=1)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        result = simulate(obj, cfg, inputs, record_transactions=True)
        best = min(best, time.perf_counter() - start)
    recorded = Recorded("bench", obj, result.transactions)
    cases, _ = plan(cfg, recorded)
    unit_cycles = sum(case.charged for unit_cases in cases.values() for case in unit_cases)
    for top in cases:  # build outside the timed region
        rtl_build.build(top, UNITS[top].params(cfg))
    start = time.perf_counter()
    (report,) = cosimulate(cfg, [recorded])
    rtl_wall = time.perf_counter() - start
    py_rate, rtl_rate = unit_cycles / best, unit_cycles / rtl_wall
    return {
        "config": cfg.name,
        "workload": f"GEMM {m}x{k}x{c} + drain, vector {vec}",
        "transactions": report.compared,
        "unit cycles": unit_cycles,
        "python s": best,
        "rtl s": rtl_wall,
        "python cycles/s": py_rate,
        "rtl cycles/s": rtl_rate,
        "ratio": py_rate / rtl_rate,
        "mismatches": f"{report.value_mismatches} value, {report.cycle_mismatches} cycle",
    }


def main() -> None:
    rows = [measure(PRESETS["base"], 256, 64, 64, 2048), measure(PRESETS["tiny"], 192, 32, 16, 2048)]
    table = Table(title="RTL co-simulation vs Python simulator (same unit cycles)")
    for key in rows[0]:
        table.add_column(key)
    for row in rows:
        table.add_row(*(_fmt(v) for v in row.values()))
    Console().print(table)
    lines = [
        "# RTL co-simulation speed",
        "",
        f"Machine: {platform.machine()}, Python {platform.python_version()}, Icarus Verilog 11 + cocotb 2. "
        "Command: `python bench/bench_cosim.py` (Python: best of 3; RTL: one replay, builds cached).",
        "",
        "| " + " | ".join(rows[0]) + " |",
        "|" + "---|" * len(rows[0]),
        *("| " + " | ".join(_fmt(v) for v in row.values()) + " |" for row in rows),
        "",
        f"Target: the Python simulator >= {TARGET_RATIO}x faster than RTL simulation of the same units, "
        "with 0 value and 0 cycle mismatches.",
    ]
    RESULTS.write_text("\n".join(lines) + "\n")
    np.testing.assert_equal([r["mismatches"] for r in rows], ["0 value, 0 cycle"] * len(rows))


def _fmt(value: float | int | str) -> str:
    if isinstance(value, float):
        return f"{value:,.0f}" if value >= 100 else f"{value:.3f}"
    return f"{value:,}" if isinstance(value, int) else value


if __name__ == "__main__":
    main()
