"""Source text -> syntax nodes, with every syntax error of a file reported at once.

Lark LALR with the transformer inlined builds nodes during the parse. A valid
file is parsed in one call; a file with syntax errors is re-parsed line by line
(the grammar is line-oriented) so that each bad line yields a diagnostic and the
good lines still reach the semantic checks.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from assembler.diagnostics import Diagnostic
from assembler.nodes import BinOp, Expr, LabelDef, Mem, Name, Num, Pair, Statement, Str, Tensor, UnOp

Item = LabelDef | Statement
MAX_DECIMAL_DIGITS = 100  # far beyond any in-range constant (`operands.EXPR_BITS`)


@v_args(inline=True)
class _ToNodes(Transformer):
    """Builds `assembler.nodes` objects; runs inside the LALR parser."""

    def start(self, *lines: Item | tuple[Item, ...]) -> list[Item]:
        items: list[Item] = []
        for line in lines:
            if type(line) is tuple:
                items.extend(line)
            else:
                items.append(line)
        return items

    def labelled(self, *items: Item) -> tuple[Item, ...]:
        return items

    def label(self, name: Token) -> LabelDef:
        return LabelDef(str(name), name.line, name.column)

    def statement(self, name: Token, *operands: object) -> Statement:
        return Statement(str(name), tuple(op for op in operands if op is not None), name.line, name.column)

    def mem(self, imm: Expr, base: Expr) -> Mem:
        return Mem(imm, base, imm.col)

    def tensor(self, name: Token, dtype: Token, *rest: Expr | None) -> Tensor:
        shape = tuple(dim for dim in rest[:-1] if dim is not None)
        return Tensor(str(name), Name(str(dtype), dtype.column), shape, rest[-1], name.column)

    def pair(self, key: Token, value: Token | Str) -> Pair:
        text = value.value if isinstance(value, Str) else str(value)
        return Pair(str(key), text, key.column)

    def word(self, token: Token) -> Token:
        return token

    def string(self, token: Token) -> Str:
        return Str(json.loads(token), token.column)

    def expr(self, *children: Expr | Token) -> Expr:
        """Operands and operators alternate; order them by precedence (left-associative)."""
        values, pending = [children[0]], []
        for i in range(1, len(children), 2):
            op = children[i]
            while pending and _PRECEDENCE[pending[-1]] >= _PRECEDENCE[op]:
                _reduce(values, pending.pop())
            pending.append(op)
            values.append(children[i + 1])
        while pending:
            _reduce(values, pending.pop())
        return values[0]

    def unop(self, op: Token, arg: Expr) -> UnOp:
        return UnOp(str(op), arg, op.column)

    def int_(self, token: Token) -> Num:
        text = token.replace("_", "")
        if text[1:2] in ("x", "X", "b", "B"):
            return Num(int(text, 0), token.column)
        # A longer decimal is out of range anyway (`operands.evaluate` says so); Python refuses > 4300 digits.
        return Num(int(text[:MAX_DECIMAL_DIGITS]), token.column)

    def float_(self, token: Token) -> Num:
        return Num(float(token), token.column)

    def name(self, token: Token) -> Name:
        return Name(str(token), token.column)


_PRECEDENCE = {"|": 0, "^": 1, "&": 2, "<<": 3, ">>": 3, "+": 4, "-": 4, "*": 5, "/": 5, "%": 5}


def _reduce(values: list[Expr], op: Token) -> None:
    right = values.pop()
    left = values.pop()
    values.append(BinOp(str(op), left, right, left.col, op.column))


@cache
def _parser() -> Lark:
    grammar = resources.files("assembler").joinpath("grammar.lark").read_text()
    return Lark(grammar, parser="lalr", transformer=_ToNodes(), maybe_placeholders=True)


def parse(source: str, filename: str) -> tuple[list[Item], list[Diagnostic]]:
    """All items of the valid lines, and one diagnostic per line with a syntax error."""
    parser = _parser()
    try:
        return parser.parse(source + "\n"), []
    except UnexpectedInput:
        pass
    items: list[Item] = []
    diagnostics: list[Diagnostic] = []
    for lineno, text in enumerate(source.splitlines(), start=1):
        try:
            parsed = parser.parse(text + "\n")
        except UnexpectedInput as err:
            diagnostics.append(_syntax_diagnostic(err, text, lineno, filename))
            continue
        items.extend(_relocate(item, lineno) for item in parsed)
    return items, diagnostics


def _relocate(item: Item, lineno: int) -> Item:
    if isinstance(item, LabelDef):
        return LabelDef(item.name, lineno, item.col)
    return Statement(item.name, item.operands, lineno, item.col)


# Common mistakes, recognised by the parser state they fail in (Lark's match_examples).
_EXAMPLES: dict[str, tuple[str, ...]] = {
    "operand missing after ','": ("add x1, x2,\n", "add x1,, x2\n", "add x1, x2, )\n"),
    "operand missing after an operator": ("addi x1, x2, 3 +\n", "addi x1, x2, 3 * * 2\n", "addi x1, x2, 4 <<\n"),
    "unbalanced parentheses": ("addi x1, x2, (3\n", "addi x1, x2, 3)\n", "lw x1, 4(x2\n", "addi x1, x2, ((1)\n"),
    "missing ',' between operands": ("add x1, x2 (x3)\n", "addi x1, x2, 3 4\n", "add x1, x2 x3 x4\n"),
    "a label needs a name before ':'": (": add x1, x2, x3\n", "add: : nop\n"),
    "malformed tensor declaration (expected NAME: dtype[dims] @ address)": (
        ".input a: i8 64 @ x\n",
        ".input a: i8[64 @ x\n",
        ".input a: i8[64]\n",
        ".input a: i8[64] x\n",
    ),
}

_TOKEN_NAMES = {
    "NAME": "a name",
    "INT": "a number",
    "FLOAT": "a number",
    "STRING": "a string",
    "BINOP": "an operator",
    "UNOP": "a unary operator",
    "_NL": "end of line",
}


def _syntax_diagnostic(err: UnexpectedInput, text: str, lineno: int, filename: str) -> Diagnostic:
    col = err.column if isinstance(err.column, int) and err.column > 0 else len(text) + 1
    if isinstance(err, UnexpectedCharacters):
        char = text[col - 1] if col - 1 < len(text) else "?"
        message = f"unexpected character {char!r}"
        hint = "'#' and ';' start comments; names are [A-Za-z_.$][A-Za-z0-9_.$]*"
    else:
        label = _match_examples(err)
        found = _describe(err.token) if isinstance(err, UnexpectedToken) else "end of input"
        message = label or f"unexpected {found}"
        expected = sorted({_expected_name(name) for name in getattr(err, "expected", ())})
        hint = f"found {found}; expected {', '.join(expected)}" if expected else ""
        if isinstance(err, UnexpectedEOF):
            col = len(text) + 1
    return Diagnostic(filename, lineno, col, f"syntax error: {message}", hint, text)


def _match_examples(err: UnexpectedInput) -> str | None:
    """The `_EXAMPLES` label whose example fails in the same parser state (and, for a wrong token, with the same
    accepted tokens; the same token wins outright). Lark's `UnexpectedInput.match_examples` does this too, but
    in lark 1.3.1 it raises TypeError formatting a debug message whenever accepted tokens differ."""
    candidate = None
    for label, examples in _EXAMPLES.items():
        for example in examples:
            try:
                _parser().parse(example)
            except UnexpectedInput as other:
                if other.state != err.state:
                    continue
                tokens = isinstance(err, UnexpectedToken) and isinstance(other, UnexpectedToken)
                if tokens and other.accepts != err.accepts:
                    continue
                if getattr(other, "token", None) == getattr(err, "token", None) is not None:
                    return label
                candidate = candidate or label
    return candidate


def _describe(token: Token) -> str:
    if token.type == "_NL" or token.type == "$END":
        return "end of line"
    return f"{token.value!r}"


def _expected_name(terminal: str) -> str:
    if terminal in _TOKEN_NAMES:
        return _TOKEN_NAMES[terminal]
    try:
        pattern = _parser().get_terminal(terminal).pattern
    except KeyError:
        return terminal
    return repr(pattern.value)
