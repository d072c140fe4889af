"""The Python entry point: load a program, place inputs, run, collect outputs, counters, trace and transactions."""

from __future__ import annotations

import gc
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from assembler.objfile import ObjectFile, TensorDecl
from isa.enums import Unit
from isa.errors import DynfuseError
from simulator.config import MachineConfig, load_config
from simulator.counters import aggregate, kernel_cycles, snapshot
from simulator.machine import Machine


@dataclass(frozen=True)
class Transaction:
    """One matrix- or vector-unit instruction as executed, for replay on the RTL.

    pc, mnemonic: which instruction. start: the cycle the unit started it. cycles: the latency charged by
    `simulator.timing` (finish - start; matrix and vector units have no stall inside an instruction, except
    that `vc.lds` may wait for its streamed rows, as `timing.chain_stream_finish` says, and `mx.mms` may
    stall on a full stream FIFO, as `timing.stream_row_out` says).
    operands, by instruction (arrays are copies of what the unit read; scalars are Python numbers):
      mx.preload      w (K x cols weights)                                 result: w
      mx.mm, mx.mms   a (rows x K activations), w                          result: rows x cols (i32 or f32)
      mx.mma          a, w, acc (rows x cols accumulator before)           result: acc + a @ w
      mx.drain        acc, [bias], [residual], mult (raw 32-bit), shift, act, out_dtype (enum ints)
                                                                           result: rows x cols in out_dtype
      v.OP / vc.OP    a, b (array of n, of period (.vr), of n/period (.vc), or a scalar (.vs)); unary ops: a;
                      reductions: a, period; clip: a, lo, hi; rqnt: a, mult, shift; qnt: a, scale (float)
                                                                           result: flat output vector
      vc.ld / vc.st   a (the loaded / stored register contents)            result: a
      vc.lds          n (elements taken from the matrix stream)            result: those elements
    `ep.cfg` writes configuration only and is not recorded.
    """

    pc: int
    mnemonic: str
    operands: dict[str, Any]
    result: np.ndarray
    cycles: int
    start: int


@dataclass(frozen=True)
class RunResult:
    outputs: dict[str, np.ndarray]
    counters: Any  # simulator.counters.Counters
    kernel_counters: dict[str, Any]
    transactions: tuple[Transaction, ...]
    config: MachineConfig
    _trace: tuple[tuple[int, int, int, int], ...] = field(default=(), repr=False)
    _text: tuple[str, ...] = field(default=(), repr=False)

    def trace_events(self) -> list[dict[str, Any]]:
        """Chrome trace-event slices: one track (tid) per unit, one slice per instruction; times in us."""
        events: list[dict[str, Any]] = [
            {"ph": "M", "name": "thread_name", "pid": 0, "tid": int(u), "args": {"name": u.name}} for u in Unit
        ]
        us = self.config.cycles_to_us
        for unit, pc, start, finish in self._trace:
            events.append(
                {
                    "ph": "X",
                    "pid": 0,
                    "tid": int(unit),
                    "name": self._text[pc] if 0 <= pc < len(self._text) else "?",
                    "ts": us(start),
                    "dur": us(finish - start),
                    "args": {"pc": pc, "start_cycle": start, "end_cycle": finish},
                }
            )
        return events

    def write_trace(self, path: str | Path) -> None:
        if not self._trace:
            raise DynfuseError("no trace was recorded: run with trace=True")
        Path(path).write_text(json.dumps({"traceEvents": self.trace_events(), "displayTimeUnit": "ns"}))


def load_program(source: ObjectFile | str | Path) -> ObjectFile:
    """An ObjectFile, a binary (.bin) or assembly source (.s)."""
    if isinstance(source, ObjectFile):
        return source
    path = Path(source)
    if path.suffix == ".s":
        from assembler.source import assemble_file

        return assemble_file(path)
    from assembler.binary import load

    return load(path)


