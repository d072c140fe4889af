"""The Verilog ISA header is a view of isa/table.py and must never go stale."""

from __future__ import annotations

import re
from pathlib import Path

from isa import INSTRUCTIONS
from isa.fields import FIELD_TABLE
from rtl.generate import GENERATED_DIR, RENDERERS, RTL_UNITS, macro_name, stale_files, write


def test_committed_header_is_current() -> None:
    assert stale_files() == [], "run `python -m rtl.generate` and commit rtl/generated/"


def test_stale_header_is_detected(tmp_path: Path) -> None:
    write(tmp_path)
    assert stale_files(tmp_path) == []
    header = tmp_path / "isa_pkg.vh"
    header.write_text(header.read_text().replace("`define DF_OP_V_ADD 48", "`define DF_OP_V_ADD 49"))
    assert stale_files(tmp_path) == [header]


def _defines() -> dict[str, int]:
    text = RENDERERS["isa_pkg.vh"]()
    return {m[1]: int(m[2]) for m in re.finditer(r"`define DF_(\w+) (\d+)", text)}


def test_header_holds_every_unit_row_and_field() -> None:
    defines = _defines()
    for spec in INSTRUCTIONS:
        if spec.unit in RTL_UNITS:
            name = macro_name(spec.mnemonic)
            assert defines[f"OP_{name}"] == spec.opcode
            assert defines[f"LAT_{name}"] == spec.latency
            for key, value in spec.fixed:
                if key != "opcode":
                    assert defines[f"{key.upper()}_{name}"] == value
    for field in FIELD_TABLE:
        assert (defines[f"F_{field.name.upper()}_LO"], defines[f"F_{field.name.upper()}_W"]) == (field.lo, field.width)


def test_latency_function_matches_each_row_by_mask() -> None:
    text = RENDERERS["isa_functions.vh"]()
    rows = re.findall(r"64'h([0-9a-f]+)\) == 64'h([0-9a-f]+)\) df_latency = (\d+);  // (\S+)", text)
    unit_specs = [s for s in INSTRUCTIONS if s.unit in RTL_UNITS]
    assert [r[3] for r in rows] == [s.mnemonic for s in unit_specs]
    for (mask, match, latency, _), spec in zip(rows, unit_specs, strict=True):
        assert (int(mask, 16), int(match, 16), int(latency)) == (spec.mask, spec.match, spec.latency)
    assert GENERATED_DIR.is_dir()
