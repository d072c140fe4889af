"""Generate `docs/isa.md` from the table, so the reference can never disagree with the ISA.

`python -m isa.render` rewrites the file; tests/isa checks it is not stale.
"""

from __future__ import annotations

import enum
import sys
from pathlib import Path

from isa.enums import Activation, Counter, DType, EpilogueFlags, Extension, Unit
from isa.fields import FIELD_TABLE, WORD_BITS
from isa.memory_map import LOCAL_ACC_BASE
from isa.spec import InstructionSpec
from isa.table import INSTRUCTIONS

DOC_PATH = Path(__file__).resolve().parent.parent / "docs" / "isa.md"

_SECTIONS = (
    ("Scalar control", lambda s: s.unit is Unit.scalar and s.extension is Extension.base or s.unit is None),
    ("DMA", lambda s: s.unit in (Unit.load, Unit.store)),
    ("Matrix unit", lambda s: s.unit is Unit.matrix),
    ("Vector unit (memory to memory)", lambda s: s.mnemonic.startswith("v.")),
    ("Vector chains (vector registers)", lambda s: s.mnemonic.startswith("vc.")),
    ("Fusion control flow", lambda s: s.unit is Unit.scalar and s.extension is Extension.fusion),
)


def _encoding(spec: InstructionSpec) -> str:
    return " ".join(f"{name}={value:#x}" for name, value in spec.fixed)


def _row(spec: InstructionSpec) -> str:
    unit = spec.unit.name if spec.unit is not None else "(operand)"
    dtypes = ",".join(d.name for d in spec.dtypes) or "-"
    cells = (
        f"`{spec.syntax}`",
        unit,
        spec.extension.value,
        _encoding(spec),
        spec.timing,
        str(spec.latency),
        dtypes,
        spec.semantics.replace("|", "\\|"),
    )
    return "| " + " | ".join(cells) + " |"


def _enum_table(kind: type[enum.IntEnum]) -> list[str]:
    return [f"- `{kind.__name__}`: " + ", ".join(f"`{m.name}`={m.value}" for m in kind)]


def render_markdown() -> str:
    lines = [
        "# dynfuse ISA reference",
        "",
        "Generated from `isa/table.py` by `python -m isa.render`; do not edit by hand.",
        "",
        f"{len(INSTRUCTIONS)} instructions, "
        + ", ".join(f"{sum(s.extension is e for s in INSTRUCTIONS)} {e.value}" for e in Extension)
        + f". Every instruction is one {WORD_BITS}-bit little-endian word; the PC counts words.",
        f"Local addresses below `{LOCAL_ACC_BASE:#x}` are scratchpad bytes; from there up, accumulator bytes.",
        "Timing rules and numerics: see `docs/architecture.md`.",
        "",
        "## Word layout",
        "",
        "Fields may share bits across instructions, never within one.",
        "",
        "| field | bits | kind | meaning |",
        "|---|---|---|---|",
        *(f"| `{f.name}` | [{f.hi}:{f.lo}] | {f.kind.value} | {f.doc} |" for f in FIELD_TABLE),
        "",
        "## Operand names",
        "",
        *_enum_table(DType),
        *_enum_table(Unit),
        "- unit short names in assembly: `sc`, `ld`, `mx`, `vx`, `st`",
        *_enum_table(Counter),
        *_enum_table(Activation),
        *_enum_table(EpilogueFlags),
    ]
    header = "| syntax | unit | ext | encoding | timing | lat | dtypes | semantics |"
    for title, member in _SECTIONS:
        lines += ["", f"## {title}", "", header, "|---|---|---|---|---|---|---|---|"]
        lines += [_row(s) for s in INSTRUCTIONS if member(s)]
    return "\n".join(lines) + "\n"


def main() -> int:
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else DOC_PATH
    target.write_text(render_markdown())
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
