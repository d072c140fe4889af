"""Turn one matrix/vector/epilogue operation into a `Case`: stimulus plus expectation.

Values expected come from the caller (the simulator's semantics or a recorded
transaction); every expected cycle comes from `simulator.timing`: output row i
of an instruction is due at (the cycles charged for its first i + 1 rows) - 1,
and the whole instruction must occupy the unit exactly the cycles charged.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from isa import DType, Instruction, encode
from rtl.check import Busy, Case, Expected
from rtl.jobs import Item, Watch, pack
from rtl.units import ACC_BITS, ELEM_BITS
from simulator import timing
from simulator.config import MachineConfig

WORD32 = (1 << 32) - 1
SLACK = 8  # extra cycles to wait for late events before declaring them missing

MATRIX_IDLE = {"en": 1, "w_valid": 0, "in_w": 0, "in_valid": 0, "in_first": 0, "in_a": 0, "acc_en": 0, "in_acc": 0}
VECTOR_IDLE = {"in_valid": 0, "in_mask": 0, "in_a": 0, "in_b": 0}
EPILOGUE_IDLE = {"in_valid": 0, "in_acc": 0, "in_res": 0}
FETCH_IDLE = {
    "w_valid": 0,
    "in_w": 0,
    "mem_we": 0,
    "mem_addr": 0,
    "mem_wdata": 0,
    "start": 0,
    "instr": 0,
    "rs1": 0,
    "rs2": 0,
    "k": 0,
    "acc_en": 0,
    "in_acc": 0,
}
DRAIN_WRITE_IDLE = EPILOGUE_IDLE | {"start": 0, "instr": 0, "rd": 0, "rs2": 0}
STREAM_IDLE = {"w_valid": 0, "in_w": 0, "in_valid": 0, "in_first": 0, "in_a": 0, "lds_start": 0}


def _pad(x: np.ndarray, rows: int, cols: int) -> np.ndarray:
    out = np.zeros((rows, cols), dtype=np.int64)
    out[: x.shape[0], : x.shape[1]] = x
    return out


def _u32(value: int) -> int:
    return int(value) & WORD32


def _weight_rows(w: np.ndarray, n: int) -> np.ndarray:
    """A K x C weight tile as the array takes it: zero-padded to N x N, the last row first."""
    return _pad(w, n, n)[::-1]


def preload_case(cfg: MachineConfig, label: str, w: np.ndarray, charged: int | None = None) -> Case:
    """Shift a K x C int8 weight tile (zero-padded to N x N) into the array."""
    n = cfg.array_size
    item = Item(
        label,
        {},
        {"w_valid": [1] * n, "in_w": pack(_weight_rows(w, n), ELEM_BITS)},
        (Watch(("w_ready",), (), 1, edge=True),),
        timeout=n + SLACK,
    )
    due = timing.preload_cycles(cfg)
    return Case(label, item, (Expected(np.array([due])),), due if charged is None else charged, Busy.first_event)


def matmul_case(
    cfg: MachineConfig,
    label: str,
    a: np.ndarray,
    product: np.ndarray,
    *,
    acc: np.ndarray | None = None,
    charged: int | None = None,
) -> Case:
    """Stream rows x K int8 activations through the preloaded array; expect `product` (rows x C int32).

    With `acc` (mx.mma) each accumulator row is presented as its output row leaves, and added.
    """
    n = cfg.array_size
    rows = a.shape[0]
    offsets = np.array([timing.matmul_cycles(cfg, i + 1) - 1 for i in range(rows)])
    drive = {"in_valid": [1] * rows, "in_first": [1], "in_a": pack(_pad(a, rows, n), ELEM_BITS)}
    if acc is not None:
        acc_rows = np.zeros((int(offsets[-1]) + 1, n), dtype=np.int64)
        acc_rows[offsets] = _pad(acc, rows, n)
        drive = {**drive, "in_acc": pack(acc_rows, ACC_BITS)}
    item = Item(
        label,
        {"acc_en": int(acc is not None)},
        drive,
        (Watch(("out_valid",), ("out_p",), rows),),
        timeout=2 * n + SLACK,
    )
    care = np.zeros((rows, n), dtype=bool)
    care[:, : product.shape[1]] = True
    expected = Expected(offsets, {"out_p": _pad(product, rows, n)}, {"out_p": care})
    due = timing.matmul_cycles(cfg, rows)
    return Case(label, item, (expected,), due if charged is None else charged, Busy.last_event)


def fetch_case(
    cfg: MachineConfig,
    label: str,
    matmul: Instruction,
    rs1: int,
    rs2: int,
    image: tuple[int, np.ndarray],
    w: np.ndarray,
    product: np.ndarray,
    *,
    acc: np.ndarray | None = None,
    charged: int | None = None,
) -> Case:
    """One `mx.mm*` whose A the matrix unit fetches itself (`matrix_fetch`): the scratchpad `image` (address,
    bytes) is written N bytes a cycle, the K x C int8 weights `w` preloaded, then the matmul word starts with its
    register values (`rs1`: A's address, `rs2`: a strided form's row stride). Expect `product` (rows x C int32;
    with `acc`, mx.mma*) at the cycles of `matmul_case`, counted from the start."""
    n = cfg.array_size
    at, data = image
    lo = at - at % n  # whole N-byte writes, from an aligned address
    padded = np.zeros(-(-(at - lo + data.size) // n) * n, dtype=np.int64)
    padded[at - lo : at - lo + data.size] = data.view(np.uint8)
    writes = padded.size // n
    origin = writes + n  # the weights are usable N cycles after the preload starts (`matmul_start`)
    rows = product.shape[0]
    offsets = origin + np.array([timing.matmul_cycles(cfg, i + 1) - 1 for i in range(rows)])
    drive = {
        "mem_we": [1] * writes,
        "mem_addr": [lo + i * n for i in range(writes)],
        "mem_wdata": pack(padded.reshape(writes, n), ELEM_BITS),
        "w_valid": [0] * writes + [1] * n,
        "in_w": [0] * writes + pack(_weight_rows(w, n), ELEM_BITS),
        "start": [0] * origin + [1],
        "instr": [0] * origin + [encode(matmul)],
        "rs1": [0] * origin + [_u32(rs1)],
        "rs2": [0] * origin + [_u32(rs2)],
        "k": [0] * origin + [w.shape[0]],
    }
    if acc is not None:
        acc_rows = np.zeros((int(offsets[-1]) + 1, n), dtype=np.int64)
        acc_rows[offsets] = _pad(acc, rows, n)
        acc_en = np.zeros(int(offsets[-1]) + 1, dtype=np.int64)
        acc_en[offsets] = 1
        drive |= {"in_acc": pack(acc_rows, ACC_BITS), "acc_en": acc_en.tolist()}
    item = Item(label, {}, drive, (Watch(("out_valid",), ("out_p",), rows),), timeout=rows + 2 * n + SLACK)
    care = np.zeros((rows, n), dtype=bool)
    care[:, : product.shape[1]] = True
    expected = Expected(offsets, {"out_p": _pad(product, rows, n)}, {"out_p": care})
    due = timing.matmul_cycles(cfg, rows)
    return Case(label, item, (expected,), due if charged is None else charged, Busy.last_event, origin=origin)


@dataclass(frozen=True)
class MatrixOp:
    """One preload or matmul of a run replayed on the matrix unit at the cycle the simulator started it."""

    start: int  # cycles after the run's first instruction started
    charged: int  # cycles the simulator charges it (preload: until its weights are in; matmul: its results)
    w: np.ndarray | None = None  # preload: the K x C int8 weight tile
    a: np.ndarray | None = None  # matmul: rows x K int8 activations
    product: np.ndarray | None = None  # matmul: its rows x C int32 result (accumulated, for mx.mma)
    acc: np.ndarray | None = None  # mx.mma: the accumulator rows it adds to


def matrix_run_case(cfg: MachineConfig, label: str, ops: list[MatrixOp]) -> Case:
    """Preloads and matmuls that overlap on the pipelined matrix unit, each driven from its simulator start cycle.

    Matmul row i is due at its start + `matmul_cycles(i + 1)` - 1 (the last at start + its charged cycles - 1) and
    each preload's weights at its start + charged cycles (`w_ready` rises): with the array fed on the simulator's
    schedule, a preload overwriting weights still in use, or a matmul entering too early, shows as a wrong value.
    The run is busy until its last matmul's results are out.
    """
    n = cfg.array_size
    matmuls = [op for op in ops if op.a is not None]
    preloads = [op for op in ops if op.w is not None]
    due = [op.start + timing.matmul_cycles(cfg, i + 1) - 1 for op in matmuls for i in range(op.a.shape[0])]
    length = max([*due, *(op.start + n - 1 for op in preloads)]) + 1
    w_valid, in_valid, in_first, acc_en = (np.zeros(length, dtype=np.int64) for _ in range(4))
    in_w, in_a = np.zeros((length, n), dtype=np.int64), np.zeros((length, n), dtype=np.int64)
    in_acc = np.zeros((length, n), dtype=np.int64)
    for op in preloads:
        w_valid[op.start : op.start + n] = 1
        in_w[op.start : op.start + n] = _weight_rows(op.w, n)
    products, care = [], []
    for op in matmuls:
        rows = op.a.shape[0]
        in_valid[op.start : op.start + rows] = 1
        in_first[op.start] = 1
        in_a[op.start : op.start + rows] = _pad(op.a, rows, n)
        out = op.start + np.array([timing.matmul_cycles(cfg, i + 1) - 1 for i in range(rows)])
        if op.acc is not None:
            acc_en[out] = 1
            in_acc[out] = _pad(op.acc, rows, n)
        products.append(_pad(op.product, rows, n))
        mask = np.zeros((rows, n), dtype=bool)
        mask[:, : op.product.shape[1]] = True
        care.append(mask)
    drive = {
        "w_valid": w_valid.tolist(),
        "in_w": pack(in_w, ELEM_BITS),
        "in_valid": in_valid.tolist(),
        "in_first": in_first.tolist(),
        "in_a": pack(in_a, ELEM_BITS),
        "acc_en": acc_en.tolist(),
        "in_acc": pack(in_acc, ACC_BITS),
    }
    item = Item(
        label,
        {},
        drive,
        (Watch(("out_valid",), ("out_p",), len(due)), Watch(("w_ready",), (), len(preloads), edge=True)),
        timeout=SLACK,
    )
    expected = (
        Expected(np.array(due), {"out_p": np.concatenate(products)}, {"out_p": np.concatenate(care)}),
        Expected(np.array([op.start + op.charged for op in preloads], dtype=np.int64)),
    )
    charged = max(op.start + op.charged for op in matmuls)
    return Case(label, item, expected, charged, Busy.last_event, transactions=len(ops))


def vector_case(
    cfg: MachineConfig,
    label: str,
    instruction: Instruction,
    a: np.ndarray,
    result: np.ndarray,
    *,
    b: np.ndarray | None = None,
    c: np.ndarray | None = None,
    rs2: int = 0,
    rs3: int = 0,
    dtype: DType = DType.i32,
    period: int = 0,
    chained: bool = False,
    charged: int | None = None,
) -> Case:
    """One vector instruction over the flat `a` (and `b`, `c`, already broadcast to a's length; `c`: the
    per-element shifts of a per-channel requantize, whose multipliers are `b`).

    `period` > 0 marks a reduction: one result per row of `period` elements, due in the beat holding the
    row's last element. `chained` ops are charged only their pipeline depth behind the last input beat.
    """
    lanes = cfg.vector_lanes
    n = a.size
    beats = -(-n // lanes)
    flat_mask = np.arange(beats * lanes) < n
    mask_rows = flat_mask.reshape(beats, lanes)
    latency = instruction.spec.latency
    item = Item(
        label,
        {"instr": encode(instruction), "reg_dtype": int(dtype), "rs2": _u32(rs2), "rs3": _u32(rs3)},
        {
            "in_valid": [1] * beats,
            "in_mask": pack(mask_rows, 1),
            "in_a": pack(_pad(a.reshape(1, -1), 1, beats * lanes).reshape(beats, lanes), ACC_BITS),
            "in_b": pack(
                _pad((np.zeros(n) if b is None else b).reshape(1, -1), 1, beats * lanes).reshape(beats, lanes), ACC_BITS
            ),
            "in_c": pack(
                _pad((np.zeros(n) if c is None else c).reshape(1, -1), 1, beats * lanes).reshape(beats, lanes), ACC_BITS
            ),
        },
        (Watch(("out_valid",), ("out_data", "out_mask"), beats),),
        timeout=latency + SLACK,
    )
    if period:
        ends = np.zeros(beats * lanes, dtype=bool)
        ends[np.arange(period - 1, n, period)] = True
        values = np.zeros(beats * lanes, dtype=np.int64)
        values[ends] = result.reshape(-1)
        out_mask, out_data = ends.reshape(beats, lanes), values.reshape(beats, lanes)
    else:
        out_mask = mask_rows
        out_data = _pad(result.reshape(1, -1), 1, beats * lanes).reshape(beats, lanes)
    if chained:
        per_beat = timing.chain_op_cycles(cfg, latency)
        offsets = np.arange(beats) + per_beat
        due, busy = per_beat, Busy.after_last_input
    else:
        offsets = np.array([timing.vector_cycles(cfg, (j + 1) * lanes, latency) - 1 for j in range(beats)])
        due, busy = timing.vector_cycles(cfg, n, latency), Busy.last_event
    expected = Expected(offsets, {"out_mask": out_mask.astype(np.int64), "out_data": out_data}, {"out_data": out_mask})
    return Case(label, item, (expected,), due if charged is None else charged, busy)


def per_channel_operands(mnemonic: str, table: np.ndarray, period: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Each of n elements' (mult, shift) in a per-channel requantize: the table row of its column (`v.rqnt.vr`:
    i mod period) or row (`v.rqnt.vc`: i div period), as the lanes receive them (in_b, in_c)."""
    index = np.arange(n)
    channel = index // period if mnemonic.endswith(".vc") else index % period
    pairs = np.asarray(table, np.int64).reshape(-1, 2)
    return pairs[channel, 0], pairs[channel, 1]


