"""The event-driven engine against a cycle-ticking reference model of the same rules.

The reference advances one cycle at a time: in each cycle, units (lowest number first, repeatedly)
start their head instruction when it has issued, the unit is free, its token's push has retired and no
other unit holds one of its banks; then the scalar core issues the next instruction if that unit's queue
has room, and units get another chance in the same cycle. DMA data phases share one DRAM channel. The
engine must give every instruction the same start and finish cycle.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import PRESETS
from simulator.engine import DMA, MATRIX, PLAIN, POP, QUEUED_UNITS, STAT_FIELDS, STREAM, VECTOR, Engine, Op


@dataclass(frozen=True)
class Spec:
    unit: int
    dur: int
    banks: tuple[int, ...]
    kind: int
    dep: int | None = None  # index of the push a pop waits for
    xfer: int = 0
    extra: int = 0
    n: int = 0  # STREAM: elements taken, index of the last row they come from, pipeline latency
    row: int = 0
    lat: int = 0


N = PRESETS["tiny"].array_size  # the tests run on tiny; streamed rows here are 4 elements wide


@st.composite
def programs(draw) -> list[Spec]:
    specs: list[Spec] = []
    pushes: list[int] = []
    for _ in range(draw(st.integers(1, 30))):
        unit = draw(st.sampled_from(QUEUED_UNITS))
        choice = draw(st.sampled_from(["work", "work", "dma", "push", "pop", "stream"]))
        banks = tuple(sorted(draw(st.sets(st.integers(0, 3), max_size=2))))
        if choice == "pop" and pushes:
            specs.append(Spec(unit, 0, (), POP, pushes.pop(draw(st.integers(0, len(pushes) - 1)))))
        elif choice == "push":
            pushes.append(len(specs))
            specs.append(Spec(unit, 0, (), PLAIN))
        elif choice == "stream":
            rows = draw(st.integers(1, 8))
            specs.append(Spec(MATRIX, rows + 2 * N - 1, banks, PLAIN))  # mx.mms
            n, lat = draw(st.integers(1, 4 * rows)), draw(st.integers(0, 2))
            specs.append(Spec(VECTOR, 0, (), STREAM, len(specs) - 1, n=n, row=(n - 1) // 4, lat=lat))
        elif choice == "dma" and unit in (1, 4):
            xfer, extra = draw(st.integers(1, 12)), draw(st.integers(0, 2))
            specs.append(Spec(unit, 0, banks, DMA, None, xfer, extra))
        else:
            specs.append(Spec(unit, draw(st.integers(0, 15)), banks, PLAIN))
    return specs


def engine_times(specs: list[Spec], cfg) -> list[tuple[int, int]]:
    engine = Engine(cfg, None)
    ops: list[Op] = []
    now = 0
    for spec in specs:
        dep = ops[spec.dep] if spec.dep is not None else None
        mask = sum(1 << b for b in spec.banks)
        op = Op(spec.unit, len(ops), spec.dur, spec.banks, mask, [0] * STAT_FIELDS, spec.kind, dep)
        op.xfer, op.extra, op.n, op.row, op.lat = spec.xfer, spec.extra, spec.n, spec.row, spec.lat
        ops.append(op)
        now = engine.submit(op, now) + 1
    engine.drain()
    return [(op.start, op.finish) for op in ops]


def reference_times(specs: list[Spec], cfg) -> list[tuple[int, int]]:
    n = len(specs)
    start: list[int | None] = [None] * n
    finish: list[int | None] = [None] * n
    queues: dict[int, deque[int]] = {u: deque() for u in QUEUED_UNITS}
    free = dict.fromkeys(QUEUED_UNITS, 0)
    owner, until = [-1] * 4, [0] * 4
    channel = 0

    def eligible(u: int, t: int) -> bool:
        if not queues[u] or free[u] > t:
            return False
        spec = specs[queues[u][0]]
        if spec.kind == STREAM and start[spec.dep] is None:  # the stream has not begun
            return False
        if spec.kind == POP and (finish[spec.dep] is None or finish[spec.dep] > t):
            return False
        return all(owner[b] == u or until[b] <= t for b in spec.banks)

    def start_all(t: int) -> None:
        nonlocal channel
        while True:
            u = next((u for u in QUEUED_UNITS if eligible(u, t)), None)
            if u is None:
                return
            i = queues[u].popleft()
            spec = specs[i]
            if spec.kind == DMA:
                data = max(t + cfg.dram_latency, channel)
                channel = data + spec.xfer
                end = channel + spec.extra
            elif spec.kind == STREAM:  # row r of a stream started at s is ready at s + r + 2N - 1
                last_ready = start[spec.dep] + spec.row + 2 * N - 1
                end = max(t + -(-spec.n // cfg.vector_lanes), last_ready + 1) + spec.lat
            else:
                end = t + spec.dur
            start[i], finish[i], free[u] = t, end, end
            for b in spec.banks:
                owner[b], until[b] = u, end

    t, issued = 0, 0
    while issued < n or any(queues.values()):
        start_all(t)
        if issued < n and len(queues[specs[issued].unit]) < cfg.queue_depth:
            queues[specs[issued].unit].append(issued)
            issued += 1
            start_all(t)
        t += 1
    return list(zip(start, finish, strict=True))


@settings(max_examples=300, deadline=None)
@given(specs=programs(), depth=st.integers(1, 4), latency=st.integers(0, 6))
def test_engine_matches_cycle_ticking_reference(specs: list[Spec], depth: int, latency: int) -> None:
    cfg = replace(PRESETS["tiny"], queue_depth=depth, dram_latency=latency)
    assert engine_times(specs, cfg) == reference_times(specs, cfg)
