"""Scalar core: ALU through programs, branch costs, hardware loops, scalar memory, counters, dispatch."""

from __future__ import annotations

import numpy as np
import pytest
from sim_helpers import machine, py_alu, run_asm

from isa import BY_MNEMONIC, INSTRUCTIONS
from simulator import PRESETS, SimulatorTrap

CFG = PRESETS["tiny"]  # branch_penalty 2, dram_latency 20


def regs(source: str) -> list[int]:
    return machine(source + "\nhalt\n").x


def test_alu_and_immediates() -> None:
    x = regs(
        "li x1, -7\nli x2, 3\ndiv x3, x1, x2\nrem x4, x1, x2\nsrli x5, x1, 28\nsltu x6, x2, x1\nmul x7, x1, x1\n"
        "addi x0, x1, 5\nli x8, 0xffffffff\nsrai x9, x1, 1"
    )
    assert x[3:8] == [-2, -1, 15, 1, 49]
    assert x[0] == 0 and x[8] == -1 and x[9] == -4


def test_branch_costs_and_targets() -> None:
    m = machine("li x1, 1\nbeq x1, x0, skip\nbne x1, x0, skip\nli x2, 99\nskip: halt\n")
    assert m.x[2] == 0
    # li (1) + not-taken beq (1) + taken bne (1 + penalty) + halt (1)
    assert m.now == 1 + 1 + (1 + CFG.branch_penalty) + 1


def test_jal_jalr_call_and_return() -> None:
    m = machine("jal x1, fn\nli x3, 7\nhalt\nfn: li x2, 5\njalr x0, 0(x1)\n")
    assert m.x[1:4] == [1, 5, 7]


def test_hardware_loops_are_zero_overhead_and_nest() -> None:
    m = machine("li x1, 3\nloop x1, end1\nloopi 4, end2\naddi x2, x2, 1\nend2: addi x3, x3, 1\nend1: halt\n")
    assert m.x[2] == 12 and m.x[3] == 3
    # li + loop + 3 x (loopi + 4 x addi + addi) + halt: no per-iteration cost
    assert m.now == 1 + 1 + 3 * (1 + 4 + 1) + 1
    assert sum(m.count) == m.now


def test_zero_count_loop_skips_its_body() -> None:
    assert machine("loopi 0, end\naddi x2, x2, 1\nend: halt\n").x[2] == 0


def test_loop_stack_overflow_traps() -> None:
    src = "loopi 2, e\nloopi 2, e\nloopi 2, e\nloopi 2, e\nloopi 2, e\nnop\ne: halt\n"
    with pytest.raises(SimulatorTrap, match="loop stack overflow") as err:
        machine(src)
    assert err.value.pc == 4 and err.value.instruction_text.startswith("loopi 2")


def test_lw_sw_stall_for_dram_latency() -> None:
    src = ".kernel k\n.output o: i32[2] @ O\nli x1, O\nli x2, 41\nsw x2, 4(x1)\nlw x3, 4(x1)\naddi x3, x3, 1\n"
    src += "sw x3, 0(x1)\nhalt\n.endkernel\n.data\nO: .zero 8\n"
    r = run_asm(src)
    assert r.outputs["o"].tolist() == [42, 41]
    assert r.counters.scalar_stall_dram == 3 * CFG.dram_latency
    assert r.counters.cycle == 7 + 3 * CFG.dram_latency


def test_rdcnt_reads_counters() -> None:
    m = machine("nop\nnop\nrdcnt x1, cycle\nrdcnt x2, instret\nhalt\n")
    assert m.x[1] == 2 and m.x[2] == 4


def test_rdcnt_sees_unit_work_after_fence() -> None:
    src = "li x1, 0\nli x2, 1024\nv.add x2, x1, x1, 64, i8\nfence\nrdcnt x5, vector_elem_ops\n"
    src += "rdcnt x6, vector_busy\nhalt\n"
    m = machine(src)
    assert m.x[5] == 64 and m.x[6] == 64 // CFG.vector_lanes + 1


def test_zero_tests_branch_on_tile_contents() -> None:
    src = (
        "li x1, 0\nbz.tile x1, 16, i32, allzero\nli x2, 1\n"
        "allzero: li x3, 64\nbnz.tile x3, 4, i8, nonzero\nli x4, 1\nnonzero: halt\n"
    )
    m = machine(src, local={64: np.array([0, 0, 3, 0], np.int8)})
    assert m.x[2] == 0 and m.x[4] == 0
    m = machine(src, local={0: np.array([0, 1], np.int32)})
    assert m.x[2] == 1