def drain_case(
    cfg: MachineConfig,
    label: str,
    config_word: Instruction,
    scale: int,
    acc: np.ndarray,
    result: np.ndarray,
    *,
    bias: np.ndarray | None = None,
    residual: np.ndarray | None = None,
    table: np.ndarray | None = None,
    latency: int,
    charged: int | None = None,
) -> Case:
    """Drain rows x C int32 accumulator rows through the epilogue configured by an `ep.cfg` word (`table`: the
    per-column (mult, shift) pairs of a per-channel drain, cols x 2)."""
    n = cfg.array_size
    rows, cols = acc.shape
    zeros = np.zeros_like(acc)
    pairs = np.zeros((cols, 2), np.int64) if table is None else np.asarray(table, np.int64)
    item = Item(
        label,
        {
            "cfg": encode(config_word),
            "scale": _u32(scale),
            "in_bias": pack(_pad((np.zeros(cols) if bias is None else bias).reshape(1, -1), 1, n), ACC_BITS)[0],
            "in_mult": pack(_pad(pairs[:, 0].reshape(1, -1), 1, n), ACC_BITS)[0],
            "in_shift": pack(_pad(pairs[:, 1].reshape(1, -1), 1, n), ACC_BITS)[0],
        },
        {
            "in_valid": [1] * rows,
            "in_acc": pack(_pad(acc, rows, n), ACC_BITS),
            "in_res": pack(_pad(zeros if residual is None else residual, rows, n), ACC_BITS),
        },
        (Watch(("out_valid",), ("out_data",), rows),),
        timeout=latency + SLACK,
    )
    offsets = np.array([timing.drain_cycles(cfg, i + 1, latency) - 1 for i in range(rows)])
    care = np.zeros((rows, n), dtype=bool)
    care[:, :cols] = True
    expected = Expected(offsets, {"out_data": _pad(result, rows, n)}, {"out_data": care})
    due = timing.drain_cycles(cfg, rows, latency)
    return Case(label, item, (expected,), due if charged is None else charged, Busy.last_event)


