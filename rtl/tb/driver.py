"""The one cocotb driver/monitor for every RTL unit.

It replays a job file (`rtl.jobs`) cycle by cycle and writes the events it saw;
judging them is the checker's job, outside the simulator. Inputs change and
outputs are sampled after they settle in the same half cycle, so the value read
at cycle t is what the unit shows during cycle t.
"""

from __future__ import annotations

import os
from pathlib import Path

import cocotb
from cocotb.clock import Clock
from cocotb.simtime import get_sim_time
from cocotb.triggers import FallingEdge, ReadOnly

from rtl.jobs import CLOCK_NS, Event, ItemResult, read_job, write_results

JOB_ENV = "DYNFUSE_RTL_JOB"
RESULT_ENV = "DYNFUSE_RTL_RESULT"
RESET_CYCLES = 2


class _Clocked:
    def __init__(self, dut) -> None:
        self.dut = dut
        self.cycle = 0
        self.handles: dict = {}
        self.written: dict[str, int] = {}  # skip writes that change nothing (each costs a VPI call)

    def handle(self, name: str):
        if name not in self.handles:
            self.handles[name] = getattr(self.dut, name)
        return self.handles[name]

    def set(self, values: dict[str, int]) -> None:
        for name, value in values.items():
            if self.written.get(name) != value:
                self.handle(name).value = value
                self.written[name] = value

    def read(self, name: str) -> int:
        value = self.handle(name).value
        return int(value) if value.is_resolvable else -1

    async def tick(self) -> None:
        await FallingEdge(self.dut.clk)
        self.cycle += 1


async def _run_item(clk: _Clocked, item, idle: dict[str, int], settle: bool) -> ItemResult:
    start, start_ns = clk.cycle, get_sim_time("ns")
    driven = item.cycles
    events: list[list[Event]] = [[] for _ in item.watches]
    previous = [True] * len(item.watches)  # an edge watch must see its signal low first
    clk.set(item.hold)
    t = 0
    while True:
        inputs = {name: values[t] if t < len(values) else idle.get(name, 0) for name, values in item.drive.items()}
        clk.set(inputs)
        if settle:
            await ReadOnly()  # let combinational outputs see this cycle's inputs
        current = {**item.hold, **inputs}
        for w, watch in enumerate(item.watches):
            high = all((current[n] if n in current else clk.read(n)) == 1 for n in watch.when)
            if high and not (watch.edge and previous[w]) and len(events[w]) < watch.count:
                events[w].append(Event(t, {n: clk.read(n) for n in watch.record}))
            previous[w] = high
        done = all(len(e) >= w.count for e, w in zip(events, item.watches, strict=True))
        if (t >= driven - 1 and done) or t >= driven + item.timeout:
            break
        await clk.tick()
        t += 1
    return ItemResult(item.label, tuple(tuple(e) for e in events), start, start_ns)


@cocotb.test()
async def replay_job(dut) -> None:
    """Drive every item of the job and record the watched events."""
    job = read_job(Path(os.environ[JOB_ENV]))
    Clock(dut.clk, CLOCK_NS, unit="ns", impl="gpi").start()
    clk = _Clocked(dut)
    clk.set({**job.idle, "rst": 1})
    for _ in range(RESET_CYCLES):
        await clk.tick()
    clk.set({"rst": 0})
    await clk.tick()
    results = []
    for item in job.items:
        results.append(await _run_item(clk, item, job.idle, job.settle))
        await clk.tick()
        clk.set({**job.idle, "rst": int(job.reset_between)})  # a reset keeps one item's failure out of the next
        for _ in range(job.gap):
            await clk.tick()
        clk.set({"rst": 0})
    write_results(results, Path(os.environ[RESULT_ENV]))
