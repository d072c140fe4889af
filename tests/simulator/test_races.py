"""Checked mode: unsynchronised accesses by two units are reported with both instructions."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from sim_helpers import machine

from simulator import SimulatorTrap
from simulator.config import load_config
from simulator.races import epoch_dtype

LOAD = "li x1, 0\nli x2, 0\nli x3, 16\ndma.ld x1, x2, x3, 4, 16, i8\n"


def checked(source: str):
    return machine(source + "halt\n", checked=True)


def test_reading_what_another_unit_still_writes_is_a_race() -> None:
    with pytest.raises(SimulatorTrap, match="data race") as err:
        checked(LOAD + "mx.preload x1, 4, 4, i8\n")
    trap = err.value
    assert trap.pc == 4 and trap.instruction_text.startswith("mx.preload")
    assert "dma.ld x1, x2, x3, 4, 16, i8" in trap.reason and "pc 3" in trap.reason and "load unit" in trap.reason


def test_a_token_orders_the_two() -> None:
    checked(LOAD + "sync.push ld, mx\nsync.pop ld, mx\nmx.preload x1, 4, 4, i8\n")


def test_fence_orders_everything() -> None:
    checked(LOAD + "fence\nmx.preload x1, 4, 4, i8\n")


def test_token_between_other_units_does_not_help() -> None:
    with pytest.raises(SimulatorTrap, match="data race"):
        checked(LOAD + "sync.push ld, st\nsync.pop ld, st\nmx.preload x1, 4, 4, i8\n")


def test_transitive_ordering_through_a_third_unit() -> None:
    checked(LOAD + "sync.push ld, vx\nsync.pop ld, vx\nsync.push vx, mx\nsync.pop vx, mx\nmx.preload x1, 4, 4, i8\n")


def test_overwriting_what_another_unit_still_reads_is_a_race() -> None:
    src = "li x1, 0\nli x2, 4096\nli x3, 16\ndma.st x2, x1, x3, 4, 16, i8\nli x4, 64\ndma.ld x1, x4, x3, 4, 16, i8\n"
    with pytest.raises(SimulatorTrap, match="load unit writes it here.*store unit\\) reads it"):
        checked(src)


def test_same_unit_accesses_are_ordered() -> None:
    checked("li x1, 0\nv.relu x1, x1, 64, i8\nv.add x1, x1, x1, 64, i8\n")


def test_disjoint_ranges_do_not_race() -> None:
    checked(LOAD + "li x5, 1024\nmx.preload x5, 4, 4, i8\n")


def test_scalar_tile_test_needs_a_token() -> None:
    with pytest.raises(SimulatorTrap, match="scalar unit reads"):
        checked(LOAD + "bz.tile x1, 16, i8, end\nend: nop\n")
    checked(LOAD + "sync.push ld, sc\nsync.pop ld, sc\nbz.tile x1, 16, i8, end\nend: nop\n")


def test_dram_round_trip_needs_a_token() -> None:
    store = "li x1, 0\nli x2, 4096\nli x3, 16\ndma.st x2, x1, x3, 4, 16, i8\n"
    reload = "li x4, 1024\ndma.ld x4, x2, x3, 4, 16, i8\n"
    with pytest.raises(SimulatorTrap, match="data race on DRAM"):
        checked(store + reload)
    checked(store + "sync.push st, ld\nsync.pop st, ld\n" + reload)


def test_unchecked_mode_does_not_look() -> None:
    machine(LOAD + "mx.preload x1, 4, 4, i8\nhalt\n")


@pytest.mark.parametrize("max_cycles", [10_000, (1 << 30) - 1, 1 << 30, 1 << 40])
def test_epochs_narrow_only_where_a_run_cannot_outgrow_them(max_cycles: int) -> None:
    """Epochs are int32 (half the shadow memory) only while a run's instruction counts fit; the verdicts are the
    same either way."""
    cfg = replace(load_config("tiny"), max_cycles=max_cycles)
    assert epoch_dtype(max_cycles) == (np.int32 if max_cycles < 1 << 30 else np.int64)
    with pytest.raises(SimulatorTrap, match="data race"):
        machine(LOAD + "mx.preload x1, 4, 4, i8\nhalt\n", cfg, checked=True)
    m = machine(LOAD + "fence\nmx.preload x1, 4, 4, i8\nhalt\n", cfg, checked=True)
    assert m.races.dram.reads.dtype == epoch_dtype(max_cycles)


def test_a_strided_read_races_only_with_the_bytes_of_its_rows() -> None:
    """mx.mm.s reads rows of 4 bytes 16 apart: a vector write into the gaps between them does not race with it, a
    write into a row does."""
    setup = "li x5, 0x1000000\nli x2, 1024\nmx.preload x2, 4, 4, i8\nli x1, 0\nli x3, 16\nmx.mm.s x5, x1, x3, 4\n"
    checked(setup + "li x4, 4\nv.relu x4, x4, 12, i8\nli x4, 52\nv.relu x4, x4, 12, i8\n")
    with pytest.raises(SimulatorTrap, match="data race"):
        checked(setup + "li x4, 48\nv.relu x4, x4, 1, i8\n")


def test_a_strided_drain_races_only_with_the_bytes_of_its_rows() -> None:
    """mx.drain.s writes rows of 4 bytes 16 apart: a vector read of the gaps between them does not race with it, a
    read of a row does."""
    setup = "li x1, 0x1000000\nli x2, 0\nli x4, 1\nep.cfg x2, x2, x4, 0, none, none, i8\nli x6, 0\n"
    setup += "li x3, 16\nmx.drain.s x6, x1, x3, 4, 4\nli x7, 1024\n"
    checked(setup + "li x4, 4\nv.relu x7, x4, 12, i8\nli x4, 52\nv.relu x7, x4, 12, i8\n")
    with pytest.raises(SimulatorTrap, match="data race"):
        checked(setup + "li x4, 48\nv.relu x7, x4, 1, i8\n")
