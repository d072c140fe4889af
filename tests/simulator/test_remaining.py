"""`simulator.remaining`: the least cycles a branch-free program still needs from each pc, against the simulator on
hypothesis-drawn programs mixing every unit (the oracle: a pc issued at cycle t of a run ending at cycle C has at
most C - t left, so its bound must not pass that), tight where one unit dominates, and what the watchdog does with
it: a run whose budget it cannot meet stops early, a run within its budget never does."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_timing_only import CFG, DRAM, programs

from assembler.source import assemble
from isa.enums import Unit
from simulator import SimulatorTrap, simulate
from simulator.machine import WATCHDOG_EVERY, Machine
from simulator.remaining import remaining_bounds


def _bounds(source: str) -> np.ndarray | None:
    obj = assemble(source)
    return remaining_bounds(CFG, obj.text, Machine(obj, CFG).text.table)


@settings(max_examples=200, deadline=None)
@given(programs(), st.integers(0, 2**32 - 1))
def test_no_pc_is_bounded_past_what_its_run_still_takes(source: str, seed: int) -> None:
    data = np.random.default_rng(seed).integers(-128, 128, DRAM, dtype=np.int8)
    try:
        run = simulate(assemble(source), CFG, {"d": data}, trace=True)
    except SimulatorTrap:
        return
    bounds = _bounds(source)
    if bounds is None:
        assert "bz.tile" in source  # the drawn programs' only branch
        return
    issued: dict[int, int] = {}
    for unit, pc, start, _ in run._trace:
        if unit == Unit.scalar:
            issued.setdefault(pc, start)
    end = run.counters.cycle
    assert all(issued[pc] + int(b) <= end for pc, b in enumerate(bounds) if b and pc in issued), source


def _dmas(count: int) -> str:
    load = "li x1, {local}\nli x2, D + {dram}\nli x3, 64\ndma.ld x1, x2, x3, 4, 16, i8"
    loads = [load.format(local=64 * (i % 8), dram=64 * i) for i in range(count)]
    return "\n".join([".kernel k", *loads, "halt", ".endkernel", ".data", f"D: .zero {64 * count}", ""])


def test_the_bound_is_tight_where_one_unit_dominates() -> None:
    """DMAs one after another: the load unit's time is the run's, within a tenth (an inflated bound fails above)."""
    source = _dmas(100)
    cycles = simulate(assemble(source), CFG).counters.cycle
    bounds = _bounds(source)
    assert bounds is not None and 0.9 * cycles < bounds[0] <= cycles


def test_branches_and_register_counted_loops_have_no_bound() -> None:
    body = ".kernel k\nli x1, 3\n{}\nhalt\n.endkernel\n"
    assert _bounds(body.format("loop x1, 2\nnop")) is None
    assert _bounds(body.format("loopi 0, 2\nnop")) is None
    assert _bounds(body.format("beq x1, x0, 1")) is None
    assert _bounds(body.format("loopi 4, 2\nnop")) is not None


def test_a_run_that_cannot_meet_its_budget_stops_early_and_one_that_can_never_does() -> None:
    source = _dmas(WATCHDOG_EVERY)  # four instructions a load: a checkpoint every WATCHDOG_EVERY // 4 loads
    obj = assemble(source)
    cycles = simulate(obj, CFG).counters.cycle
    assert simulate(obj, replace(CFG, max_cycles=cycles)).counters.cycle == cycles
    with pytest.raises(SimulatorTrap, match="cannot finish within") as trap:
        simulate(obj, replace(CFG, max_cycles=cycles * 4 // 5))
    assert trap.value.pc == WATCHDOG_EVERY  # at the first checkpoint, a quarter in, not at its budget
    with pytest.raises(SimulatorTrap, match="exceeded"):  # a bound within a tenth: one cycle short is seen at the end
        simulate(obj, replace(CFG, max_cycles=cycles - 1))
