"""Generated views of the ISA table are committed; a stale one fails here."""

from __future__ import annotations

from isa import INSTRUCTIONS
from isa.render import DOC_PATH, render_markdown


def test_docs_isa_md_is_up_to_date() -> None:
    assert DOC_PATH.read_text() == render_markdown(), "docs/isa.md is stale: run `python -m isa.render`"


def test_every_instruction_is_documented_once() -> None:
    text = render_markdown()
    for spec in INSTRUCTIONS:
        assert text.count(f"| `{spec.syntax}` |") == 1, spec.mnemonic
