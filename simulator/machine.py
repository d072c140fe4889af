"""The simulated machine: architectural state, the pre-decoded program and the issue loop.

The program is decoded once into one closure per instruction (`steps[pc]() -> next pc`), built by the
explicit mnemonic -> builder map in `simulator.dispatch`. A step does its instruction's data work at
issue, in program order, and hands unit instructions to the timing engine, which decides when they run.
Words decode with numpy through a bounded table shared by every machine (`simulator.decode`): a word's
instruction and unit are a function of the word alone (the ISA table), and the planner simulates many programs
built of the same words. Each step is built when the run first reaches it, but for the instructions straight-line
code runs most (`simulator.dispatch.RUN_ONCE`, and in a run without values `TIMED`): those run at once the first
time, and get a step only when reached again.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import compress
from operator import attrgetter, itemgetter
from typing import TypeVar

import numpy as np

from assembler.disasm import format_instruction
from assembler.objfile import ObjectFile
from isa import INSTRUCTIONS, EncodingError, Instruction
from isa.enums import Extension, Unit
from isa.fields import NUM_VREGS, NUM_XREGS, Kind
from simulator.config import MachineConfig
from simulator.decode import decode_words, decoded
from simulator.dispatch import BUILDERS, RUN_ONCE, TIMED_BUILDERS, TIMED_ONCE
from simulator.engine import DMA, PLAIN, S_ACC_RD, S_ACC_WR, S_SPAD_RD, S_SPAD_WR, STAT_FIELDS, Engine, Op
from simulator.errors import Fault, SimulatorTrap
from simulator.memory import Memory
from simulator.races import RaceChecker
from simulator.remaining import remaining_bounds
from simulator.units.matrix import WeightShape

Step = Callable[[], int]
Builder = Callable[["Machine", int, Instruction], Step]  # what simulator.dispatch maps each mnemonic to
Once = Callable[["Machine", int, Instruction], int]  # an instruction run without a step: returns the next pc
T = TypeVar("T")
# a statistics row: int64s (`counters.snapshot` takes all of a run's rows as one buffer, no int converted one by one)
_ZERO_ROW = array("q", bytes(8 * STAT_FIELDS))
# straight-line code checks the watchdog at least this often (taken branches and loop ends check it too), so a
# cycle budget (`MachineConfig.max_cycles`) stops a long unrolled kernel soon after it is exceeded
WATCHDOG_EVERY = 256
BOUND_FROM = 32  # a checkpoint asks whether the run can still finish within its budget from 1/32 of it on


# hardware loops, from the ISA table: the instructions with a loop-end field (where a step jumps back), by mnemonic
LOOP_END_FIELD = {s.mnemonic: f.name for s in INSTRUCTIONS for f in s.fields if f.kind is Kind.loop_end}
# instructions that steer control flow or set a register by a value read from memory (the table's `reads_data`): a
# program holding one is simulated with its values even when only its timing is asked for (`Machine(timing_only=True)`)
READS_DATA = frozenset(s.mnemonic for s in INSTRUCTIONS if s.reads_data)
FUSION = frozenset(s.mnemonic for s in INSTRUCTIONS if s.extension is Extension.fusion)  # (`counters` split on it)


@dataclass(frozen=True)
class DecodedText:
    """A program's text decoded: each distinct word's instruction (None: an illegal word) and unit (`table`), the
    decode errors by pc, the pcs hardware loops jump back from (their ends), whether any instruction reads data
    into control (`READS_DATA`), and per pc whether its instruction is of the fusion extension (the counters split
    on it). Nothing else is per pc: a run looks up the words it reaches (`instruction`), and a planning run of a
    kernel unrolled into hundreds of thousands of words reaches each once."""

    text: Sequence[int]
    table: dict[int, tuple[Instruction | None, Unit]]
    errors: dict[int, str]
    loop_ends: frozenset[int]
    reads_data: bool
    fusion: np.ndarray

    def instruction(self, pc: int) -> tuple[Instruction | None, Unit]:
        """The instruction (None: an illegal word) and unit at `pc`."""
        return self.table[self.text[pc]]

    @cached_property
    def instructions(self) -> list[Instruction | None]:
        """Per pc, its instruction (None: an illegal word)."""
        table = self.table
        return [table[w][0] for w in self.text]


def decode_text(text: Sequence[int]) -> DecodedText:
    """Each distinct word decoded once (`simulator.decode`: a program repeats many of its words); the pcs of illegal
    words and of loops are looked up only when the text holds some; the fusion flags by numpy over the words, from
    the distinct words that are fusion instructions (a test per pc took as long as the rest of a run's counters)."""
    try:
        table: dict[int, tuple[Instruction | None, Unit]] = decode_words(text)
        errors: dict[int, str] = {}
    except EncodingError:
        table, errors = _with_illegal(text)
    legal = {w: d for w, d in table.items() if d[0] is not None} if errors else table
    words, names = list(legal), list(map(_mnemonic, map(_first, legal.values())))  # (the word passes run in C)
    mnemonics = set(names)
    loops = (
        {w: legal[w][0].field(LOOP_END_FIELD[legal[w][0].spec.mnemonic]) for w in _where(words, names, LOOP_END_FIELD)}
        if not mnemonics.isdisjoint(LOOP_END_FIELD)
        else {}
    )
    fusion = list(_where(words, names, FUSION)) if not mnemonics.isdisjoint(FUSION) else []
    return DecodedText(
        text,
        table,
        {pc: errors[w] for pc, w in enumerate(text) if w in errors} if errors else {},
        frozenset(pc + loops[text[pc]] for pc in _where(range(len(text)), text, loops)) if loops else frozenset(),
        not mnemonics.isdisjoint(READS_DATA),
        _fusion_pcs(text, fusion),
    )


def _where(items: Iterable[T], keys: Iterable[object], wanted: Container[object]) -> Iterator[T]:
    """The items whose key is in `wanted` (one pass in C)."""
    return compress(items, map(wanted.__contains__, keys))


_first, _mnemonic = itemgetter(0), attrgetter("spec.mnemonic")


def _fusion_pcs(text: Sequence[int], words: list[int]) -> np.ndarray:
    """Per pc, whether its word is one of `words` (no pass over the text when there are none)."""
    if not words:
        return np.zeros(len(text), dtype=bool)
    return np.isin(np.array(text, dtype=np.uint64), np.array(words, dtype=np.uint64))


def _with_illegal(text: Sequence[int]) -> tuple[dict[int, tuple[Instruction | None, Unit]], dict[int, str]]:
    """The words of a text that holds an illegal one, one by one: each illegal word's error kept (it traps when
    reached, as a step), the others decoded."""
    table: dict[int, tuple[Instruction | None, Unit]] = {}
    errors: dict[int, str] = {}
    for word in dict.fromkeys(text):
        try:
            table[word] = decoded(word)
        except EncodingError as err:
            table[word] = (None, Unit.scalar)
            errors[word] = f"illegal instruction: {err}"
    return table, errors


class Machine:
    def __init__(
        self,
        obj: ObjectFile,
        cfg: MachineConfig,
        checked: bool = False,
        trace: bool = False,
        record_transactions: bool = False,
        timing_only: bool = False,
    ) -> None:
        self.obj = obj
        self.cfg = cfg
        self.x = [0] * NUM_XREGS
        self.v: list[np.ndarray | None] = [None] * NUM_VREGS
        self.trace: list[tuple[int, int, int, int]] | None = [] if trace else None
        self.engine = Engine(cfg, self.trace)
        self._submit = self.engine.submit
        self.now = 0
        self.mask = 0  # banks touched by the instruction being issued
        self.loops: list[list[int]] = []  # [body start, end, remaining]
        self.tokens: dict[tuple[int, int], deque[tuple[Op, np.ndarray | None]]] = {}
        self.stream: deque[list] = deque()  # [mx.mms op, flat data, consumed, cols, global index of its row 0]
        self.stream_rows = 0  # rows every mx.mms so far has streamed
        self.weights: np.ndarray | WeightShape | None = None  # (without values: their shape alone)
        self.epilogue: tuple | None = None
        self.transactions: list | None = [] if record_transactions else None
        self.kernel_entries: list[tuple[int, int]] = []  # (kernel index, cycle) each time a kernel is entered
        self.halt_cycle = -1
        n = len(obj.text)
        text = decode_text(obj.text)
        self.text, self.decode_errors = text, text.errors
        self._n, self._words, self._table = n, text.text, text.table  # (`_step` looks each reached pc up)
        self.fusion = text.fusion  # per pc: a fusion-extension instruction (`counters.snapshot`)
        # per pc its unit, set when its step is built (a pc never reached counts nothing: `counters.snapshot`)
        self.units: list[int] = [Unit.scalar] * (n + 1)
        # value semantics, off when only the timing is asked for (`timing_only`) and no value read can change what
        # runs (`READS_DATA`; recorded transactions need values): the units then do every access's bookkeeping
        # (banks, bytes, races) and timing as with values, but compute and move no data
        self.values = not timing_only or text.reads_data or record_transactions
        self.mem = Memory(cfg, obj, self.values)
        # the builders of steps and the instructions run once without one (`_first`); without values, those of
        # `simulator.dispatch.TIMED` too, which compute nothing
        self._builders, self._once = (BUILDERS, RUN_ONCE) if self.values else (TIMED_BUILDERS, TIMED_ONCE)
        self._resolved = self.mem.resolved  # (`read_local`, `written` look an access up here before `Memory.local`)
        self._banks = self.mem.banks_of_mask  # (`unit_op` looks a mask up here before asking `Memory.banks`)
        self.count = [0] * (n + 1)
        self.stats: list[list[int] | None] = [None] * (n + 1)  # allocated for instructions that count anything
        self.races = RaceChecker(cfg.spad_bytes + cfg.acc_bytes, self.describe, cfg.max_cycles) if checked else None
        # each step is built when first reached (`_step`): a run stopped by its cycle budget builds no more than
        # it ran, and straight-line code builds each step once, as before
        self.steps: list[Step | bool | None] = [None] * (n + 1)  # False: run once without a step (`_first`)
        self._loop_ends = text.loop_ends
        self._entered: dict[int, list[int]] = {}  # pc -> the kernels starting there, in order
        for k, kernel in enumerate(obj.kernels):
            self._entered.setdefault(kernel.start, []).append(k)
        # the pcs whose step `_step` wraps (a loop end, a kernel entry, a watchdog checkpoint): most are not, and
        # straight-line code builds a step per instruction run, so the others skip those tests
        self._wrapped = self._loop_ends | self._entered.keys() | set(range(WATCHDOG_EVERY, n, WATCHDOG_EVERY))

    @property
    def instructions(self) -> list[Instruction | None]:
        """Per pc, its instruction (None: an illegal word)."""
        return self.text.instructions

    # --- helpers for instruction builders -----------------------------------------------------------
    def describe(self, pc: int) -> str:
        n = len(self.obj.text)
        ins = self.text.instruction(pc)[0] if 0 <= pc < n else None
        if ins is not None:
            return format_instruction(ins, pc)
        return "<no instruction>" if pc >= n else f".word {self.obj.text[pc]:#018x}"

    def row(self, pc: int) -> list[int]:
        """The statistics row of `pc` (see simulator.engine's S_* fields), allocated on first use."""
        row = self.stats[pc]
        if row is None:
            row = self.stats[pc] = _ZERO_ROW[:]
        return row

    def read_local(self, addr: int, count: int, dtype: np.dtype, row: list[int]) -> np.ndarray:
        found = self._resolved.get((addr, count, dtype))
        view, mask, is_acc, shadow, nbytes = self.mem.local(addr, count, dtype) if found is None else found
        self.mask |= mask
        row[S_ACC_RD if is_acc else S_SPAD_RD] += nbytes
        if self.races is not None:
            self.races.access(self.races.local, slice(shadow, shadow + nbytes), addr, write=False)
        return view

    def read_local_rows(
        self, addr: int, rows: int, count: int, stride: int, dtype: np.dtype, row: list[int]
    ) -> np.ndarray:
        """`rows` rows of `count` elements, `stride` bytes apart (dense ones read as one access): the banks, bytes
        and race-checked bytes are those of the rows alone, not the gaps between them."""
        if rows <= 1 or stride == count * dtype.itemsize:
            return self.read_local(addr, rows * count, dtype, row).reshape(rows, count)
        return self._local_rows(addr, rows, count, stride, dtype, row, write=False)

    def write_local(self, addr: int, values: np.ndarray, row: list[int]) -> None:
        self.written(addr, values.size, values.dtype, row)[:] = values.reshape(-1)

    def written(self, addr: int, count: int, dtype: np.dtype, row: list[int]) -> np.ndarray:
        """A write of `count` elements at `addr` as the timing sees it (banks, bytes, races); returns the view to
        fill (`write_local`; left as it is when values are off)."""
        found = self._resolved.get((addr, count, dtype))
        view, mask, is_acc, shadow, nbytes = self.mem.local(addr, count, dtype) if found is None else found
        self.mask |= mask
        row[S_ACC_WR if is_acc else S_SPAD_WR] += nbytes
        if self.races is not None:
            self.races.access(self.races.local, slice(shadow, shadow + nbytes), addr, write=True)
        return view

    def written_rows(
        self, addr: int, rows: int, count: int, stride: int, dtype: np.dtype, row: list[int]
    ) -> np.ndarray:
        """`written` for `rows` rows of `count` elements `stride` bytes apart (dense ones as one access): the banks,
        bytes and race-checked bytes are those of the rows alone, not the gaps between them."""
        if rows <= 1 or stride == count * dtype.itemsize:
            return self.written(addr, rows * count, dtype, row).reshape(rows, count)
        return self._local_rows(addr, rows, count, stride, dtype, row, write=True)

    def _local_rows(
        self, addr: int, rows: int, count: int, stride: int, dtype: np.dtype, row: list[int], write: bool
    ) -> np.ndarray:
        view, mask, is_acc, shadow = self.mem.local_rows(addr, rows, count, stride, dtype, write)
        self.mask |= mask
        stat = (S_ACC_WR if is_acc else S_SPAD_WR) if write else (S_ACC_RD if is_acc else S_SPAD_RD)
        row[stat] += view.size * dtype.itemsize
        if self.races is not None:
            self.races.access(self.races.local, shadow, addr, write=write)
        return view

    def check_dram(self, addr: int, rows: int, row_bytes: int, stride: int, write: bool) -> None:
        if self.races is None or rows * row_bytes == 0:
            return
        if rows == 1 or stride == row_bytes:
            idx: slice | np.ndarray = slice(addr, addr + rows * row_bytes)
        else:
            idx = (addr + stride * np.arange(rows)[:, None] + np.arange(row_bytes)).ravel()
        self.races.access(self.races.dram, idx, addr, write)

    def unit_op(self, unit: int, pc: int, dur: int, row: list[int], kind: int = PLAIN, dep: Op | None = None) -> Op:
        """The timing record of the instruction being issued (banks gathered by read_local/write_local)."""
        mask, self.mask = self.mask, 0
        banks = self._banks.get(mask)
        return Op(unit, pc, dur, self.mem.banks(mask) if banks is None else banks, mask, row, kind, dep)

    def issue(self, unit: int, pc: int, dur: int, row: list[int], kind: int = PLAIN, n: int = 0) -> Op:
        """`unit_op` and `submit` in one call (`n`: the op's rows), for the instructions straight-line matrix code
        issues by the hundred thousand."""
        mask, self.mask = self.mask, 0
        banks = self._banks.get(mask)
        op = Op(unit, pc, dur, self.mem.banks(mask) if banks is None else banks, mask, row, kind)
        op.n = n
        self.now = self._submit(op, self.now) + 1
        return op

    def submit(self, op: Op) -> None:
        """Hand `op` to its unit's queue (stalling issue while the queue is full); the issue takes one cycle."""
        self.now = self._submit(op, self.now) + 1

    def dma_op(self, unit: int, pc: int, dur: int, xfer: int, extra: int, row: list[int]) -> Op:
        op = self.unit_op(unit, pc, dur, row, DMA)
        op.xfer, op.extra = xfer, extra
        return op

    def record(self, op: Op, pc: int, operands: dict, result: np.ndarray) -> None:
        """Keep a unit instruction's inputs and output for RTL replay (callers check `transactions` first)."""
        self.transactions.append((op, pc, operands, result))

    def watchdog(self, pc: int = -1) -> None:
        """Stop a run past its cycle budget; at a checkpoint `pc` outside loops, also one that cannot finish within
        it (`simulator.remaining`: the least time its unissued instructions need). The bound is computed once the
        run has used 1/BOUND_FROM of its budget: a run far inside its budget (every run without one) never pays
        for it."""
        budget = self.cfg.max_cycles
        if self.now > budget:
            raise Fault(f"watchdog: the run exceeded max_cycles={budget}")
        if pc < 0 or self.now * BOUND_FROM < budget:
            return
        bounds = self._remaining
        least = -1 if bounds is None else self.now + int(bounds[pc])
        if least > budget:
            raise Fault(f"watchdog: the run cannot finish within max_cycles={budget} (it needs at least {least})")

    @cached_property
    def _remaining(self) -> np.ndarray | None:
        """`watchdog`'s bounds (`simulator.remaining`), computed at the first checkpoint that asks."""
        return remaining_bounds(self.cfg, self._words, self._table)

    def release(self) -> None:
        """Drop the step closures (they refer back to the machine) so the run's memory is freed at once."""
        self.steps = []

    # --- the issue loop -------------------------------------------------------------------------------
    def run(self) -> None:
        steps, count, build, pc = self.steps, self.count, self._step, 0
        try:
            if self.trace is None:
                first = self._first
                while pc >= 0:
                    count[pc] += 1
                    step = steps[pc]
                    pc = step() if step else first(pc)
            else:
                trace = self.trace
                while pc >= 0:
                    count[pc] += 1
                    issued = self.now
                    nxt = (steps[pc] or build(pc))()
                    trace.append((Unit.scalar, pc, issued, max(self.now, issued + 1)))
                    pc = nxt
        except Fault as fault:
            at = pc if fault.pc is None else fault.pc
            raise SimulatorTrap(at, self.describe(at), self.now, fault.reason) from None

    def _first(self, pc: int) -> int:
        """Run `pc` reached with no step built: a `RUN_ONCE` instruction the first time at once (marked False), unless
        its step must be wrapped (see `_step`) or the race checker watches it; any other, or one reached again, by
        building its step (kept) and running it. After an instruction run once, the straight line goes on here while
        the next pc has no step either (the issue loop's work for it, inline); a fault says at which pc."""
        n, table, words, units, steps, count = self._n, self._table, self._words, self.units, self.steps, self.count
        once, builders, plain = self._once, self._builders, self._wrapped if self.races is None else None
        try:
            while True:
                if pc >= n:
                    return self._step(pc)()
                ins, units[pc] = table[words[pc]]
                if ins is None:
                    return self._step(pc)()
                mnemonic = ins.spec.mnemonic
                if plain is None or pc in plain:
                    return self._wrap(pc, builders[mnemonic](self, pc, ins))()
                now = once.get(mnemonic)
                if now is None or steps[pc] is not None:
                    step = steps[pc] = builders[mnemonic](self, pc, ins)  # (nothing to wrap it with: `_wrap`)
                    return step()
                steps[pc] = False
                pc = now(self, pc, ins)
                if steps[pc] is not None:  # (never the last pc: a RUN_ONCE instruction goes on to the next)
                    return pc
                count[pc] += 1
        except Fault as fault:
            fault.pc = pc
            raise

    def _step(self, pc: int) -> Step:
        """Build the step of `pc`: its instruction's builder (`simulator.dispatch`), wrapped (`_wrap`)."""
        n = self._n
        ins, self.units[pc] = self._table[self._words[pc]] if pc < n else (None, Unit.scalar)
        if ins is not None:
            step = self._builders[ins.spec.mnemonic](self, pc, ins)
        elif pc == n:
            step = self._fell_off(n)
        else:
            step = self._illegal(pc)
        return self._wrap(pc, step)

    def _wrap(self, pc: int, step: Step) -> Step:
        """Keep `pc`'s step wrapped, innermost first, by a hardware loop's end, the kernels entered there, a watchdog
        checkpoint (every WATCHDOG_EVERY instructions of the text: see the constant) and, in checked mode, the race
        checker."""
        if pc in self._wrapped:
            if pc in self._loop_ends:
                step = self._loop_end(pc, step)
            for k in self._entered.get(pc, ()):
                step = self._kernel_entry(k, step)
            if pc < self._n and pc and not pc % WATCHDOG_EVERY:
                step = self._watched(pc, step)
        if self.races is not None:
            step = self._checked(self.races, self.units[pc], pc, step)
        self.steps[pc] = step
        return step

    def _illegal(self, pc: int) -> Step:
        reason = self.decode_errors[pc]

        def step() -> int:
            raise Fault(reason)

        return step

    def _fell_off(self, n: int) -> Step:
        def step() -> int:
            raise Fault(f"execution ran past the last instruction (pc {n}) without halt")

        return step

    def _loop_end(self, end: int, inner: Step) -> Step:
        loops, count = self.loops, self.count

        def step() -> int:
            while loops and loops[-1][1] == end:
                top = loops[-1]
                top[2] -= 1
                if top[2] > 0:
                    count[end] -= 1
                    self.watchdog()
                    return top[0]
                loops.pop()
            return inner()

        return step

    def _kernel_entry(self, k: int, inner: Step) -> Step:
        entries = self.kernel_entries

        def step() -> int:
            if not entries or entries[-1][0] != k:
                entries.append((k, self.now))
            return inner()

        return step

    def _watched(self, pc: int, inner: Step) -> Step:
        def step() -> int:
            self.watchdog(pc)
            return inner()

        return step

    @staticmethod
    def _checked(races: RaceChecker, unit: int, pc: int, inner: Step) -> Step:
        def step() -> int:
            races.begin(unit, pc)
            return inner()

        return step
