"""Items -> ObjectFile in two passes: lay out and define symbols, then resolve and encode.

Both front ends end here, so text and builder programs share every rule. All
problems are collected; if there are any, one `AssemblyError` lists them all.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import gc
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

import numpy as np

from assembler.diagnostics import AssemblyError, Diagnostic, Problem, nearest
from assembler.objfile import MAX_TENSOR_RANK, KernelMeta, ObjectFile, Section, Symbol, TensorDecl
from assembler.operands import ENUM_NAMES, REGISTER_NAMES, evaluate, f32_bits, field_value
from assembler.program import (
    DATA_SIZES,
    Align,
    Data,
    DataBase,
    Equ,
    Instr,
    InstrRun,
    Item,
    KernelAttr,
    KernelBegin,
    KernelEnd,
    KernelTensor,
    Label,
    SetSection,
    Zero,
)
from assembler.texts import TextCache
from isa import BY_MNEMONIC, INSTRUCTIONS, DType, Field, InstructionSpec, Kind
from isa.encoding import encode_fields
from isa.fields import ENUM_KINDS

NAME_RE = re.compile(r"[A-Za-z_.$][A-Za-z0-9_.$]*")
LOCAL_PREFIX = ".L"
MAX_DATA_BYTES = 1 << 28
ADDRESS_LIMIT = 1 << 32
MAX_EQU_DEPTH = 128  # .equ symbols resolved through one another (each level is a few Python frames)
TARGET_KINDS = (Kind.target, Kind.loop_end)
ROW = {spec.mnemonic: i for i, spec in enumerate(INSTRUCTIONS)}  # mnemonic -> index of its ISA table row
DATA_RANGES = {"i8": (-(1 << 7), (1 << 8) - 1), "i32": (-(1 << 31), (1 << 32) - 1)}

Reporter = Callable[[Any, int, str, str], Diagnostic]  # (loc, col, message, hint) -> diagnostic


@dataclass
class _Kernel:
    begin: KernelBegin
    start: int
    end: int = -1
    tensors: list[KernelTensor] = field(default_factory=list)
    attrs: dict[str, str] = field(default_factory=dict)


@dataclass
class _Linker:
    """Mutable state of one link; lives only inside `link`."""

    report: Reporter
    problems: list[Diagnostic] = field(default_factory=list)
    labels: dict[str, tuple[Section, int]] = field(default_factory=dict)  # data labels hold offsets
    equs: dict[str, Equ] = field(default_factory=dict)
    equ_values: dict[str, int | float] = field(default_factory=dict)
    evaluating: set[str] = field(default_factory=set)
    data_base: int = 0
    data_base_set: bool = False
    first_pass: bool = True

    def fail(self, loc: Any, col: int, problem: Problem) -> None:
        if problem.loc is not None:
            loc, col = problem.loc, 0
        self.problems.append(self.report(loc, problem.col or col, problem.message, problem.hint))

    def lookup(self, name: str, col: int) -> int | float:
        label = self.labels.get(name)
        if label is not None:
            section, value = label
            return value if section is Section.text else self.data_base + value
        equ = self.equs.get(name)
        if equ is not None:
            return self._equ_value(equ, col)
        if name in REGISTER_NAMES:
            raise Problem(f"register {name} cannot be used in an expression", "", col)
        if self.first_pass:
            raise Problem(f"{name!r} must be defined before this line", "only earlier symbols are known here", col)
        raise Problem(f"unknown symbol {name!r}", nearest(name, [*self.labels, *self.equs]), col)

    def _equ_value(self, equ: Equ, col: int) -> int | float:
        if equ.name in self.equ_values:
            return self.equ_values[equ.name]
        if equ.name in self.evaluating:
            raise Problem(f".equ {equ.name} is defined in terms of itself", "", col)
        if len(self.evaluating) >= MAX_EQU_DEPTH:
            raise Problem(
                f".equ {equ.name}: symbols defined through more than {MAX_EQU_DEPTH} other .equ symbols",
                "define long chains in steps that use numbers",
                col,
            )
        self.evaluating.add(equ.name)
        try:
            value = evaluate(equ.value, self.lookup)
        except Problem as problem:
            if problem.loc is None:
                problem.loc = equ.loc
            raise
        finally:
            self.evaluating.discard(equ.name)
        self.equ_values[equ.name] = value  # (cleared when data labels move: `.data_base`, and after pass 1)
        return value

    def define(self, name: str, loc: Any, col: int) -> bool:
        if not NAME_RE.fullmatch(name):
            self.fail(loc, col, Problem(f"{name!r} is not a valid symbol name", "names are [A-Za-z_.$][A-Za-z0-9_.$]*"))
        elif name in REGISTER_NAMES:
            self.fail(loc, col, Problem(f"{name!r} is a register name and cannot be a symbol"))
        elif name in self.labels or name in self.equs:
            self.fail(loc, col, Problem(f"symbol {name!r} is already defined"))
        else:
            return True
        return False

    def integer(self, arg: Any, loc: Any, what: str, lo: int, hi: int) -> int | None:
        try:
            value = evaluate(arg, self.lookup)
            if isinstance(value, float) or not lo <= value <= hi:
                raise Problem(f"{what} must be an integer in [{lo}, {hi}], got {value!r}", col=getattr(arg, "col", 0))
        except Problem as problem:
            self.fail(loc, getattr(arg, "col", 0), problem)
            return None
        return value


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic GC while building many small acyclic objects (+35% at 100k lines); restored after."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def link(items: list[Item], report: Reporter, texts: TextCache | None = None) -> ObjectFile:
    """Assemble items into an object file, or raise AssemblyError listing every problem. With `texts`, the text
    and the data section are shared with equal ones linked before (`TextCache.shared_text` / `shared_data`)."""
    state = _Linker(report)
    placed, data_size, kernels = _layout(state, items)
    state.first_pass = False
    state.equ_values.clear()
    words = tuple(_encode(state, placed))
    if texts is not None and not state.problems:
        words = texts.shared_text(words)
    data = _fill_data(state, placed, data_size)
    metas = [_kernel_meta(state, kernel) for kernel in kernels]
    if state.data_base + data_size >= ADDRESS_LIMIT:
        state.problems.append(report(None, 0, "data section extends past the 32-bit DRAM address space", ""))
    if state.problems:
        raise AssemblyError(state.problems)
    blob = bytes(data)
    return ObjectFile(
        text=words,
        data=blob if texts is None else texts.shared_data(blob),
        data_base=state.data_base,
        symbols=_symbols(state),
        kernels=tuple(m for m in metas if m is not None),
    )


def _layout(state: _Linker, items: list[Item]) -> tuple[list[tuple[Item, int]], int, list[_Kernel]]:
    """Pass 1: positions of instructions and data, label values, kernel ranges."""
    placed: list[tuple[Item, int]] = []
    kernels: list[_Kernel] = []
    open_kernel: _Kernel | None = None
    section = Section.text
    pc = offset = 0
    for item in items:
        kind = type(item)
        if kind is Instr:
            if section is Section.data:
                state.fail(item.loc, 0, Problem("instruction in the .data section", "switch back with .text"))
            placed.append((item, pc))
            pc += 1
        elif kind is InstrRun:
            if section is Section.data:
                for loc in item.locs:
                    state.fail(loc, 0, Problem("instruction in the .data section", "switch back with .text"))
            placed.append((item, pc))
            pc += len(item.rows)
        elif kind is Label:
            if state.define(item.name, item.loc, item.col):
                state.labels[item.name] = (section, pc if section is Section.text else offset)
        elif kind is Data:
            if _in_data(state, section, item):
                placed.append((item, offset))
                offset += len(item.items) if isinstance(item.items, bytes) else len(item.items) * DATA_SIZES[item.kind]
        elif kind is SetSection:
            section = item.section
        elif kind is Equ:
            if state.define(item.name, item.loc, item.col):
                state.equs[item.name] = item
        elif kind is Zero:
            count = state.integer(item.count, item.loc, ".zero count", 0, MAX_DATA_BYTES)
            if count is not None and _in_data(state, section, item):
                offset += count
        elif kind is Align:
            boundary = state.integer(item.boundary, item.loc, ".align boundary", 1, 1 << 16)
            if boundary is not None and boundary & (boundary - 1):
                state.fail(item.loc, 0, Problem(f".align boundary {boundary} is not a power of two"))
            elif boundary is not None and _in_data(state, section, item):
                offset += -offset % boundary
        elif kind is DataBase:
            _set_data_base(state, item, offset)
        elif kind is KernelBegin:
            if open_kernel is not None:
                state.fail(
                    item.loc,
                    0,
                    Problem(
                        f"kernel {item.name!r} starts inside kernel {open_kernel.begin.name!r}",
                        "close the open kernel with .endkernel first",
                    ),
                )
            elif _kernel_name_ok(state, item, kernels):
                open_kernel = _Kernel(item, pc)
        elif kind is KernelEnd:
            if open_kernel is None:
                state.fail(item.loc, 0, Problem(".endkernel without an open .kernel"))
            else:
                open_kernel.end = pc
                kernels.append(open_kernel)
                open_kernel = None
        else:
            _kernel_metadata(state, item, open_kernel, pc)
        if offset > MAX_DATA_BYTES:
            state.fail(item.loc, 0, Problem(f"data section exceeds {MAX_DATA_BYTES} bytes"))
            offset = 0
    if open_kernel is not None:
        state.fail(open_kernel.begin.loc, 0, Problem(f"kernel {open_kernel.begin.name!r} has no .endkernel"))
    return placed, offset, kernels


def _in_data(state: _Linker, section: Section, item: Item) -> bool:
    if section is Section.text:
        state.fail(item.loc, 0, Problem("data directive in the .text section", "switch to data with .data"))
        return False
    return True


def _set_data_base(state: _Linker, item: DataBase, offset: int) -> None:
    if state.data_base_set or offset:
        state.fail(item.loc, 0, Problem(".data_base must appear once, before any data"))
        return
    base = state.integer(item.address, item.loc, ".data_base", 0, ADDRESS_LIMIT - 1)
    if base is not None:
        state.data_base, state.data_base_set = base, True
        state.equ_values.clear()  # data label values moved


def _kernel_name_ok(state: _Linker, item: KernelBegin, kernels: list[_Kernel]) -> bool:
    if not NAME_RE.fullmatch(item.name):
        state.fail(item.loc, 0, Problem(f"kernel name {item.name!r} is not a valid name"))
        return False
    if any(k.begin.name == item.name for k in kernels):
        state.fail(item.loc, 0, Problem(f"kernel {item.name!r} is already defined"))
        return False
    return True


def _kernel_metadata(state: _Linker, item: KernelTensor | KernelAttr, kernel: _Kernel | None, pc: int) -> None:
    directive = ".attr" if type(item) is KernelAttr else ".output" if item.output else ".input"
    if kernel is None:
        state.fail(item.loc, 0, Problem(f"{directive} outside a .kernel block"))
    elif pc != kernel.start:
        state.fail(
            item.loc,
            0,
            Problem(
                f"{directive} must come before the kernel's first instruction",
                "kernel metadata directives lead the .kernel block",
            ),
        )
    elif type(item) is KernelAttr:
        if not NAME_RE.fullmatch(item.key):
            state.fail(item.loc, 0, Problem(f"attribute key {item.key!r} is not a valid name"))
        elif item.key in kernel.attrs:
            state.fail(item.loc, 0, Problem(f"attribute {item.key!r} is already set for this kernel"))
        else:
            kernel.attrs[item.key] = item.value
    elif not NAME_RE.fullmatch(item.name):
        state.fail(item.loc, 0, Problem(f"tensor name {item.name!r} is not a valid name"))
    elif any(t.name == item.name for t in kernel.tensors):
        state.fail(item.loc, 0, Problem(f"kernel tensor {item.name!r} is already declared"))
    else:
        kernel.tensors.append(item)


def _encode(state: _Linker, placed: list[tuple[Item, int]]) -> list[int]:
    """Pass 2 for text: resolve every operand and encode (0 for a word with problems). Words whose operands are
    all plain (`_plain_operands`) are encoded with numpy, one ISA row at a time (`_encode_row`); the others take
    the general path (`_general_word`), in program order, so problems are reported as they were."""
    rows: list[int] = []
    args: list[tuple] = []
    cols: dict[int, tuple[int, ...]] = {}  # text items: the column of each operand
    for item, pc in placed:
        kind = type(item)
        if kind is InstrRun:
            rows += item.rows
            args += item.args
        elif kind is Instr:
            rows.append(ROW[item.spec.mnemonic])
            args.append(item.args)
            cols[pc] = item.cols
    words = np.zeros(len(rows), dtype=np.uint64)
    ids = np.array(rows, dtype=np.intp)
    order = np.argsort(ids, kind="stable")
    ends = np.cumsum(np.bincount(ids, minlength=len(INSTRUCTIONS)))
    general: list[np.ndarray] = []
    for row in np.flatnonzero(np.diff(ends, prepend=0)):
        at = order[ends[row - 1] if row else 0 : ends[row]]
        encoded, plain = _encode_row(INSTRUCTIONS[row], list(map(args.__getitem__, at.tolist())), at, state.labels)
        words[at[plain]] = encoded[plain]
        general.append(at[~plain])
    text_len = len(rows)
    pcs = np.sort(np.concatenate(general)).tolist() if general else []
    locs = _locations(placed) if pcs else []
    for pc in pcs:
        words[pc] = _general_word(state, INSTRUCTIONS[rows[pc]], args[pc], locs[pc], cols.get(pc, ()), pc, text_len)
    return words.tolist()


def _locations(placed: list[tuple[Item, int]]) -> list[Any]:
    """Where each instruction was written, by pc: only a general-path word needs one (a builder's programs mostly
    have none, and a million locations cost a list as long)."""
    locs: list[Any] = []
    for item, _ in placed:
        kind = type(item)
        if kind is InstrRun:
            locs += item.locs
        elif kind is Instr:
            locs.append(item.loc)
    return locs


def _general_word(state: _Linker, spec: InstructionSpec, args: tuple, loc: Any, cols: tuple, pc: int, n: int) -> int:
    """One word by the general path (symbols, expressions, pc-relative targets, every error), 0 on a problem."""
    values = []
    try:
        for i, (fld, arg) in enumerate(zip(spec.fields, args, strict=True)):
            col = cols[i] if cols else 0
            value = field_value(spec, fld, arg, col, pc, state.lookup)
            if fld.kind in TARGET_KINDS and not 0 <= pc + value <= n:
                raise Problem(f"{fld.name} {pc + value} is outside the program", f"text is [0, {n}]", col)
            values.append(value)
    except Problem as problem:
        state.fail(loc, 0, problem)
        return 0
    return encode_fields(spec, values)


def _encode_row(
    spec: InstructionSpec, args: list[tuple], pcs: np.ndarray, labels: dict[str, tuple[Section, int]]
) -> tuple[np.ndarray, np.ndarray]:
    """The words of instructions of one ISA row at `pcs` and which of them were plain (every operand as
    `_plain_operands` takes it: an int of the field's range, an allowed enum name, or a target naming a text
    label, `_target_column`); the others are left to the general path."""
    count = len(args)
    words = np.full(count, spec.match, dtype=np.uint64)
    plain = np.ones(count, dtype=bool)
    try:
        columns = list(zip(*args, strict=True))  # (one length each: a strict transpose checks it)
    except ValueError:
        return words, ~plain  # (the general path reports the operand count)
    if len(columns) != len(spec.fields):
        return words, ~plain
    for fld, accepts, column in zip(spec.fields, _plain_operands(spec.mnemonic), columns, strict=True):
        if fld.kind in TARGET_KINDS:
            values, ok = _target_column(fld, column, pcs, labels)
        else:
            values, ok = _plain_column(accepts, column, ENUM_KINDS.get(fld.kind))
        plain &= ok
        words |= (values.astype(np.uint64) & np.uint64((1 << fld.width) - 1)) << np.uint64(fld.lo)
    return words, plain


def _target_column(
    fld: Field, column: tuple, pcs: np.ndarray, labels: dict[str, tuple[Section, int]]
) -> tuple[np.ndarray, np.ndarray]:
    """Targets of many instructions at `pcs` as pc-relative field values, and which are plain: a name of a text
    label (a builder's loop ends and branches), in the field's range, a loop end after its loop. Anything else
    (numbers, .equ and data symbols, expressions, every problem) takes the general path (`field_value`)."""
    found = [labels.get(v) if type(v) is str else None for v in column]
    known = np.array([at is not None and at[0] is Section.text for at in found], dtype=bool)
    values = np.array([at[1] if ok else 0 for at, ok in zip(found, known.tolist(), strict=True)], dtype=np.int64) - pcs
    lo, hi = fld.value_range
    ok = known & (values >= max(lo, 1 if fld.kind is Kind.loop_end else lo)) & (values <= hi)
    return values, ok


def _plain_column(
    accepts: tuple[int, int] | dict[str, int] | None, column: tuple, members: type[enum.Enum] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """One operand of many instructions as field values (int64) and which of them are plain; vectorised when the
    column holds one Python type, element by element when it mixes them. An enum field (`members`, its enum) takes
    its members by name as `field_value` takes them (generators pass `Activation.none`, not "none")."""
    count = len(column)
    if accepts is None:
        return np.zeros(count, dtype=np.int64), np.zeros(count, dtype=bool)
    types = set(map(type, column))
    if type(accepts) is tuple:
        if types == {int}:
            try:
                values = np.array(column, dtype=np.int64)
            except OverflowError:  # wider than 64 bits: out of every field's range
                values = np.array([v if -(1 << 63) <= v < (1 << 63) else accepts[1] + 1 for v in column])
            return values, (values >= accepts[0]) & (values <= accepts[1])
        typed = [v if type(v) is int and accepts[0] <= v <= accepts[1] else None for v in column]
    elif types == {str}:
        values = np.array(list(map(accepts.get, column, repeat(-1))), dtype=np.int64)
        return values, values >= 0
    elif members is not None and types == {members}:
        values = np.array([accepts.get(v.name, -1) for v in column], dtype=np.int64)
        return values, values >= 0
    else:
        typed = [accepts.get(v) if type(v) is str else None for v in column]
    ok = np.array([v is not None for v in typed], dtype=bool)
    return np.array([0 if v is None else v for v in typed], dtype=np.int64), ok


@functools.cache
def _plain_operands(mnemonic: str) -> tuple[tuple[int, int] | dict[str, int] | None, ...]:
    """Per operand, what a plain builder argument may be taken as without `field_value`: an int within the
    field's range (registers, absolute immediates), or an enum name (str -> value; a dtype one the instruction
    allows); None where the value needs the general path (pc-relative targets)."""
    spec = BY_MNEMONIC[mnemonic]
    plain: list[tuple[int, int] | dict[str, int] | None] = []
    for fld in spec.fields:
        if fld.kind in TARGET_KINDS:
            plain.append(None)
        elif fld.name == "dtype" and spec.dtypes:
            plain.append({d.name: int(d) for d in spec.dtypes})
        elif fld.kind in ENUM_NAMES:
            plain.append(ENUM_NAMES[fld.kind])
        else:
            plain.append(fld.value_range)
    return tuple(plain)


def _fill_data(state: _Linker, placed: list[tuple[Item, int]], size: int) -> bytes | bytearray:
    """Pass 2 for data: evaluate every initialiser into its reserved bytes. A section that is one byte string (a
    kernel's constants image, megabytes) is that string itself, not copied twice more."""
    inits = [(item, offset) for item, offset in placed if type(item) is Data]
    if len(inits) == 1:
        ((item, offset),) = inits
        if offset == 0 and isinstance(item.items, bytes) and len(item.items) == size:
            return item.items
    data = bytearray(size)
    for item, offset in inits:
        if isinstance(item.items, bytes):
            data[offset : offset + len(item.items)] = item.items
            continue
        try:
            chunk = b"".join(_data_bytes(state, item.kind, arg) for arg in item.items)
        except Problem as problem:
            state.fail(item.loc, 0, problem)
            continue
        data[offset : offset + len(chunk)] = chunk
    return data


def _data_bytes(state: _Linker, kind: str, arg: Any) -> bytes:
    value = evaluate(arg, state.lookup)
    col = getattr(arg, "col", 0)
    if kind == "f32":
        return f32_bits(float(value), col).to_bytes(4, "little")
    lo, hi = DATA_RANGES[kind]
    if isinstance(value, float):
        raise Problem(f"fp32 literal {value!r} in .{kind} data", "use .f32 for floating-point data", col)
    if not lo <= value <= hi:
        raise Problem(f".{kind} value {value} out of range", f".{kind} values must be in [{lo}, {hi}]", col)
    size = DATA_SIZES[kind]
    return (value & ((1 << (8 * size)) - 1)).to_bytes(size, "little")


def _kernel_meta(state: _Linker, kernel: _Kernel) -> KernelMeta:
    inputs, outputs = [], []
    for tensor in kernel.tensors:
        decl = _tensor_decl(state, tensor)
        if decl is not None:
            (outputs if tensor.output else inputs).append(decl)
    return KernelMeta(
        kernel.begin.name, kernel.start, kernel.end, tuple(inputs), tuple(outputs), tuple(kernel.attrs.items())
    )


def _tensor_decl(state: _Linker, tensor: KernelTensor) -> TensorDecl | None:
    dtype = tensor.dtype
    name = getattr(dtype, "name", dtype)
    if isinstance(dtype, DType):
        value = dtype
    elif isinstance(name, str) and name in ENUM_NAMES[Kind.dtype]:
        value = DType(ENUM_NAMES[Kind.dtype][name])
    else:
        allowed = ", ".join(d.name for d in DType)
        state.fail(tensor.loc, getattr(dtype, "col", 0), Problem(f"unknown dtype {name!r}", f"dtypes: {allowed}"))
        return None
    if len(tensor.shape) > MAX_TENSOR_RANK:
        problem = Problem(f"a tensor has at most {MAX_TENSOR_RANK} dimensions, got {len(tensor.shape)}")
        state.fail(tensor.loc, 0, problem)
        return None
    dims = [state.integer(dim, tensor.loc, "a dimension", 0, ADDRESS_LIMIT - 1) for dim in tensor.shape]
    address = state.integer(tensor.address, tensor.loc, "a tensor address", 0, ADDRESS_LIMIT - 1)
    if address is None or None in dims:
        return None
    decl = TensorDecl(tensor.name, value, tuple(dims), address)
    if address + decl.nbytes > ADDRESS_LIMIT:
        state.fail(
            tensor.loc, 0, Problem(f"tensor {tensor.name!r} ({decl.nbytes} bytes) extends past the 4 GiB address space")
        )
        return None
    return decl


def _symbols(state: _Linker) -> tuple[Symbol, ...]:
    """Every non-local label, in address order (text first) so a disassembly re-assembles identically."""
    symbols = [
        Symbol(name, section, value if section is Section.text else state.data_base + value)
        for name, (section, value) in state.labels.items()
        if not name.startswith(LOCAL_PREFIX)
    ]
    order = {name: i for i, name in enumerate(state.labels)}
    symbols.sort(key=lambda s: (s.section is Section.data, s.value, order[s.name]))
    return tuple(symbols)
