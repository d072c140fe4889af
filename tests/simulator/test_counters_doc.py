"""docs/counters.md is the cost model's data dictionary; it is generated and must not go stale."""

from __future__ import annotations

from pathlib import Path

from simulator.counters import counters_markdown

DOC = Path(__file__).resolve().parents[2] / "docs" / "counters.md"


def test_counters_doc_is_up_to_date() -> None:
    assert DOC.read_text() == counters_markdown(), (
        'docs/counters.md is stale: python -c "from simulator.counters import counters_markdown as m; '
        "print(m(), end='')\" > docs/counters.md"
    )
