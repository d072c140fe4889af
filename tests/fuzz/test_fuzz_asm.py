"""Fuzzing the assembler and the binary loader: mutated example sources and binaries.

Only AssemblyError / BinaryFormatError / SimulatorTrap (the project's errors) may escape; whatever assembles
lists as text that re-assembles to the same bytes, and whatever the loader accepts round-trips the same way
and simulates within a small cycle budget or traps."""

from __future__ import annotations

import zlib
from dataclasses import replace
from pathlib import Path

import numpy as np
from fuzz_helpers import fuzz, mutate_bytes, pick

from assembler import AssemblyError, BinaryFormatError, assemble, disassemble, from_bytes, to_bytes
from assembler.binary import HEADER
from isa.errors import DynfuseError
from simulator.config import PRESETS
from simulator.inputs import random_inputs
from simulator.run import simulate

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.s"))
SOURCES = [p.read_text() for p in EXAMPLES]
BINARIES = [to_bytes(assemble(s)) for s in SOURCES]
TOKENS = [
    "x1", "v3", "0", "-1", "0x7fffffff", "0x" + "f" * 40, "9" * 60, "1e39", "3.5", "nan", "(", ")", ",", "+", "*",
    "<<", "~", ":", "@", "[", "]", "i8", "f32", ".equ", ".data", ".text", ".kernel k", ".endkernel", ".zero",
    ".align 3", "li", "loopi", "jal x0,", "halt", "mx.mms", "vc.lds", "label", '"s"', "#", "\t", " " * 3,
]  # fmt: skip
SIM = replace(PRESETS["tiny"], max_cycles=20_000)


def _mutate_source(text: str, rng: np.random.Generator) -> str:
    lines = text.splitlines()
    for _ in range(int(rng.integers(1, 4))):
        i = int(rng.integers(0, len(lines)))
        action = int(rng.integers(0, 5))
        if action == 0:
            del lines[i]
        elif action == 1:
            lines.insert(i, lines[int(rng.integers(0, len(lines)))])
        elif action == 2:
            words = lines[i].split(" ")
            words[int(rng.integers(0, len(words)))] = pick(rng, TOKENS)
            lines[i] = " ".join(words)
        elif action == 3:
            at = int(rng.integers(0, len(lines[i]) + 1))
            lines[i] = lines[i][:at] + pick(rng, TOKENS) + lines[i][at:]
        else:
            lines[i] = lines[i][: int(rng.integers(0, len(lines[i]) + 1))]
        if not lines:
            lines = [""]
    return "\n".join(lines) + "\n"


def _round_trips(blob: bytes) -> None:
    obj = from_bytes(blob)
    assert to_bytes(obj) == blob
    assert to_bytes(assemble(disassemble(obj))) == blob, "the listing does not re-assemble to the same bytes"


def test_fuzz_assembler_text() -> None:
    def case(rng: np.random.Generator) -> str:
        obj = assemble(_mutate_source(pick(rng, SOURCES), rng))
        _round_trips(to_bytes(obj))
        return "assembled"

    counts = fuzz("assembler text", case, (AssemblyError,))
    assert counts["assembled"] and counts["rejected"]


def _reseal(blob: bytes) -> bytes:
    crc = HEADER.size - 4
    if len(blob) < HEADER.size:
        return blob
    out = bytearray(blob)
    out[crc : crc + 4] = b"\0\0\0\0"
    out[crc : crc + 4] = zlib.crc32(out).to_bytes(4, "little")
    return bytes(out)


def test_fuzz_binaries_load_round_trip_and_simulate() -> None:
    def case(rng: np.random.Generator) -> str:
        blob = mutate_bytes(pick(rng, BINARIES), rng)
        if rng.random() < 0.8:  # most damage should reach the section parsers, past the checksum
            blob = _reseal(blob)
        try:
            _round_trips(blob)
        except BinaryFormatError:
            return "rejected"
        obj = from_bytes(blob)
        try:
            simulate(obj, SIM, random_inputs(obj, 0))
        except DynfuseError:
            return "loaded, trapped"
        return "loaded, ran"

    counts = fuzz("binaries", case, ())
    assert counts["rejected"] and sum(n for k, n in counts.items() if k.startswith("loaded"))
