"""The text front end: source -> syntax nodes -> program items -> ObjectFile.

Statements are matched against the ISA table here (mnemonic, operand count and
form) and against the directive list; everything is reported with the
statement's file:line:col, its source line and a caret.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from assembler import program as ir
from assembler.diagnostics import AssemblyError, Diagnostic, Problem, nearest
from assembler.link import Reporter, link, paused_gc
from assembler.nodes import BinOp, LabelDef, Mem, Name, Num, Pair, Statement, Str, Tensor, UnOp, column
from assembler.objfile import ObjectFile, Section
from assembler.parser import parse
from isa import BY_MNEMONIC

_EXPR_NODES = (Num, Name, UnOp, BinOp)


def assemble(source: str, filename: str = "<input>") -> ObjectFile:
    """Assemble source text; raises AssemblyError listing every problem in the file."""
    lines = source.splitlines()

    def report(loc: Any, col: int, message: str, hint: str) -> Diagnostic:
        if loc is None:
            return Diagnostic(filename, 0, 0, message, hint)
        line, item_col = loc
        text = lines[line - 1] if 0 < line <= len(lines) else ""
        return Diagnostic(filename, line, col or item_col, message, hint, text)

    with paused_gc():
        return _assemble(source, filename, report)


def _assemble(source: str, filename: str, report: Reporter) -> ObjectFile:
    nodes, diagnostics = parse(source, filename)
    items: list[ir.Item] = []
    for node in nodes:
        if type(node) is LabelDef:
            items.append(ir.Label(node.name, (node.line, node.col), node.col))
            continue
        try:
            items.append(_lower(node))
        except Problem as problem:
            diagnostics.append(report((node.line, node.col), problem.col, problem.message, problem.hint))
    try:
        obj = link(items, report)
    except AssemblyError as err:
        diagnostics.extend(err.diagnostics)
    if diagnostics:
        raise AssemblyError(diagnostics)
    return obj


def assemble_file(path: str | Path) -> ObjectFile:
    path = Path(path)
    try:
        source = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise AssemblyError([Diagnostic(str(path), 0, 0, f"source is not UTF-8 text (byte {err.start})")]) from None
    return assemble(source, str(path))


def _lower(statement: Statement) -> ir.Item:
    if statement.name.startswith("."):
        directive = _DIRECTIVES.get(statement.name)
        if directive is None:
            raise Problem(f"unknown directive {statement.name!r}", nearest(statement.name, _DIRECTIVES))
        return directive(statement, (statement.line, statement.col))
    return _instruction(statement)


def _instruction(statement: Statement) -> ir.Instr:
    spec = BY_MNEMONIC.get(statement.name)
    if spec is None:
        hint = nearest(statement.name, BY_MNEMONIC) or "see docs/isa.md for the instruction list"
        raise Problem(f"unknown mnemonic {statement.name!r}", hint)
    operands = statement.operands
    for op in operands:
        if type(op) is Pair:
            raise Problem(f"missing ',' after {op.key!r}", f"syntax: {spec.syntax}", op.col)
    if len(operands) != len(spec.operands):
        count = len(spec.operands)
        raise Problem(
            f"{spec.mnemonic} takes {count} operand{'s' if count != 1 else ''}, got {len(operands)}",
            f"syntax: {spec.syntax}",
        )
    args: list[Any] = []
    cols: list[int] = []
    for written, expected in zip(operands, spec.operands, strict=True):
        kind = type(written)
        if expected.base is not None:
            if kind is not Mem:
                raise Problem(f"expected the memory form {expected.text}", f"syntax: {spec.syntax}", column(written))
            args += (written.imm, written.base)
            cols += (written.imm.col, written.base.col)
        elif kind in _EXPR_NODES:
            args.append(written)
            cols.append(written.col)
        else:
            raise Problem(
                f"{_describe(written)} is not valid for {expected.text}", f"syntax: {spec.syntax}", column(written)
            )
    return ir.Instr(spec, tuple(args), (statement.line, statement.col), tuple(cols))


def _describe(operand: object) -> str:
    if type(operand) is Mem:
        return "a memory operand imm(reg)"
    if type(operand) is Tensor:
        return "a tensor declaration"
    if type(operand) is Str:
        return "a string"
    return "this operand"


def _expect(statement: Statement, count: int, form: str) -> tuple[Any, ...]:
    if len(statement.operands) != count:
        raise Problem(
            f"{statement.name} takes {count} operand{'s' if count != 1 else ''}, got {len(statement.operands)}",
            f"syntax: {statement.name} {form}".rstrip(),
        )
    return statement.operands


def _expr(statement: Statement, operand: object, form: str) -> Any:
    if type(operand) not in _EXPR_NODES:
        raise Problem(
            f"{statement.name} expects an expression here", f"syntax: {statement.name} {form}", column(operand)
        )
    return operand


def _name(statement: Statement, operand: object, form: str) -> str:
    if type(operand) is not Name:
        raise Problem(f"{statement.name} expects a name here", f"syntax: {statement.name} {form}", column(operand))
    return operand.name


def _section(section: Section) -> Callable[[Statement, Any], ir.Item]:
    def lower(statement: Statement, loc: Any) -> ir.Item:
        _expect(statement, 0, "")
        return ir.SetSection(section, loc)

    return lower


def _data(kind: str) -> Callable[[Statement, Any], ir.Item]:
    def lower(statement: Statement, loc: Any) -> ir.Item:
        if not statement.operands:
            raise Problem(f"{statement.name} needs at least one value", f"syntax: {statement.name} value, value, ...")
        return ir.Data(kind, tuple(_expr(statement, op, "value, ...") for op in statement.operands), loc)

    return lower


def _single(make: Callable[[Any, Any], ir.Item]) -> Callable[[Statement, Any], ir.Item]:
    def lower(statement: Statement, loc: Any) -> ir.Item:
        (operand,) = _expect(statement, 1, "expr")
        return make(_expr(statement, operand, "expr"), loc)

    return lower


def _equ(statement: Statement, loc: Any) -> ir.Item:
    name, value = _expect(statement, 2, "NAME, expr")
    return ir.Equ(_name(statement, name, "NAME, expr"), _expr(statement, value, "NAME, expr"), loc, name.col)


def _kernel(statement: Statement, loc: Any) -> ir.Item:
    (name,) = _expect(statement, 1, "NAME")
    return ir.KernelBegin(_name(statement, name, "NAME"), loc)


def _end_kernel(statement: Statement, loc: Any) -> ir.Item:
    _expect(statement, 0, "")
    return ir.KernelEnd(loc)


def _tensor(output: bool) -> Callable[[Statement, Any], ir.Item]:
    form = "NAME: dtype[dim, ...] @ address"

    def lower(statement: Statement, loc: Any) -> ir.Item:
        (decl,) = _expect(statement, 1, form)
        if type(decl) is not Tensor:
            raise Problem(
                f"{statement.name} expects a tensor declaration", f"syntax: {statement.name} {form}", column(decl)
            )
        return ir.KernelTensor(output, decl.name, decl.dtype, decl.shape, decl.address, loc)

    return lower


def _attr(statement: Statement, loc: Any) -> ir.Item:
    (pair,) = _expect(statement, 1, "key value")
    if type(pair) is not Pair:
        raise Problem(
            ".attr expects a key and a value", 'syntax: .attr key value (value: name, number or "string")', column(pair)
        )
    return ir.KernelAttr(pair.key, pair.value, loc)


_DIRECTIVES: dict[str, Callable[[Statement, Any], ir.Item]] = {
    ".text": _section(Section.text),
    ".data": _section(Section.data),
    ".i8": _data("i8"),
    ".i32": _data("i32"),
    ".word": _data("i32"),
    ".f32": _data("f32"),
    ".zero": _single(ir.Zero),
    ".align": _single(ir.Align),
    ".data_base": _single(ir.DataBase),
    ".equ": _equ,
    ".kernel": _kernel,
    ".endkernel": _end_kernel,
    ".input": _tensor(False),
    ".output": _tensor(True),
    ".attr": _attr,
}
