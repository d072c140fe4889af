"""Whether a model can run on a machine at all, checked from its types before any tensor is allocated.

Every kernel holds its node's operands in DRAM at once, so a node whose inputs and outputs together exceed the
machine's DRAM cannot run under any plan. `dynfuse fuse` asks this before drawing random inputs (a model with a
[1, 1e6] x [1e6, 1000] MatMul would otherwise allocate gigabytes first).
"""

from __future__ import annotations

import math

from fusion.engine.errors import EngineError
from fusion.graph.ir import Graph
from simulator.config import MachineConfig


def check_fits_dram(graph: Graph, config: MachineConfig) -> None:
    """EngineError naming the first node (or graph input) whose operands do not fit the machine's DRAM."""
    for name in graph.inputs:
        need = _nbytes(graph, name)
        if need > config.dram_bytes:
            raise EngineError(f"graph input {name!r} ({_bytes(need)}) does not fit the {_machine(config)}")
    for node in graph.nodes:
        values = dict.fromkeys((*node.inputs, *node.outputs))
        need = sum(_nbytes(graph, v) for v in values)
        if need > config.dram_bytes:
            raise EngineError(
                f"node {node.name!r} ({node.op.value}) needs {_bytes(need)} of DRAM for its operands "
                f"({', '.join(values)}); it does not fit the {_machine(config)}"
            )


def _nbytes(graph: Graph, value: str) -> int:
    t = graph.types[value]
    return math.prod(t.shape) * t.dtype.size  # exact (numpy's int64 product can wrap on hostile shapes)


def _machine(config: MachineConfig) -> str:
    return f"{config.name} machine's {_bytes(config.dram_bytes)} of DRAM"


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} bytes"