def drain_write_case(
    cfg: MachineConfig, case: Case, drain: Instruction, out_dtype: DType, rd: int, rs2: int, stride: int
) -> Case:
    """`case` (a `drain_case`) on the epilogue with its write side (`drain_write`): the drain word starts with its
    register values (`rd`: the output's address, `rs2`: a strided form's row stride); row i is written at rd + i *
    `stride` (the simulator's), in the cycle it leaves the epilogue, its first cols columns only (i8: the low byte
    of each element)."""
    (expected,) = case.expected
    rows, cols = expected.values["out_data"].shape[0], drain.by_name()["cols"]
    data = expected.values["out_data"] & (0xFF if out_dtype is DType.i8 else -1)
    mask = np.zeros((rows, cfg.array_size), dtype=np.int64)
    mask[:, :cols] = 1
    drive = case.item.drive | {"start": [1], "instr": [encode(drain)], "rd": [_u32(rd)], "rs2": [_u32(rs2)]}
    watch = Watch(("wr_en",), ("wr_addr", "wr_mask", "wr_data"), rows)
    item = replace(case.item, drive=drive, watches=(*case.item.watches, watch))
    addresses = (rd + stride * np.arange(rows, dtype=np.int64)).reshape(rows, 1)
    written = Expected(expected.offsets, {"wr_addr": addresses, "wr_mask": mask, "wr_data": data * mask})
    return replace(case, item=item, expected=(expected, written))


