"""The stimulus a cocotb run drives and the events it records, as plain data.

A job is a list of items run back to back on one RTL unit. An item holds some
inputs steady (`hold`), drives others cycle by cycle (`drive`), and watches for
output events: cycles where every signal of a watch's `when` is high. Values are
the integers on the (packed) ports, so the cocotb side does no arithmetic and one
driver serves every unit; packing and unpacking happen here, vectorised.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from isa.errors import DynfuseError

CLOCK_NS = 10  # clock period of every RTL simulation


class JobError(DynfuseError):
    """A job or result file is malformed."""


@dataclass(frozen=True)
class Watch:
    """Record `record` ports at each cycle where all `when` ports are 1 (only on a 0 -> 1 edge if `edge`)."""

    when: tuple[str, ...]
    record: tuple[str, ...]
    count: int  # events expected; the item ends once every watch has seen its count
    edge: bool = False


@dataclass(frozen=True)
class Item:
    label: str
    hold: dict[str, int]
    drive: dict[str, list[int]]  # port -> value per cycle; a shorter list falls back to the idle value
    watches: tuple[Watch, ...]
    timeout: int  # cycles after the last driven cycle before giving up on missing events

    @property
    def cycles(self) -> int:
        return max((len(v) for v in self.drive.values()), default=0)


@dataclass(frozen=True)
class Job:
    toplevel: str
    items: tuple[Item, ...]
    idle: dict[str, int] = field(default_factory=dict)  # values between items
    gap: int = 1  # idle cycles between items
    settle: bool = False  # outputs depend combinationally on inputs: sample after they settle
    reset_between: bool = False  # reset the unit in the gap between items (items share no state)


@dataclass(frozen=True)
class Event:
    offset: int  # cycles after the item's first driven cycle
    values: dict[str, int]


@dataclass(frozen=True)
class ItemResult:
    label: str
    events: tuple[tuple[Event, ...], ...]  # per watch
    start_cycle: int  # absolute cycle of the item's first driven cycle
    start_ns: float  # simulation time of that cycle's falling edge, to find it in the waveform


def write_job(job: Job, path: Path) -> None:
    path.write_text(json.dumps(asdict(job)))


def read_job(path: Path) -> Job:
    raw = json.loads(path.read_text())
    items = tuple(
        Item(
            i["label"],
            i["hold"],
            i["drive"],
            tuple(Watch(tuple(w["when"]), tuple(w["record"]), w["count"], w["edge"]) for w in i["watches"]),
            i["timeout"],
        )
        for i in raw["items"]
    )
    return Job(raw["toplevel"], items, raw["idle"], raw["gap"], raw["settle"], raw["reset_between"])


def write_results(results: list[ItemResult], path: Path) -> None:
    path.write_text(json.dumps([asdict(r) for r in results]))


def read_results(path: Path) -> list[ItemResult]:
    if not path.exists():
        raise JobError(f"the RTL run wrote no result file {path}")
    return [
        ItemResult(
            r["label"],
            tuple(tuple(Event(e["offset"], e["values"]) for e in w) for w in r["events"]),
            r["start_cycle"],
            r["start_ns"],
        )
        for r in json.loads(path.read_text())
    ]


def pack(values: np.ndarray, bits: int) -> list[int]:
    """Pack the last axis of `values` (element 0 in the low bits) into one integer per row."""
    arr = np.asarray(values, dtype=np.int64)
    if arr.ndim == 1:
        arr = arr[None, :]
    if bits == 1:
        words = np.packbits(arr.astype(np.uint8), axis=-1, bitorder="little")
    else:
        words = (arr.astype(np.dtype(f"<i{bits // 8}"))).view(np.uint8).reshape(arr.shape[0], -1)
    return [int.from_bytes(row.tobytes(), "little") for row in words]


def unpack(words: list[int], count: int, bits: int, signed: bool = True) -> np.ndarray:
    """Inverse of `pack`: one row of `count` elements per integer."""
    if not words:
        return np.zeros((0, count), dtype=np.int64)
    nbytes = (count * bits + 7) // 8
    raw = np.frombuffer(b"".join(w.to_bytes(nbytes, "little") for w in words), dtype=np.uint8)
    raw = raw.reshape(len(words), nbytes)
    if bits == 1:
        return np.unpackbits(raw, axis=-1, bitorder="little")[:, :count].astype(np.int64)
    kind = "i" if signed else "u"
    return raw.view(np.dtype(f"<{kind}{bits // 8}")).astype(np.int64)
