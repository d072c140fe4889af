"""Program-level co-simulation: run a program on the simulator, replay its unit transactions on the RTL.

Every matrix and vector transaction the simulator records (operands, result,
charged cycles) becomes a `Case` on the RTL unit that implements it; each unit's
cases run back to back in program order in one simulation; a `vc.lds` is replayed
together with the `mx.mms` it consumes. Preloads and matmuls that overlap on the pipelined matrix unit (a run:
each starts before every earlier one of the run has finished) are replayed together, each at its simulator start
cycle. Transactions the RTL has no datapath for
(f32 arithmetic, conversions, configuration writes, partial streams) are counted
as skipped, with the reason.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from assembler.objfile import ObjectFile
from isa import DType, EpilogueFlags, Instruction, decode, make
from rtl.check import Case
from rtl.replay import BatchReport, run_cases
from rtl.stimulus import (
    MatrixOp,
    drain_case,
    drain_write_case,
    matmul_case,
    matrix_run_case,
    per_channel_operands,
    preload_case,
    stream_case,
    vector_case,
)
from rtl.units import DRAIN_WRITE, LANE_BINARY, LANE_OTHER, LANE_REDUCE, LANE_UNARY, MATRIX, STREAM, VECTOR, RtlUnit
from simulator.config import MachineConfig
from simulator.timing import matmul_cycles
from simulator.units.vector import MODE_VC, MODE_VR, MODE_VS, broadcast_rows

INT_VECTOR_OPS = frozenset((*LANE_BINARY, *LANE_UNARY, *LANE_REDUCE, *LANE_OTHER))
BIT_MOVES = frozenset({"ld", "st", "copy"})  # move values unchanged: f32 ones replay as their 32-bit patterns
CHAINED_TIMINGS = frozenset({"chain_op", "chain_store"})


@dataclass(frozen=True)
class Skip:
    mnemonic: str
    reason: str


@dataclass(frozen=True)
class CosimReport:
    program: str
    config: str
    batches: tuple[BatchReport, ...]
    skipped: dict[tuple[str, str], int] = field(default_factory=dict)  # (mnemonic, reason) -> count

    @property
    def compared(self) -> int:
        return sum(v.transactions for b in self.batches for v in b.verdicts)

    @property
    def value_mismatches(self) -> int:
        return sum(b.value_mismatches for b in self.batches)

    @property
    def cycle_mismatches(self) -> int:
        return sum(b.cycle_mismatches for b in self.batches)

    @property
    def ok(self) -> bool:
        return self.value_mismatches == 0 and self.cycle_mismatches == 0

    def lines(self) -> list[str]:
        out = [
            f"{self.program} on {self.config}: {self.compared} transactions compared, "
            f"{self.value_mismatches} value mismatches, {self.cycle_mismatches} cycle mismatches"
        ]
        out += [f"  {b.unit}: {sum(v.transactions for v in b.verdicts)} compared" for b in self.batches]
        out += [f"  skipped {n} x {mnemonic}: {reason}" for (mnemonic, reason), n in sorted(self.skipped.items())]
        out += [f"  FIRST MISMATCH {b.first_mismatch()}" for b in self.batches if not b.ok]
        return out


def _int(dtype: np.dtype) -> bool:
    return dtype in (np.dtype(np.int8), np.dtype(np.int32))


def _matrix_case(
    cfg: MachineConfig, label: str, ins: Instruction, ops: dict, result: np.ndarray, cycles: int
) -> Case | Skip:
    timing = ins.spec.timing
    if ops["w"].dtype != np.int8:
        return Skip(ins.mnemonic, "f32 matrix arithmetic has no RTL datapath")
    if timing == "preload":
        return preload_case(cfg, label, ops["w"], charged=cycles)
    if timing == "matmul_stream":  # here the array's own rows + 2N - 1; stalls on a full FIFO: on stream_path
        return matmul_case(cfg, label, ops["a"], result)
    return matmul_case(cfg, label, ops["a"], result, acc=ops.get("acc"), charged=cycles)


def _drain_case(
    cfg: MachineConfig, label: str, ins: Instruction, ops: dict, result: np.ndarray, cycles: int
) -> Case | Skip:
    if ops["acc"].dtype != np.int32 or DType(ops["out_dtype"]) is DType.f32:
        return Skip(ins.mnemonic, "f32 epilogue has no RTL datapath")
    flags = EpilogueFlags(
        int("bias" in ops) * EpilogueFlags.bias
        + int("residual" in ops) * EpilogueFlags.res
        + int("table" in ops) * EpilogueFlags.pc
    )
    word = make("ep.cfg", 0, 0, 0, ops["shift"], ops["act"], int(flags), ops["out_dtype"])
    case = drain_case(
        cfg,
        label,
        word,
        ops["mult"],
        ops["acc"],
        result,
        bias=ops.get("bias"),
        residual=ops.get("residual"),
        table=ops.get("table"),
        latency=ins.spec.latency,
        charged=cycles,
    )
    # the write side: a dense form's rs2 is not read (any value), a strided one's is the stride
    rs2 = ops["out_stride"] if ins.spec.mnemonic == "mx.drain.s" else 0xDEAD
    return drain_write_case(cfg, case, ins, DType(ops["out_dtype"]), ops["out_addr"], rs2, ops["out_stride"])


def _op_name(ins: Instruction) -> str:
    return ins.mnemonic.split(".")[1]


def _vector_case(
    cfg: MachineConfig, label: str, ins: Instruction, ops: dict, result: np.ndarray, cycles: int
) -> Case | Skip:
    a = ops.get("a")
    if _op_name(ins) in BIT_MOVES and a is not None and a.dtype == np.asarray(result).dtype == np.float32:
        a, result = a.view(np.int32), np.asarray(result).view(np.int32)
    if _op_name(ins) not in INT_VECTOR_OPS or a is None or not _int(a.dtype):
        return Skip(ins.mnemonic, "f32 and conversion ops have no RTL datapath")
    a = a.reshape(-1)
    dtype = DType.i8 if a.dtype == np.int8 else DType.i32
    fields = ins.by_name()
    mode = dict(ins.spec.fixed).get("mode", 0)
    b, rs2, rs3 = ops.get("b"), 0, 0
    if mode == MODE_VS:
        b, rs2 = None, int(b)
    elif mode in (MODE_VR, MODE_VC):
        shaped, rows = broadcast_rows(a, np.asarray(b).reshape(-1), mode)
        b = np.broadcast_to(rows, shaped.shape).reshape(-1)
    if "lo" in ops:
        rs2, rs3 = int(ops["lo"]), int(ops["hi"])
    if "mult" in ops:
        rs2 = int(ops["mult"])
    c = None
    if "table" in ops:  # per-channel requantize: each element's channel's (mult, shift) on in_b / in_c
        b, c = per_channel_operands(ins.mnemonic, np.asarray(ops["table"]), int(ops["period"]), a.size)
    period = int(ops.get("period", fields.get("period", 0))) if ins.spec.timing.endswith("reduce") else 0
    return vector_case(
        cfg,
        label,
        ins,
        a,
        np.asarray(result),
        b=None if b is None else np.asarray(b).reshape(-1),
        c=c,
        rs2=rs2,
        rs3=rs3,
        dtype=dtype,
        period=period,
        chained=ins.spec.timing in CHAINED_TIMINGS,
        charged=cycles,
    )


Builder = Callable[[MachineConfig, str, Instruction, dict, np.ndarray, int], "Case | Skip"]
ROUTES: dict[str, tuple[RtlUnit, Builder]] = {
    "preload": (MATRIX, _matrix_case),
    "matmul": (MATRIX, _matrix_case),
    "matmul_stream": (MATRIX, _matrix_case),
    "drain": (DRAIN_WRITE, _drain_case),
    "vector": (VECTOR, _vector_case),
    "vector_reduce": (VECTOR, _vector_case),
    "chain_load": (VECTOR, _vector_case),
    "chain_op": (VECTOR, _vector_case),
    "chain_reduce": (VECTOR, _vector_case),
    "chain_store": (VECTOR, _vector_case),
}
NOT_REPLAYED = {
    "epilogue_config": "a configuration register write; its fields are replayed with each mx.drain",
}


@dataclass(frozen=True)
class Recorded:
    """One program's simulator run, ready for replay (each transaction carries its start cycle)."""

    name: str
    obj: ObjectFile
    transactions: tuple