def stream_schedule(cfg: MachineConfig, rows: int, mms_start: int, lds_start: int) -> tuple[list[int], list[int]]:
    """Cycle each row of one mx.mms leaves the array and is taken by the vc.lds consuming it whole (empty FIFO)."""
    depth = cfg.stream_fifo_depth
    out: list[int] = []
    taken: list[int] = []
    for i in range(rows):
        before = taken[i - depth] if i >= depth else -1
        out.append(timing.stream_row_out(timing.stream_row_ready(cfg, mms_start, i), out[-1] if out else -1, before))
        taken.append(timing.stream_row_taken(lds_start, i, out[i]))
    return out, taken


def _array_steps(cfg: MachineConfig, rows: int, mms_start: int, out: list[int]) -> np.ndarray:
    """Cycles the array advances (is not frozen on a full FIFO) from `mms_start`: row k enters at the k-th."""
    frozen = np.zeros(out[-1] + 1, dtype=bool)
    for i in range(rows):
        arrived = max(timing.stream_row_ready(cfg, mms_start, i), out[i - 1] + 1 if i else 0)
        frozen[arrived : out[i]] = True
    return np.flatnonzero(~frozen[mms_start:]) + mms_start


def stream_case(
    cfg: MachineConfig,
    label: str,
    lds: Instruction,
    w: np.ndarray,
    a: np.ndarray,
    product: np.ndarray,
    *,
    mms_start: int,
    lds_start: int,
    charged: int,
    mms_charged: int | None = None,
) -> Case:
    """Preload `w`, then `mx.mms` of `a` (rows x K) consumed whole by `vc.lds`, one N-wide row per beat.

    Starts are the simulator's cycles. Row j leaves the array at `stream_row_out` (the array freezes while the
    FIFO holds stream_fifo_depth rows: input rows are presented on the cycles it advances, and it must take each
    one then); beat j is due when chain_stream_finish says the first j + 1 beats end. `mms_charged` (the
    simulator's mx.mms cycles) fixes when the last row must leave the array.
    """
    n, rows = cfg.array_size, a.shape[0]
    first = min(mms_start, lds_start)
    m0, s0 = n + mms_start - first, n + lds_start - first  # item offsets, after the N-cycle weight load
    out, _ = stream_schedule(cfg, rows, m0, s0)
    enter = _array_steps(cfg, rows, m0, out)[:rows]
    valid = np.zeros(enter[-1] + 1, dtype=np.int64)
    valid[enter] = 1
    a_rows = np.zeros((enter[-1] + 1, n), dtype=np.int64)
    a_rows[enter] = _pad(a, rows, n)
    item = Item(
        label,
        {"instr": encode(lds)},
        {
            "w_valid": [1] * n,
            "in_w": pack(_weight_rows(w, n), ELEM_BITS),
            "in_valid": valid.tolist(),
            "in_first": [0] * int(enter[0]) + [1],
            "in_a": pack(a_rows, ELEM_BITS),
            "lds_start": [0] * s0 + [1],
        },
        (
            Watch(("out_valid",), ("out_data", "out_mask"), rows),
            Watch(("in_valid",), ("in_ready",), rows),
            Watch(("out_row_valid",), (), rows),
        ),
        timeout=2 * n + rows + lds.spec.latency + SLACK,
    )
    lanes, lat = cfg.vector_lanes, lds.spec.latency
    offsets = np.array([timing.chain_stream_finish(cfg, s0, (j + 1) * lanes, out[j], lat) - 1 for j in range(rows)])
    ones = np.ones((rows, lanes), dtype=np.int64)
    rows_out = np.array(out)
    if mms_charged is not None:
        rows_out[-1] = m0 + mms_charged - 1
    expected = (
        Expected(offsets, {"out_data": product.astype(np.int64), "out_mask": ones}),
        Expected(enter, {"in_ready": np.ones((rows, 1), dtype=np.int64)}),
        Expected(rows_out),
    )
    return Case(label, item, expected, charged, Busy.last_event, origin=s0)
