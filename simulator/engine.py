"""The timing engine: per-unit in-order queues started in global time order.

Data work happens when an instruction issues (program order); this engine only decides *when* each unit
instruction runs. An instruction starts at the earliest cycle at which it has issued, its unit is free,
its dependency is satisfied (a `sync.pop`'s matching push has retired; a `vc.lds`'s matrix stream has
begun) and no other unit holds a bank it touches. Instructions are timed lazily, always the one with the
earliest possible start next, so bank and DRAM-channel arbitration is first come, first served in time
(ties: lower unit number first) while the engine jumps from event to event instead of ticking cycles.
The matrix unit is pipelined (`MatrixPipe`): it starts its instructions in order, but a matmul holds only the
array's input and a preload only the weight port, so the next one may start while earlier results are still on
their way (double-buffered weights); instructions that need those results wait for them. Every dependency points
to an earlier-issued instruction. The one exception is the bounded stream FIFO:
an `mx.mms` whose rows fill it cannot finish until a `vc.lds` takes them, so its finish stays open (the
matrix unit and its banks are held) until the consumers of its rows are timed; a program whose `vc.lds`
can never start then is a deadlock, reported as a trap.
"""

from __future__ import annotations

from collections import deque

from isa.enums import Unit
from simulator.config import MachineConfig
from simulator.errors import Fault
from simulator.timing import (
    chain_stream_finish,
    matmul_input_cycles,
    matmul_start,
    matrix_drained_start,
    preload_start,
    stream_row_out,
    stream_row_ready,
    stream_row_taken,
)

INF = float("inf")
LOAD, MATRIX, VECTOR, STORE = int(Unit.load), int(Unit.matrix), int(Unit.vector), int(Unit.store)
QUEUED_UNITS = (LOAD, MATRIX, VECTOR, STORE)  # plain ints: list indexing with IntEnum members is slower

# Op kinds: how the start, the finish cycle and the dependency are computed (PRODUCER: mx.mms, STREAM: vc.lds;
# on the matrix unit PRELOAD, MATMUL (mx.mm, mx.mma) and CONFIG (ep.cfg) overlap, PLAIN ones (mx.drain,
# sync.push) wait for every earlier result and hold the whole unit until they finish).
PLAIN, DMA, STREAM, POP, PRODUCER, PRELOAD, MATMUL, CONFIG = range(8)

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
    S_STREAM,
) = range(18)
STAT_FIELDS = 18


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
        "ready",
        "token",
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


class MatrixPipe:
    """The matrix unit's pipeline: when each of its resources frees up, by the rules of `simulator.timing` (the
    engine's `_candidate` and `_start` apply them, inline: they run for every matrix instruction).

    Instructions start in order (never before the previous one started). A preload holds the weight port, a
    matmul the array's input (`matmul_input_cycles`); their results are in at their finish. PLAIN instructions
    (`mx.drain`, `sync.push`) and `mx.mms` wait for every earlier finish; a drain holds the whole unit until its own.
    """

    __slots__ = ("last", "hold", "weights", "input", "done", "open", "busy_until")

    def __init__(self) -> None:
        self.last = 0  # start of the previous instruction
        self.hold = 0  # finish of the last instruction that holds the whole unit
        self.weights = 0  # finish of the last preload: the weight port is free and its weights are in
        self.input: float = 0  # the array's input is free (INF behind an mx.mms waiting for the stream FIFO)
        self.done = 0  # latest known finish of any instruction
        self.open = False  # an mx.mms whose finish waits for the stream FIFO
        self.busy_until = 0  # end of the busy time counted so far (overlapping instructions count once)

    def resolved(self, finish: int) -> None:
        """The open mx.mms is done at `finish`."""
        self.open = False
        self.input = finish
        self.done = max(self.done, finish)


