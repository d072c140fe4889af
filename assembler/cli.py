"""`dynfuse asm` and `dynfuse disasm`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from assembler.binary import load, save
from assembler.diagnostics import AssemblyError, Diagnostic
from assembler.disasm import disassemble
from assembler.objfile import ObjectFile, Section
from assembler.source import assemble_file
from isa import Extension

ObjectReader = Callable[[Path], ObjectFile]
_CONTAINERS: dict[bytes, tuple[str, ObjectReader]] = {}  # leading magic bytes -> (what it is, its reader)


def register_container(magic: bytes, description: str, reader: ObjectReader) -> None:
    """Let `dynfuse disasm` read objects wrapped in another file format. A package to the assembler's right
    registers its own (the fusion engine: on-disk kernel cache entries), so the assembler imports none of it."""
    _CONTAINERS[magic] = (description, reader)


def read_object(path: Path) -> ObjectFile:
    """A binary object, or the object inside a registered container (recognised by its leading bytes)."""
    with open(path, "rb") as f:
        head = f.read(max((len(m) for m in _CONTAINERS), default=0))
    for magic, (_, reader) in _CONTAINERS.items():
        if head.startswith(magic):
            return reader(path)
    return load(path)


def register(subparsers: argparse._SubParsersAction) -> None:
    asm = subparsers.add_parser("asm", help="assemble a .s file into a binary object")
    asm.add_argument("source", type=Path, help="assembly source file")
    asm.add_argument("-o", "--output", type=Path, help="output binary (default: source with .bin)")
    asm.add_argument(
        "--check-ext",
        choices=[e.value for e in Extension],
        action="append",
        default=None,
        help="fail unless the program uses only these extensions (repeatable; e.g. --check-ext base)",
    )
    asm.set_defaults(run=run_asm)
    dis = subparsers.add_parser("disasm", help="disassemble a binary object into re-assemblable source")
    dis.add_argument("binary", type=Path, help="binary object file, or a kernel cache entry (.dfk)")
    dis.add_argument("-o", "--output", type=Path, help="output file (default: stdout)")
    dis.set_defaults(run=run_disasm)


def summary(obj: ObjectFile) -> str:
    extensions = ", ".join(sorted(e.value for e in obj.extensions())) or "none"
    counts = (
        _count(len(obj.text), "instruction"),
        _count(len(obj.data), "data byte"),
        _count(len(obj.kernels), "kernel"),
    )
    return f"{', '.join(counts)}, extensions: {extensions}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def run_asm(args: argparse.Namespace) -> int:
    obj = assemble_file(args.source)
    if args.check_ext:
        allowed = {Extension(e) for e in args.check_ext}
        _check_extensions(obj, allowed, str(args.source))
    output = args.output or args.source.with_suffix(".bin")
    save(obj, output)
    print(f"{args.source} -> {output}: {summary(obj)}")
    return 0


def _check_extensions(obj: ObjectFile, allowed: set[Extension], filename: str) -> None:
    names = ", ".join(sorted(e.value for e in allowed))
    symbols = sorted((s.value, s.name) for s in obj.symbols if s.section is Section.text)
    diagnostics = []
    for pc, ins in enumerate(obj.instructions()):
        if ins.spec.extension not in allowed:
            where = max(((v, n) for v, n in symbols if v <= pc), default=None)
            context = f" ({where[1]}+{pc - where[0]})" if where else ""
            diagnostics.append(
                Diagnostic(
                    filename,
                    0,
                    0,
                    f"instruction {pc}{context}: {ins.mnemonic} belongs to the {ins.spec.extension.value} extension",
                    f"--check-ext allows only: {names}",
                )
            )
    if diagnostics:
        raise AssemblyError(diagnostics)


def run_disasm(args: argparse.Namespace) -> int:
    text = disassemble(read_object(args.binary))
    if args.output:
        args.output.write_text(text)
    else:
        sys.stdout.write(text)
    return 0
