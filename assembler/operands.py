"""Operand values: names of registers and enums, constant expressions, field encoding rules.

Shared by both front ends: an argument is a syntax node (text) or a plain
Python value (builder), and `field_value` turns either into the integer the
field holds, raising `Problem` with a column and a hint when it cannot.
"""

from __future__ import annotations

import enum
import numbers
import struct
from collections.abc import Callable

from assembler.diagnostics import Problem, nearest
from assembler.nodes import BinOp, Name, Num, UnOp
from isa import BY_MNEMONIC, EncodingError, Field, InstructionSpec, Kind
from isa.encoding import check_range
from isa.enums import UNIT_SHORT_NAMES
from isa.fields import ENUM_KINDS, FIELD_TABLE, NUM_VREGS, NUM_XREGS

XREGS: dict[str, int] = {f"x{i}": i for i in range(NUM_XREGS)} | {"zero": 0}
VREGS: dict[str, int] = {f"v{i}": i for i in range(NUM_VREGS)}
REGISTER_NAMES = frozenset(XREGS) | frozenset(VREGS)

# Names accepted for each enum kind; units also by their short names (the printed form).
ENUM_NAMES: dict[Kind, dict[str, int]] = {
    kind: {member.name: int(member) for member in cls} for kind, cls in ENUM_KINDS.items()
}
ENUM_NAMES[Kind.unit] |= {short: int(unit) for short, unit in UNIT_SHORT_NAMES.items()}
# How the disassembler prints each enum value.
ENUM_TEXT: dict[Kind, dict[int, str]] = {
    kind: {int(member): member.name for member in cls} for kind, cls in ENUM_KINDS.items()
}
ENUM_TEXT[Kind.unit] = {int(unit): short for short, unit in UNIT_SHORT_NAMES.items()}
_ENUM_WHAT = {
    Kind.dtype: "dtype",
    Kind.unit: "unit",
    Kind.counter: "counter",
    Kind.act: "activation",
    Kind.epflags: "epilogue flag set",
}

_ENUM_KIND_SET = frozenset(ENUM_KINDS)
_RANGES: dict[str, tuple[int, int]] = {f.name: f.value_range for f in FIELD_TABLE}

Lookup = Callable[[str, int], int | float]  # (symbol name, column) -> value, raises Problem

_F32 = struct.Struct("<f")
_U32 = struct.Struct("<I")


def f32_bits(value: float, col: int = 0) -> int:
    """The IEEE-754 single-precision bit pattern of `value` (rounded to nearest)."""
    try:
        return _U32.unpack(_F32.pack(value))[0]
    except OverflowError:
        raise Problem(f"fp32 literal {value!r} is too large for single precision", col=col) from None


EXPR_BITS = 128  # constant expressions are bounded: wider integers are an error, not an unbounded computation


def evaluate(arg: object, lookup: Lookup) -> int | float:
    """Value of a constant expression (node or plain value); names resolve through `lookup`. Iterative (a
    1000-term sum is a 1000-deep tree) and bounded: every integer must fit EXPR_BITS bits (signed)."""
    kind = type(arg)
    if kind is not BinOp and kind is not UnOp:
        return _leaf(arg, lookup)
    values: list[int | float] = []
    stack: list[tuple[object, bool]] = [(arg, False)]
    while stack:
        node, ready = stack.pop()
        kind = type(node)
        if kind is BinOp:
            if ready:
                right = values.pop()
                values.append(_bounded(_binary(node.op, values.pop(), right, node.op_col), node.op_col))
            else:
                stack += ((node, True), (node.right, False), (node.left, False))
        elif kind is UnOp:
            if ready:
                values.append(_bounded(_unary(node.op, values.pop(), node.col), node.col))
            else:
                stack += ((node, True), (node.arg, False))
        else:
            values.append(_leaf(node, lookup))
    return values[0]


def _leaf(arg: object, lookup: Lookup) -> int | float:
    kind = type(arg)
    if kind is Num:
        return _bounded(arg.value, arg.col)
    if kind is Name:
        return lookup(arg.name, arg.col)
    if isinstance(arg, enum.Enum | bool):
        raise Problem(f"expected a number, got {arg!r}")
    if isinstance(arg, numbers.Integral):  # also numpy integers
        return _bounded(int(arg), 0)
    if isinstance(arg, numbers.Real):
        return float(arg)
    if isinstance(arg, str):
        return lookup(arg, 0)
    raise Problem(f"expected a number or a symbol name, got {type(arg).__name__} {arg!r}")


def _bounded(value: int | float, col: int) -> int | float:
    if type(value) is int and value.bit_length() >= EXPR_BITS:  # (never printed: its digits could be huge)
        raise Problem(f"integer wider than {EXPR_BITS} bits in a constant expression", col=col)
    return value


def _unary(op: str, value: int | float, col: int) -> int | float:
    if op == "-":
        return -value
    if op == "~":
        return ~_integer(value, "~", col)
    return value


def _integer(value: int | float, op: str, col: int) -> int:
    if isinstance(value, float):
        raise Problem(f"operator {op!r} needs integers, got the fp32 literal {value!r}", col=col)
    return value


