"""Scalar core: ALU, branches, jumps, scalar DRAM access, hardware loops, counters, fences and tokens."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from isa import Instruction
from isa.enums import Counter, DType, Unit
from simulator.counters import read_counter
from simulator.engine import POP, S_DRAM, S_DRAM_RD, S_DRAM_WR, S_FENCE, S_TAKEN, S_TOKEN, retired_token
from simulator.errors import Fault
from simulator.semantics.scalar import ALU, BRANCH_CONDITIONS, unsigned32, wrap32
from simulator.timing import branch_cycles, scalar_cycles, scalar_mem_cycles, sync_cycles, zero_count_read_start

if TYPE_CHECKING:
    from simulator.machine import Builder, Machine, Step

HALTED = -1
LOOP_STACK_DEPTH = 4


def alu(name: str, immediate: bool) -> Builder:
    """`add rd, rs1, rs2` and `addi rd, rs1, imm` alike: the second operand is read from x or from a constant."""
    op = ALU[name]

    def build(m: Machine, pc: int, ins: Instruction) -> Step:
        rd, rs1, second = ins.values
        x, nxt, cost = m.x, pc + 1, scalar_cycles(m.cfg)
        source, index = ([second], 0) if immediate else (x, second)

        def step() -> int:
            x[rd] = op(x[rs1], source[index])
            x[0] = 0
            m.now += cost
            return nxt

        return step

    return build


def li(m: Machine, pc: int, ins: Instruction) -> Step:
    rd, value = ins.values
    x, nxt, cost, value = m.x, pc + 1, scalar_cycles(m.cfg), wrap32(value)

    def step() -> int:
        x[rd] = value
        x[0] = 0
        m.now += cost
        return nxt

    return step


def li_now(m: Machine, pc: int, ins: Instruction) -> int:
    """`li` run once without a step (`Machine._first`): straight-line code runs most of its `li`s once each."""
    rd, value = ins.values
    x = m.x
    x[rd] = wrap32(value)
    x[0] = 0
    m.now += scalar_cycles(m.cfg)
    return pc + 1


def _jump_target(m: Machine, target: int) -> int:
    if not 0 <= target <= len(m.obj.text):
        raise Fault(f"jump target {target} is outside the program [0, {len(m.obj.text)})")
    return target


def _take(m: Machine, row: list[int], cost: int, target: int) -> int:
    """A taken branch or jump: charge it, count it, check the watchdog, return the checked target."""
    m.now += cost
    row[S_TAKEN] += 1
    m.watchdog()
    return _jump_target(m, target)


def branch(name: str) -> Builder:
    cond = BRANCH_CONDITIONS[name]

    def build(m: Machine, pc: int, ins: Instruction) -> Step:
        rs1, rs2, offset = ins.values
        x, nxt, target = m.x, pc + 1, pc + offset
        not_taken, taken = branch_cycles(m.cfg, False), branch_cycles(m.cfg, True)
        row = m.row(pc)

        def step() -> int:
            if cond(x[rs1], x[rs2]):
                return _take(m, row, taken, target)
            m.now += not_taken
            return nxt

        return step

    return build


def jal(m: Machine, pc: int, ins: Instruction) -> Step:
    rd, offset = ins.values
    x, target, cost, row = m.x, pc + offset, branch_cycles(m.cfg, True), m.row(pc)

    def step() -> int:
        x[rd] = pc + 1
        x[0] = 0
        return _take(m, row, cost, target)

    return step


def jalr(m: Machine, pc: int, ins: Instruction) -> Step:
    rd, imm, rs1 = ins.values
    x, cost, row = m.x, branch_cycles(m.cfg, True), m.row(pc)

    def step() -> int:
        target = x[rs1] + imm
        x[rd] = pc + 1
        x[0] = 0
        return _take(m, row, cost, target)

    return step


def scalar_memory(store: bool) -> Builder:
    """`lw` / `sw`: one 32-bit DRAM word; issue stalls for the DRAM latency."""

    def build(m: Machine, pc: int, ins: Instruction) -> Step:
        reg, imm, rs1 = ins.values  # rd for lw, rs2 for sw
        x, nxt, cost, row = m.x, pc + 1, scalar_mem_cycles(m.cfg), m.row(pc)
        stall = cost - scalar_cycles(m.cfg)

        def step() -> int:
            addr = x[rs1] + imm
            word = m.mem.dram_word(addr)
            m.check_dram(addr, 1, 4, 4, write=store)
            if store:
                word[0] = x[reg]
                row[S_DRAM_WR] += 4
            else:
                x[reg] = int(word[0])
                x[0] = 0
                row[S_DRAM_RD] += 4
            row[S_DRAM] += stall
            m.now += cost
            return nxt

        return step

    return build


def _loop(m: Machine, pc: int, lend: int, count_of) -> Step:
    body, end, cost = pc + 1, pc + lend, scalar_cycles(m.cfg)
    loops = m.loops

    def step() -> int:
        count = count_of()
        m.now += cost
        if lend <= 1:
            raise Fault("hardware loop body is empty (lend must be at least 2)")
        if count == 0:
            return end
        if len(loops) >= LOOP_STACK_DEPTH:
            raise Fault(f"hardware loop stack overflow (depth {LOOP_STACK_DEPTH})")
        loops.append([body, end, count])
        return body

    return step


def loop(m: Machine, pc: int, ins: Instruction) -> Step:
    rs1, lend = ins.values
    x = m.x
    return _loop(m, pc, lend, lambda: unsigned32(x[rs1]))


def loopi(m: Machine, pc: int, ins: Instruction) -> Step:
    n, lend = ins.values
    return _loop(m, pc, lend, lambda: n)


def rdcnt(m: Machine, pc: int, ins: Instruction) -> Step:
    rd, counter = ins.values
    x, nxt, cost, which = m.x, pc + 1, scalar_cycles(m.cfg), Counter(counter)

    def step() -> int:
        m.engine.advance(m.now)
        x[rd] = wrap32(read_counter(m, which))
        x[0] = 0
        m.now += cost
        return nxt

    return step


def nop(m: Machine, pc: int, ins: Instruction) -> Step:
    nxt, cost = pc + 1, scalar_cycles(m.cfg)

    def step() -> int:
        m.now += cost
        return nxt

    return step


def _wait_all(m: Machine, row: list[int], cost: int) -> None:
    done = m.engine.drain()
    issued = m.now
    m.now = max(m.now + cost, done)
    row[S_FENCE] += m.now - issued - cost
    if m.races is not None:
        m.races.fence()
    m.watchdog()


def fence(m: Machine, pc: int, ins: Instruction) -> Step:
    nxt, cost, row = pc + 1, scalar_cycles(m.cfg), m.row(pc)

    def step() -> int:
        _wait_all(m, row, cost)
        return nxt

    return step


def halt(m: Machine, pc: int, ins: Instruction) -> Step:
    cost, row = scalar_cycles(m.cfg), m.row(pc)

    def step() -> int:
        _wait_all(m, row, cost)
        m.halt_cycle = m.now
        return HALTED

    return step


def sync_push(m: Machine, pc: int, ins: Instruction) -> int:
    """`sync.push` run (`simulator.dispatch.RUN_ONCE`; bound to its pc as its step when reached again)."""
    src, dst = ins.values
    tokens = m.tokens.get((src, dst))
    if tokens is None:
        tokens = m.tokens[src, dst] = deque()
    clock = m.races.token(src) if m.races is not None else None
    if src == Unit.scalar:
        tokens.append((retired_token(m.now), clock))
        m.now += scalar_cycles(m.cfg)
        return pc + 1
    op = m.unit_op(src, pc, sync_cycles(m.cfg), m.row(pc))
    tokens.append((op, clock))
    m.submit(op)
    return pc + 1


def sync_pop(m: Machine, pc: int, ins: Instruction) -> int:
    """`sync.pop` run (`simulator.dispatch.RUN_ONCE`; bound to its pc as its step when reached again)."""
    src, dst = ins.values
    tokens, row = m.tokens.get((src, dst)), m.row(pc)
    if not tokens:
        names = f"{Unit(src).name} -> {Unit(dst).name}"
        raise Fault(f"sync.pop {names} has no earlier sync.push to match (push tokens earlier in program order)")
    push, clock = tokens.popleft()
    if m.races is not None:
        m.races.join(dst, clock)
    if dst == Unit.scalar:
        m.engine.wait_for(push)
        if push.finish > m.now:
            row[S_TOKEN] += push.finish - m.now
            m.now = push.finish
        m.now += scalar_cycles(m.cfg)
        return pc + 1
    m.submit(m.unit_op(dst, pc, sync_cycles(m.cfg), row, POP, push))
    return pc + 1


def zero_test(branch_if_zero: bool) -> Builder:
    """`bz.tile` / `bnz.tile`: branch on whether a local tile is all zeros (read as memory is at issue)."""

    def build(m: Machine, pc: int, ins: Instruction) -> Step:
        rs1, n, dtype, offset = ins.values
        dt = DType(dtype).numpy
        x, nxt, target, row = m.x, pc + 1, pc + offset, m.row(pc)
        not_taken, taken = branch_cycles(m.cfg, False), branch_cycles(m.cfg, True)

        def step() -> int:
            tile = m.read_local(x[rs1], n, dt, row)
            m.mask = 0  # the scalar core's read does not occupy a unit
            if (not tile.any()) == branch_if_zero:
                return _take(m, row, taken, target)
            m.now += not_taken
            return nxt

        return step

    return build


def zero_count_read(m: Machine, pc: int, ins: Instruction) -> Step:
    """`zc.rd`: the zero-tile counter, once the last `dma.stz` issued before it has finished (the wait is counted
    as a token stall: the scalar core waits for the store unit)."""
    (rd,) = ins.values
    x, nxt, row, cost, engine = m.x, pc + 1, m.row(pc), scalar_cycles(m.cfg), m.engine

    def step() -> int:
        counted = engine.counted
        if counted is not None:
            engine.wait_for(counted)
            start = zero_count_read_start(m.now, counted.finish)
            row[S_TOKEN] += start - m.now
            m.now = start
        x[rd] = wrap32(engine.zero_tiles)
        x[0] = 0
        m.now += cost
        m.watchdog()
        return nxt

    return step


def dispatch(m: Machine, pc: int, ins: Instruction) -> Step:
    """Indirect branch through a DRAM table of absolute instruction indices."""
    rs1, table, ncase = ins.values
    x, nxt, row = m.x, pc + 1, m.row(pc)
    not_taken, taken = branch_cycles(m.cfg, False), branch_cycles(m.cfg, True)

    def step() -> int:
        index = unsigned32(x[rs1])
        if index >= ncase:
            m.now += not_taken
            return nxt
        addr = table + 4 * index
        target = int(m.mem.dram_word(addr)[0])
        m.check_dram(addr, 1, 4, 4, write=False)
        row[S_DRAM_RD] += 4
        return _take(m, row, taken, target)

    return step
