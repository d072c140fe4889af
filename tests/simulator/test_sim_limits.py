"""What a user can ask `dynfuse sim` that must end in one line and a non-zero exit, quickly: runaway programs
(a default cycle budget and --max-cycles), tensors that cannot exist, bad seeds, repeated inputs."""

from __future__ import annotations

import time
import zlib
from pathlib import Path

import numpy as np
import pytest

from assembler.binary import HEADER, to_bytes
from assembler.source import assemble
from dynfuse.cli import main
from simulator.cli import DEFAULT_MAX_CYCLES

SPIN = ".text\n.kernel k\nspin: jal x0, spin\n.endkernel\n"


def reseal(blob: bytes) -> bytes:
    """The binary with its header checksum recomputed (damage then reaches the section checks)."""
    crc = HEADER.size - 4
    out = bytearray(blob)
    out[crc : crc + 4] = b"\0\0\0\0"
    out[crc : crc + 4] = zlib.crc32(out).to_bytes(4, "little")
    return bytes(out)


def _program(tmp_path: Path, text: str, name: str = "p.s") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _kernel_with_input(decl: str) -> str:
    return f".text\n.kernel k\n.input {decl}\nhalt\n.endkernel\n"


def _fails(argv: list[str], capsys, message: str) -> None:
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) <= 4, err


def test_a_runaway_program_stops_at_max_cycles(tmp_path: Path, capsys) -> None:
    _fails(["sim", _program(tmp_path, SPIN), "--max-cycles", "5000"], capsys, "exceeded max_cycles=5000")


def test_the_default_budget_stops_a_runaway_program_on_base(tmp_path: Path, capsys) -> None:
    assert DEFAULT_MAX_CYCLES <= 10_000_000  # seconds, not the preset watchdog's ~12 minutes
    start = time.monotonic()
    _fails(["sim", _program(tmp_path, SPIN), "--config", "base"], capsys, "--max-cycles")
    assert time.monotonic() - start < 120


def test_max_cycles_must_be_positive(tmp_path: Path, capsys) -> None:
    _fails(["sim", _program(tmp_path, SPIN), "--max-cycles", "0"], capsys, "--max-cycles must be >= 1")


@pytest.mark.parametrize(
    ("decl", "message"),
    [
        (f"a: f32[{','.join(['1'] * 70)}] @ 0", "at most 32 dimensions"),
        ("a: f32[4294967295, 4294967295] @ 0", "extends past the 4 GiB address space"),
        ("a: f32[262144, 1024] @ 0", "does not fit the 536870912-byte DRAM of base"),
    ],
)
def test_tensors_that_cannot_exist_are_refused_before_allocation(
    tmp_path: Path, capsys, decl: str, message: str
) -> None:
    _fails(["sim", _program(tmp_path, _kernel_with_input(decl)), "--random-inputs", "1"], capsys, message)


def test_a_negative_seed_is_an_error(tmp_path: Path, capsys) -> None:
    path = _program(tmp_path, _kernel_with_input("a: f32[4] @ 0"))
    _fails(["sim", path, "--random-inputs", "-1"], capsys, "seed must be a non-negative integer")


def test_an_input_given_twice_is_an_error(tmp_path: Path, capsys) -> None:
    path = _program(tmp_path, _kernel_with_input("a: f32[4] @ 0"))
    for i in (1, 2):
        np.save(tmp_path / f"a{i}.npy", np.full(4, i, np.float32))
    argv = ["sim", path, "--input", f"a={tmp_path / 'a1.npy'}", "--input", f"a={tmp_path / 'a2.npy'}"]
    _fails(argv, capsys, "--input a is given twice")


def test_vc_lds_of_zero_elements_is_a_trap(tmp_path: Path, capsys) -> None:
    path = _program(tmp_path, ".text\n.kernel k\nvc.lds v1, 0\nhalt\n.endkernel\n")
    _fails(["sim", path], capsys, "vc.lds takes at least 1 element")


def test_a_binary_whose_loop_ends_past_the_program_is_refused(tmp_path: Path, capsys) -> None:
    obj = assemble(".text\nloopi 3, end\naddi x1, x1, 1\nend: halt\n")
    blob = bytearray(to_bytes(obj))
    text = to_bytes(obj).index(obj.text[0].to_bytes(8, "little"))
    bad = assemble(".text\nloopi 3, end\naddi x1, x1, 1\nhalt\nnop\nnop\nend: nop\n").text[0]
    blob[text : text + 8] = bad.to_bytes(8, "little")  # the loop's end now lies 5 words on, past the 3 there
    path = tmp_path / "p.bin"
    path.write_bytes(reseal(bytes(blob)))
    _fails(["sim", str(path)], capsys, "outside [0, 3]")
