"""Properties over random programs and random junk.

- asm -> bin -> disasm -> asm -> bin is byte-identical, every word equals isa.encode(isa.make(...)) of the
  values the generator meant (an oracle independent of the assembler's resolver), and the same program
  written as ProgramBuilder calls gives the same bytes.
- random bytes, mutated binaries and random text only ever raise the project's own error types; a mutated
  binary the loader accepts lists as assembly that re-assembles to its exact bytes.
"""

from __future__ import annotations

import contextlib
import struct
import zlib
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from assembler import (
    AssemblyError,
    BinaryFormatError,
    ObjectFile,
    ProgramBuilder,
    assemble,
    disassemble,
    from_bytes,
    to_bytes,
)
from assembler.builder import builder_method_name
from assembler.disasm import statement_text
from assembler.operands import ENUM_NAMES, VREGS, XREGS
from isa import INSTRUCTIONS, Kind, encode, make
from isa.fields import ENUM_KINDS

NAMES = st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True).filter(lambda n: n not in XREGS and n not in VREGS)
F32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


Step = tuple[str, tuple, dict]  # a ProgramBuilder call: method name, args, kwargs


@dataclass(frozen=True)
class Generated:
    """One random program as text, as ProgramBuilder calls, and the words an independent oracle expects."""

    source: str
    steps: list[Step]
    expected_words: list[int]

    def build(self) -> ObjectFile:
        b = ProgramBuilder()
        with contextlib.ExitStack() as kernels:
            for method, args, kwargs in self.steps:
                if method == "kernel":
                    kernels.enter_context(b.kernel(*args, **kwargs))
                elif method == "endkernel":
                    kernels.close()
                else:
                    getattr(b, method)(*args, **kwargs)
        return b.build()


def _text_of_int(draw: st.DrawFn, value: int) -> str:
    """An integer written plainly, in hex, or as a small expression."""
    style = draw(st.sampled_from(["dec", "hex", "expr"]))
    if style == "hex" and value >= 0:
        return hex(value)
    if style == "expr":
        k = draw(st.integers(-100, 100))
        return f"({value - k}) + {k}" if k >= 0 else f"{value - k} - {-k}"
    return str(value)


def _data(draw: st.DrawFn, labels: list[str]) -> tuple[list[str], list[Step], dict[str, int]]:
    lines, steps, address, offset = [".data"], [("data", (), {})], {}, 0
    for label in labels:
        lines.append(f"{label}:")
        steps.append(("label", (label,), {}))
        address[label] = offset
        kind = draw(st.sampled_from(["i8", "i32", "f32", "zero", "align"]))
        if kind in ("i8", "i32", "f32"):
            lo, hi, size = {"i8": (-128, 255, 1), "i32": (-(2**31), 2**32 - 1, 4), "f32": (None, None, 4)}[kind]
            values = draw(st.lists(F32 if kind == "f32" else st.integers(lo, hi), min_size=1, max_size=6))
            lines.append(f".{kind} {', '.join(map(repr, values))}")
            steps.append((kind, tuple(values), {}))
            offset += size * len(values)
        elif kind == "zero":
            count = draw(st.integers(0, 9))
            lines.append(f".zero {count}")
            steps.append(("zero", (count,), {}))
            offset += count
        else:
            lines.append(".align 4")
            steps.append(("align", (4,), {}))
            offset += -offset % 4
    return lines, steps, address


@st.composite
def programs(draw: st.DrawFn) -> Generated:
    n = draw(st.integers(1, 24))
    label_at = draw(st.dictionaries(NAMES, st.integers(0, n), max_size=6))
    names_at: dict[int, list[str]] = {}
    for name, pos in label_at.items():
        names_at.setdefault(pos, []).append(name)
    data_labels = [f"d_{name}" for name in draw(st.lists(NAMES, max_size=3, unique=True))]
    data_lines, data_steps, data_address = _data(draw, data_labels)  # drawn first: addresses feed the oracle
    if label_at and draw(st.booleans()):
        data_lines.append(f"dispatch_table: .word {', '.join(label_at)}")
        data_steps += [("label", ("dispatch_table",), {}), ("word", tuple(label_at), {})]
    kernel_cuts = sorted(draw(st.lists(st.integers(0, n), max_size=4)))
    kernels = list(zip(kernel_cuts[0::2], kernel_cuts[1::2], strict=False))

    lines, steps, expected = [".text"], [("text", (), {})], []
    for pc in range(n + 1):
        for k, (start, end) in enumerate(kernels):
            if end == pc and start != end:
                lines.append(".endkernel")
                steps.append(("endkernel", (), {}))
            if start == pc:
                inputs = []
                lines.append(f".kernel kern{k}")
                if data_labels and draw(st.booleans()):
                    rows = draw(st.integers(1, 64))
                    lines.append(f".input t: i8[{rows}, 4] @ {data_labels[0]}")
                    inputs.append(("t", "i8", (rows, 4), data_labels[0]))
                level = draw(st.integers(0, 9))
                lines.append(f".attr level {level}")
                steps.append(("kernel", (f"kern{k}",), {"inputs": inputs, "attrs": {"level": level}}))
                if start == end:
                    lines.append(".endkernel")
                    steps.append(("endkernel", (), {}))
        lines += [f"{name}:" for name in names_at.get(pc, [])]
        steps += [("label", (name,), {}) for name in names_at.get(pc, [])]
        if pc == n:
            break
        spec = draw(st.sampled_from(INSTRUCTIONS))
        operands = [_operand(draw, spec, field, pc, n, label_at, data_address) for field in spec.fields]
        lines.append(f"    {statement_text(spec, [text for text, _, _ in operands])}")
        steps.append((builder_method_name(spec), tuple(value for _, value, _ in operands), {}))
        expected.append(encode(make(spec.mnemonic, *(field for _, _, field in operands))))
    return Generated("\n".join(lines + data_lines) + "\n", steps + data_steps, expected)


