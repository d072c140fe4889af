"""The binary format: round trip, header fields, and a clear BinaryFormatError for every kind of damage."""

from __future__ import annotations

import struct
import zlib

import pytest

from assembler import BinaryFormatError, KernelMeta, ObjectFile, Section, Symbol, assemble, from_bytes, to_bytes
from assembler.binary import HEADER, MAGIC, VERSION_MAJOR, VERSION_MINOR, isa_fingerprint

SOURCE = """
.data_base 0x400
.text
.kernel k1
.input a: i8[4, 4] @ a
.output c: f32[4] @ 0x1000
.attr sparsity dense
.attr note "ünïcode ✓"
start: dma.ld x1, x2, x3, 4, 4, i8
    bnz.tile x1, 16, i8, start
.endkernel
    halt
.data
a: .i8 1, 2, 3, 4, 5
"""


@pytest.fixture(scope="module")
def obj() -> ObjectFile:
    return assemble(SOURCE)


@pytest.fixture(scope="module")
def blob(obj: ObjectFile) -> bytes:
    return to_bytes(obj)


def reseal(blob: bytearray | bytes) -> bytes:
    """Recompute the header checksum, so a test reaches the checks behind it."""
    out = bytearray(blob)
    out[HEADER.size - 4 : HEADER.size] = b"\0\0\0\0"
    out[HEADER.size - 4 : HEADER.size] = struct.pack("<I", zlib.crc32(out))
    return bytes(out)


def test_round_trip_preserves_everything(obj: ObjectFile, blob: bytes) -> None:
    back = from_bytes(blob)
    assert back == obj
    assert back.kernels[0].attr("note") == "ünïcode ✓"
    assert back.data_base == 0x400 and back.symbol("a") == Symbol("a", Section.data, 0x400)


def test_header_fields(blob: bytes) -> None:
    magic, major, minor, flags, fingerprint, size, count, crc = HEADER.unpack_from(blob)
    assert (magic, major, minor, flags) == (MAGIC, VERSION_MAJOR, VERSION_MINOR, 0)
    assert fingerprint == isa_fingerprint() and size == len(blob) and count == 4
    assert crc == zlib.crc32(blob[: HEADER.size - 4] + b"\0\0\0\0" + blob[HEADER.size :])


def test_every_truncation_is_rejected_clearly(blob: bytes) -> None:
    for length in range(len(blob)):
        with pytest.raises(BinaryFormatError, match="truncated|magic"):
            from_bytes(blob[:length])


def test_every_single_bit_flip_is_rejected(blob: bytes) -> None:
    for index in range(len(blob)):
        for bit in (0, 7):
            damaged = bytearray(blob)
            damaged[index] ^= 1 << bit
            with pytest.raises(BinaryFormatError):
                from_bytes(bytes(damaged))


@pytest.mark.parametrize(
    ("offset", "value", "message"),
    [
        (0, b"ELF\0\0\0\0\0", "not a dynfuse binary: expected magic"),
        (8, struct.pack("<H", VERSION_MAJOR + 1), f"unsupported format version {VERSION_MAJOR + 1}.0"),
        (10, struct.pack("<H", VERSION_MINOR + 1), f"unsupported format version {VERSION_MAJOR}.{VERSION_MINOR + 1}"),
        (16, b"\x01" * 8, "built for another ISA revision: fingerprint 0101010101010101"),
        (12, struct.pack("<I", 4), "unknown flags"),
    ],
)
def test_header_problems_name_offset_expected_and_found(blob: bytes, offset: int, value: bytes, message: str) -> None:
    damaged = bytearray(blob)
    damaged[offset : offset + len(value)] = value
    with pytest.raises(BinaryFormatError, match=message) as info:
        from_bytes(reseal(damaged), "prog.bin")
    assert str(info.value).startswith(f"prog.bin: offset {offset:#x}:")


def test_checksum_mismatch_is_reported_as_corruption(blob: bytes) -> None:
    damaged = bytearray(blob)
    damaged[-1] ^= 0xFF
    with pytest.raises(BinaryFormatError, match="checksum mismatch.*corrupted"):
        from_bytes(bytes(damaged))


def test_trailing_bytes_are_rejected(blob: bytes) -> None:
    with pytest.raises(BinaryFormatError, match="trailing bytes"):
        from_bytes(blob + b"\0")


def test_invalid_instruction_word_names_its_index(blob: bytes) -> None:
    text_offset = struct.unpack_from("<I", blob, HEADER.size + 4)[0]
    damaged = bytearray(blob)
    damaged[text_offset + 8 : text_offset + 16] = struct.pack("<Q", 0xFF)  # opcode 0xff exists nowhere
    with pytest.raises(BinaryFormatError, match=rf"offset {text_offset + 8:#x}: instruction 1: .*not a valid"):
        from_bytes(reseal(damaged))


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (ObjectFile((), symbols=(Symbol("far", Section.text, 3),)), "expected a text address in \\[0, 0\\], found 3"),
        (ObjectFile((), b"ab", 8, (Symbol("d", Section.data, 2),)), "expected a data address in \\[8, 10\\]"),
        (ObjectFile((), symbols=(Symbol("x1", Section.text, 0),)), "'x1' is not a valid name"),
        (ObjectFile((), symbols=(Symbol(".L3", Section.text, 0),)), "local .L\\* labels are not stored"),
        (ObjectFile((), symbols=(Symbol("a", Section.text, 0),) * 2), "defined twice"),
        (ObjectFile((), kernels=(KernelMeta("k", 0, 2),)), "expected 0 <= start <= end <= 0"),
        (ObjectFile((0, 0)), "not a valid instruction"),
    ],
)
def test_inconsistent_objects_are_refused_on_write(bad: ObjectFile, message: str) -> None:
    with pytest.raises(BinaryFormatError, match=message):
        to_bytes(bad)


def test_inconsistent_objects_are_refused_on_load(obj: ObjectFile) -> None:
    """A symbol past the text, smuggled past the writer, is caught by the loader."""
    good = to_bytes(ObjectFile(obj.text, symbols=(Symbol("end", Section.text, len(obj.text)),)))
    bad = good.replace(
        struct.pack("<I", len(obj.text)) + struct.pack("<I", 3) + b"end",
        struct.pack("<I", len(obj.text) + 1) + struct.pack("<I", 3) + b"end",
    )
    assert bad != good
    with pytest.raises(BinaryFormatError, match="symbol 'end': expected a text address"):
        from_bytes(reseal(bad))
