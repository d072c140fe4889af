"""The machine's decode path: words decoded through a cache shared by every run, and the watchdog in
straight-line code (a cycle budget stops a long unrolled kernel soon after it is exceeded)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from assembler.objfile import ObjectFile
from assembler.source import assemble
from isa import decode
from simulator import load_config, simulate
from simulator.decode import decoded
from simulator.errors import SimulatorTrap
from simulator.machine import WATCHDOG_EVERY, Machine

STRAIGHT = 3 * WATCHDOG_EVERY  # instructions of straight-line code, no branch or loop


def _straight_line(n: int) -> ObjectFile:
    body = "\n".join(f"addi x{1 + i % 7}, x0, {i}" for i in range(n))
    return assemble(f".kernel k\n{body}\nhalt\n.endkernel\n")


def test_runs_share_decoded_words_and_decode_as_the_table_says() -> None:
    obj = _straight_line(40)
    cfg = load_config("tiny")
    first, second = Machine(obj, cfg), Machine(obj, cfg)
    assert all(a is b for a, b in zip(first.instructions, second.instructions, strict=True))
    assert [decoded(w)[0] for w in obj.text] == [decode(w) for w in obj.text]
    assert first.units == second.units


def test_an_illegal_word_traps_in_every_run() -> None:
    obj = _straight_line(4)
    bad = replace(obj, text=[*obj.text[:2], 0xFF, *obj.text[2:]])
    for _ in range(2):  # the decode error is not cached as an instruction
        with pytest.raises(SimulatorTrap, match="illegal instruction") as trap:
            simulate(bad, "tiny")
        assert trap.value.pc == 2


def test_the_watchdog_stops_straight_line_code_within_its_checkpoint_interval() -> None:
    """Past its budget, or at the first checkpoint where what is left cannot fit it (`simulator.remaining`: here an
    issue cycle per instruction)."""
    obj = _straight_line(STRAIGHT)
    cycles = simulate(obj, "tiny").counters.cycle
    budget = cycles // 3
    with pytest.raises(SimulatorTrap, match="watchdog") as trap:
        simulate(obj, replace(load_config("tiny"), max_cycles=budget))
    assert trap.value.pc <= STRAIGHT // 3 + WATCHDOG_EVERY + 1


def test_a_run_within_its_budget_is_not_stopped() -> None:
    obj = _straight_line(STRAIGHT)
    cycles = simulate(obj, "tiny").counters.cycle
    assert simulate(obj, replace(load_config("tiny"), max_cycles=cycles)).counters.cycle == cycles
    with pytest.raises(SimulatorTrap, match="watchdog"):  # one cycle less: stopped at halt at the latest
        simulate(obj, replace(load_config("tiny"), max_cycles=cycles - 1))


def test_a_stopped_run_builds_only_the_steps_it_reached() -> None:
    obj = _straight_line(STRAIGHT)
    cycles = simulate(obj, "tiny").counters.cycle
    m = Machine(obj, replace(load_config("tiny"), max_cycles=cycles // 3))
    with pytest.raises(SimulatorTrap, match="watchdog") as trap:
        m.run()
    assert [pc for pc, step in enumerate(m.steps) if step is not None] == list(range(trap.value.pc + 1))


def test_li_runs_once_without_a_step_and_gets_one_when_reached_again() -> None:
    body = "nop\nli x1, 5\nloopi 3, end\nli x2, 7\naddi x3, x3, 1\nend: nop\nli x4, -1\nhalt"
    obj = assemble(f".kernel k\n{body}\n.endkernel\n")  # (pc 0: the kernel's entry, pc 5: the loop's end)
    m = Machine(obj, load_config("tiny"))
    m.run()
    assert m.steps[1] is False and m.steps[6] is False  # run once each: no step
    assert callable(m.steps[3]) and m.x[1:5] == [5, 7, 3, -1]  # in the loop body: built when reached again
    traced = simulate(obj, "tiny", trace=True)  # (the traced run builds every step)
    assert simulate(obj, "tiny").counters == traced.counters