def _operand(draw, spec, field, pc, n, labels, data_address) -> tuple[str, object, int]:
    """(source text, builder argument, encoded field value) of one random valid operand."""
    kind = field.kind
    if kind is Kind.xreg or kind is Kind.vreg:
        names = XREGS if kind is Kind.xreg else VREGS
        name = draw(st.sampled_from(sorted(names)))
        return name, draw(st.sampled_from([name, names[name]])), names[name]
    if kind in ENUM_KINDS:
        choices = [d.name for d in spec.dtypes] if field.name == "dtype" else sorted(ENUM_NAMES[kind])
        name = draw(st.sampled_from(choices))
        value = ENUM_NAMES[kind][name]
        return name, draw(st.sampled_from([name, ENUM_KINDS[kind](value)])), value
    if kind in (Kind.target, Kind.loop_end):
        lo = pc + 1 if kind is Kind.loop_end else 0
        options = [name for name, pos in labels.items() if pos >= lo]
        if options and draw(st.booleans()):
            name = draw(st.sampled_from(options))
            return name, name, labels[name] - pc
        absolute = draw(st.integers(lo, n))
        return _text_of_int(draw, absolute), absolute, absolute - pc
    if field.name == "table" and data_address and draw(st.booleans()):
        name = draw(st.sampled_from(sorted(data_address)))
        return name, name, data_address[name]
    if kind is Kind.imm32 and draw(st.booleans()):
        value = draw(F32)
        return repr(value), value, struct.unpack("<I", struct.pack("<f", value))[0]
    lo, hi = field.value_range
    value = draw(st.integers(lo, hi))
    return _text_of_int(draw, value), value, value


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_assemble_disassemble_reassemble_is_byte_identical(program: Generated) -> None:
    obj = assemble(program.source)
    assert list(obj.text) == program.expected_words
    blob = to_bytes(obj)
    assert to_bytes(program.build()) == blob  # the object API gives the same bytes
    loaded = from_bytes(blob)
    assert loaded == obj
    listing = disassemble(loaded)
    again = to_bytes(assemble(listing, "listing.s"))
    assert again == blob, listing


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_raise_only_binary_format_errors(blob: bytes) -> None:
    with contextlib.suppress(BinaryFormatError):
        from_bytes(blob)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.data())
def test_mutated_binaries_raise_only_binary_format_errors(program: Generated, data: st.DataObject) -> None:
    blob = bytearray(to_bytes(assemble(program.source)))
    for _ in range(data.draw(st.integers(1, 4))):
        action = data.draw(st.sampled_from(["flip", "truncate", "insert", "reseal"]))
        if action == "flip" and blob:
            i = data.draw(st.integers(0, len(blob) - 1))
            blob[i] ^= 1 << data.draw(st.integers(0, 7))
        elif action == "truncate":
            del blob[data.draw(st.integers(0, len(blob))) :]
        elif action == "insert":
            i = data.draw(st.integers(0, len(blob)))
            blob[i:i] = data.draw(st.binary(min_size=1, max_size=8))
        elif len(blob) >= 40:  # recompute the checksum so damage reaches the section parsers
            blob[36:40] = b"\0\0\0\0"
            blob[36:40] = struct.pack("<I", zlib.crc32(blob))
    try:
        loaded = from_bytes(bytes(blob))
    except BinaryFormatError:
        return
    assert to_bytes(loaded) == bytes(blob)  # whatever loads is a faithful, writable object
    listing = disassemble(loaded)
    assert to_bytes(assemble(listing)) == bytes(blob)  # and its listing re-assembles to the same bytes


ASM_ALPHABET = st.sampled_from(list('abx0123v .,:;#()[]@+-*/%<>&|^~"\n\t$_') + ["add", ".kernel", "li", "x1"])


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=80), st.lists(ASM_ALPHABET, max_size=40).map("".join)))
def test_random_text_raises_only_assembly_errors(source: str) -> None:
    try:
        assemble(source)
    except AssemblyError as err:
        assert err.diagnostics and all(d.line >= 0 for d in err.diagnostics)
