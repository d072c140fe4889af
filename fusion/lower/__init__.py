"""Lowering of graphs to accelerator programs: the unfused baseline (one base-ISA kernel per node).

from fusion.lower import compile
model = compile("model.onnx", "base", "int8", samples=[{"x": x}])
outputs, counters = model.run({"x": x})
"""

from fusion.lower.compiler import CompiledModel, LazyInt8Model, compile

__all__ = ["CompiledModel", "LazyInt8Model", "compile"]
