"""pyverilog reads rtl/hdl; the RTL must agree with every machine preset and with the ISA header."""

from __future__ import annotations

import re
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from isa import INSTRUCTIONS
from rtl.build import GENERATED_DIR, hdl_sources
from rtl.conformance import config_mismatches
from rtl.generate import RTL_UNITS
from rtl.introspect import read_modules
from rtl.units import FIFO, STREAM, UNITS
from simulator.config import PRESETS

pytestmark = pytest.mark.rtl  # iverilog preprocesses for pyverilog and compiles


@pytest.fixture(scope="module")
def modules():
    return read_modules()


@pytest.mark.parametrize("config", sorted(PRESETS))
def test_rtl_matches_machine_config(modules, config: str) -> None:
    assert config_mismatches(modules, PRESETS[config]) == []


def test_the_stream_fifo_depth_comes_from_the_config(modules) -> None:
    deep = replace(PRESETS["base"], stream_fifo_depth=5)
    assert FIFO.params(deep)["DEPTH"] == STREAM.params(deep)["DEPTH"] == 5
    assert config_mismatches(modules, deep) == []  # the stream path hands the config's depth to its FIFO


def test_lane_pipeline_is_as_deep_as_the_slowest_unit_instruction(modules) -> None:
    deepest = max(s.latency for s in INSTRUCTIONS if s.unit in RTL_UNITS)
    assert modules["vector_unit"].parameters({})["LAT_MAX"] == deepest


def _doctored(tmp_path: Path, name: str, old: str, new: str) -> list[Path]:
    """A copy of rtl/hdl with one edit in one file."""
    out = []
    for path in hdl_sources():
        text = path.read_text()
        if path.name == name:
            assert old in text
            text = text.replace(old, new)
        (tmp_path / path.name).write_text(text)
        out.append(tmp_path / path.name)
    return out


@pytest.mark.parametrize(
    ("name", "old", "new", "complaint"),
    [
        ("matrix_unit.v", "input  [N*DATA_W-1:0]   in_a", "input  [4*DATA_W-1:0]   in_a", "matrix_unit.in_a"),
        ("vector_unit.v", "parameter LANES = 4", "parameter LANES = 8", "default LANES=8"),
        ("pe.v", "parameter ACC_W = 32", "parameter ACC_W = 24", "pe: default ACC_W=24"),
        (
            "stream_fifo.v",
            "parameter DEPTH = 4",
            "parameter DEPTH = 4,\n    parameter SLOTS = 2",
            "not derived from the machine config",
        ),
        ("stream_fifo.v", "parameter DEPTH = 4", "parameter DEPTH = 5", "stream_fifo: default DEPTH=5"),
        (
            "stream_path.v",
            "stream_fifo #(.WIDTH(N * ACC_W), .DEPTH(DEPTH))",
            "stream_fifo #(.WIDTH(N * ACC_W), .DEPTH(N + 1))",
            "stream_path.u_fifo (stream_fifo): DEPTH=17, config base has 16",
        ),
        (
            "matrix_unit.v",
            "systolic_array #(.N(N),",
            "systolic_array #(.N(4),",
            "stream_path.u_matrix.u_array (systolic_array): N=4, config base has 16",
        ),
        (
            "epilogue.v",
            "    output [N*ACC_W-1:0]        out_data",
            "    output [N*ACC_W-1:0]        out_q",
            "differ from the harness",
        ),
    ],
)
def test_drift_is_caught(tmp_path: Path, name: str, old: str, new: str, complaint: str) -> None:
    problems = config_mismatches(read_modules(_doctored(tmp_path, name, old, new)), PRESETS["base"])
    assert any(complaint in p for p in problems), problems


@pytest.mark.parametrize("config", sorted(PRESETS))
@pytest.mark.parametrize("toplevel", sorted(UNITS))
def test_verilog_2005_compiles_without_warnings(tmp_path: Path, toplevel: str, config: str) -> None:
    params = UNITS[toplevel].params(PRESETS[config])
    args = [f"-P{toplevel}.{k}={v}" for k, v in params.items()]
    proc = subprocess.run(
        [
            "iverilog",
            "-g2005",
            "-Wall",
            f"-I{GENERATED_DIR}",
            "-s",
            toplevel,
            *args,
            "-o",
            str(tmp_path / "a.out"),
            *map(str, hdl_sources()),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0 and not proc.stderr.strip() and not proc.stdout.strip(), proc.stderr + proc.stdout


def test_rtl_types_no_opcode_by_hand() -> None:
    """Opcodes reach the RTL only through the generated header's defines."""
    for path in hdl_sources():
        text = path.read_text()
        assert not re.search(r"opcode\s*==\s*\d", text), f"{path.name} compares an opcode with a literal"
        assert not re.search(r"funct\s*==\s*\d", text), f"{path.name} compares a funct with a literal"
