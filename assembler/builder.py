"""`ProgramBuilder`: emit programs from Python without text, for the fusion engine.

One method per ISA row is generated from the table (`v.add.vs` -> `v_add_vs`,
Python keywords get a trailing underscore: `and_`); operands are given
positionally in field order or by field name. Registers and immediates are
ints, enums are members or names, targets are label names or absolute
instruction indices. `build()` runs the same linker as the text path, so both
give identical bytes; problems are reported at the Python line that emitted them.
"""

from __future__ import annotations

import contextlib
import keyword
import linecache
import sys
from collections.abc import Iterator, Mapping, Sequence
from types import CodeType
from typing import Any

import numpy as np

from assembler import program as ir
from assembler.diagnostics import AssemblyError, Diagnostic
from assembler.link import DATA_RANGES, ROW, link, paused_gc
from assembler.objfile import ObjectFile, Section
from assembler.texts import TextCache
from isa import BY_MNEMONIC, INSTRUCTIONS, DType, InstructionSpec
from isa.errors import IsaTableError

TensorSpec = tuple[str, DType | str, Sequence[int], Any]  # name, dtype, shape, address (int or data label)


def _caller(depth: int = 2) -> tuple[CodeType, int]:
    """Where the caller `depth` frames up is, as (code, bytecode offset): `frame.f_lineno` scans the code's line
    table (microseconds deep in a long generator function), and the line is only needed for a diagnostic
    (`_report` looks it up)."""
    frame = sys._getframe(depth)
    return frame.f_code, frame.f_lasti


def _user_frame() -> tuple[str, int]:
    """The innermost frame outside this module and contextlib: where the user called us."""
    frame = sys._getframe(1)
    while frame.f_back is not None and frame.f_code.co_filename in (__file__, contextlib.__file__):
        frame = frame.f_back
    return frame.f_code.co_filename, frame.f_lineno


def _call_error(message: str, hint: str = "") -> AssemblyError:
    """A mistake in the shape of a call: reported at once, at the caller's line."""
    return AssemblyError([_report(_user_frame(), 0, message, hint)])


def _line_at(code: CodeType, offset: int) -> int:
    """The source line of bytecode `offset` in `code` (what `frame.f_lineno` says at that instruction)."""
    for start, end, line in code.co_lines():
        if start <= offset < end and line is not None:
            return line
    return code.co_firstlineno


def _report(loc: Any, col: int, message: str, hint: str) -> Diagnostic:
    if loc is None:
        return Diagnostic("<builder>", 0, 0, message, hint)
    filename, lineno = loc
    if isinstance(filename, CodeType):  # (code, offset) from `_caller`: the line looked up now
        filename, lineno = filename.co_filename, _line_at(filename, lineno)
    source = linecache.getline(filename, lineno).rstrip("\n")
    indent = len(source) - len(source.lstrip())
    return Diagnostic(filename, lineno, indent + 1, message, hint, source)


class ProgramBuilder:
    """Collects program items; see the module docstring. Methods return the builder for chaining."""

    def __init__(self, data_base: int | None = None, texts: TextCache | None = None) -> None:
        self._items: list[ir.Item] = []
        self._texts = texts  # encoded texts shared with other programs (`TextCache`), if given
        self._open: ir.InstrRun | None = None  # the run instructions are appended to (closed by any other item)
        if data_base is not None:
            self._add(ir.DataBase(data_base, _caller()))

    def _add(self, item: ir.Item) -> None:
        """Append a non-instruction item; it ends the open run of instructions."""
        self._open = None
        self._items.append(item)

    def _run(self) -> ir.InstrRun:
        """The open run of instructions (a new one after any other item)."""
        run = self._open
        if run is None:
            run = self._open = ir.InstrRun([], [], [])
            self._items.append(run)
        return run

    # --- text ------------------------------------------------------------------------------

    def instr(self, mnemonic: str, *args: Any, **kwargs: Any) -> ProgramBuilder:
        """Emit any instruction by mnemonic (the generated methods are shortcuts for this)."""
        spec = BY_MNEMONIC.get(mnemonic)
        if spec is None:
            raise _call_error(f"unknown mnemonic {mnemonic!r}")
        run = self._open or self._run()
        run.rows.append(ROW[mnemonic])
        run.args.append(_bind(spec, args, kwargs))
        run.locs.append(_caller())
        return self

    def emitter(self, method: str) -> Any:
        """A function emitting the instruction of builder method `method` (`mx_preload`) from positional operands
        in field order, every instruction located at this call: for a helper that emits one kind of instruction
        very often (the `li`s of `fusion.lower.Emitter`'s registers), it skips the per-instruction caller lookup
        and operand binding."""
        row = _METHOD_ROWS.get(method)
        if row is None:
            raise _call_error(f"no instruction method {method!r}")
        loc = _caller()

        def emit(*args: Any) -> None:
            run = self._open or self._run()
            run.rows.append(row)
            run.args.append(args)
            run.locs.append(loc)

        return emit

    def label(self, name: str) -> str:
        """Define `name` at the current position of the current section; returns the name."""
        self._add(ir.Label(name, _caller()))
        return name

    def equ(self, name: str, value: int | float | str) -> str:
        self._add(ir.Equ(name, value, _caller()))
        return name

    def text(self) -> ProgramBuilder:
        self._add(ir.SetSection(Section.text, _caller()))
        return self

    def data(self) -> ProgramBuilder:
        self._add(ir.SetSection(Section.data, _caller()))
        return self

    # --- data ------------------------------------------------------------------------------

    def i8(self, *values: Any) -> ProgramBuilder:
        """Bytes in [-128, 255]: ints, symbol names, or one sequence / numpy array; or one bytes object, taken
        as it is (a kernel's constants image, megabytes: not copied)."""
        if len(values) == 1 and type(values[0]) is bytes and values[0]:
            self._add(ir.Data("i8", values[0], _caller()))
            return self
        return self._data("i8", values)

    def i32(self, *values: Any) -> ProgramBuilder:
        return self._data("i32", values)

    def word(self, *values: Any) -> ProgramBuilder:
        """32-bit words, typically label names (dispatch tables)."""
        return self._data("i32", values)

    def f32(self, *values: Any) -> ProgramBuilder:
        return self._data("f32", values)

    def zero(self, count: int) -> ProgramBuilder:
        self._add(ir.Zero(count, _caller()))
        return self

    def align(self, boundary: int) -> ProgramBuilder:
        self._add(ir.Align(boundary, _caller()))
        return self

    def _data(self, kind: str, values: tuple[Any, ...]) -> ProgramBuilder:
        if len(values) == 1 and isinstance(values[0], np.ndarray | list | tuple):
            values = values[0]
        if isinstance(values, np.ndarray):
            payload: Any = _array_bytes(kind, values)
        else:
            payload = tuple(values)
        if len(payload) == 0:
            raise _call_error(f".{kind} needs at least one value")
        self._add(ir.Data(kind, payload, _caller(3)))
        return self

    # --- kernels ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def kernel(
        self,
        name: str,
        inputs: Sequence[TensorSpec] = (),
        outputs: Sequence[TensorSpec] = (),
        attrs: Mapping[str, str] | None = None,
    ) -> Iterator[ProgramBuilder]:
        """`with b.kernel("gemm", inputs=[("a", "i8", (64, 64), "a_buf")], attrs={...}):` emits a kernel block."""
        loc = _user_frame()
        self._add(ir.KernelBegin(name, loc))
        for output, group in ((False, inputs), (True, outputs)):
            for tensor_name, dtype, shape, address in group:
                self._add(ir.KernelTensor(output, tensor_name, dtype, tuple(shape), address, loc))
        for key, value in (attrs or {}).items():
            self._add(ir.KernelAttr(key, str(value), loc))
        yield self
        self._add(ir.KernelEnd(_user_frame()))

    # --- result ----------------------------------------------------------------------------

    def build(self) -> ObjectFile:
        """Link everything emitted so far; raises AssemblyError listing every problem."""
        with paused_gc():
            return link(self._items, _report, self._texts)


