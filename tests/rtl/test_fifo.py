"""The matrix -> vector stream FIFO under random valid/ready traffic.

Its oracle is the traffic itself: rows leave in the order they were accepted,
an empty FIFO passes a row on in the cycle it arrives (a consumer finishes at
`last_row_out + 1`, the chain_stream timing rule), and it refuses rows
exactly when DEPTH rows wait.
"""

from __future__ import annotations

import numpy as np
import pytest

from rtl import build as rtl_build
from rtl.jobs import Item, Job, Watch, pack, unpack
from rtl.units import ACC_BITS, FIFO
from simulator.config import PRESETS
from simulator.timing import chain_stream_finish

pytestmark = pytest.mark.rtl
CYCLES = 400


def _traffic(rng: np.random.Generator, cfg, push_rate: float, pop_rate: float) -> Item:
    """Random pushes and pops, ending with enough pops to leave the FIFO empty for the next item."""
    n, tail = cfg.array_size, FIFO.params(cfg)["DEPTH"] + 1
    rows = rng.integers(-(2**31), 2**31, (CYCLES, n), dtype=np.int64)
    valid = rng.random(CYCLES) < push_rate
    ready = rng.random(CYCLES) < pop_rate
    valid[-tail:], ready[-tail:] = False, True
    return Item(
        f"push {push_rate} pop {pop_rate}",
        {},
        {
            "in_valid": valid.astype(int).tolist(),
            "in_data": pack(rows, ACC_BITS),
            "out_ready": ready.astype(int).tolist(),
        },
        (Watch(("in_valid",), ("in_ready",), CYCLES), Watch(("out_ready",), ("out_valid", "out_data"), CYCLES)),
        timeout=0,
    )


@pytest.mark.parametrize("config", ["tiny", "base"])
def test_stream_fifo_orders_and_bounds_rows(config: str) -> None:
    cfg = PRESETS[config]
    params = FIFO.params(cfg)
    depth, n = params["DEPTH"], cfg.array_size
    rng = np.random.default_rng(3)
    items = [_traffic(rng, cfg, p, q) for p, q in ((0.9, 0.3), (0.3, 0.9), (0.6, 0.6), (1.0, 1.0))]
    built = rtl_build.build(FIFO.toplevel, params)
    idle = {"in_valid": 0, "out_ready": 0, "in_data": 0}
    results = rtl_build.run(built, Job(FIFO.toplevel, tuple(items), idle, settle=FIFO.combinational))
    passed_through = 0
    for item, result in zip(items, results, strict=True):
        offered, polled = result.events
        valid = np.array(item.drive["in_valid"], dtype=bool)
        ready = np.array(item.drive["out_ready"], dtype=bool)
        in_ready = np.zeros(CYCLES, dtype=bool)
        in_ready[[e.offset for e in offered]] = [e.values["in_ready"] == 1 for e in offered]
        out_valid = np.zeros(CYCLES, dtype=bool)
        out_valid[[e.offset for e in polled]] = [e.values["out_valid"] == 1 for e in polled]
        push, pop = valid & in_ready, ready & out_valid
        # occupancy during cycle t counts the pushes and pops of earlier cycles
        occupancy = np.concatenate(([0], np.cumsum(push.astype(int) - pop.astype(int))[:-1]))
        assert occupancy.max() <= depth
        np.testing.assert_array_equal(in_ready[valid], (occupancy < depth)[valid])
        np.testing.assert_array_equal(out_valid[ready], ((occupancy > 0) | valid)[ready])
        pushed = unpack(item.drive["in_data"], n, ACC_BITS)[push]
        popped = unpack([e.values["out_data"] for e in polled if e.values["out_valid"] == 1], n, ACC_BITS)
        np.testing.assert_array_equal(popped, pushed[: len(popped)])
        push_cycles, pop_cycles = np.flatnonzero(push), np.flatnonzero(pop)
        assert len(pop_cycles) == len(push_cycles)
        assert (pop_cycles >= push_cycles).all()
        # a row arriving at an empty FIFO with a ready consumer is taken that cycle: done at last_row_out + 1
        through = np.flatnonzero(push & pop & (occupancy == 0))
        passed_through += through.size
        np.testing.assert_array_equal(through + 1, [chain_stream_finish(cfg, 0, 0, int(t), 0) for t in through])
    assert passed_through > 0
