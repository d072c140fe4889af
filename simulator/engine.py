"""The timing engine: per-unit in-order queues started in global time order.

Data work happens when an instruction issues (program order); this engine only decides *when* each unit
instruction runs. An instruction starts at the earliest cycle at which it has issued, its unit is free,
its dependency is satisfied (a `sync.pop`'s matching push has retired; a `vc.lds`'s matrix stream has
begun) and no other unit holds a bank it touches. Instructions are timed lazily, always the one with the
earliest possible start next, so bank and DRAM-channel arbitration is first come, first served in time
(ties: lower unit number first) while the engine jumps from event to event instead of ticking cycles.
Every dependency points to an earlier-issued instruction, so the engine can never deadlock.
"""

from __future__ import annotations

from collections import deque

from isa.enums import Unit
from simulator.config import MachineConfig
from simulator.errors import Fault
from simulator.timing import chain_stream_finish, stream_row_ready

INF = float("inf")
LOAD, MATRIX, VECTOR, STORE = int(Unit.load), int(Unit.matrix), int(Unit.vector), int(Unit.store)
QUEUED_UNITS = (LOAD, MATRIX, VECTOR, STORE)  # plain ints: list indexing with IntEnum members is slower

# Op kinds: how the finish cycle and the dependency are computed.
PLAIN, DMA, STREAM, POP = 0, 1, 2, 3

# Per-pc statistics row layout (one list per instruction, shared with the counters module).
(
    S_BUSY,
    S_TOKEN,
    S_BANK,
    S_DRAM,
    S_QUEUE,
    S_FENCE,
    S_DRAM_RD,
    S_DRAM_WR,
    S_SPAD_RD,
    S_SPAD_WR,
    S_ACC_RD,
    S_ACC_WR,
    S_MACS_I8,
    S_MACS_F32,
    S_VOPS_INT,
    S_VOPS_F32,
    S_TAKEN,
) = range(17)
STAT_FIELDS = 17


class Op:
    """One unit instruction in flight: what the engine needs to time it, and, once timed, when it ran."""

    __slots__ = (
        "unit",
        "pc",
        "issue",
        "dur",
        "banks",
        "mask",
        "kind",
        "dep",
        "xfer",
        "extra",
        "n",
        "row",
        "lat",
        "start",
        "finish",
        "stats",
    )

    def __init__(
        self,
        unit: int,
        pc: int,
        dur: int,
        banks: tuple[int, ...],
        mask: int,
        stats: list[int],
        kind: int = PLAIN,
        dep: Op | None = None,
    ) -> None:
        self.unit = unit
        self.pc = pc
        self.dur = dur
        self.banks = banks
        self.mask = mask
        self.stats = stats
        self.kind = kind
        self.dep = dep
        self.issue = 0
        self.start = -1
        self.finish = -1


def retired_token(now: int) -> Op:
    """A token pushed by the scalar core: available at once."""
    op = Op(Unit.scalar, -1, 0, (), 0, [0] * STAT_FIELDS)
    op.start = op.finish = now
    return op


class Engine:
    def __init__(self, cfg: MachineConfig, trace: list[tuple[int, int, int, int]] | None) -> None:
        self.cfg = cfg
        self.depth = cfg.queue_depth
        self.queues: list[deque[Op]] = [deque() for _ in Unit]
        self.free = [0] * len(Unit)
        self.cand: list[float | None] = [None] * len(Unit)
        nbanks = cfg.spad_banks + cfg.acc_banks
        self.bank_owner = [-1] * nbanks
        self.bank_until = [0] * nbanks
        self.channel_free = 0
        self.pending = 0
        self.trace = trace

    def submit(self, op: Op, now: int) -> int:
        """Queue `op` at cycle `now`; returns the (possibly later) cycle at which it could be issued."""
        queue = self.queues[op.unit]
        if self.pending:
            self.advance(now)
        while len(queue) >= self.depth:
            head = queue[0]
            self.wait_for(head)
            if head.start > now:
                op.stats[S_QUEUE] += head.start - now
                now = head.start
            self.advance(now)
        op.issue = now
        queue.append(op)
        self.pending += 1
        return now

    def wait_for(self, op: Op) -> None:
        """Time instructions in order until `op` has been timed."""
        while op.start < 0:
            if not self.pending:
                raise Fault(f"internal: instruction at pc {op.pc} can never start")
            self.advance(INF, one=True)

    def drain(self) -> int:
        """Time everything; returns the cycle at which every unit is idle."""
        self.advance(INF)
        return max(self.free)

    def advance(self, limit: float, one: bool = False) -> None:
        """Start, in time order, every queued instruction that can start at or before `limit`."""
        queues, cand, candidate = self.queues, self.cand, self._candidate
        while self.pending:
            best, best_t = -1, INF
            for u in QUEUED_UNITS:
                queue = queues[u]
                if queue:
                    c = cand[u]
                    if c is None:
                        c = cand[u] = candidate(u, queue[0])
                    if c < best_t:
                        best, best_t = u, c
            if best < 0 or best_t > limit:
                return
            self._start(best, int(best_t))
            if one:
                return

    def _candidate(self, u: int, op: Op) -> float:
        t = op.issue
        if self.free[u] > t:
            t = self.free[u]
        dep = op.dep
        if dep is not None:
            if dep.start < 0:
                return INF
            ready = dep.finish if op.kind == POP else dep.start
            if ready > t:
                t = ready
        owner, until = self.bank_owner, self.bank_until
        for b in op.banks:
            if owner[b] != u and until[b] > t:
                t = until[b]
        return t

    def _start(self, u: int, t: int) -> None:
        op = self.queues[u].popleft()
        self.pending -= 1
        stats = op.stats
        ready = max(op.issue, self.free[u])
        if op.dep is not None:
            dep_ready = op.dep.finish if op.kind == POP else op.dep.start
            if dep_ready > ready:
                stats[S_TOKEN] += dep_ready - ready
                ready = dep_ready
        stats[S_BANK] += t - ready
        kind = op.kind
        if kind == DMA:
            data_start = t + self.cfg.dram_latency
            if self.channel_free > data_start:
                stats[S_DRAM] += self.channel_free - data_start
                data_start = self.channel_free
            self.channel_free = data_start + op.xfer
            finish = self.channel_free + op.extra
            stats[S_BUSY] += finish - t - (data_start - t - self.cfg.dram_latency)
        elif kind == STREAM:
            last_ready = stream_row_ready(self.cfg, op.dep.start, op.row)
            finish = chain_stream_finish(self.cfg, t, op.n, last_ready, op.lat)
            stats[S_BUSY] += finish - t
        else:
            finish = t + op.dur
            stats[S_BUSY] += op.dur
        op.start, op.finish = t, finish
        self.free[u] = finish
        for b in op.banks:
            self.bank_owner[b] = u
            self.bank_until[b] = finish
        cand = self.cand
        cand[u] = None
        for v in QUEUED_UNITS:
            c = cand[v]
            if c is not None and (c == INF or self.queues[v][0].mask & op.mask):
                cand[v] = None
        if self.trace is not None:
            self.trace.append((u, op.pc, t, finish))
