"""Timing interactions between units: overlap, tokens, full queues, bank conflicts, the DRAM channel."""

from __future__ import annotations

from sim_helpers import machine, run_asm, unit_slices

from isa.enums import Unit
from simulator import PRESETS

CFG = PRESETS["tiny"]  # queue 4; spad banks of 8 KiB; DRAM: latency 20, 8 B/cycle, 16 B bursts
BANK1 = 8192


def starts(m, unit: int) -> list[tuple[str, int, int]]:
    return [(m.instructions[pc].mnemonic, s, f) for pc, s, f in unit_slices(m, unit)]


def test_units_overlap_when_independent() -> None:
    m = machine(
        f"li x1, 0\nli x2, 0\nli x3, 64\ndma.ld x1, x2, x3, 4, 64, i8\nli x4, {BANK1}\nv.add x4, x4, x4, 64, i8\nhalt\n"
    )
    ((_, ld_start, ld_end),) = starts(m, Unit.load)
    ((_, vx_start, vx_end),) = starts(m, Unit.vector)
    assert ld_start == 3 and vx_start == 5 and vx_end < ld_end
    assert m.now == ld_end  # halt completes when the last unit goes idle


def test_bank_conflict_makes_the_later_one_wait() -> None:
    src = "li x1, 0\nli x2, 0\nli x3, 64\ndma.ld x1, x2, x3, 4, 64, i8\nli x4, 4096\nv.relu x4, x4, 64, i8\nhalt\n"
    r = run_asm(src, trace=True)
    m = machine(src)
    ((_, _, ld_end),) = starts(m, Unit.load)
    ((_, vx_start, _),) = starts(m, Unit.vector)
    assert vx_start == ld_end  # same bank (0): the vector op waits for the DMA
    assert r.counters.vector_stall_bank == ld_end - 5


def test_token_wait_is_counted() -> None:
    src = (
        "li x1, 0\nli x2, 0\nli x3, 16\ndma.ld x1, x2, x3, 4, 16, i8\nsync.push ld, mx\nsync.pop ld, mx\n"
        "mx.preload x1, 4, 4, i8\nhalt\n"
    )
    m = machine(src)
    (_, _, ld_end), _push = starts(m, Unit.load)
    pop, preload = starts(m, Unit.matrix)
    assert pop[1] == ld_end and preload[1] == ld_end and preload[2] == ld_end + CFG.array_size
    r = run_asm(src)
    assert r.counters.matrix_stall_token == ld_end - 5  # the pop issued at cycle 5 and waited for the push
    assert r.counters.instructions_load == 2 and r.counters.instructions_matrix == 2


def test_full_queue_stalls_issue_until_an_entry_leaves() -> None:
    ops = "".join("v.relu x1, x1, 400, i8\n" for _ in range(CFG.queue_depth + 2))
    m = machine("li x1, 0\n" + ops + "halt\n")
    slices = starts(m, Unit.vector)
    per_op = -(-400 // CFG.vector_lanes) + 1
    assert [s for _, s, _ in slices] == [1 + i * per_op for i in range(len(slices))]
    # scalar-track slices span from the attempt to issue until the issue cycle has passed
    issue = [f - 1 for u, pc, s, f in m.trace if u == Unit.scalar and m.instructions[pc].mnemonic == "v.relu"]
    # the first queue_depth + 1 issue back to back (one runs, depth wait); the next waits for a start
    assert issue[: CFG.queue_depth + 1] == list(range(1, CFG.queue_depth + 2))
    assert issue[CFG.queue_depth + 1] == slices[1][1]
    r = run_asm("li x1, 0\n" + ops + "halt\n")
    assert r.counters.scalar_stall_queue_full == slices[1][1] - (CFG.queue_depth + 2)


def test_load_and_store_share_the_dram_channel() -> None:
    src = (
        f"li x1, 0\nli x2, 0\nli x3, 256\ndma.ld x1, x2, x3, 1, 256, i8\nli x4, {BANK1}\nli x5, 4096\n"
        "dma.st x5, x4, x3, 1, 256, i8\nhalt\n"
    )
    m = machine(src)
    ((_, ld_start, ld_end),) = starts(m, Unit.load)
    ((_, st_start, st_end),) = starts(m, Unit.store)
    transfer = 256 // CFG.dram_bytes_per_cycle
    assert ld_end == ld_start + CFG.dram_latency + transfer
    # the store's data phase waits for the load's to finish on the shared channel
    assert st_end == max(st_start + CFG.dram_latency, ld_end) + transfer
    r = run_asm(src)
    assert r.counters.store_stall_dram == ld_end - (st_start + CFG.dram_latency)
    assert r.counters.store_busy == CFG.dram_latency + transfer


def test_fence_waits_for_every_unit() -> None:
    m = machine("li x1, 0\nv.relu x1, x1, 400, i8\nfence\nli x2, 5\nhalt\n")
    ((_, _, end),) = starts(m, Unit.vector)
    fence_issue = [s for u, pc, s, f in m.trace if u == Unit.scalar and m.instructions[pc].mnemonic == "li"][1]
    assert fence_issue == end


def test_counters_add_up_and_respect_the_roofline() -> None:
    src = (
        "li x1, 0\nli x2, 0\nli x3, 64\ndma.ld x1, x2, x3, 4, 64, i8\nsync.push ld, mx\nsync.pop ld, mx\n"
        "mx.preload x1, 4, 4, i8\nli x5, 0x1000000\nmx.mm x5, x1, 16\nhalt\n"
    )
    c = run_asm(src).counters
    for unit in ("load", "matrix", "vector", "store"):
        parts = sum(getattr(c, f"{unit}_{k}") for k in ("busy", "idle", "stall_token", "stall_bank", "stall_dram"))
        assert parts == c.cycle
    assert c.macs == 16 * 4 * 4 and c.roofline_bound_cycles <= c.cycle and 0 < c.roofline_fraction <= 1
    assert c.energy_total_pj == sum(
        getattr(c, f"energy_{k}_pj") for k in ("dram", "spad", "acc", "mac", "vector", "instruction")
    )
