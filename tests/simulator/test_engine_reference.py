"""The event-driven engine against a cycle-ticking reference model of the same rules.

The reference advances one cycle at a time: in each cycle, units (lowest number first, repeatedly)
start their head instruction when it has issued, the unit is free, its token's push has retired and no
other unit holds one of its banks; then the scalar core issues the next instruction if that unit's queue
has room, and units get another chance in the same cycle. DMA data phases share one DRAM channel. Then
the stream moves: a running mx.mms lets its next row out of the array when the row has come through
(2N - 1 array steps after it entered) unless the FIFO holds `stream_fifo_depth` rows, in which case the
whole array freezes for the cycle; a running vc.lds takes one row that is out. The matrix unit is pipelined: a
preload waits for the previous preload, a matmul for the previous matmul's rows (`n` cycles after its start) and the
last preload, a drain-like (PLAIN) instruction or an mx.mms for every earlier matrix instruction to finish, and
nothing starts before a drain has finished. A bank is held until the last of its owner's instructions on it has
finished. The engine must give every instruction the same start and finish cycle, and deadlock exactly when the
reference never finishes.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import PRESETS
from simulator.engine import (
    CONFIG,
    DMA,
    MATMUL,
    MATRIX,
    PLAIN,
    POP,
    PRELOAD,
    PRODUCER,
    QUEUED_UNITS,
    STAT_FIELDS,
    STREAM,
    VECTOR,
    Engine,
    Op,
)
from simulator.errors import Fault


@dataclass(frozen=True)
class Spec:
    unit: int
    dur: int
    banks: tuple[int, ...]
    kind: int
    dep: int | None = None  # index of the push a pop waits for
    xfer: int = 0
    extra: int = 0
    n: int = 0  # PRODUCER: rows; STREAM: elements taken, (global) last row they touch, pipeline latency
    row: int = 0
    lat: int = 0


N = PRESETS["tiny"].array_size  # the tests run on tiny; streamed rows here are N = L = 4 elements wide
DEADLOCK = "deadlock"


@st.composite
def programs(draw) -> list[Spec]:
    specs: list[Spec] = []
    pushes: list[int] = []
    producers: list[tuple[int, int]] = []  # (spec index, rows) of each mx.mms
    streamed, taken = 0, 0  # elements produced and consumed
    for _ in range(draw(st.integers(1, 30))):
        unit = draw(st.sampled_from(QUEUED_UNITS))
        choice = draw(
            st.sampled_from(["work", "work", "dma", "push", "pop", "stream", "take", "take", "preload", "mm", "mm"])
        )
        banks = tuple(sorted(draw(st.sets(st.integers(0, 3), max_size=2))))
        if choice == "pop" and pushes:
            specs.append(Spec(unit, 0, (), POP, pushes.pop(draw(st.integers(0, len(pushes) - 1)))))
        elif choice == "push":
            pushes.append(len(specs))
            specs.append(Spec(unit, 0, (), PLAIN))
        elif choice == "stream":
            rows = draw(st.integers(1, 12))
            producers.append((len(specs), rows))
            specs.append(Spec(MATRIX, rows + 2 * N - 1, banks, PRODUCER, n=rows))  # mx.mms
            streamed += rows * N
        elif choice == "preload":
            specs.append(Spec(MATRIX, N, banks, PRELOAD))
        elif choice == "mm":
            rows = draw(st.integers(0, 12))
            specs.append(Spec(MATRIX, rows + 2 * N - 1, banks, MATMUL, n=rows))
        elif choice == "take" and taken < streamed:
            specs.append(_take(draw, producers, taken, draw(st.integers(1, streamed - taken))))
            taken = specs[-1].n + taken
        elif choice == "dma" and unit in (1, 4):
            xfer, extra = draw(st.integers(1, 12)), draw(st.integers(0, 2))
            specs.append(Spec(unit, 0, banks, DMA, None, xfer, extra))
        else:
            kind = CONFIG if unit == MATRIX and draw(st.booleans()) else PLAIN
            specs.append(Spec(unit, draw(st.integers(0, 15)), banks, kind))
    if taken < streamed and draw(st.integers(0, 3)):  # else rows may stay in the FIFO (a deadlock if too many)
        specs.append(_take(draw, producers, taken, streamed - taken))
    return specs


def _take(draw, producers: list[tuple[int, int]], taken: int, n: int) -> Spec:
    """vc.lds of n elements after `taken` were consumed: its dependency is the producer of its last row."""
    last_row = (taken + n - 1) // N
    ends = np.cumsum([rows for _, rows in producers])
    index = producers[int(np.searchsorted(ends, last_row, side="right"))][0]
    completed = (taken + n) // N - taken // N
    return Spec(VECTOR, 0, (), STREAM, index, xfer=completed, n=n, row=last_row, lat=draw(st.integers(0, 2)))


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
        try:
            now = engine.submit(op, now) + 1
        except Fault as fault:
            return _deadlock(fault)
    try:
        engine.drain()
    except Fault as fault:
        return _deadlock(fault)
    return [(op.start, op.finish) for op in ops]


def _deadlock(fault: Fault) -> str:
    assert str(fault).startswith("deadlock: ") and "stream FIFO" in str(fault), fault
    return DEADLOCK


def reference_times(specs: list[Spec], cfg) -> list[tuple[int, int]] | str:
    n = len(specs)
    start: list[int | None] = [None] * n
    finish: list[int | None] = [None] * n
    queues: dict[int, deque[int]] = {u: deque() for u in QUEUED_UNITS}
    free: dict[int, float] = dict.fromkeys(QUEUED_UNITS, 0)
    owner, holders = [-1] * 4, [[] for _ in range(4)]  # a bank's unit and its instructions on it since it took it
    matrix: list[int] = []  # matrix instructions started so far
    weights, rows_free, hold = 0, 0.0, 0.0  # last preload's finish, array input free, last drain's finish
    channel = 0
    out: list[int] = []  # cycle each streamed row left the array
    took: list[int] = []  # cycle the vector unit took each row
    producing: list | None = None  # [spec index, rows out, array steps done]
    consuming: list | None = None  # [spec index, rows taken]

    def done_by(i: int, t: int) -> bool:
        return finish[i] is not None and finish[i] <= t

    def matrix_ready(spec: Spec, t: int) -> bool:
        if hold > t:
            return False
        if spec.kind == PRELOAD:
            return weights <= t
        if spec.kind == MATMUL:
            return weights <= t and rows_free <= t
        if spec.kind in (PLAIN, PRODUCER):
            return all(done_by(i, t) for i in matrix)
        return True

    def eligible(u: int, t: int) -> bool:
        if not queues[u]:
            return False
        spec = specs[queues[u][0]]
        if (not matrix_ready(spec, t)) if u == MATRIX else free[u] > t:
            return False
        if spec.kind == STREAM and start[spec.dep] is None:  # the stream has not begun
            return False
        if spec.kind == POP and (finish[spec.dep] is None or finish[spec.dep] > t):
            return False
        return all(owner[b] == u or all(done_by(i, t) for i in holders[b]) for b in spec.banks)

    def take_banks(i: int, u: int) -> None:
        for b in specs[i].banks:
            if owner[b] != u:
                owner[b], holders[b] = u, []
            holders[b].append(i)

    def occupy(i: int, u: int, end: float) -> None:
        nonlocal weights, rows_free, hold
        finish[i], free[u] = (None if end == float("inf") else int(end)), end
        spec = specs[i]
        if u == MATRIX:
            if spec.kind == PRELOAD:
                weights = int(end)
            elif spec.kind == MATMUL:
                rows_free = start[i] + spec.n
            elif spec.kind == PRODUCER:
                rows_free = end
            elif spec.kind == PLAIN:
                hold = end

    def start_all(t: int) -> None:
        nonlocal channel, producing, consuming
        while True:
            u = next((u for u in QUEUED_UNITS if eligible(u, t)), None)
            if u is None:
                return
            i = queues[u].popleft()
            spec = specs[i]
            start[i] = t
            take_banks(i, u)
            if u == MATRIX:
                matrix.append(i)
            if spec.kind == DMA:
                data = max(t + cfg.dram_latency, channel)
                channel = data + spec.xfer
                occupy(i, u, channel + spec.extra)
            elif spec.kind == PRODUCER:
                producing = [i, 0, 0]
                occupy(i, u, float("inf"))
            elif spec.kind == STREAM:
                consuming = [i, 0]
                occupy(i, u, float("inf"))
            else:
                occupy(i, u, t + spec.dur)

    def stream_step(t: int) -> None:
        nonlocal producing, consuming
        if producing is not None:
            i, done, steps = producing
            if steps == done + 2 * N - 1:  # row `done` is at the array's output
                held = sum(o < t for o in out) - sum(c < t for c in took)
                if held < cfg.stream_fifo_depth:
                    out.append(t)
                    producing = [i, done + 1, steps + 1]
            else:
                producing = [i, done, steps + 1]
            if producing[1] == specs[i].n:
                occupy(i, MATRIX, t + 1)
                producing = None
        if consuming is not None:
            i, got = consuming
            spec = specs[i]
            if got < spec.xfer and len(out) > len(took) and out[len(took)] <= t:
                took.append(t)
                consuming = [i, got + 1]
            if consuming[1] == spec.xfer and len(out) > spec.row:
                occupy(i, VECTOR, max(start[i] + -(-spec.n // cfg.vector_lanes), out[spec.row] + 1) + spec.lat)
                consuming = None

    t, issued, idle = 0, 0, 0
    while issued < n or any(queues.values()) or producing is not None or consuming is not None:
        progress = (issued, len(out), len(took), sum(x is not None for x in finish))
        start_all(t)
        if issued < n and len(queues[specs[issued].unit]) < cfg.queue_depth:
            queues[specs[issued].unit].append(issued)
            issued += 1
            start_all(t)
        stream_step(t)
        same = progress == (issued, len(out), len(took), sum(x is not None for x in finish))
        idle = idle + 1 if same else 0
        if idle > 200:  # nothing has moved for longer than any instruction here takes
            return DEADLOCK
        t += 1
    return list(zip(start, finish, strict=True))


@settings(max_examples=300, deadline=None)
@given(specs=programs(), depth=st.integers(1, 4), latency=st.integers(0, 6))
def test_engine_matches_cycle_ticking_reference(specs: list[Spec], depth: int, latency: int) -> None:
    cfg = replace(PRESETS["tiny"], queue_depth=depth, dram_latency=latency, stream_fifo_depth=depth)
    assert engine_times(specs, cfg) == reference_times(specs, cfg)
