"""Vector chains (fusion extension): intermediates stay in vector registers, one pass over the data.

A register holds a numpy array; its dtype is the element type. `vc.ld`/`vc.st` move data between local
memory and registers, `vc.lds` takes elements the matrix unit streams (`mx.mms`), the rest compute.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from isa import Instruction
from isa.enums import DType
from simulator.engine import STREAM, VECTOR
from simulator.errors import Fault
from simulator.memory import NUMPY_DTYPES
from simulator.semantics import vector as sem
from simulator.timing import chain_op_cycles, vector_cycles
from simulator.units.vector import MODE_VS, TO_INT8, broadcast_rows, scalar_operand, vops_field

if TYPE_CHECKING:
    from simulator.machine import Builder, Machine, Step

_DTYPE_OF = {np.dtype(d.numpy): d for d in DType}


def _source(m: Machine, vs: int) -> tuple[np.ndarray, DType]:
    value = m.v[vs]
    if value is None:
        raise Fault(f"v{vs} is read before any instruction wrote it")
    return value, _DTYPE_OF[value.dtype]


def _set(m: Machine, vd: int, value: np.ndarray) -> None:
    if value.size > m.cfg.vreg_elems:
        raise Fault(f"{value.size} elements overflow v{vd} (vreg_elems = {m.cfg.vreg_elems})")
    m.v[vd] = value


def _compute(
    m: Machine,
    pc: int,
    row: list[int],
    dur: int,
    vd: int,
    result: np.ndarray,
    elems: int,
    dtype: DType,
    operands: Callable[[], dict],
) -> None:
    _set(m, vd, result)
    row[vops_field(dtype)] += elems
    op = m.unit_op(VECTOR, pc, dur, row)
    if m.transactions is not None:
        m.record(op, pc, operands(), result)
    m.submit(op)


def chain_load(m: Machine, pc: int, ins: Instruction) -> Step:
    vd, rs1, n, dtype = ins.values
    dt, npdt = DType(dtype), NUMPY_DTYPES[dtype]
    x, nxt, row, dur = m.x, pc + 1, m.row(pc), vector_cycles(m.cfg, n, ins.spec.latency)

    def step() -> int:
        value = m.read_local(x[rs1], n, npdt, row).copy()
        _compute(m, pc, row, dur, vd, value, 0, dt, lambda: {"a": value})
        return nxt

    return step


def chain_store(m: Machine, pc: int, ins: Instruction) -> Step:
    rd, vs1 = ins.values
    x, nxt, row, dur = m.x, pc + 1, m.row(pc), chain_op_cycles(m.cfg, ins.spec.latency)

    def step() -> int:
        value, _ = _source(m, vs1)
        m.write_local(x[rd], value, row)
        op = m.unit_op(VECTOR, pc, dur, row)
        if m.transactions is not None:
            m.record(op, pc, {"a": value}, value)
        m.submit(op)
        return nxt

    return step


def chain_stream(m: Machine, pc: int, ins: Instruction) -> Step:
    vd, n = ins.values
    nxt, row, lat = pc + 1, m.row(pc), ins.spec.latency

    def step() -> int:
        if n < 1:
            raise Fault(f"vc.lds takes at least 1 element from the matrix stream, got n={n}")
        parts, need, last, completed = [], n, None, 0
        stream = m.stream
        while need:
            if not stream:
                got = n - need
                raise Fault(
                    f"stream underflow: vc.lds wants {n} elements, the matrix unit streamed {got} "
                    "(issue mx.mms before vc.lds)"
                )
            entry = stream[0]
            producer, data, used, cols, first_row = entry
            take = min(need, data.size - used)
            parts.append(data[used : used + take])
            entry[2] = used + take
            need -= take
            if take:  # an mx.mms of zero rows streams nothing
                completed += (used + take) // cols - used // cols
                last = (producer, first_row + (used + take - 1) // cols)
            if entry[2] == data.size:
                stream.popleft()
        value = np.concatenate(parts) if len(parts) != 1 else parts[0].copy()
        _set(m, vd, value)
        op = m.unit_op(VECTOR, pc, 0, row, STREAM, last[0] if last else None)
        op.n, op.row, op.xfer, op.lat = n, last[1] if last else 0, completed, lat
        if last is None:
            op.kind, op.dur = 0, chain_op_cycles(m.cfg, lat)
        if m.transactions is not None:
            m.record(op, pc, {"n": n}, value)
        m.submit(op)
        return nxt

    return step


def binary(op_name: str, mode: int) -> Builder:
    def build(m: Machine, pc: int, ins: Instruction) -> Step:
        f = ins.by_name()
        vd, vs1 = f["vd"], f["vs1"]
        other = f["rs2"] if mode == MODE_VS else f["vs2"]
        x, nxt, row, dur = m.x, pc + 1, m.row(pc), chain_op_cycles(m.cfg, ins.spec.latency)

        def step() -> int:
            a, dt = _source(m, vs1)
            if mode == MODE_VS:
                b = scalar_operand(x[other], dt)
                result = sem.binary(op_name, a, b, dt)
            else:
                b, bdt = _source(m, other)
                if bdt is not dt:
                    raise Fault(f"operand dtypes differ: v{vs1} is {dt.name}, v{other} is {bdt.name}")
                if mode == 0:
                    if b.size != a.size:
                        raise Fault(f"v{vs1} has {a.size} elements, v{other} has {b.size}")
                    result = sem.binary(op_name, a, b, dt)
                else:
                    shaped, bb = broadcast_rows(a, b, mode)
                    result = sem.binary(op_name, shaped, bb, dt).reshape(-1)
            _compute(m, pc, row, dur, vd, result, a.size, dt, lambda: {"a": a, "b": b})
            return nxt

        return step

    return build


def unary(op_name: str) -> Builder:
    def build(m: Machine, pc: int, ins: Instruction) -> Step:
        vd, vs1 = ins.values
        nxt, row, dur = pc + 1, m.row(pc), chain_op_cycles(m.cfg, ins.spec.latency)

        def step() -> int:
            a, dt = _source(m, vs1)
            _compute(m, pc, row, dur, vd, sem.unary(op_name, a, dt), a.size, dt, lambda: {"a": a})
            return nxt

        return step

    return build


def reduce(op_name: str) -> Builder:
    def build(m: Machine, pc: int, ins: Instruction) -> Step:
        vd, vs1, period = ins.values
        nxt, row, lat = pc + 1, m.row(pc), ins.spec.latency

        def step() -> int:
            a, dt = _source(m, vs1)
            dur = vector_cycles(m.cfg, a.size, lat)
            result = sem.reduce(op_name, a, period, dt)
            _compute(m, pc, row, dur, vd, result, a.size, dt, lambda: {"a": a, "period": period})
            return nxt

        return step

    return build


def clip(m: Machine, pc: int, ins: Instruction) -> Step:
    vd, vs1, rs2, rs3 = ins.values
    x, nxt, row, dur = m.x, pc + 1, m.row(pc), chain_op_cycles(m.cfg, ins.spec.latency)

    def step() -> int:
        a, dt = _source(m, vs1)
        lo, hi = scalar_operand(x[rs2], dt), scalar_operand(x[rs3], dt)
        result = sem.clip(a, lo, hi, dt)
        _compute(m, pc, row, dur, vd, result, a.size, dt, lambda: {"a": a, "lo": lo, "hi": hi})
        return nxt

    return step


def convert(m: Machine, pc: int, ins: Instruction) -> Step:
    vd, vs1, dtype2 = ins.values
    dst = DType(dtype2)
    nxt, row, dur = pc + 1, m.row(pc), chain_op_cycles(m.cfg, ins.spec.latency)

    def step() -> int:
        a, src = _source(m, vs1)
        counted = DType.f32 if DType.f32 in (src, dst) else src
        _compute(m, pc, row, dur, vd, sem.convert(a, src, dst), a.size, counted, lambda: {"a": a})
        return nxt

    return step


def to_int8(kind: str) -> Builder:
    """`vc.rqnt` / `vc.qnt`: the register's elements to int8 (see `simulator.units.vector.TO_INT8`)."""
    _, decode, convert = TO_INT8[kind]

    def build(m: Machine, pc: int, ins: Instruction) -> Step:
        f = ins.by_name()
        vd, vs1, rs2, shift = f["vd"], f["vs1"], f["rs2"], f.get("shift", 0)
        x, nxt, row, dur = m.x, pc + 1, m.row(pc), chain_op_cycles(m.cfg, ins.spec.latency)

        def step() -> int:
            a, dt = _source(m, vs1)
            params = decode(x[rs2], shift)
            result = convert(a, *params.values())
            _compute(m, pc, row, dur, vd, result, a.size, dt, lambda: {"a": a, **params})
            return nxt

        return step

    return build
