"""Compare what the RTL did with what the simulator says: values bit-exact, cycles exact.

A `Case` is one transaction replayed on one unit: the stimulus item, the events
the simulator's model expects (offset and element values per watch) and the
cycles the simulator charges. `compare` turns the recorded events into a
`Verdict` naming the first differing cycle, signal, expected and actual value.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

from rtl.jobs import CLOCK_NS, Event, Item, ItemResult, unpack
from rtl.units import Port, RtlUnit


class Busy(enum.Enum):
    """How the cycles an instruction occupies its unit are read off the RTL's events."""

    first_event = "first_event"  # preload: the cycle the weights become usable
    last_event = "last_event"  # last output offset + 1 (first input at offset 0)
    after_last_input = "after_last_input"  # chained ops: last output offset - last input offset


@dataclass(frozen=True)
class Expected:
    """What one watch of an item should record."""

    offsets: np.ndarray  # cycle offset of each event
    values: dict[str, np.ndarray] = field(default_factory=dict)  # port -> (events, elements)
    care: dict[str, np.ndarray] = field(default_factory=dict)  # port -> bool mask of compared elements


@dataclass(frozen=True)
class Case:
    label: str
    item: Item
    expected: tuple[Expected, ...]  # one per watch of the item
    charged: int  # cycles the simulator charges for the instruction
    busy: Busy
    origin: int = 0  # item offset at which the instruction starts (after others it waits for)
    transactions: int = 1  # simulator transactions it replays (a run of overlapping matrix ones: several)


@dataclass(frozen=True)
class Mismatch:
    label: str
    kind: str  # "value" or "cycle"
    cycle: int  # item cycle offset
    time_ns: float  # where that cycle is in the waveform
    signal: str
    expected: int
    actual: int

    def __str__(self) -> str:
        return (
            f"{self.label}: {self.kind} mismatch at cycle {self.cycle} (t = {self.time_ns:g} ns), {self.signal}: "
            f"expected {self.expected}, got {self.actual}"
        )


@dataclass(frozen=True)
class Verdict:
    label: str
    value: Mismatch | None
    cycle: Mismatch | None
    measured: int  # busy cycles read off the RTL
    transactions: int = 1  # simulator transactions it judged

    @property
    def ok(self) -> bool:
        return self.value is None and self.cycle is None


def measured_busy(case: Case, events: tuple[Event, ...]) -> int:
    if not events:
        return -1
    if case.busy is Busy.first_event:
        return events[0].offset
    if case.busy is Busy.last_event:
        return events[-1].offset + 1 - case.origin
    return events[-1].offset - (case.item.cycles - 1)


def _mismatch(case: Case, result: ItemResult, kind: str, offset: int, signal: str, want: int, got: int) -> Mismatch:
    return Mismatch(case.label, kind, offset, result.start_ns + offset * CLOCK_NS, signal, want, got)


def compare(unit: RtlUnit, params: dict[str, int], case: Case, result: ItemResult) -> Verdict:
    value: Mismatch | None = None
    cycle: Mismatch | None = None
    for watch, expected, events in zip(case.item.watches, case.expected, result.events, strict=True):
        offsets = np.array([e.offset for e in events], dtype=np.int64)
        when = watch.when[0]
        n = min(len(events), len(expected.offsets))
        late = np.flatnonzero(offsets[:n] != expected.offsets[:n])
        if late.size and cycle is None:
            j = int(late[0])
            at = int(min(offsets[j], expected.offsets[j]))
            cycle = _mismatch(
                case, result, "cycle", at, f"{when} (event {j})", int(expected.offsets[j]), int(offsets[j])
            )
        if len(events) < len(expected.offsets) and cycle is None:
            cycle = _mismatch(case, result, "cycle", int(expected.offsets[n]), f"{when} (event {n} missing)", 1, 0)
        for name, want in expected.values.items():
            if value is None:
                value = _first_value_mismatch(
                    case, result, unit.port(name), params, events[:n], want[:n], expected.care.get(name)
                )
    measured = measured_busy(case, result.events[0] if result.events else ())
    if measured != case.charged and cycle is None:
        cycle = _mismatch(case, result, "cycle", max(measured, 0), "busy cycles", case.charged, measured)
    return Verdict(case.label, value, cycle, measured, case.transactions)


def _first_value_mismatch(
    case: Case,
    result: ItemResult,
    port: Port,
    params: dict[str, int],
    events: tuple[Event, ...],
    want: np.ndarray,
    care: np.ndarray | None,
) -> Mismatch | None:
    if not events:
        return None
    got = unpack(
        [e.values[port.name] for e in events],
        port.elements(params),
        port.element_bits(params),
        signed=port.element_bits(params) > 1,
    )
    want = np.asarray(want, dtype=np.int64).reshape(got.shape[0], -1)
    differs = got[:, : want.shape[1]] != want
    if care is not None:
        differs &= np.asarray(care, dtype=bool).reshape(-1, want.shape[1])[: got.shape[0]]  # events may be missing
    bad = np.argwhere(differs)
    if not bad.size:
        return None
    j, k = (int(x) for x in bad[0])
    return _mismatch(case, result, "value", events[j].offset, f"{port.name}[{k}]", int(want[j, k]), int(got[j, k]))
