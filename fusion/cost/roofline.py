"""The roofline bound of a whole model: a property of (model, machine, dtype), the same for every plan.

    bound = max(total MACs / peak MACs per cycle, compulsory DRAM bytes / DRAM bytes per cycle)

with compulsory = the graph inputs, the weights as the kernels read them (int8 matrix operands and int32 biases
on the int8 path, float32 otherwise: `fusion.lower.compiler.constant_forms`) and the graph outputs, each moved
once. `dynfuse fuse --report/--compare/--json` and the benches print this one number, and the fraction
bound / measured cycles beside each cycle count (1.0 = at the roofline). A zero-skip kernel skipping MACs on
sparse data can beat the compute side, so the fraction may then exceed 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from fusion.cost.analytic import roofline_cycles
from fusion.graph.cost import macs
from fusion.graph.ir import DataType, Graph
from fusion.lower.compiler import constant_forms
from fusion.lower.context import (
    CONST_F32,
    CONST_I8,
    CONST_TAPS_F32,
    CONST_TAPS_I8,
    split_const_key,
    storage_dtype,
)
from fusion.quant.plan import QuantPlan
from simulator.config import MachineConfig


@dataclass(frozen=True)
class ModelRoofline:
    macs: int
    compulsory_bytes: int
    cycles: float

    def fraction(self, measured_cycles: int) -> float:
        """bound / measured cycles (0 when nothing was measured)."""
        return self.cycles / measured_cycles if measured_cycles else 0.0


def _stored_bytes(graph: Graph, plan: QuantPlan | None, value: str) -> int:
    ttype = graph.types[value]
    size = storage_dtype(graph, plan, value).size if ttype.dtype == DataType.float32 else ttype.dtype.size
    return ttype.size * size


# forms that hold one constant's same elements in different orders (a Conv weight as a matrix and tap-major): a
# kernel reads one of them, so the bound counts the smallest once
_LAYOUTS = frozenset({CONST_F32, CONST_I8, CONST_TAPS_F32, CONST_TAPS_I8})


def compulsory_bytes(graph: Graph, plan: QuantPlan | None) -> int:
    """Bytes any execution moves at least once: inputs, weights and outputs (each value counted once)."""
    boundary = dict.fromkeys(v for v in (*graph.inputs, *graph.outputs) if not graph.is_constant(v))
    weights: dict[tuple[str, str], int] = {}
    for key, data in constant_forms(graph, plan).items():
        form, value = split_const_key(key) or ("", key)
        slot = (value, "layout" if form in _LAYOUTS else form)
        weights[slot] = min(weights.get(slot, data.nbytes), data.nbytes)
    return sum(weights.values()) + sum(_stored_bytes(graph, plan, v) for v in boundary)


def model_roofline(graph: Graph, config: MachineConfig, plan: QuantPlan | None) -> ModelRoofline:
    """The model's bound on `config`; `plan` is the int8 quantization plan (None: fp32)."""
    total_macs = sum(macs(graph, node) for node in graph.nodes)
    moved = compulsory_bytes(graph, plan)
    return ModelRoofline(total_macs, moved, roofline_cycles(total_macs, moved, config))
