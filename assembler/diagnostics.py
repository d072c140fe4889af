"""Readable assembler diagnostics: file:line:col, the source line, a caret, and a hint.

An assembly run collects every problem it finds and raises one `AssemblyError`
at the end, so a user fixes a whole file per round trip, not one line.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass

from isa.errors import DynfuseError


@dataclass(frozen=True)
class Diagnostic:
    file: str
    line: int  # 1-based; 0 when unknown
    col: int  # 1-based; 0 when unknown
    message: str
    hint: str = ""
    source: str = ""  # the offending source line, without its newline

    def render(self) -> str:
        where = self.file if self.line <= 0 else f"{self.file}:{self.line}:{max(self.col, 1)}"
        out = [f"{where}: error: {self.message}"]
        if self.source:
            text = self.source.expandtabs(4)
            prefix = self.source[: max(self.col - 1, 0)].expandtabs(4)
            out += [f"    {text}", f"    {' ' * len(prefix)}^"]
        if self.hint:
            out.append(f"    hint: {self.hint}")
        return "\n".join(out)


class AssemblyError(DynfuseError):
    """Every problem of one assembly run; str() is the full report."""

    def __init__(self, diagnostics: Iterable[Diagnostic]) -> None:
        unique = dict.fromkeys(diagnostics)  # an .equ used many times reports its problem once
        self.diagnostics = tuple(sorted(unique, key=lambda d: (d.file, d.line, d.col)))
        super().__init__(self.report())

    def report(self) -> str:
        count = len(self.diagnostics)
        body = "\n".join(d.render() for d in self.diagnostics)
        return f"assembly failed: {count} error{'s' if count != 1 else ''}\n{body}"


class Problem(Exception):
    """Internal: one problem found while resolving an item.

    `col` 0 means the item's own column; `loc` is set when the problem lies in
    another item than the one being resolved (an `.equ` it uses).
    """

    def __init__(self, message: str, hint: str = "", col: int = 0) -> None:
        super().__init__(message)
        self.message, self.hint, self.col = message, hint, col
        self.loc: object = None


def nearest(word: str, candidates: Iterable[str]) -> str:
    """A `did you mean` hint naming the closest candidates, or '' when none is close."""
    close = difflib.get_close_matches(word, list(candidates), n=3, cutoff=0.6)
    return f"did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
