"""The operator lists in the docs are the code's: docs/onnx_import.md's table names every ONNX converter (and only
those), its run-time column agrees with the lowering, and docs/fusion.md's chain row lists CHAIN_OPS, its kernel
family table has a row per registered strategy and its field table a row per Strategy field."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from fusion.engine.codegen.chain import CHAIN_OPS
from fusion.engine.strategies import REGISTRY, Strategy
from fusion.graph.ops import OpType
from fusion.lower.compiler import supported_ops
from fusion.lower.kernels.recipes import RECIPES
from fusion.onnx_import.converters import CONVERTERS

DOCS = Path(__file__).resolve().parents[1] / "docs"


def operator_rows(text: str) -> list[tuple[list[str], str, str]]:
    """(ONNX ops, IR op cell, run-time column) of each row of the table under '## Operators' (a cell may hold
    escaped pipes, `\\|`)."""
    section = text.split("## Operators", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]] if line.startswith("| ") else []
        if len(cells) == 4 and cells[0] != "ONNX op":
            rows.append(([op.strip() for op in cells[0].split(",")], cells[1], cells[3]))
    return rows


def ir_ops(onnx_ops: list[str], cell: str) -> list[OpType]:
    """The IR ops a row's ONNX ops become: 'same name', or the cell's leading op name ('(constant)': none)."""
    if cell == "same name":
        return [OpType(op) for op in onnx_ops]
    match = re.match(r"[A-Z][A-Za-z]*", cell)
    return [OpType(match.group(0))] if match else []


def chain_ops_listed(text: str) -> set[str]:
    match = re.search(r"Chain ops \(`CHAIN_OPS`\): ([A-Za-z, ]+)", text)
    assert match, "docs/fusion.md's chain row no longer lists 'Chain ops (`CHAIN_OPS`): ...'"
    return {op.strip() for op in match.group(1).split(",")}


ROWS = operator_rows((DOCS / "onnx_import.md").read_text())


def test_table_lists_exactly_the_converters() -> None:
    listed = [op for ops, _, _ in ROWS for op in ops]
    assert len(listed) == len(set(listed)), "an op is listed twice"
    assert set(listed) == set(CONVERTERS), (
        f"missing: {sorted(set(CONVERTERS) - set(listed))}; not converted: {sorted(set(listed) - set(CONVERTERS))}"
    )


@pytest.mark.parametrize("ops, ir, runtime", ROWS, ids=[",".join(r[0]) for r in ROWS])
def test_runtime_column_agrees_with_the_lowering(ops: list[str], ir: str, runtime: str) -> None:
    """'refused'/'fold' rows have no lowering; the others have one; 'vector' rows have a vector recipe."""
    for op in ir_ops(ops, ir):
        lowered = op in supported_ops()
        if runtime.startswith(("refused", "fold")):
            assert not lowered, f"{op.value} is documented as {runtime!r} but has a lowering"
        else:
            assert lowered, f"{op.value} is documented as running ({runtime!r}) but has no lowering"
        if runtime.startswith("vector"):
            assert op in RECIPES, f"{op.value} is documented as a vector recipe but has none"


def test_chain_row_lists_chain_ops() -> None:
    assert chain_ops_listed((DOCS / "fusion.md").read_text()) == {op.value for op in CHAIN_OPS}


def _first_cells(text: str, header: str) -> set[str]:
    """The backquoted names in the first column of the table whose header row starts with `header`."""
    table = text.split(header, 1)[1].split("\n\n", 1)[0]
    return {name for line in table.splitlines() for name in re.findall(r"`(\w+)`", line.split("|")[1])}


def test_every_strategy_and_strategy_field_is_documented() -> None:
    text = (DOCS / "fusion.md").read_text()
    assert set(REGISTRY) <= _first_cells(text, "| strategy | module |")
    fields = {f.name for f in dataclasses.fields(Strategy)} - {"name"}  # the prose above the table: the stable key
    assert fields <= _first_cells(text, "| field | who asks |")