def _stream_case(cfg: MachineConfig, label: str, ins: Instruction, txn, mms, fifo_empty_at: int) -> Case | Skip:
    """vc.lds replayed with the mx.mms whose stream it consumes, on the stream path (array -> FIFO -> lanes)."""
    if mms is None:
        return Skip(ins.mnemonic, "consumes only part of an mx.mms stream")
    if mms.start < fifo_empty_at:
        return Skip(ins.mnemonic, "its mx.mms starts while an earlier stream may still hold the FIFO")
    n = cfg.array_size
    if mms.operands["w"].dtype != np.int8:
        return Skip(ins.mnemonic, "f32 matrix arithmetic has no RTL datapath")
    if n != cfg.vector_lanes or mms.result.shape[1] != n:
        return Skip(ins.mnemonic, "stream rows narrower than the vector unit need a gearbox the RTL lacks")
    return stream_case(
        cfg,
        label,
        ins,
        mms.operands["w"],
        mms.operands["a"],
        mms.result,
        mms_start=mms.start,
        lds_start=txn.start,
        charged=txn.cycles,
        mms_charged=mms.cycles,
    )


def _matrix_op(cfg: MachineConfig, txn, origin: int) -> MatrixOp:
    ops, start = txn.operands, txn.start - origin
    if "a" not in ops:
        return MatrixOp(start, txn.cycles, w=ops["w"])
    charged = matmul_cycles(cfg, ops["a"].shape[0]) if txn.mnemonic == "mx.mms" else txn.cycles  # stalls: stream_path
    return MatrixOp(start, charged, a=ops["a"], product=txn.result, acc=ops.get("acc"))


