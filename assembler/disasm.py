"""ObjectFile -> assembly text that re-assembles to the identical binary.

Branch targets print as labels (symbols, or synthesised `.L<index>` locals),
data as byte or word lists split at its labels, kernels as `.kernel` blocks
with their metadata. Operand text comes from the ISA table, like the parser.
"""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np

from assembler.link import NAME_RE
from assembler.objfile import KernelMeta, ObjectFile, Section, TensorDecl
from assembler.operands import ENUM_TEXT
from isa import Instruction, InstructionSpec, Kind

BYTES_PER_LINE = 16
WORDS_PER_LINE = 8
_TARGETS = (Kind.target, Kind.loop_end)


def disassemble(obj: ObjectFile) -> str:
    instructions = obj.instructions()
    text_labels: dict[int, list[str]] = defaultdict(list)
    data_labels: dict[int, list[str]] = defaultdict(list)
    for sym in obj.symbols:
        (text_labels if sym.section is Section.text else data_labels)[sym.value].append(sym.name)
    for pc, ins in enumerate(instructions):
        for field, value in zip(ins.spec.fields, ins.values, strict=True):
            target = pc + value
            if field.kind in _TARGETS and 0 <= target <= len(instructions) and target not in text_labels:
                text_labels[target].append(f".L{target}")
    data_names = {address: names[0] for address, names in data_labels.items()}
    lines: list[str] = []
    if obj.data_base:
        lines.append(f".data_base {obj.data_base:#x}")
    lines.append(".text")
    lines += _text_lines(obj, instructions, text_labels, data_names)
    if obj.data or data_labels:
        lines.append(".data")
        lines += _data_lines(obj, data_labels)
    return "\n".join(lines) + "\n"


def _text_lines(
    obj: ObjectFile, instructions: list[Instruction], labels: dict[int, list[str]], data_names: dict[int, str]
) -> list[str]:
    lines: list[str] = []
    kernels = list(obj.kernels)
    open_kernel: KernelMeta | None = None
    for pc in range(len(instructions) + 1):
        if open_kernel is not None and open_kernel.end == pc:
            lines.append(".endkernel")
            open_kernel = None
        while kernels and kernels[0].start == pc:
            kernel = kernels.pop(0)
            lines += _kernel_header(kernel, data_names)
            if kernel.end == pc:
                lines.append(".endkernel")
            else:
                open_kernel = kernel
        lines += [f"{name}:" for name in labels.get(pc, ())]
        if pc < len(instructions):
            lines.append("    " + format_instruction(instructions[pc], pc, labels, data_names))
    return lines


def _kernel_header(kernel: KernelMeta, data_names: dict[int, str]) -> list[str]:
    lines = [f".kernel {kernel.name}"]
    lines += [f".input {_tensor(t, data_names)}" for t in kernel.inputs]
    lines += [f".output {_tensor(t, data_names)}" for t in kernel.outputs]
    lines += [f".attr {key} {_attr_value(value)}" for key, value in kernel.attrs]
    return lines


def _tensor(t: TensorDecl, data_names: dict[int, str]) -> str:
    dims = ", ".join(str(d) for d in t.shape)
    return f"{t.name}: {t.dtype.name}[{dims}] @ {data_names.get(t.address, hex(t.address))}"


def _attr_value(value: str) -> str:
    return value if NAME_RE.fullmatch(value) else json.dumps(value)


def format_instruction(
    ins: Instruction, pc: int, labels: dict[int, list[str]] | None = None, data_names: dict[int, str] | None = None
) -> str:
    """One instruction as assembly; targets print as labels when `labels` names them, else as indices."""
    values = dict(zip((f.name for f in ins.spec.fields), ins.values, strict=True))
    kinds = {f.name: f.kind for f in ins.spec.fields}

    def show(name: str) -> str:
        kind, value = kinds[name], values[name]
        if kind is Kind.xreg:
            return f"x{value}"
        if kind is Kind.vreg:
            return f"v{value}"
        if kind in ENUM_TEXT:
            return ENUM_TEXT[kind][value]
        if kind in _TARGETS:
            names = (labels or {}).get(pc + value)
            return names[0] if names else str(pc + value)
        if name == "table" and data_names and value in data_names:
            return data_names[value]
        return str(value)

    comment = "".join(_float_note(value) for name, value in values.items() if kinds[name] is Kind.imm32)
    return statement_text(ins.spec, [show(f.name) for f in ins.spec.fields]) + comment


def statement_text(spec: InstructionSpec, field_texts: list[str]) -> str:
    """`mnemonic a, b, imm(reg)` from one text per field (in `spec.fields` order)."""
    written, i = [], 0
    for op in spec.operands:
        written.append(field_texts[i] if op.base is None else f"{field_texts[i]}({field_texts[i + 1]})")
        i += len(op.fields)
    return f"{spec.mnemonic} {', '.join(written)}".rstrip()


def _float_note(bits: int) -> str:
    """`  # fp32 0.5` when a 32-bit immediate reads better as a float (large as an int, short as a float)."""
    value = np.uint32(bits & 0xFFFFFFFF).view(np.float32)
    text = str(value)
    if abs(bits) < 1 << 20 or not np.isfinite(value) or len(text) > 10:
        return ""
    return f"  # fp32 {text}"


def _data_lines(obj: ObjectFile, labels: dict[int, list[str]]) -> list[str]:
    size = len(obj.data)
    bounds = sorted({0, size, *(a - obj.data_base for a in labels)})
    lines: list[str] = []
    for start, end in zip(bounds, bounds[1:] + [size], strict=True):
        lines += [f"{name}:" for name in labels.get(obj.data_base + start, ())]
        chunk = obj.data[start:end]
        if chunk and start % 4 == 0 and len(chunk) % 4 == 0:
            words = [int.from_bytes(chunk[i : i + 4], "little") for i in range(0, len(chunk), 4)]
            lines += _rows(".i32", [f"{w:#010x}" for w in words], WORDS_PER_LINE)
        else:
            lines += _rows(".i8", [str(b) for b in chunk], BYTES_PER_LINE)
    return lines


def _rows(directive: str, values: list[str], per_line: int) -> list[str]:
    return [f"    {directive} {', '.join(values[i : i + per_line])}" for i in range(0, len(values), per_line)]