def _array_bytes(kind: str, array: np.ndarray) -> bytes:
    """Data from a numpy array, range-checked like the text path, without a Python loop over elements."""
    flat = np.ascontiguousarray(array).reshape(-1)
    if kind == "f32":
        if flat.dtype.kind not in "iuf":
            raise _call_error(f".f32 needs a numeric array, got dtype {flat.dtype}")
        with np.errstate(over="ignore"):
            out = flat.astype("<f4")
        if not np.array_equal(np.isfinite(out), np.isfinite(flat)):
            raise _call_error(".f32 array has values too large for single precision")
        return out.tobytes()
    if flat.dtype.kind not in "iu":
        raise _call_error(f".{kind} needs an integer array, got dtype {flat.dtype}")
    lo, hi = DATA_RANGES[kind]
    limits = np.iinfo(flat.dtype)
    if flat.size and (limits.min < lo or limits.max > hi) and (flat.min() < lo or flat.max() > hi):
        raise _call_error(f".{kind} array has values outside [{lo}, {hi}]")
    # (integer casts wrap: two's complement; an array already of the type is not copied before `tobytes`)
    return flat.astype("<u1" if kind == "i8" else "<u4", copy=False).tobytes()


def _bind(spec: InstructionSpec, args: tuple, kwargs: dict) -> tuple:
    names = [f.name for f in spec.fields]
    if len(args) > len(names):
        raise _call_error(f"{spec.mnemonic} takes {len(names)} operands, got {len(args)}", spec.syntax)
    bound = dict(zip(names, args, strict=False))
    for key, value in kwargs.items():
        if key not in names:
            raise _call_error(f"{spec.mnemonic} has no operand {key!r}", f"operands: {', '.join(names)}")
        if key in bound:
            raise _call_error(f"{spec.mnemonic}: operand {key!r} given twice")
        bound[key] = value
    missing = [n for n in names if n not in bound]
    if missing:
        raise _call_error(f"{spec.mnemonic}: missing operand(s) {', '.join(missing)}", spec.syntax)
    return tuple(bound[n] for n in names)


def builder_method_name(spec: InstructionSpec) -> str:
    name = spec.python_name
    return name + "_" if keyword.iskeyword(name) else name


def _generated(spec: InstructionSpec) -> Any:
    arity, row = len(spec.fields), ROW[spec.mnemonic]

    def emit(self: ProgramBuilder, *args: Any, **kwargs: Any) -> ProgramBuilder:
        if kwargs or len(args) != arity:
            args = _bind(spec, args, kwargs)
        frame = sys._getframe(1)  # where it was emitted, as `_caller` keeps it (inlined: one call per instruction)
        run = self._open or self._run()
        run.rows.append(row)
        run.args.append(args)
        run.locs.append((frame.f_code, frame.f_lasti))
        return self

    emit.__name__ = emit.__qualname__ = builder_method_name(spec)
    emit.__doc__ = f"`{spec.syntax}`: {spec.semantics}"
    return emit


_METHOD_ROWS = {builder_method_name(spec): ROW[spec.mnemonic] for spec in INSTRUCTIONS}
for _spec in INSTRUCTIONS:
    if hasattr(ProgramBuilder, builder_method_name(_spec)):
        raise IsaTableError(f"mnemonic {_spec.mnemonic!r} clashes with ProgramBuilder.{builder_method_name(_spec)}")
    setattr(ProgramBuilder, builder_method_name(_spec), _generated(_spec))
