"""What a kernel generator knows about the graph it lowers: storage dtypes, DRAM views, quantization."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from fusion.graph.ir import DataType, Graph, Node
from fusion.lower.errors import UnsupportedTypeError
from fusion.lower.views import View, dense
from fusion.quant.params import QuantParams
from fusion.quant.plan import MatrixQuant, QuantPlan
from isa.enums import DType
from simulator.config import MachineConfig

CONST_F32, CONST_I8, CONST_BIAS = "f32", "i8", "bias"
CONST_TAPS_F32, CONST_TAPS_I8 = "f32taps", "i8taps"  # a Conv weight packed tap-major (`kernels.conv_implicit`)
SEL_TRUE, SEL_FALSE = "sel_true", "sel_false"  # a constant Where condition as float clamps (kernels.recipes)
FORM_DTYPES = {
    CONST_F32: DType.f32,
    CONST_I8: DType.i8,
    CONST_BIAS: DType.i32,
    CONST_TAPS_F32: DType.f32,
    CONST_TAPS_I8: DType.i8,
    SEL_TRUE: DType.f32,
    SEL_FALSE: DType.f32,
}


@dataclass(frozen=True)
class LowerContext:
    """Read-only facts for the kernel generators. `plan` is None on the fp32 path."""

    graph: Graph
    config: MachineConfig
    plan: QuantPlan | None
    params: QuantParams | None
    addresses: Mapping[str, int]  # value (or constant form key, or temp key) -> DRAM address
    views: Mapping[str, View] = field(default_factory=dict)  # values read through another value's bytes
    # the buffer slot (`local_alloc.slot`) the generator's step 0 uses: its steps follow `rotation` steps of another
    # program in one pipeline (`fusion.engine.pipelined`), so its first tiles avoid that program's last ones
    rotation: int = 0

    @property
    def int8(self) -> bool:
        return self.plan is not None

    def scale(self, value: str) -> float | None:
        """The int8 scale a value is stored at (None: stored as float32, as every constant form but CONST_I8)."""
        if split_const_key(value) is not None:
            return None
        return None if self.plan is None else self.plan.scales[value]

    def dtype(self, value: str) -> DType:
        if (form := split_const_key(value)) is not None:
            return form_dtype(form[0])
        return storage_dtype(self.graph, self.plan, value)

    def view(self, value: str) -> View:
        """A graph value's DRAM view, or a constant form's (given by its `const_key`)."""
        if value in self.views:  # e.g. a Transpose's output read in place from its input (`engine.codegen`)
            return self.views[value]
        if (form := split_const_key(value)) is not None:
            return self.const_view(form[1], form[0])
        if self.graph.is_constant(value):
            return self.const_view(value, CONST_F32)
        return dense(self.addresses[value], self.graph.types[value].shape, self.dtype(value))

    def const_view(self, value: str, form: str) -> View:
        return dense(self.addresses[const_key(value, form)], self.graph.types[value].shape, form_dtype(form))

    def matrix(self, node: Node) -> MatrixQuant:
        assert self.plan is not None
        return self.plan.matrix[node.name]

    def temp(self, node: Node, index: int) -> int:
        return self.addresses[temp_key(node, index)]


def const_key(value: str, form: str) -> str:
    return f"const:{form}:{value}"


def bias_form(node: str) -> str:
    """The form of an int32 bias as matrix node `node` adds it. Per node: two nodes sharing one bias constant (CSE
    merges equal ones) quantize it at their own scales and bias corrections, so one key per value would give one of
    them the other's bias."""
    return f"{CONST_BIAS}@{node}"


def taps_form(int8: bool) -> str:
    """The form of a Conv weight packed tap-major, as the int8 or fp32 path reads it."""
    return CONST_TAPS_I8 if int8 else CONST_TAPS_F32


def form_dtype(form: str) -> DType:
    return FORM_DTYPES[form.partition("@")[0]]


def split_const_key(key: str) -> tuple[str, str] | None:
    """(form, value) of a `const_key`, None for a graph value name."""
    if not key.startswith("const:"):
        return None
    form, _, value = key[len("const:") :].partition(":")
    return form, value


def temp_key(node: Node, index: int) -> str:
    return f"temp:{node.name}:{index}"


def storage_dtype(graph: Graph, plan: QuantPlan | None, value: str) -> DType:
    ttype = graph.types[value]
    if ttype.dtype != DataType.float32:
        raise UnsupportedTypeError(
            f"value {value!r} is {ttype}: only float32 tensors (int8 after quantization) run on the accelerator"
        )
    if plan is not None and plan.scales.get(value) is not None:
        return DType.i8
    return DType.f32


def const_scalar(graph: Graph, value: str) -> float | None:
    """The value of a one-element float constant (used as a `.vs` scalar operand), else None."""
    if graph.is_constant(value) and graph.constants[value].size == 1 and graph.types[value].dtype == DataType.float32:
        return float(np.asarray(graph.constants[value]).reshape(-1)[0])
    return None