def test_dispatch_table() -> None:
    src = """.kernel k
.input sel: i32[1] @ S
.output out: i32[1] @ O
li x1, S
lw x2, 0(x1)
dispatch x2, TABLE, 3
li x3, -1
j_end: li x9, O
sw x3, 0(x9)
halt
case0: li x3, 100
jal x0, j_end
case1: li x3, 101
jal x0, j_end
case2: li x3, 102
jal x0, j_end
.endkernel
.data
TABLE: .word case0, case1, case2
S: .zero 4
O: .zero 4
"""
    for sel, want in ((0, 100), (2, 102), (3, -1), (-1, -1)):
        assert run_asm(src, inputs={"sel": np.array([sel], np.int32)}).outputs["out"][0] == want


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("li x1, 1\ndiv x2, x1, x0\nhalt", "division by zero"),
        ("li x1, 1\njalr x0, 100(x1)\nhalt", "jump target 101 is outside the program"),
        ("li x1, 3\nlw x2, 0(x1)\nhalt", "misaligned DRAM word access"),
        ("li x1, -4\nsw x2, 0(x1)\nhalt", "outside the"),
        ("nop", "ran past the last instruction"),
        ("sync.pop ld, mx\nhalt", "no earlier sync.push"),
    ],
)
def test_scalar_faults(source: str, message: str) -> None:
    with pytest.raises(SimulatorTrap, match=message):
        machine(source)


def test_watchdog_stops_runaway_programs() -> None:
    from dataclasses import replace

    from assembler.source import assemble
    from simulator.machine import Machine

    m = Machine(assemble("top: jal x0, top\n"), replace(CFG, max_cycles=1000))
    with pytest.raises(SimulatorTrap, match="watchdog") as err:
        m.run()
    assert err.value.cycle > 1000 and err.value.pc == 0


def test_illegal_word_traps_when_reached() -> None:
    from assembler.objfile import ObjectFile
    from isa import encode, make
    from simulator import simulate

    obj = ObjectFile((encode(make("nop")), 0xFF, encode(make("halt"))))
    with pytest.raises(SimulatorTrap, match="illegal instruction") as err:
        simulate(obj, "tiny")
    assert err.value.pc == 1 and err.value.cycle == 1


def test_nested_loops_may_share_their_end() -> None:
    m = machine("loopi 2, e\nloopi 3, e\naddi x2, x2, 1\ne: halt\n")
    assert m.x[2] == 6


def test_branch_to_the_loop_end_continues_the_loop() -> None:
    m = machine("li x1, 0\nloopi 5, e\naddi x1, x1, 1\nbne x1, x0, e\naddi x2, x2, 1\ne: halt\n")
    assert (m.x[1], m.x[2]) == (5, 0)


ALU_ROWS = [s.mnemonic for s in INSTRUCTIONS if s.opcode in (0x01, 0x02)]


@pytest.mark.parametrize("mnemonic", ALU_ROWS)
@pytest.mark.parametrize(("a", "b"), [(-7, 3), (2**31 - 1, 2), (5, -(2**31)), (-1, 33)])
def test_every_alu_row_through_a_program(mnemonic: str, a: int, b: int) -> None:
    immediate = BY_MNEMONIC[mnemonic].opcode == 0x02
    if immediate:
        b = max(b, -(2**30))  # the immediate field holds 31 signed bits
    name = mnemonic[:-1] if immediate else mnemonic
    operand = f"{b}" if immediate else "x2"
    m = machine(f"li x1, {a}\nli x2, {b}\n{mnemonic} x3, x1, {operand}\nhalt\n")
    assert m.x[3] == py_alu(name, a, b)
    assert m.now == 4


@pytest.mark.parametrize("mnemonic", [s.mnemonic for s in INSTRUCTIONS if s.opcode == 0x04])
@pytest.mark.parametrize(("a", "b"), [(1, 1), (-1, 1), (1, -1), (0, 5)])
def test_every_branch_row(mnemonic: str, a: int, b: int) -> None:
    taken = {
        "beq": a == b,
        "bne": a != b,
        "blt": a < b,
        "bge": a >= b,
        "bltu": a % 2**32 < b % 2**32,
        "bgeu": a % 2**32 >= b % 2**32,
    }[mnemonic]
    m = machine(f"li x1, {a}\nli x2, {b}\n{mnemonic} x1, x2, over\nli x3, 1\nover: halt\n")
    assert m.x[3] == (0 if taken else 1)
    assert m.now == 2 + 1 + (CFG.branch_penalty if taken else 1) + 1