def _flush(cfg: MachineConfig, run: list[tuple[str, object, Case]], out: list[Case]) -> None:
    """One case for a run of overlapping matrix transactions (its only case if it has one)."""
    if len(run) == 1:
        out.append(run[0][2])
    elif run:
        origin = run[0][1].start
        label = f"{run[0][0]} .. {run[-1][0]} (overlapping)"
        out.append(matrix_run_case(cfg, label, [_matrix_op(cfg, txn, origin) for _, txn, _ in run]))
    run.clear()


def plan(cfg: MachineConfig, run: Recorded) -> tuple[dict[str, list[Case]], Counter]:
    """Group one program's transactions into per-unit case lists (program order); count the skipped ones."""
    cases: dict[str, list[Case]] = {}
    skipped: Counter = Counter()
    stream = None  # the last mx.mms transaction not yet consumed
    fifo_empty_at = 0  # the end of the last vc.lds: a replay starts from an empty FIFO
    overlapping: list = []  # the current run of matrix transactions, (label, transaction, case)
    busy_until = 0  # the latest finish in that run
    matrix_cases = cases.setdefault(MATRIX.toplevel, [])
    for index, txn in enumerate(run.transactions):
        ins = decode(run.obj.text[txn.pc])
        timing = ins.spec.timing
        label = f"{run.name} #{index} pc {txn.pc} {ins.mnemonic}"
        if ROUTES.get(timing, (None,))[0] is MATRIX:
            made = _matrix_case(cfg, label, ins, txn.operands, txn.result, txn.cycles)
            if timing == "matmul_stream":
                stream = txn
            if isinstance(made, Skip):
                skipped[(made.mnemonic, made.reason)] += 1
                continue
            if txn.start >= busy_until:
                _flush(cfg, overlapping, matrix_cases)
            overlapping.append((label, txn, made))
            busy_until = max(busy_until, txn.start + txn.cycles)
            continue
        if timing == "chain_stream":
            whole = stream is not None and stream.result.size == txn.operands["n"]
            unit, made = STREAM, _stream_case(cfg, label, ins, txn, stream if whole else None, fifo_empty_at)
            stream, fifo_empty_at = None, txn.start + txn.cycles
        elif timing in ROUTES:
            unit, build_case = ROUTES[timing]
            made = build_case(cfg, label, ins, txn.operands, txn.result, txn.cycles)
        else:
            skipped[(ins.mnemonic, NOT_REPLAYED.get(timing, f"no RTL unit implements timing rule {timing!r}"))] += 1
            continue
        if isinstance(made, Skip):
            skipped[(made.mnemonic, made.reason)] += 1
        else:
            cases.setdefault(unit.toplevel, []).append(made)
    _flush(cfg, overlapping, matrix_cases)
    if not matrix_cases:
        del cases[MATRIX.toplevel]
    return cases, skipped


def cosimulate(cfg: MachineConfig, runs: list[Recorded], vcd_dir: Path | None = None) -> list[CosimReport]:
    """Replay every program's transactions; each RTL unit runs once for all programs together."""
    plans = [plan(cfg, run) for run in runs]
    units = {**{u.toplevel: u for u, _ in ROUTES.values()}, STREAM.toplevel: STREAM}
    batches: dict[str, BatchReport] = {}
    for top in sorted({top for cases, _ in plans for top in cases}):
        batches[top] = run_cases(units[top], cfg, [c for cases, _ in plans for c in cases.get(top, [])], vcd_dir)
    reports, taken = [], dict.fromkeys(batches, 0)
    for run, (cases, skipped) in zip(runs, plans, strict=True):
        mine = []
        for top, unit_cases in sorted(cases.items()):
            whole = batches[top]
            verdicts = whole.verdicts[taken[top] : taken[top] + len(unit_cases)]
            taken[top] += len(unit_cases)
            mine.append(BatchReport(top, verdicts, whole.vcd))
        reports.append(CosimReport(run.name, cfg.name, tuple(mine), dict(skipped)))
    return reports
