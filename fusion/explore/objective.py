"""The search objective and constraints: a small arithmetic language over a design's figures, parsed (never
evaluated as Python).

    cycles * area_mm2                 energy_uj + 0.5 * dram_traffic_bytes / 1e6          log(cycles) + log(area_mm2)
    constraints: cycles <= 50000      area_mm2 < 4      roofline_fraction >= 0.3

Names are a design's figures (`Design.metrics`: cycles, dram_traffic_bytes, energy_pj, energy_uj, area_mm2,
roofline_fraction, plan_seconds) and its machine's fields (array_size, spad_bytes, ...); functions log, sqrt,
min, max. An unknown name or a syntax error is an error naming the expression and the column.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache

from lark import Lark, Token, Transformer, UnexpectedInput
from lark.exceptions import VisitError
from lark.tree import Tree

from fusion.explore.errors import ExploreError

GRAMMAR = r"""
?start: sum
?sum: product | sum "+" product -> add | sum "-" product -> sub
?product: unary | product "*" unary -> mul | product "/" unary -> div
?unary: atom | "-" unary -> neg
?atom: NUMBER -> number | NAME -> name | NAME "(" sum ("," sum)* ")" -> call | "(" sum ")"
constraint: sum COMPARE sum
COMPARE: "<=" | ">=" | "<" | ">"
%import common.CNAME -> NAME
%import common.NUMBER
%import common.WS
%ignore WS
"""
FUNCTIONS: dict[str, tuple[Callable[..., float], int | None]] = {
    "log": (math.log, 1),
    "sqrt": (math.sqrt, 1),
    "min": (min, None),
    "max": (max, None),
}
Metrics = Mapping[str, float]
Expr = Callable[[Metrics], float]


@cache
def _parser(start: str) -> Lark:
    return Lark(GRAMMAR, start=start, parser="lalr")


class _Build(Transformer):
    """Parse tree -> closure; names checked against the known ones while building."""

    def __init__(self, names: frozenset[str], text: str) -> None:
        super().__init__()
        self.names, self.text = names, text

    def number(self, items: list[Token]) -> Expr:
        value = float(items[0])
        return lambda m: value

    def name(self, items: list[Token]) -> Expr:
        name = str(items[0])
        if name not in self.names:
            raise ExploreError(f"{self.text!r}: unknown name {name!r} (known: {', '.join(sorted(self.names))})")
        return lambda m: m[name]

    def call(self, items: list) -> Expr:
        name, args = str(items[0]), items[1:]
        if name not in FUNCTIONS:
            raise ExploreError(f"{self.text!r}: unknown function {name!r} (known: {', '.join(FUNCTIONS)})")
        fn, arity = FUNCTIONS[name]
        if arity is not None and len(args) != arity:
            raise ExploreError(f"{self.text!r}: {name} takes {arity} argument(s), got {len(args)}")
        return lambda m: _guarded(name, fn, [a(m) for a in args])

    def add(self, items: list[Expr]) -> Expr:
        a, b = items
        return lambda m: a(m) + b(m)

    def sub(self, items: list[Expr]) -> Expr:
        a, b = items
        return lambda m: a(m) - b(m)

    def mul(self, items: list[Expr]) -> Expr:
        a, b = items
        return lambda m: a(m) * b(m)

    def div(self, items: list[Expr]) -> Expr:
        a, b = items
        return lambda m: _divide(a(m), b(m))

    def neg(self, items: list[Expr]) -> Expr:
        (a,) = items
        return lambda m: -a(m)


def _divide(a: float, b: float) -> float:
    return a / b if b else math.copysign(math.inf, a) if a else math.nan


def _guarded(name: str, fn: Callable[..., float], args: list[float]) -> float:
    try:
        return float(fn(*args))
    except ValueError:  # log or sqrt of a negative: no value (the trial is infeasible)
        return math.nan


def _parse(text: str, start: str) -> Tree:
    try:
        return _parser(start).parse(text)
    except UnexpectedInput as err:
        pointer = " " * (err.column - 1) + "^" if err.column > 0 else ""
        raise ExploreError(f"cannot parse {text!r} at column {err.column}:\n  {text}\n  {pointer}") from None


def _build(tree: Tree, names: frozenset[str], text: str) -> Expr:
    try:
        return _Build(names, text).transform(tree)
    except VisitError as err:  # an unknown name or function, raised inside the transformer
        raise err.orig_exc from None


@dataclass(frozen=True)
class Objective:
    text: str
    fn: Expr

    def __call__(self, metrics: Metrics) -> float:
        return self.fn(metrics)


@dataclass(frozen=True)
class Constraint:
    """`lhs OP rhs`, satisfied when `violation <= 0` (Optuna's convention)."""

    text: str
    lhs: Expr
    op: str
    rhs: Expr

    def violation(self, metrics: Metrics) -> float:
        a, b = self.lhs(metrics), self.rhs(metrics)
        gap = a - b if self.op in ("<=", "<") else b - a
        if self.op in ("<", ">") and gap == 0:
            return 1.0  # on the bound of a strict comparison: not satisfied
        return gap if not math.isnan(gap) else math.inf


def parse_objective(text: str, names: frozenset[str]) -> Objective:
    return Objective(text, _build(_parse(text, "start"), names, text))


def parse_constraint(text: str, names: frozenset[str]) -> Constraint:
    lhs, op, rhs = _parse(text, "constraint").children
    return Constraint(text, _build(lhs, names, text), str(op), _build(rhs, names, text))