class Engine:
    def __init__(self, cfg: MachineConfig, trace: list[tuple[int, int, int, int]] | None) -> None:
        self.cfg = cfg
        self.depth = cfg.queue_depth
        self.queues: list[deque[Op]] = [deque() for _ in Unit]
        self.free = [0] * len(Unit)
        self.cand: list[float | None] = [None] * len(Unit)
        # the earliest queued start (cycle; None: not known) and its unit (-1: none can start), kept while no candidate
        # or queue head changes
        self.scan_t: float | None = None
        self.scan_u = -1
        self.tail = LOAD  # the unit last submitted to: when its queue holds every queued op, no other needs a look
        nbanks = cfg.spad_banks + cfg.acc_banks
        self.bank_owner = [-1] * nbanks
        self.bank_until = [0] * nbanks
        self.channel_free = 0
        self.pending = 0
        self.trace = trace
        # the stream FIFO, by global row index (rows in the order mx.mms produce them)
        self.row_ready: list[int] = []  # cycle each row would leave the array without stalls
        self.row_out: list[int] = []  # cycle each row did leave it (known prefix)
        self.row_taken: list[int] = []  # cycle the vector unit took each row (known prefix)
        self.open: tuple[Op, int] | None = None  # an mx.mms whose finish waits for FIFO room, with its last row
        self.matrix = MatrixPipe()
        self.behind_open: dict[int, int] = {}  # bank -> latest finish of matrix ops on it while an mx.mms is open
        # the store path's zero-tile counter: `dma.stz` adds (at issue, like all data work), `zc.clr` clears, and
        # `zc.rd` waits for the last `dma.stz` issued (`counted`) before it reads
        self.zero_tiles = 0
        self.counted: Op | None = None

    def submit(self, op: Op, now: int) -> int:
        """Queue `op` at cycle `now`; returns the (possibly later) cycle at which it could be issued."""
        u = op.unit
        queue = self.queues[u]
        depth = self.depth
        if len(queue) < depth:
            # advance(now) when something may start by now (not when the kept scan says none can); with the queue full,
            # the loop below starts, in the same time order, all that advance(now) would and then more
            if self.pending:
                scan_t = self.scan_t
                if scan_t is None or scan_t <= now:
                    self.advance(now)
        else:
            while len(queue) >= depth:
                head = queue[0]
                if head.start < 0:  # (`wait_for`, inline; `_start` at once when the kept scan says the head goes next)
                    scan_t = self.scan_t
                    if scan_t is not None and self.scan_u == u:
                        self._start(u, scan_t)
                    else:
                        self.advance(INF, head)
                    if head.start < 0:
                        raise self._stuck(f"the instruction at pc {head.pc} can never start")
                start = head.start
                if start > now:
                    op.stats[S_QUEUE] += start - now
                    now = start
                self.advance(now)
        op.issue = now
        queue.append(op)
        self.tail = u
        if len(queue) == 1:  # a new head: the earliest start may change
            self.scan_t = None
        self.pending += 1
        return now

    def wait_for(self, op: Op) -> None:
        """Time instructions in order until `op` has been timed."""
        if op.start < 0:
            self.advance(INF, op)
            if op.start < 0:
                raise self._stuck(f"the instruction at pc {op.pc} can never start")

    def drain(self) -> int:
        """Time everything; returns the cycle at which every unit is idle."""
        self.advance(INF)
        if self.pending or self.open is not None:
            raise self._stuck("the units can never go idle")
        return max(self.free)

    def _stuck(self, what: str) -> Fault:
        if self.open is not None:
            op, last = self.open
            return Fault(
                f"deadlock: {what}: mx.mms at pc {op.pc} waits for room in the stream FIFO "
                f"(stream_fifo_depth = {self.cfg.stream_fifo_depth} rows, {last + 1 - len(self.row_taken)} not "
                "taken) and no vc.lds that would take them can start (it must not wait for the matrix unit)"
            )
        return Fault(f"internal: {what}")

    def advance(self, limit: float, until: Op | None = None) -> None:
        """Start, in time order, every queued instruction that can start at or before `limit` (with `until`: stop
        once that one has started)."""
        queues, cand = self.queues, self.cand
        while self.pending:
            best_t = self.scan_t
            if best_t is None:
                best = self.tail
                queue = queues[best]
                if len(queue) == self.pending:  # the only unit with queued work: no other to look at
                    best_t = cand[best]
                    if best_t is None:
                        best_t = cand[best] = self._candidate(best, queue[0])
                    if best_t == INF:
                        best = -1
                else:
                    best, best_t = -1, INF
                    for u in QUEUED_UNITS:
                        queue = queues[u]
                        if queue:
                            c = cand[u]
                            if c is None:
                                c = cand[u] = self._candidate(u, queue[0])
                            if c < best_t:
                                best, best_t = u, c
                self.scan_u, self.scan_t = best, best_t
            else:
                best = self.scan_u
            if best < 0 or best_t > limit:
                return
            self._start(best, best_t)  # (a finite candidate is an int: only INF is a float)
            if until is not None and until.start >= 0:
                return

    def _candidate(self, u: int, op: Op) -> float:
        """The earliest start of `op` at the head of unit `u`'s queue; keeps on `op` its readiness before the banks
        (`ready`) and the cycles it waits for its token (`token`) for `_start`'s stall counters (valid as long as
        the candidate is: `_finish` drops both together)."""
        if u == MATRIX:  # in order, after the unit's hold, and by its kind's rule
            pipe = self.matrix
            t = op.issue
            if pipe.last > t:
                t = pipe.last
            if pipe.hold > t:
                t = pipe.hold
            kind = op.kind
            if kind == MATMUL:
                t = matmul_start(t, pipe.input, pipe.weights)
            elif kind == PRELOAD:
                t = preload_start(t, pipe.weights)
            elif kind in (PLAIN, PRODUCER):
                t = matrix_drained_start(t, INF if pipe.open else pipe.done)
        else:
            t = op.issue
            if self.free[u] > t:
                t = self.free[u]
        dep = op.dep
        token = 0
        if dep is not None:
            if dep.start < 0:
                return INF
            ready = dep.finish if op.kind == POP else dep.start
            if ready > t:
                token, t = ready - t, ready
        op.ready, op.token = t, token
        owner, until = self.bank_owner, self.bank_until
        for b in op.banks:
            if owner[b] != u and until[b] > t:
                t = until[b]
        return t

    def _start(self, u: int, t: int) -> None:
        op = self.queues[u].popleft()
        self.pending -= 1
        stats = op.stats
        if op.token:
            stats[S_TOKEN] += op.token
        if t != op.ready:
            stats[S_BANK] += t - op.ready
        op.start = t
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
            finish = self._consume(op, t)
            stats[S_BUSY] += finish - t
        elif kind == PRODUCER:
            finish = self._produce(op, t)
        else:
            finish = t + op.dur
        if u == MATRIX:  # book it on the pipe; busy cycles beyond those already counted (overlaps count once)
            pipe = self.matrix
            pipe.last = t
            if kind == PRELOAD:
                pipe.weights = finish
            elif kind == MATMUL:
                pipe.input = t + matmul_input_cycles(self.cfg, op.n)
            elif kind == PRODUCER:
                pipe.input = finish
                pipe.open = finish == INF
            elif kind == PLAIN:
                pipe.hold = finish
            if finish != INF and finish > pipe.done:  # (a known finish is an int)
                pipe.done = finish
            end, counted = t + op.dur, pipe.busy_until
            if end > counted:
                pipe.busy_until = end
                stats[S_BUSY] += end - (t if t > counted else counted)
        elif kind != DMA and kind != STREAM:
            stats[S_BUSY] += op.dur
        self._finish(op, finish)
        if kind == STREAM:
            self._resolve()

    def _finish(self, op: Op, finish: int | float) -> None:
        """Record when `op` frees its unit and banks (INF: not known yet, an mx.mms waiting for the FIFO)."""
        u = op.unit
        owner, until = self.bank_owner, self.bank_until
        if u == MATRIX:  # overlapping instructions: each bank is held until the latest of them finishes
            self.free[u] = INF if self.matrix.open else self.matrix.done  # (every result in)
            for b in op.banks:
                if owner[b] != u or until[b] < finish:
                    owner[b], until[b] = u, finish
                elif until[b] == INF and finish != INF:
                    self.behind_open[b] = max(self.behind_open.get(b, 0), int(finish))
        else:
            self.free[u] = finish
            for b in op.banks:
                owner[b], until[b] = u, finish
        cand = self.cand
        cand[u] = None
        self.scan_t = None
        if self.pending != len(self.queues[u]):  # (else no other unit has a queued op, hence a candidate, to drop)
            for v in QUEUED_UNITS:
                c = cand[v]
                if c is not None and (c == INF or self.queues[v][0].mask & op.mask):
                    cand[v] = None
        if finish == INF:
            return
        op.finish = finish
        if self.trace is not None:
            self.trace.append((u, op.pc, op.start, op.finish))

    # --- the stream FIFO ------------------------------------------------------------------------------
    def _extend_out(self) -> None:
        """Work out `stream_row_out` for every row whose FIFO slot is decided (its predecessor D rows back taken)."""
        ready, out, taken, depth = self.row_ready, self.row_out, self.row_taken, self.cfg.stream_fifo_depth
        while len(out) < len(ready) and len(out) - depth < len(taken):
            i = len(out)
            out.append(stream_row_out(ready[i], out[i - 1] if i else -1, taken[i - depth] if i >= depth else -1))

    def _produce(self, op: Op, t: int) -> int | float:
        """mx.mms starts at t: its rows join the stream; its finish, or INF until the FIFO lets its last row out."""
        if not op.n:  # no rows: nothing to wait for
            return t + op.dur
        base = len(self.row_ready)
        self.row_ready.extend(stream_row_ready(self.cfg, t, k) for k in range(op.n))
        self._extend_out()
        last = base + op.n - 1
        if last >= len(self.row_out):
            self.open = (op, last)
            return INF
        return self._stalled_finish(op, last)

    def _stalled_finish(self, op: Op, last: int) -> int:
        finish = self.row_out[last] + 1
        op.stats[S_STREAM] += finish - op.start - op.dur
        return finish

    def _consume(self, op: Op, t: int) -> int:
        """vc.lds starts at t: take the rows it completes, one per cycle; it ends after its last row is out."""
        taken, out = self.row_taken, self.row_out
        first = len(taken)
        for q in range(op.xfer):
            self._extend_out()
            taken.append(stream_row_taken(t, q, out[first + q]))
        self._extend_out()
        return chain_stream_finish(self.cfg, t, op.n, out[op.row], op.lat)

    def _resolve(self) -> None:
        """Finish the open mx.mms once the FIFO has let its last row out."""
        if self.open is not None and self.open[1] < len(self.row_out):
            op, last = self.open
            self.open = None
            finish = self._stalled_finish(op, last)
            self.matrix.resolved(finish)
            for b in op.banks:
                if self.bank_until[b] == INF:
                    self.bank_until[b] = max(finish, self.behind_open.pop(b, 0))
            self._finish(op, finish)
