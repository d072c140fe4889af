"""Performance counters: names, meanings and how they are computed from a run.

The names are stable (the fusion engine's learned cost model trains on them) and `isa.enums.Counter`
ids read a subset from a program with `rdcnt`. `COUNTER_DOCS` is the documentation; `counters_markdown()`
renders it as docs/counters.md. Every instruction's work is accounted to its pc, so the same
aggregation gives whole-run and per-kernel counters.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, make_dataclass
from itertools import repeat
from operator import is_not
from typing import TYPE_CHECKING, Any

import numpy as np

from isa.enums import Counter, Extension, Unit
from simulator import engine as E

if TYPE_CHECKING:
    from simulator.machine import Machine

UNIT_NAMES = tuple(u.name for u in Unit)
STALL_CAUSES = {
    "token": "waiting for a sync token (unit: sync.pop; scalar: sync.pop into sc)",
    "queue_full": "scalar only: issue blocked because the target unit's queue was full",
    "bank": "waiting for a scratchpad/accumulator bank another unit holds",
    "dram": "DMA waiting for the shared DRAM channel (bandwidth); scalar: lw/sw latency",
    "fence": "scalar only: fence/halt waiting for every unit to go idle",
    "stream_full": "matrix only: mx.mms frozen while the stream FIFO holds stream_fifo_depth rows not yet taken",
}

COUNTER_DOCS: tuple[tuple[str, type, str], ...] = (
    ("cycle", int, "total cycles (the run: until halt completes; a kernel: its share of the timeline)"),
    ("instret", int, "instructions executed (hardware-loop iterations count each body instruction)"),
    *(
        (f"instructions_{u}", int, f"instructions executed by the {u} unit (sync tokens count for their queue)")
        for u in UNIT_NAMES
    ),
    *((f"instructions_{e.value}", int, f"instructions of the {e.value} ISA extension") for e in Extension),
    *(
        (f"{u}_busy", int, f"cycles the {u} unit was executing (scalar: issue cycles incl. branch penalties)")
        for u in UNIT_NAMES
    ),
    *((f"{u}_idle", int, f"cycles the {u} unit was neither busy nor stalled") for u in UNIT_NAMES),
    *((f"{u}_stall_{c}", int, f"{u} unit cycles stalled {doc}") for u in UNIT_NAMES for c, doc in STALL_CAUSES.items()),
    ("taken_branches", int, "taken branches, jumps and dispatches"),
    ("dram_read_bytes", int, "bytes read from DRAM (DMA loads, lw, dispatch tables)"),
    ("dram_write_bytes", int, "bytes written to DRAM (DMA stores, sw)"),
    ("spad_read_bytes", int, "scratchpad bytes read"),
    ("spad_write_bytes", int, "scratchpad bytes written"),
    ("acc_read_bytes", int, "accumulator bytes read"),
    ("acc_write_bytes", int, "accumulator bytes written"),
    ("macs", int, "multiply-accumulates done by the matrix unit (useful rows x K x cols, no padding)"),
    ("macs_int8", int, "int8 multiply-accumulates"),
    ("macs_fp32", int, "fp32 multiply-accumulates"),
    ("vector_elem_ops", int, "elements processed by vector-unit operations (loads/stores of chains excluded)"),
    ("vector_elem_ops_fp32", int, "of which in fp32"),
    ("energy_dram_pj", float, "DRAM access energy"),
    ("energy_spad_pj", float, "scratchpad access energy"),
    ("energy_acc_pj", float, "accumulator access energy"),
    ("energy_mac_pj", float, "matrix-unit arithmetic energy"),
    ("energy_vector_pj", float, "vector-unit arithmetic energy"),
    ("energy_instruction_pj", float, "instruction fetch/decode energy"),
    ("energy_total_pj", float, "sum of the energy components"),
    ("roofline_bound_cycles", float, "max(macs / (N*N), DRAM bytes / bytes per cycle): no schedule beats it"),
    ("roofline_fraction", float, "roofline_bound_cycles / cycle (1.0 = at the roofline)"),
)


def _as_dict(self: Any) -> dict[str, int | float]:
    return asdict(self)


Counters = make_dataclass(
    "Counters",
    [(name, kind, field(metadata={"doc": doc})) for name, kind, doc in COUNTER_DOCS],
    frozen=True,
    namespace={"as_dict": _as_dict, "__doc__": "Counters of a run or a kernel; see COUNTER_DOCS for meanings."},
)


def counters_markdown() -> str:
    lines = ["# Simulator counters", "", "| name | type | meaning |", "|---|---|---|"]
    lines += [f"| `{name}` | {kind.__name__} | {doc} |" for name, kind, doc in COUNTER_DOCS]
    lines += ["", "`rdcnt` ids (`isa.enums.Counter`): " + ", ".join(f"{c.value} = `{c.name}`" for c in Counter)]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Snapshot:
    """Per-pc statistics of a run as arrays (built once, then aggregated over any pc range)."""

    stats: np.ndarray  # (pcs, STAT_FIELDS)
    count: np.ndarray  # executions per pc
    unit: np.ndarray  # unit per pc
    fusion: np.ndarray  # pc belongs to the fusion extension


def snapshot(m: Machine) -> Snapshot:
    """The run's per-pc lists as arrays (`np.fromiter`: no per-element type discovery; a planning run converts
    tens of thousands of pcs); the statistics rows (`array`s of int64, `Machine.row`) as one buffer."""
    n = len(m.stats)
    fusion = np.zeros(n, dtype=bool)
    fusion[: len(m.fusion)] = m.fusion
    stats = np.zeros((n, E.STAT_FIELDS), dtype=np.int64)
    rows = b"".join(filter(None, m.stats))  # (a row is never empty)
    if rows:
        used = np.fromiter(map(is_not, m.stats, repeat(None)), dtype=bool, count=n)
        stats[used] = np.frombuffer(rows, dtype=np.int64).reshape(-1, E.STAT_FIELDS)
    return Snapshot(
        stats,
        np.fromiter(m.count, dtype=np.int64, count=len(m.count)),
        np.fromiter(m.units, dtype=np.int64, count=len(m.units)),
        fusion,
    )


def aggregate(m: Machine, snap: Snapshot, lo: int, hi: int, cycles: int) -> Any:
    """Counters of the instructions at pcs [lo, hi) over a span of `cycles`."""
    stats, count, unit, fusion = snap.stats[lo:hi], snap.count[lo:hi], snap.unit[lo:hi], snap.fusion[lo:hi]
    col = stats.sum(axis=0)
    cfg = m.cfg
    values: dict[str, int | float] = {"cycle": int(cycles), "instret": int(count.sum())}
    for u in Unit:
        values[f"instructions_{u.name}"] = int(count[unit == u].sum())
    values["instructions_fusion"] = int(count[fusion].sum())
    values["instructions_base"] = values["instret"] - values["instructions_fusion"]
    taken = int(col[E.S_TAKEN])
    for u in Unit:
        mine = stats[unit == u].sum(axis=0)
        if u is Unit.scalar:
            busy = values["instret"] + taken * cfg.branch_penalty
            stalls = {
                "token": mine[E.S_TOKEN],
                "queue_full": col[E.S_QUEUE],
                "bank": 0,
                "dram": mine[E.S_DRAM],
                "fence": col[E.S_FENCE],
                "stream_full": 0,
            }
        else:
            busy = mine[E.S_BUSY]
            stalls = {
                "token": mine[E.S_TOKEN],
                "queue_full": 0,
                "bank": mine[E.S_BANK],
                "dram": mine[E.S_DRAM],
                "fence": 0,
                "stream_full": mine[E.S_STREAM],
            }
        values[f"{u.name}_busy"] = int(busy)
        for cause, value in stalls.items():
            values[f"{u.name}_stall_{cause}"] = int(value)
        values[f"{u.name}_idle"] = max(0, int(cycles - busy - sum(stalls.values())))
    values["taken_branches"] = taken
    for name, idx in (
        ("dram_read_bytes", E.S_DRAM_RD),
        ("dram_write_bytes", E.S_DRAM_WR),
        ("spad_read_bytes", E.S_SPAD_RD),
        ("spad_write_bytes", E.S_SPAD_WR),
        ("acc_read_bytes", E.S_ACC_RD),
        ("acc_write_bytes", E.S_ACC_WR),
        ("macs_int8", E.S_MACS_I8),
        ("macs_fp32", E.S_MACS_F32),
        ("vector_elem_ops_fp32", E.S_VOPS_F32),
    ):
        values[name] = int(col[idx])
    values["macs"] = values["macs_int8"] + values["macs_fp32"]
    values["vector_elem_ops"] = int(col[E.S_VOPS_INT]) + values["vector_elem_ops_fp32"]
    e = cfg.energy
    dram_bytes = values["dram_read_bytes"] + values["dram_write_bytes"]
    energy = {
        "energy_dram_pj": dram_bytes * e.dram_byte,
        "energy_spad_pj": (values["spad_read_bytes"] + values["spad_write_bytes"]) * e.spad_byte,
        "energy_acc_pj": (values["acc_read_bytes"] + values["acc_write_bytes"]) * e.acc_byte,
        "energy_mac_pj": values["macs_int8"] * e.mac_int8 + values["macs_fp32"] * e.mac_fp32,
        "energy_vector_pj": (values["vector_elem_ops"] - values["vector_elem_ops_fp32"]) * e.vector_int_op
        + values["vector_elem_ops_fp32"] * e.vector_fp32_op,
        "energy_instruction_pj": values["instret"] * e.instruction,
    }
    values.update({k: float(v) for k, v in energy.items()})
    values["energy_total_pj"] = float(sum(energy.values()))
    bound = max(values["macs"] / cfg.peak_macs_per_cycle, dram_bytes / cfg.dram_bytes_per_cycle)
    values["roofline_bound_cycles"] = float(bound)
    values["roofline_fraction"] = float(bound / cycles) if cycles else 0.0
    return Counters(**values)


def kernel_cycles(m: Machine, end: int) -> dict[str, int]:
    """Each kernel's share of the timeline: from entering it until another kernel is entered or the run ends."""
    spans: dict[str, int] = {k.name: 0 for k in m.obj.kernels}
    entries = m.kernel_entries
    for i, (k, start) in enumerate(entries):
        stop = entries[i + 1][1] if i + 1 < len(entries) else end
        spans[m.obj.kernels[k].name] += stop - start
    return spans


def read_counter(m: Machine, which: Counter) -> int:
    """The value `rdcnt` sees: everything issued so far, timed up to the current cycle."""
    if which is Counter.cycle:
        return m.now
    if which is Counter.instret:
        return sum(m.count)
    return int(aggregate(m, snapshot(m), 0, len(m.count), m.now).as_dict()[which.name])
