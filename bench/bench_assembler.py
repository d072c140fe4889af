"""Assembler throughput: the text path (Lark) and the object path (ProgramBuilder), side by side.

Generates one program of mixed rows of the ISA table (random in-range
operands, labels every 16 instructions, branches and loops to nearby labels, a
data section), assembles it both ways, checks the bytes are identical, and
reports instructions per second. Usage: python bench/bench_assembler.py [--n 100000]
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from assembler import ProgramBuilder, assemble, disassemble, from_bytes, to_bytes
from assembler.builder import builder_method_name
from assembler.disasm import statement_text
from assembler.operands import ENUM_TEXT
from isa import INSTRUCTIONS, InstructionSpec, Kind
from isa.fields import ENUM_KINDS, Field

LABEL_EVERY = 16
RESULTS = Path(__file__).parent / "results" / "assembler.md"


def operand(spec: InstructionSpec, field: Field, pc: int, n: int, rng: np.random.Generator) -> tuple[str, object]:
    """(text, builder value) of one random valid operand for `field` at instruction `pc`."""
    kind = field.kind
    if kind is Kind.xreg:
        n = int(rng.integers(32))
        return f"x{n}", n
    if kind is Kind.vreg:
        n = int(rng.integers(8))
        return f"v{n}", n
    if kind in ENUM_KINDS:
        names = [d.name for d in spec.dtypes] if field.name == "dtype" else list(ENUM_TEXT[kind].values())
        name = names[int(rng.integers(len(names)))]
        return name, name
    if kind is Kind.target:
        label = f"L{min(max(pc // LABEL_EVERY + int(rng.integers(-4, 5)), 0), (n - 1) // LABEL_EVERY + 1)}"
        return label, label
    if kind is Kind.loop_end:
        label = f"L{pc // LABEL_EVERY + 1}"
        return label, label
    if field.name == "table":
        return "table", "table"
    if kind is Kind.imm32 and rng.random() < 0.3:
        value = float(np.float32(rng.normal()))
        return repr(value), value
    lo, hi = field.value_range
    value = int(rng.integers(lo, hi + 1))
    return str(value), value


Drawn = list[tuple[InstructionSpec, list[tuple[str, object]]]]


def draw(n: int, seed: int = 0) -> Drawn:
    """n random rows of the table, each with (text, builder value) operands."""
    rng = np.random.default_rng(seed)
    rows = rng.integers(len(INSTRUCTIONS), size=n)
    return [
        (INSTRUCTIONS[row], [operand(INSTRUCTIONS[row], f, pc, n, rng) for f in INSTRUCTIONS[row].fields])
        for pc, row in enumerate(rows)
    ]


def last_label(n: int) -> str:
    return f"L{(n - 1) // LABEL_EVERY + 1}"


def to_text(drawn: Drawn) -> str:
    lines = [".text"]
    for pc, (spec, pairs) in enumerate(drawn):
        if pc % LABEL_EVERY == 0:
            lines.append(f"L{pc // LABEL_EVERY}:")
        lines.append(f"    {statement_text(spec, [t for t, _ in pairs])}")
    lines += [f"{last_label(len(drawn))}:", "    halt", ".data", "table:", "    .word L0, L1, L2, L3"]
    return "\n".join(lines) + "\n"


def emit(drawn: Drawn) -> tuple[ProgramBuilder, float]:
    """The same program through the builder, and the seconds the calls took."""
    calls = [(getattr(ProgramBuilder, builder_method_name(spec)), tuple(v for _, v in pairs)) for spec, pairs in drawn]
    start = time.perf_counter()
    b = ProgramBuilder()
    for pc, (method, values) in enumerate(calls):
        if pc % LABEL_EVERY == 0:
            b.label(f"L{pc // LABEL_EVERY}")
        method(b, *values)
    b.label(last_label(len(drawn)))
    b.halt()
    b.data()
    b.label("table")
    b.word("L0", "L1", "L2", "L3")
    return b, time.perf_counter() - start


def best_of(repeats: int, fn: Callable[[], object]) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000, help="instructions in the generated program")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    drawn = draw(args.n)
    source = to_text(drawn)
    assemble(".text\nnop\n")  # build the Lark parser outside the timing
    text_s, text_obj = best_of(args.repeats, lambda: assemble(source))
    emit_s = min(emit(drawn)[1] for _ in range(args.repeats))
    builder, _ = emit(drawn)
    build_s, built = best_of(args.repeats, builder.build)
    assert to_bytes(text_obj) == to_bytes(built), "text and object paths disagree"
    count = len(text_obj.text)
    object_s = emit_s + build_s
    write_s, blob = best_of(args.repeats, lambda: to_bytes(replace(text_obj)))  # fresh object: decodes and validates
    load_s, _ = best_of(args.repeats, lambda: from_bytes(blob))
    disasm_s, _ = best_of(args.repeats, lambda: disassemble(replace(text_obj)))
    rows = [
        ("text: assemble(source)", text_s, ">= 10,000"),
        ("object: builder calls + build()", object_s, ">= 50,000"),
        ("object: build() alone", build_s, ""),
        ("binary: to_bytes (validated)", write_s, ""),
        ("binary: from_bytes (validated)", load_s, ""),
        ("disassemble (decodes)", disasm_s, ""),
    ]
    table = Table(title=f"assembler throughput, {count} instructions, {platform.machine()}, {os.cpu_count()} cores")
    for column in ("path", "seconds", "instructions/s", "target"):
        table.add_column(column)
    for name, seconds, target in rows:
        table.add_row(name, f"{seconds:.3f}", f"{count / seconds:,.0f}", target)
    Console().print(table)
    lines = [
        "# Assembler throughput",
        "",
        f"`python bench/bench_assembler.py --n {args.n}`: best of {args.repeats}, {count} instructions of random",
        f"table rows, {platform.machine()} with {os.cpu_count()} cores; both paths give identical bytes (checked).",
        "",
        "| path | seconds | instructions/s | target |",
        "|---|---|---|---|",
        *(f"| {name} | {seconds:.3f} | {count / seconds:,.0f} | {target} |" for name, seconds, target in rows),
        "",
    ]
    RESULTS.write_text("\n".join(lines))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
