"""Read rtl/hdl with pyverilog: every module's parameters (with defaults) and ports (with widths).

The config cross-check compares these with `rtl.units` and the simulator's
`MachineConfig`, so the RTL and the simulator cannot drift apart silently.
"""

from __future__ import annotations

import operator
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from pyverilog.vparser import ast
from pyverilog.vparser.parser import VerilogParser

from rtl.build import GENERATED_DIR, hdl_sources


class WidthError(ValueError):
    """An expression the small evaluator does not understand."""


@dataclass(frozen=True)
class PortInfo:
    name: str
    direction: str  # "input" or "output"
    msb: ast.Node | None
    lsb: ast.Node | None

    def width(self, params: Mapping[str, int]) -> int:
        if self.msb is None:
            return 1
        return evaluate(self.msb, params) - evaluate(self.lsb, params) + 1


@dataclass(frozen=True)
class Instance:
    """A module instantiated inside another, with the parameter expressions it is given."""

    module: str
    name: str
    params: dict[str, ast.Node]


@dataclass(frozen=True)
class ModuleInfo:
    name: str
    path: Path
    defaults: dict[str, ast.Node]  # parameter -> default expression
    ports: dict[str, PortInfo]
    instances: tuple[Instance, ...] = ()

    def parameters(self, overrides: Mapping[str, int]) -> dict[str, int]:
        """Parameter values with `overrides` applied, defaults evaluated in declaration order."""
        values: dict[str, int] = {}
        for name, expr in self.defaults.items():
            values[name] = int(overrides[name]) if name in overrides else evaluate(expr, values)
        return values


_BINARY: dict[type, Callable[[int, int], int]] = {
    ast.Plus: operator.add,
    ast.Minus: operator.sub,
    ast.Times: operator.mul,
    ast.Divide: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Power: operator.pow,
    ast.Sll: operator.lshift,
    ast.Srl: operator.rshift,
    ast.GreaterThan: operator.gt,
    ast.LessThan: operator.lt,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.GreaterEq: operator.ge,
    ast.LessEq: operator.le,
}


def evaluate(node: ast.Node, params: Mapping[str, int]) -> int:
    """Value of a constant expression (parameters, arithmetic, ?:, $clog2)."""
    if isinstance(node, ast.Rvalue):
        return evaluate(node.var, params)
    if isinstance(node, ast.IntConst):
        return _int_literal(node.value)
    if isinstance(node, ast.Identifier):
        if node.name not in params:
            raise WidthError(f"unknown parameter {node.name!r}")
        return params[node.name]
    if type(node) in _BINARY:
        return int(_BINARY[type(node)](evaluate(node.left, params), evaluate(node.right, params)))
    if isinstance(node, ast.Uminus):
        return -evaluate(node.right, params)
    if isinstance(node, ast.Cond):
        chosen = node.true_value if evaluate(node.cond, params) else node.false_value
        return evaluate(chosen, params)
    if isinstance(node, ast.SystemCall) and node.syscall == "clog2":
        return max(0, (evaluate(node.args[0], params) - 1).bit_length())
    raise WidthError(f"cannot evaluate {type(node).__name__} {node}")


def _int_literal(text: str) -> int:
    text = text.replace("_", "")
    if "'" not in text:
        return int(text)
    _, tail = text.split("'")
    base = {"b": 2, "o": 8, "d": 10, "h": 16}[tail.lstrip("sS")[0].lower()]
    return int(tail.lstrip("sS")[1:], base)


@cache
def _tables() -> tempfile.TemporaryDirectory:
    """Where pyverilog writes its parser tables: one directory per process, removed when the process exits."""
    return tempfile.TemporaryDirectory(prefix="dynfuse-pyverilog-")


@cache
def _parser() -> VerilogParser:
    return VerilogParser(outputdir=_tables().name, debug=False)


def _preprocess(path: Path) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "pp.v"
        subprocess.run(
            ["iverilog", "-E", f"-I{GENERATED_DIR}", "-o", str(out), str(path)], check=True, capture_output=True
        )
        return out.read_text()


def _module_info(module: ast.ModuleDef, path: Path) -> ModuleInfo:
    defaults = {p.name: p.value for decl in module.paramlist.params for p in decl.list}
    ports = {}
    for port in module.portlist.ports:
        io = port.first
        width = io.width
        direction = "input" if isinstance(io, ast.Input) else "output"
        ports[io.name] = PortInfo(io.name, direction, width.msb if width else None, width.lsb if width else None)
    return ModuleInfo(module.name, path, defaults, ports, tuple(_instances(module)))


def _instances(node: ast.Node) -> list[Instance]:
    """Every instance under `node`, generate blocks included."""
    if isinstance(node, ast.InstanceList):
        params = {p.paramname: p.argname for p in node.parameterlist}
        return [Instance(node.module, i.name, params) for i in node.instances]
    return [inst for child in node.children() for inst in _instances(child)]


def read_modules(sources: list[Path] | None = None) -> dict[str, ModuleInfo]:
    """Every module defined in rtl/hdl, by name."""
    modules = {}
    for path in sources or hdl_sources():
        tree = _parser().parse(_preprocess(path))
        for definition in tree.description.definitions:
            if isinstance(definition, ast.ModuleDef):
                modules[definition.name] = _module_info(definition, path)
    return modules