def _binary(op: str, left: int | float, right: int | float, col: int) -> int | float:
    if op in ("+", "-", "*") or (op == "/" and (isinstance(left, float) or isinstance(right, float))):
        if op == "+":
            return left + right
        if op == "-":
            return left - right
        if op == "*":
            return left * right
        if right == 0:
            raise Problem("division by zero in constant expression", col=col)
        return left / right
    a, b = _integer(left, op, col), _integer(right, op, col)
    if op in ("/", "%"):
        if b == 0:
            raise Problem("division by zero in constant expression", col=col)
        quotient = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)  # truncates toward zero, like C
        return quotient if op == "/" else a - quotient * b
    if op in ("<<", ">>"):
        if b < 0 or b > 64:
            raise Problem(f"shift count {b} outside [0, 64]", col=col)
        return a << b if op == "<<" else a >> b
    if op == "&":
        return a & b
    if op == "|":
        return a | b
    return a ^ b


def field_value(spec: InstructionSpec, field: Field, arg: object, col: int, pc: int, lookup: Lookup) -> int:
    """The integer `field` of `spec` holds for `arg` (branch targets pc-relative), range-checked."""
    kind = field.kind
    if kind is Kind.xreg or kind is Kind.vreg:
        value = arg if type(arg) is int else _register(spec, field, arg, col)
    elif kind in _ENUM_KIND_SET:
        value = _enum(field, arg, col)
    else:
        number = arg if type(arg) is int else evaluate(arg, lookup)
        if isinstance(number, float):
            if kind is not Kind.imm32:
                raise Problem(
                    f"fp32 literal {number!r} is not allowed for {field.name}",
                    "fp32 literals are only accepted by imm32 operands (li) and .f32 data",
                    col,
                )
            number = f32_bits(number, col)
        value = number
        if kind is Kind.target or kind is Kind.loop_end:
            value = number - pc
            if kind is Kind.loop_end and value < 1:
                raise Problem(
                    f"loop end {number} must come after the loop instruction (at {pc})",
                    "lend is the first instruction after the loop body",
                    col,
                )
    lo, hi = _RANGES[field.name]
    if lo <= value <= hi and field.name != "dtype":
        return value  # the common case, without recomputing the field's range
    try:
        check_range(spec, field, value)
    except EncodingError:
        raise Problem(*_range_message(spec, field, value), col) from None
    return value


def _range_message(spec: InstructionSpec, field: Field, value: int) -> tuple[str, str]:
    lo, hi = field.value_range
    if field.name in ("dtype", "dtype2") and spec.dtypes and lo <= value <= hi:
        allowed = ", ".join(d.name for d in spec.dtypes)
        return f"dtype {ENUM_TEXT[Kind.dtype][value]} is not allowed for {spec.mnemonic}", f"allowed dtypes: {allowed}"
    if field.kind is Kind.target or field.kind is Kind.loop_end:
        return (
            f"{field.name} of {spec.mnemonic} is {value} instructions away, out of range",
            f"the pc-relative offset must be in [{lo}, {hi}]",
        )
    return f"{field.name}={value} out of range for {spec.mnemonic}", f"{field.name} must be in [{lo}, {hi}]"


def _register(spec: InstructionSpec, field: Field, arg: object, col: int) -> int:
    names = XREGS if field.kind is Kind.xreg else VREGS
    what = "scalar register x0..x31" if field.kind is Kind.xreg else "vector register v0..v7"
    kind = type(arg)
    if kind is Name or isinstance(arg, str):
        name = arg.name if kind is Name else arg
        if name in names:
            return names[name]
        other = VREGS if names is XREGS else XREGS
        hint = f"{name} is a {'vector' if other is VREGS else 'scalar'} register" if name in other else ""
        raise Problem(f"expected a {what} for {field.name}, got {name!r}", hint or nearest(name, names), col)
    if kind is Num or kind is BinOp or kind is UnOp:
        imm_form = spec.mnemonic + "i"
        hint = f"to use an immediate, write {imm_form}" if imm_form in BY_MNEMONIC else f"syntax: {spec.syntax}"
        raise Problem(f"expected a {what} for {field.name}, got an expression", hint, col)
    if isinstance(arg, numbers.Integral) and not isinstance(arg, enum.Enum | bool):
        return int(arg)
    raise Problem(f"expected a {what} for {field.name}, got {arg!r}", f"syntax: {spec.syntax}", col)


def _enum(field: Field, arg: object, col: int) -> int:
    names = ENUM_NAMES[field.kind]
    kind = type(arg)
    if kind is Name or isinstance(arg, str):
        name = arg.name if kind is Name else arg
        if name in names:
            return names[name]
        hint = " ".join(filter(None, [nearest(name, names), f"{field.name} is one of: {_allowed(field)}"]))
        raise Problem(f"unknown {_ENUM_WHAT[field.kind]} {name!r} for {field.name}", hint, col)
    if isinstance(arg, ENUM_KINDS[field.kind]):
        return int(arg)
    if isinstance(arg, numbers.Integral) and not isinstance(arg, enum.Enum | bool):
        return int(arg)
    what = _ENUM_WHAT[field.kind]
    raise Problem(f"expected a {what} name for {field.name}", f"{field.name} is one of: {_allowed(field)}", col)


def _allowed(field: Field) -> str:
    return ", ".join(ENUM_TEXT[field.kind].values())
