"""Lowering of graphs to accelerator programs: the unfused baseline (one base-ISA kernel per node).

from fusion.lower import compile
model = compile("model.onnx", "base", "int8", samples=[{"x": x}])
outputs, counters = model.run({"x": x})

Building blocks for other code generators (the fusion engine): `plan_dram` (a graph's constants and DRAM
addresses), `declare` (a `.kernel` input/output declaration), `emit_phases` (steps through the token pipeline,
fenced), `finish_program` (halt, data section, link), `symbol_names`, `constant_forms`, `LOWERINGS`.
"""

from fusion.lower.compiler import (
    LOWERINGS,
    CompiledModel,
    LazyInt8Model,
    compile,
    constant_forms,
    declare,
    emit_phases,
    finish_program,
    plan_dram,
    symbol_names,
)

__all__ = [
    "LOWERINGS",
    "CompiledModel",
    "LazyInt8Model",
    "compile",
    "constant_forms",
    "declare",
    "emit_phases",
    "finish_program",
    "plan_dram",
    "symbol_names",
]
