"""Vector unit, memory to memory: elementwise, broadcast, reduction and conversion over local memory."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from isa import Instruction
from isa.enums import DType
from simulator.engine import S_VOPS_F32, S_VOPS_INT, VECTOR
from simulator.errors import Fault
from simulator.memory import NUMPY_DTYPES
from simulator.semantics import vector as sem
from simulator.semantics.scalar import f32_from_bits
from simulator.timing import vector_cycles

if TYPE_CHECKING:
    from simulator.machine import Builder, Machine, Once, Step

MODE_VV, MODE_VS, MODE_VR, MODE_VC = 0, 1, 2, 3
DTYPES: tuple[DType, ...] = tuple(DType(v) for v in range(len(DType)))  # by value, without an enum call
_I8, _I32 = DType.i8.numpy, DType.i32.numpy  # (`DType.numpy` is a lookup by enum member: not per step)


def scalar_operand(value: int, dtype: DType) -> int | float:
    """A scalar register as an operand of `dtype`: its bits as fp32 for f32, its signed value otherwise."""
    return f32_from_bits(value) if dtype is DType.f32 else value


def vops_field(dtype: DType) -> int:
    return S_VOPS_F32 if dtype is DType.f32 else S_VOPS_INT


def broadcast_rows(a: np.ndarray, b: np.ndarray, mode: int) -> tuple[np.ndarray, np.ndarray]:
    """Shape a flat `a` into rows for a .vr (b repeated for every row) or .vc (one b per row) operand."""
    period = b.size if mode == MODE_VR else (a.size // b.size if b.size else 0)
    if period == 0 or a.size % period or (mode == MODE_VC and a.size // period != b.size):
        raise Fault(f"{a.size} elements do not split into rows matching a broadcast operand of {b.size}")
    rows = a.reshape(-1, period)
    return rows, (b.reshape(1, -1) if mode == MODE_VR else b.reshape(-1, 1))


def _finish(
    m: Machine, pc: int, row: list[int], dur: int, dest: int, result: np.ndarray, operands: Callable[[], dict]
) -> None:
    """Write the result, then queue the instruction (operands are captured first: dest may alias them)."""
    captured = operands() if m.transactions is not None else None
    m.write_local(dest, result, row)
    op = m.unit_op(VECTOR, pc, dur, row)
    if captured is not None:
        m.record(op, pc, captured, result)
    m.submit(op)


def _timed(m: Machine, pc: int, row: list[int], dur: int, dest: int, n: int, dtype: np.dtype) -> None:
    """Timing only (no values): the accesses of writing an `n`-element result of `dtype`, and the queued
    instruction, as `_finish` makes them, without the result."""
    m.written(dest, n, dtype, row)
    m.issue(VECTOR, pc, dur, row)


def _binary_operands(
    m: Machine, fields: tuple[int, int, int, int], mode: int, dt: DType, npdt: np.dtype, row: list[int]
) -> tuple[np.ndarray, np.ndarray | int | float]:
    """The operands of a binary op (`fields`: rs1, rs2, n, period; `npdt`: `dt.numpy`, a property lookup) read
    (.vr/.vc: `b` as read, not broadcast)."""
    rs1, rs2, n, period = fields
    x = m.x
    a = m.read_local(x[rs1], n, npdt, row)
    if mode == MODE_VV:
        return a, m.read_local(x[rs2], n, npdt, row)
    if mode == MODE_VS:
        return a, scalar_operand(x[rs2], dt)
    if period <= 0 or n % period:
        raise Fault(f"n={n} is not a whole number of rows of period {period}")
    return a, m.read_local(x[rs2], period if mode == MODE_VR else n // period, npdt, row)


def binary(op_name: str, mode: int) -> Builder:
    def build(m: Machine, pc: int, ins: Instruction) -> Step:
        f = ins.by_name()
        rd, dt = f["rd"], DType(f["dtype"])
        fields, x, nxt, row = (f["rs1"], f["rs2"], f["n"], f.get("period", 0)), m.x, pc + 1, m.row(pc)
        n, npdt = fields[2], dt.numpy
        dur, vops = vector_cycles(m.cfg, n, ins.spec.latency), vops_field(dt)

        def step() -> int:
            a, b = _binary_operands(m, fields, mode, dt, npdt, row)
            row[vops] += n
            if mode <= MODE_VS:
                result = sem.binary(op_name, a, b, dt)
            else:
                result = sem.binary(op_name, *broadcast_rows(a, b, mode), dt).reshape(-1)
            _finish(m, pc, row, dur, x[rd], result, lambda: {"a": a.copy(), "b": np.copy(b)})
            return nxt

        return step

    return build


def binary_timed(op_name: str, mode: int) -> Once:
    """`binary` without values (`simulator.dispatch.TIMED`): its reads, the faults that do not depend on values and
    the write of its result (n elements of its dtype)."""
    broadcast = mode > MODE_VS

    def run(m: Machine, pc: int, ins: Instruction) -> int:
        if broadcast:
            rd, rs1, rs2, n, period, dtype = ins.values
        else:
            (rd, rs1, rs2, n, dtype), period = ins.values, 0
        dt, npdt, row = DTYPES[dtype], NUMPY_DTYPES[dtype], m.row(pc)
        a, b = _binary_operands(m, (rs1, rs2, n, period), mode, dt, npdt, row)
        if broadcast:
            broadcast_rows(a, b, mode)  # (its faults)
        row[vops_field(dt)] += n
        sem.check_binary(op_name, dt)
        _timed(m, pc, row, vector_cycles(m.cfg, n, ins.spec.latency), m.x[rd], n, npdt)
        return pc + 1

    return run


def unary(op_name: str) -> Builder:
    def build(m: Machine, pc: int, ins: Instruction) -> Step:
        rd, rs1, n, dtype = ins.values
        dt, npdt = DTYPES[dtype], NUMPY_DTYPES[dtype]
        x, nxt, row, dur, vops = m.x, pc + 1, m.row(pc), vector_cycles(m.cfg, n, ins.spec.latency), vops_field(dt)

        values = m.values

        def step() -> int:
            a = m.read_local(x[rs1], n, npdt, row)
            if not values:  # (the result: n elements of dt)
                sem.unary_function(op_name, dt)
                row[vops] += n
                _timed(m, pc, row, dur, x[rd], n, npdt)
                return nxt
            result = sem.unary(op_name, a, dt)
            row[vops] += n
            _finish(m, pc, row, dur, x[rd], result, lambda: {"a": a.copy()})
            return nxt

        return step

    return build


def reduce(op_name: str) -> Builder:
    def build(m: Machine, pc: int, ins: Instruction) -> Step:
        rd, rs1, n, period, dtype = ins.values
        dt, npdt = DTYPES[dtype], NUMPY_DTYPES[dtype]
        x, nxt, row, dur, vops = m.x, pc + 1, m.row(pc), vector_cycles(m.cfg, n, ins.spec.latency), vops_field(dt)

        values, out = m.values, sem.reduce_output_dtype(op_name, dt).numpy

        def step() -> int:
            a = m.read_local(x[rs1], n, npdt, row)
            if not values:  # (the result: a row's reduction per row)
                rows = sem.reduce_rows(n, period)
                row[vops] += n
                _timed(m, pc, row, dur, x[rd], rows, out)
                return nxt
            result = sem.reduce(op_name, a, period, dt)
            row[vops] += n
            _finish(m, pc, row, dur, x[rd], result, lambda: {"a": a.copy(), "period": period})
            return nxt

        return step

    return build


def clip(m: Machine, pc: int, ins: Instruction) -> Step:
    rd, rs1, rs2, rs3, n, dtype = ins.values
    dt, npdt = DTYPES[dtype], NUMPY_DTYPES[dtype]
    x, nxt, row, dur, vops = m.x, pc + 1, m.row(pc), vector_cycles(m.cfg, n, ins.spec.latency), vops_field(dt)

    def step() -> int:
        a = m.read_local(x[rs1], n, npdt, row)
        lo, hi = scalar_operand(x[rs2], dt), scalar_operand(x[rs3], dt)
        result = sem.clip(a, lo, hi, dt)
        row[vops] += n
        _finish(m, pc, row, dur, x[rd], result, lambda: {"a": a.copy(), "lo": lo, "hi": hi})
        return nxt

    return step


def convert(m: Machine, pc: int, ins: Instruction) -> Step:
    rd, rs1, n, dtype, dtype2 = ins.values
    src, dst = DTYPES[dtype], DTYPES[dtype2]
    x, nxt, row, dur = m.x, pc + 1, m.row(pc), vector_cycles(m.cfg, n, ins.spec.latency)
    vops = vops_field(DType.f32 if DType.f32 in (src, dst) else src)

    values, src_np, dst_np = m.values, NUMPY_DTYPES[dtype], NUMPY_DTYPES[dtype2]

    def step() -> int:
        a = m.read_local(x[rs1], n, src_np, row)
        if not values:  # (the result: n elements of dst)
            row[vops] += n
            _timed(m, pc, row, dur, x[rd], n, dst_np)
            return nxt
        result = sem.convert(a, src, dst)
        row[vops] += n
        _finish(m, pc, row, dur, x[rd], result, lambda: {"a": a.copy()})
        return nxt

    return step


def _requantize_params(register: int, shift: int) -> dict[str, int | float]:
    return {"mult": register, "shift": shift}


def _quantize_params(register: int, shift: int) -> dict[str, int | float]:
    return {"scale": f32_from_bits(register)}


# Conversions to int8 steered by one scalar register: input dtype, register decoding, numerics.
TO_INT8: dict[str, tuple[DType, Callable[[int, int], dict], Callable[..., np.ndarray]]] = {
    "rqnt": (DType.i32, _requantize_params, sem.requantize),
    "qnt": (DType.f32, _quantize_params, sem.quantize),
}


def to_int8(kind: str) -> Builder:
    """`v.rqnt` (i32 * mult >> shift) and `v.qnt` (f32 * scale): n elements to int8."""
    src, decode, convert = TO_INT8[kind]
    src_np = src.numpy

    def build(m: Machine, pc: int, ins: Instruction) -> Step:
        f = ins.by_name()
        rd, rs1, rs2, n, shift = f["rd"], f["rs1"], f["rs2"], f["n"], f.get("shift", 0)
        x, nxt, row, dur, vops = m.x, pc + 1, m.row(pc), vector_cycles(m.cfg, n, ins.spec.latency), vops_field(src)

        values = m.values

        def step() -> int:
            a = m.read_local(x[rs1], n, src_np, row)
            if not values:  # (the result: n int8 elements)
                row[vops] += n
                _timed(m, pc, row, dur, x[rd], n, _I8)
                return nxt
            params = decode(x[rs2], shift)
            result = convert(a, *params.values())
            row[vops] += n
            _finish(m, pc, row, dur, x[rd], result, lambda: {"a": a.copy(), **params})
            return nxt

        return step

    return build


def requantize_channels(per_row: bool) -> Builder:
    """`v.rqnt.vr` / `v.rqnt.vc`: n i32 elements to int8, each by its channel's (mult, shift) pair from a table in
    local memory; the channel is the element's column (i mod period) or row (i div period)."""

    def build(m: Machine, pc: int, ins: Instruction) -> Step:
        f = ins.by_name()
        rd, rs1, rs2, n, period = f["rd"], f["rs1"], f["rs2"], f["n"], f["period"]
        x, nxt, row, dur = m.x, pc + 1, m.row(pc), vector_cycles(m.cfg, n, ins.spec.latency)
        vops = vops_field(DType.i32)

        def step() -> int:
            if period == 0:
                raise Fault("per-channel requantize with period 0")
            index = np.arange(n)
            channel = index // period if per_row else index % period
            count = (-(-n // period)) if per_row else min(n, period)
            a = m.read_local(x[rs1], n, _I32, row)
            table = m.read_local(x[rs2], 2 * count, _I32, row).reshape(count, 2)
            row[vops] += n
            if not m.values:  # timing only (the table's shifts are values: out of range, they fault only with values)
                m.written(x[rd], n, _I8, row)
                m.submit(m.unit_op(VECTOR, pc, dur, row))
                return nxt
            result = sem.requantize_channels(a, table, channel)
            _finish(m, pc, row, dur, x[rd], result, lambda: {"a": a.copy(), "table": table.copy(), "period": period})
            return nxt

        return step

    return build
