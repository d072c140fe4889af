"""Assembler: Lark-parsed text or Python instruction objects -> ObjectFile -> versioned binary.

Entry points: `assemble(text)` / `assemble_file(path)` for source, `ProgramBuilder`
for programs emitted from Python (with a `TextCache`, programs with equal texts share one tuple of words),
`to_bytes`/`from_bytes`/`save`/`load` for the binary format, `disassemble(obj)` for text that re-assembles
identically.
"""

from assembler.binary import BinaryFormatError, from_bytes, isa_fingerprint, load, save, to_bytes
from assembler.builder import ProgramBuilder
from assembler.diagnostics import AssemblyError, Diagnostic
from assembler.disasm import disassemble, format_instruction
from assembler.objfile import KernelMeta, ObjectFile, Section, Symbol, TensorDecl
from assembler.source import assemble, assemble_file
from assembler.texts import TextCache

__all__ = [
    "AssemblyError",
    "BinaryFormatError",
    "Diagnostic",
    "KernelMeta",
    "ObjectFile",
    "ProgramBuilder",
    "Section",
    "Symbol",
    "TensorDecl",
    "TextCache",
    "assemble",
    "assemble_file",
    "disassemble",
    "format_instruction",
    "from_bytes",
    "isa_fingerprint",
    "load",
    "save",
    "to_bytes",
]
