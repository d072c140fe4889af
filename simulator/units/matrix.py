"""Matrix unit: weight preload, (accumulating / streaming) matmul, epilogue configuration and drain.

Timing (`simulator.engine.MatrixPipe`): a preload fills the array's shadow weights while it computes, and the next
matmul switches to them; matmuls follow each other one row per cycle. Program semantics do not change: a matmul
uses the weights of the latest preload before it."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

import numpy as np

from isa import Instruction
from isa.enums import Activation, DType, EpilogueFlags
from isa.memory_map import LOCAL_ACC_BASE
from simulator.engine import CONFIG, MATMUL, MATRIX, PLAIN, PRELOAD, PRODUCER, S_MACS_F32, S_MACS_I8
from simulator.errors import Fault
from simulator.memory import NUMPY_DTYPES
from simulator.semantics import matrix as sem
from simulator.timing import drain_cycles, epilogue_config_cycles, matmul_cycles, preload_cycles

if TYPE_CHECKING:
    from simulator.machine import Builder, Machine, Once, Step

_ACC_DTYPE = {DType.i8: np.dtype(np.int32), DType.f32: np.dtype(np.float32)}
_ACC_OF = {np.dtype(np.int8): _ACC_DTYPE[DType.i8], np.dtype(np.float32): _ACC_DTYPE[DType.f32]}  # by weight dtype
_I8, _I32 = np.dtype(np.int8), np.dtype(np.int32)


def _pipelined(kind: int, operand: int) -> int:
    """`kind`, or PLAIN (wait for every earlier result, hold the unit) when the operand is read from the
    accumulator, which earlier matmuls may still be writing."""
    return PLAIN if operand >= LOCAL_ACC_BASE else kind


def _check_tile(n: int, rows: int, cols: int) -> None:
    if rows > n or cols > n:
        raise Fault(f"weight tile {rows} x {cols} exceeds the {n} x {n} array")


def preload(m: Machine, pc: int, ins: Instruction) -> Step:
    rs1, rows, cols, dtype = ins.values
    n, dt = m.cfg.array_size, NUMPY_DTYPES[dtype]
    x, nxt, row, dur = m.x, pc + 1, m.row(pc), preload_cycles(m.cfg)

    def step() -> int:
        _check_tile(n, rows, cols)
        addr = x[rs1]
        w = m.read_local(addr, rows * cols, dt, row).reshape(rows, cols)
        m.weights = w = w.copy()
        op = m.issue(MATRIX, pc, dur, row, _pipelined(PRELOAD, addr))
        if m.transactions is not None:
            m.record(op, pc, {"w": w}, w)
        return nxt

    return step


def preload_timed(m: Machine, pc: int, ins: Instruction) -> int:
    """`mx.preload` without values (`simulator.dispatch.TIMED`): the read's accesses; the weights stand in by their
    shape and dtype (`WeightShape`)."""
    rs1, rows, cols, dtype = ins.values
    _check_tile(m.cfg.array_size, rows, cols)
    addr, row = m.x[rs1], m.row(pc)
    m.read_local(addr, rows * cols, NUMPY_DTYPES[dtype], row)
    m.weights = _stand_in(rows, cols, dtype)
    m.issue(MATRIX, pc, preload_cycles(m.cfg), row, _pipelined(PRELOAD, addr))
    return pc + 1


@dataclass(frozen=True, slots=True)
class WeightShape:
    """What a run without values keeps of a preload's weights: their shape and dtype, all it uses of them, and what
    a matmul derives from the dtype (its accumulator's element type, the statistics field its MACs count in)."""

    shape: tuple[int, int]
    dtype: np.dtype
    acc: np.dtype
    macs: int


@cache
def _stand_in(rows: int, cols: int, dtype: int) -> WeightShape:
    dt = NUMPY_DTYPES[dtype]
    return WeightShape((rows, cols), dt, _ACC_OF[dt], S_MACS_I8 if dt == _I8 else S_MACS_F32)


def _weights(m: Machine) -> np.ndarray | WeightShape:
    if m.weights is None:
        raise Fault("matmul before any mx.preload: the array holds no weights")
    return m.weights


def _product(
    m: Machine, a_addr: int, rows: int, row: list[int], stride: int | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The activations read (rows `stride` bytes apart; None: dense), the weights and their product (None when the
    machine computes no values)."""
    w = _weights(m)
    k, cols = w.shape
    i8 = w.dtype == _I8
    a = m.read_local_rows(a_addr, rows, k, k * w.dtype.itemsize if stride is None else stride, w.dtype, row)
    row[S_MACS_I8 if i8 else S_MACS_F32] += rows * k * cols
    return a, w, sem.matmul(a, w, DType.i8 if i8 else DType.f32) if m.values else None


def _acc_address(addr: int) -> int:
    if addr < LOCAL_ACC_BASE:
        raise Fault(f"matmul destination {addr:#x} is not an accumulator address (>= {LOCAL_ACC_BASE:#x})")
    return addr


def matmul(accumulate: bool, strided: bool = False) -> Builder:
    """`mx.mm`/`mx.mma`; `strided` (`mx.mm.s`/`mx.mma.s`): A's rows are x[rs2] bytes apart."""

    def build(m: Machine, pc: int, ins: Instruction) -> Step:
        rd, rs1, *rs2, rows = ins.values
        x, nxt, row, dur = m.x, pc + 1, m.row(pc), matmul_cycles(m.cfg, rows)

        def step() -> int:
            src, stride = x[rs1], x[rs2[0]] if strided else None
            a, w, product = _product(m, src, rows, row, stride)
            dest = _acc_address(x[rd])
            recording = m.transactions is not None
            operands = {}
            if recording:  # (the A operand's address and row stride: what the RTL's row fetch reads it by)
                a_stride = a.shape[1] * a.itemsize if stride is None else stride
                operands = {"a": a.copy(), "w": w, "a_addr": src, "a_stride": a_stride}
            if accumulate:
                old = m.read_local(dest, product.size, product.dtype, row).reshape(product.shape)
                if recording:
                    operands["acc"] = old.copy()
                product = sem.accumulate(old, product)
            m.write_local(dest, product, row)
            op = m.unit_op(MATRIX, pc, dur, row, _pipelined(MATMUL, src))
            op.n = rows
            if recording:
                m.record(op, pc, operands, product)
            m.submit(op)
            return nxt

        return step

    return build


def matmul_timed(accumulate: bool, strided: bool = False) -> Once:
    """`matmul` without values (`simulator.dispatch.TIMED`): the accesses its step makes, without its arrays."""

    def run(m: Machine, pc: int, ins: Instruction) -> int:
        if strided:
            rd, rs1, rs2, rows = ins.values
        else:
            rd, rs1, rows = ins.values
        x, row = m.x, m.row(pc)
        w = _weights(m)
        (k, cols), dt, src = w.shape, w.dtype, x[rs1]
        if strided:
            m.read_local_rows(src, rows, k, x[rs2], dt, row)
        else:
            m.read_local(src, rows * k, dt, row)
        row[w.macs] += rows * k * cols
        dest, acc_dt = _acc_address(x[rd]), w.acc
        if accumulate:
            m.read_local(dest, rows * cols, acc_dt, row)
        m.written(dest, rows * cols, acc_dt, row)
        m.issue(MATRIX, pc, matmul_cycles(m.cfg, rows), row, _pipelined(MATMUL, src), rows)
        return pc + 1

    return run


def matmul_stream(m: Machine, pc: int, ins: Instruction) -> Step:
    rs1, rows = ins.values
    x, nxt, row, dur = m.x, pc + 1, m.row(pc), matmul_cycles(m.cfg, rows)

    def step() -> int:
        a, w, product = _product(m, x[rs1], rows, row)
        if product is None:  # timing only: the stream still carries rows of the product's shape and dtype
            product = np.zeros((rows, w.shape[1]), _ACC_OF[w.dtype])
        op = m.unit_op(MATRIX, pc, dur, row, PRODUCER)
        op.n = rows
        m.stream.append([op, product.reshape(-1), 0, product.shape[1], m.stream_rows])
        m.stream_rows += rows
        if m.transactions is not None:
            m.record(op, pc, {"a": a.copy(), "w": w}, product)
        m.submit(op)
        return nxt

    return step


def epilogue_config(m: Machine, pc: int, ins: Instruction) -> Step:
    rs1, rs2, rs3, shift, act, flags, dtype = ins.values
    x, nxt, row, dur = m.x, pc + 1, m.row(pc), epilogue_config_cycles(m.cfg)
    config = (Activation(act), EpilogueFlags(flags), shift, DType(dtype))

    def step() -> int:
        m.epilogue = (x[rs1], x[rs2], x[rs3], *config)
        m.submit(m.unit_op(MATRIX, pc, dur, row, CONFIG))
        return nxt

    return step


def drain(strided: bool) -> Builder:
    """`mx.drain`; `strided` (`mx.drain.s`): the output rows are x[rs2] bytes apart (the epilogue's write address
    generator steps by the register instead of a row's size), the residual stays dense rows x cols."""

    def build(m: Machine, pc: int, ins: Instruction) -> Step:
        rd, rs1, *rs2, rows, cols = ins.values
        n, x, nxt, row = m.cfg.array_size, m.x, pc + 1, m.row(pc)
        dur = drain_cycles(m.cfg, rows, ins.spec.latency)

        def step() -> int:
            if m.epilogue is None:
                raise Fault("mx.drain before any ep.cfg: the epilogue is not configured")
            if cols > n:
                raise Fault(f"drain of {cols} columns exceeds the {n}-wide array (one N-wide row per cycle)")
            bias_addr, res_addr, mult, act, flags, shift, out = m.epilogue
            acc_dt = _ACC_DTYPE[DType.f32 if m.weights is not None and m.weights.dtype == np.float32 else DType.i8]
            acc = m.read_local(x[rs1], rows * cols, acc_dt, row).reshape(rows, cols)
            bias = m.read_local(bias_addr, cols, acc_dt, row) if flags & EpilogueFlags.bias else None
            res = (
                m.read_local(res_addr, rows * cols, acc_dt, row).reshape(rows, cols)
                if flags & EpilogueFlags.res
                else None
            )
            table = None
            if flags & EpilogueFlags.pc:  # rs3 holds the local address of the per-column (mult, shift) table
                table = m.read_local(mult, 2 * cols, _I32, row).reshape(cols, 2)
            dest, stride = x[rd], x[rs2[0]] if strided else cols * out.size
            if not m.values:  # timing only: the configuration checked, the output's accesses made
                sem.check_epilogue(acc.dtype, act, out, table is not None)
                m.written_rows(dest, rows, cols, stride, NUMPY_DTYPES[out], row)
                m.submit(m.unit_op(MATRIX, pc, dur, row))
                return nxt
            result = sem.epilogue(acc, bias, res, act, mult, shift, out, table)
            operands = None
            if m.transactions is not None:  # copied before the write: the output may overlap the inputs
                extra = {"bias": bias, "residual": res, "table": table}
                operands = {"acc": acc.copy(), "mult": mult, "shift": shift, "act": int(act), "out_dtype": int(out)}
                operands |= {k: v.copy() for k, v in extra.items() if v is not None}
                operands |= {"out_addr": dest, "out_stride": stride}  # what the RTL's write address generator uses
            m.written_rows(dest, rows, cols, stride, NUMPY_DTYPES[out], row)[:] = result.reshape(rows, cols)
            op = m.unit_op(MATRIX, pc, dur, row)
            if operands is not None:
                m.record(op, pc, operands, result)
            m.submit(op)
            return nxt

        return step

    return build
