"""The versioned binary object format: ObjectFile <-> bytes, validated on every load.

Layout (little-endian):
    header   magic "DYNFUSE\\0", version major/minor (u16 each), flags (u32, 0),
             ISA fingerprint (8 bytes), file size (u64), section count (u32), crc32 (u32;
             of the whole file with this field zeroed)
    table    per section: tag (4 ASCII bytes), offset (u32), size (u32)
    TEXT     instruction words, u64 each
    DATA     data_base (u32), then the initialised data bytes
    SYMS     count (u32), then per symbol: section (u8: 0 text, 1 data), value (u32), name (str)
    KERN     count (u32), then per kernel: name (str), start, end (u32), inputs, outputs (u32 count +
             tensors: name (str), dtype (u8), rank (u8), dims (u32 each), address (u32)),
             attrs (u32 count + key, value strs)
    str      u32 byte length + UTF-8

Anything that does not match, from a wrong magic to a symbol past the end of
text, is a `BinaryFormatError` naming the offset and what was expected.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import TypeVar

from assembler.link import ADDRESS_LIMIT, LOCAL_PREFIX, NAME_RE
from assembler.objfile import MAX_TENSOR_RANK, KernelMeta, ObjectFile, Section, Symbol, TensorDecl
from assembler.operands import REGISTER_NAMES
from isa import INSTRUCTIONS, DType, EncodingError, Kind, decode
from isa.enums import UNIT_SHORT_NAMES
from isa.errors import DynfuseError
from isa.fields import ENUM_KINDS

MAGIC = b"DYNFUSE\0"
VERSION_MAJOR = 1
VERSION_MINOR = 0
HEADER = struct.Struct("<8sHHI8sQII")
ENTRY = struct.Struct("<4sII")
SECTION_TAGS = (b"TEXT", b"DATA", b"SYMS", b"KERN")
_CRC_OFFSET = HEADER.size - 4
_U8, _U32, _U64 = struct.Struct("<B"), struct.Struct("<I"), struct.Struct("<Q")
_SECTION_CODES = {Section.text: 0, Section.data: 1}

T = TypeVar("T")


class BinaryFormatError(DynfuseError):
    """A binary that is not a well-formed dynfuse object of this ISA revision."""


@cache
def isa_fingerprint() -> bytes:
    """8 bytes identifying the encodings and enum values of this ISA table revision."""
    rows = [
        (
            spec.mnemonic,
            spec.fixed,
            [(f.name, f.lo, f.width, f.kind.value) for f in spec.fields],
            [int(d) for d in spec.dtypes],
        )
        for spec in INSTRUCTIONS
    ]
    enums = [(kind.value, [(m.name, int(m)) for m in cls]) for kind, cls in ENUM_KINDS.items()]
    units = sorted((name, int(unit)) for name, unit in UNIT_SHORT_NAMES.items())
    return hashlib.sha256(repr((rows, enums, units)).encode()).digest()[:8]


# --- writing ----------------------------------------------------------------------------------


def to_bytes(obj: ObjectFile) -> bytes:
    """Serialise a valid object file (validated first, like a load)."""
    try:
        obj.instructions()
    except EncodingError as err:
        raise BinaryFormatError(f"object to write: {err}") from None
    validate(obj, "object to write")
    sections = {
        b"TEXT": b"".join(_U64.pack(w) for w in obj.text),
        b"DATA": _U32.pack(obj.data_base) + obj.data,
        b"SYMS": _U32.pack(len(obj.symbols))
        + b"".join(_U8.pack(_SECTION_CODES[s.section]) + _U32.pack(s.value) + _str(s.name) for s in obj.symbols),
        b"KERN": _U32.pack(len(obj.kernels)) + b"".join(_kernel_bytes(k) for k in obj.kernels),
    }
    offset = HEADER.size + ENTRY.size * len(sections)
    table, payload = [], []
    for tag, body in sections.items():
        table.append(ENTRY.pack(tag, offset, len(body)))
        payload.append(body)
        offset += len(body)
    header = HEADER.pack(MAGIC, VERSION_MAJOR, VERSION_MINOR, 0, isa_fingerprint(), offset, len(sections), 0)
    blob = bytearray(header + b"".join(table) + b"".join(payload))
    blob[_CRC_OFFSET : HEADER.size] = _U32.pack(zlib.crc32(blob))
    return bytes(blob)


def save(obj: ObjectFile, path: str | Path) -> None:
    Path(path).write_bytes(to_bytes(obj))


def _str(text: str) -> bytes:
    raw = text.encode("utf-8", "surrogatepass")
    return _U32.pack(len(raw)) + raw


def _tensor_bytes(t: TensorDecl) -> bytes:
    dims = b"".join(_U32.pack(d) for d in t.shape)
    return _str(t.name) + _U8.pack(int(t.dtype)) + _U8.pack(len(t.shape)) + dims + _U32.pack(t.address)


def _kernel_bytes(k: KernelMeta) -> bytes:
    parts = [_str(k.name), _U32.pack(k.start), _U32.pack(k.end)]
    for group in (k.inputs, k.outputs):
        parts.append(_U32.pack(len(group)))
        parts.extend(_tensor_bytes(t) for t in group)
    parts.append(_U32.pack(len(k.attrs)))
    parts.extend(_str(key) + _str(value) for key, value in k.attrs)
    return b"".join(parts)


# --- reading ----------------------------------------------------------------------------------


def load(path: str | Path) -> ObjectFile:
    return from_bytes(Path(path).read_bytes(), str(path))


def from_bytes(blob: bytes, source: str = "<bytes>") -> ObjectFile:
    """Parse and validate a binary; raises BinaryFormatError saying what and where."""
    blob = bytes(blob)

    def fail(offset: int, message: str) -> BinaryFormatError:
        return BinaryFormatError(f"{source}: offset {offset:#x}: {message}")

    if blob[: len(MAGIC)] != MAGIC[: len(blob)]:
        raise fail(0, f"not a dynfuse binary: expected magic {MAGIC!r}, found {blob[: len(MAGIC)]!r}")
    if len(blob) < HEADER.size:
        raise fail(len(blob), f"truncated header: expected {HEADER.size} bytes, found {len(blob)}")
    magic, major, minor, flags, fingerprint, size, count, crc = HEADER.unpack_from(blob)
    if major != VERSION_MAJOR or minor > VERSION_MINOR:
        raise fail(
            8 if major != VERSION_MAJOR else 10,
            f"unsupported format version {major}.{minor}: this build reads {VERSION_MAJOR}.0 to "
            f"{VERSION_MAJOR}.{VERSION_MINOR}",
        )
    if size != len(blob):
        what = "truncated file" if size > len(blob) else "trailing bytes after the object"
        raise fail(min(size, len(blob)), f"{what}: header says {size} bytes, found {len(blob)}")
    actual = zlib.crc32(blob[:_CRC_OFFSET] + b"\0\0\0\0" + blob[HEADER.size :])
    if actual != crc:
        raise fail(
            _CRC_OFFSET,
            f"checksum mismatch: header says {crc:#010x}, content gives {actual:#010x} (the file is corrupted)",
        )
    if fingerprint != isa_fingerprint():
        raise fail(
            16,
            f"built for another ISA revision: fingerprint {fingerprint.hex()}, this build "
            f"{isa_fingerprint().hex()}; re-assemble the source",
        )
    if flags:
        raise fail(12, f"unknown flags: expected 0, found {flags:#x}")
    bodies = _section_bodies(blob, count, fail)
    text = _Reader(bodies[b"TEXT"], fail).words()
    data_reader = _Reader(bodies[b"DATA"], fail)
    data_base = data_reader.u32()
    data = data_reader.rest()
    symbols = _Reader(bodies[b"SYMS"], fail).items(_read_symbol)
    kernels = _Reader(bodies[b"KERN"], fail).items(_read_kernel)
    obj = ObjectFile(tuple(text), data, data_base, tuple(symbols), tuple(kernels))
    validate(obj, source)
    return obj


def _section_bodies(blob: bytes, count: int, fail: Callable[[int, str], BinaryFormatError]) -> dict[bytes, tuple]:
    table_end = HEADER.size + ENTRY.size * count
    if count != len(SECTION_TAGS) or table_end > len(blob):
        raise fail(HEADER.size - 8, f"section count: expected {len(SECTION_TAGS)}, found {count}")
    bodies: dict[bytes, tuple] = {}
    cursor = table_end
    for i in range(count):
        at = HEADER.size + ENTRY.size * i
        tag, offset, size = ENTRY.unpack_from(blob, at)
        if tag != SECTION_TAGS[i]:
            raise fail(at, f"section {i}: expected tag {SECTION_TAGS[i]!r}, found {tag!r}")
        if offset != cursor or offset + size > len(blob):
            raise fail(
                at,
                f"section {tag.decode()}: expected to start at {cursor:#x} and fit the file, found "
                f"offset {offset:#x} size {size}",
            )
        bodies[tag] = (blob, offset, offset + size, tag.decode())
        cursor = offset + size
    if cursor != len(blob):
        raise fail(cursor, f"expected the file to end after the last section, found {len(blob) - cursor} more bytes")
    return bodies


class _Reader:
    """Bounds-checked cursor over one section."""

    def __init__(self, body: tuple, fail: Callable[[int, str], BinaryFormatError]) -> None:
        self.blob, self.pos, self.end, self.name = body
        self.fail = fail

    def take(self, n: int, what: str) -> bytes:
        if self.pos + n > self.end:
            raise self.fail(
                self.pos,
                f"section {self.name} truncated reading {what}: expected {n} bytes, found {self.end - self.pos}",
            )
        out = self.blob[self.pos : self.pos + n]
        self.pos += n
        return out

    def u8(self, what: str = "a byte") -> int:
        return self.take(1, what)[0]

    def u32(self, what: str = "a u32") -> int:
        return _U32.unpack(self.take(4, what))[0]

    def text(self, what: str) -> str:
        length = self.u32(f"the length of {what}")
        at = self.pos
        raw = self.take(length, what)
        try:
            return raw.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError as err:
            raise self.fail(at + err.start, f"{what} is not valid UTF-8") from None

    def rest(self) -> bytes:
        out = self.blob[self.pos : self.end]
        self.pos = self.end
        return out

    def words(self) -> list[int]:
        if (self.end - self.pos) % 8:
            raise self.fail(self.pos, f"section TEXT: expected a multiple of 8 bytes, found {self.end - self.pos}")
        words = [w for (w,) in _U64.iter_unpack(self.rest())]
        for i, word in enumerate(words):
            try:
                decode(word)
            except EncodingError as err:
                raise self.fail(self.end - 8 * (len(words) - i), f"instruction {i}: {err}") from None
        return words

    def items(self, read_one: Callable[[_Reader], T]) -> list[T]:
        count = self.u32("an item count")
        out = [read_one(self) for _ in range(min(count, self.end - self.pos))]
        if len(out) != count:
            raise self.fail(self.pos, f"section {self.name}: expected {count} items, the section holds fewer")
        if self.pos != self.end:
            raise self.fail(self.pos, f"section {self.name}: expected its end, found {self.end - self.pos} more bytes")
        return out


def _read_symbol(r: _Reader) -> Symbol:
    at = r.pos
    code = r.u8("a symbol section")
    sections = {v: k for k, v in _SECTION_CODES.items()}
    if code not in sections:
        raise r.fail(at, f"symbol section: expected 0 (text) or 1 (data), found {code}")
    value = r.u32("a symbol value")
    return Symbol(r.text("a symbol name"), sections[code], value)


def _read_tensor(r: _Reader) -> TensorDecl:
    name = r.text("a tensor name")
    at = r.pos
    dtype = r.u8("a dtype")
    if dtype not in {int(d) for d in DType}:
        raise r.fail(at, f"tensor {name!r}: expected a dtype code 0..{max(DType)}, found {dtype}")
    rank = r.u8("a tensor rank")
    shape = tuple(r.u32("a dimension") for _ in range(rank))
    return TensorDecl(name, DType(dtype), shape, r.u32("a tensor address"))


def _read_kernel(r: _Reader) -> KernelMeta:
    name = r.text("a kernel name")
    start, end = r.u32("a kernel start"), r.u32("a kernel end")
    inputs = tuple(_read_tensor(r) for _ in range(r.u32("an input count")))
    outputs = tuple(_read_tensor(r) for _ in range(r.u32("an output count")))
    attrs = tuple((r.text("an attribute key"), r.text("an attribute value")) for _ in range(r.u32("an attr count")))
    return KernelMeta(name, start, end, inputs, outputs, attrs)


# --- validation -------------------------------------------------------------------------------

_TARGETS = (Kind.target, Kind.loop_end)


def validate(obj: ObjectFile, source: str) -> None:
    """Check the cross-references a disassembly relies on; raises BinaryFormatError."""
    problems = _problems(obj)
    if problems:
        raise BinaryFormatError(f"{source}: " + "; ".join(problems[:5]))


def _name_problem(what: str, name: str, symbol: bool = False) -> str | None:
    if not NAME_RE.fullmatch(name) or (symbol and name in REGISTER_NAMES):
        return f"{what} {name!r} is not a valid name"
    return None


def _problems(obj: ObjectFile) -> list[str]:
    problems: list[str] = []
    if obj.data_base + len(obj.data) >= ADDRESS_LIMIT or obj.data_base < 0:
        problems.append(f"data [{obj.data_base:#x}, +{len(obj.data)}) is outside the 32-bit address space")
    seen: set[str] = set()
    for sym in obj.symbols:
        lo, hi = (0, len(obj.text)) if sym.section is Section.text else (obj.data_base, obj.data_base + len(obj.data))
        problem = _name_problem("symbol", sym.name, symbol=True)
        if problem is None and sym.name.startswith(LOCAL_PREFIX):
            problem = f"symbol {sym.name!r}: local {LOCAL_PREFIX}* labels are not stored"
        if problem is None and sym.name in seen:
            problem = f"symbol {sym.name!r} is defined twice"
        if problem is None and not lo <= sym.value <= hi:
            problem = f"symbol {sym.name!r}: expected a {sym.section.value} address in [{lo}, {hi}], found {sym.value}"
        seen.add(sym.name)
        if problem:
            problems.append(problem)
    problems += _order_problems(obj.symbols) + _target_problems(obj)
    previous_end, names = 0, set()
    for k in obj.kernels:
        problem = _name_problem("kernel", k.name)
        if problem is None and k.name in names:
            problem = f"kernel {k.name!r} is defined twice"
        if problem is None and not previous_end <= k.start <= k.end <= len(obj.text):
            problem = (
                f"kernel {k.name!r}: expected {previous_end} <= start <= end <= {len(obj.text)}, "
                f"found [{k.start}, {k.end})"
            )
        problems.extend([problem] if problem else _kernel_problems(k))
        names.add(k.name)
        previous_end = max(previous_end, k.end)
    return problems


def _order_problems(symbols: tuple[Symbol, ...]) -> list[str]:
    """Symbols are stored in address order, text first (as the linker writes them): a listing re-assembles to
    the same order only then."""
    keys = [(sym.section is Section.data, sym.value) for sym in symbols]
    for i in range(1, len(keys)):
        if keys[i] < keys[i - 1]:
            return [f"symbol {symbols[i].name!r} is out of address order (text first, then data, by address)"]
    return []


def _target_problems(obj: ObjectFile) -> list[str]:
    """Branch targets and loop ends inside the program ([0, instruction count]), as the assembler makes them."""
    size = len(obj.text)
    for pc, ins in enumerate(obj.instructions()):
        for field, value in zip(ins.spec.fields, ins.values, strict=True):
            if field.kind in _TARGETS and not 0 <= pc + value <= size:
                return [f"instruction {pc} ({ins.spec.mnemonic}): {field.name} {pc + value} is outside [0, {size}]"]
    return []


def _kernel_problems(k: KernelMeta) -> list[str]:
    problems = []
    tensor_names = [t.name for t in (*k.inputs, *k.outputs)]
    keys = [key for key, _ in k.attrs]
    for name in tensor_names:
        problems.append(_name_problem(f"kernel {k.name!r} tensor", name))
    for key in keys:
        problems.append(_name_problem(f"kernel {k.name!r} attribute", key))
    if len(set(tensor_names)) != len(tensor_names) or len(set(keys)) != len(keys):
        problems.append(f"kernel {k.name!r} repeats a tensor name or attribute key")
    for t in (*k.inputs, *k.outputs):
        if len(t.shape) > MAX_TENSOR_RANK or not all(0 <= d < ADDRESS_LIMIT for d in (*t.shape, t.address)):
            problems.append(f"kernel {k.name!r} tensor {t.name!r}: shape or address out of range")
        elif t.address + t.nbytes > ADDRESS_LIMIT:
            problems.append(f"kernel {k.name!r} tensor {t.name!r}: extends past the 4 GiB address space")
    return [p for p in problems if p]