def _place_inputs(m: Machine, inputs: dict[str, np.ndarray]) -> None:
    decls = {t.name: t for k in m.obj.kernels for t in k.inputs}
    for name, value in inputs.items():
        if name not in decls:
            known = ", ".join(sorted(decls)) or "none"
            raise DynfuseError(f"input {name!r} is not a .input of any kernel (inputs: {known})")
        decl = decls[name]
        array = np.asarray(value)
        if tuple(array.shape) != tuple(decl.shape):
            raise DynfuseError(f"input {name!r}: shape {array.shape} but the kernel declares {decl.shape}")
        if array.dtype != decl.dtype.numpy:
            raise DynfuseError(f"input {name!r}: dtype {array.dtype} but the kernel declares {decl.dtype.name}")
        _check_fits(m, decl)
        if m.values:  # (without values nothing reads DRAM: `Memory`)
            m.mem.dram[decl.address : decl.address + decl.nbytes] = (
                np.ascontiguousarray(array).view(np.uint8).reshape(-1)
            )


def _check_fits(m: Machine, decl: TensorDecl) -> None:
    _fits(decl, m.cfg)


def _fits(decl: TensorDecl, cfg: MachineConfig) -> None:
    if decl.address < 0 or decl.address + decl.nbytes > cfg.dram_bytes:
        raise DynfuseError(
            f"tensor {decl.name!r} at {decl.address:#x} ({decl.nbytes} bytes) does not fit the "
            f"{cfg.dram_bytes}-byte DRAM of {cfg.name}"
        )


def check_tensors_fit(obj: ObjectFile, config: MachineConfig) -> None:
    """Every declared kernel tensor lies inside DRAM: checked before anything is allocated for it."""
    for kernel in obj.kernels:
        for decl in (*kernel.inputs, *kernel.outputs):
            _fits(decl, config)


def _outputs(m: Machine) -> dict[str, np.ndarray]:
    out = {}
    for kernel in m.obj.kernels:
        for decl in kernel.outputs:
            _check_fits(m, decl)
            raw = m.mem.dram[decl.address : decl.address + decl.nbytes]
            out[decl.name] = raw.view(decl.dtype.numpy).reshape(decl.shape).copy()
    return out


def simulate(
    program: ObjectFile | str | Path,
    config: MachineConfig | str = "base",
    inputs: dict[str, np.ndarray] | None = None,
    checked: bool = False,
    trace: bool = False,
    record_transactions: bool = False,
    timing_only: bool = False,
) -> RunResult:
    """Run a program to halt. Traps raise SimulatorTrap; bad inputs raise DynfuseError.

    `timing_only`: the counters (every one, the cycles among them) without the values: the units compute and move
    no data unless a value could change what runs (`machine.READS_DATA`), and `outputs` is empty. Faults that depend
    on values (a per-channel shift out of range) are not raised; no transactions can be recorded."""
    if timing_only and record_transactions:
        raise DynfuseError("a timing-only run computes no values: it cannot record transactions")
    cfg = load_config(config)
    obj = load_program(program)
    check_tensors_fit(obj, cfg)
    collecting = gc.isenabled()
    gc.disable()  # a run allocates many small long-lived objects; generational GC passes only slow it down
    m: Machine | None = None
    try:
        m = Machine(obj, cfg, checked, trace, record_transactions, timing_only)
        _place_inputs(m, inputs or {})
        m.run()
        return _result(m, trace, outputs=not timing_only)
    finally:
        if m is not None:
            m.release()
        if collecting:
            gc.enable()


def _result(m: Machine, trace: bool, outputs: bool) -> RunResult:
    end = m.halt_cycle
    per_kernel = kernel_cycles(m, end)
    snap = snapshot(m)
    kernels = m.obj.kernels
    transactions = tuple(
        Transaction(pc, m.text.instruction(pc)[0].mnemonic, operands, result, op.finish - op.start, op.start)
        for op, pc, operands, result in (m.transactions or [])
    )
    return RunResult(
        outputs=_outputs(m) if outputs else {},
        counters=aggregate(m, snap, 0, len(m.count), end),
        kernel_counters={k.name: aggregate(m, snap, k.start, k.end, per_kernel[k.name]) for k in kernels},
        transactions=transactions,
        config=m.cfg,
        _trace=tuple(m.trace or ()),
        _text=tuple(m.describe(pc) for pc in range(len(m.obj.text))) if trace else (),
    )
