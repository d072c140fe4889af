"""State shared by the ONNX converters while one model is imported: known value types, constants, emitted nodes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper

from fusion.errors import GraphError, ShapeError
from fusion.graph.ir import DataType, Node, TensorType, make_node
from fusion.graph.ops import OpType
from fusion.graph.shapes import infer


class Unsupported(Exception):
    """Raised inside a converter for a feature (attribute value, dtype, non-constant operand) dynfuse lacks."""


@dataclass
class ImportContext:
    """Mutable scratch state of one import; the importer turns it into a frozen Graph at the end."""

    types: dict[str, TensorType] = field(default_factory=dict)
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)
    _names: set[str] = field(default_factory=set)

    def type_of(self, value: str) -> TensorType:
        if value not in self.types:
            raise GraphError(f"value {value!r} is read before it is defined")
        return self.types[value]

    def shape(self, value: str) -> tuple[int, ...]:
        return self.type_of(value).shape

    def const(self, value: str, what: str) -> np.ndarray:
        """The value of a constant operand (initializer, Constant node, or bound input), else Unsupported."""
        if value not in self.constants:
            raise Unsupported(f"{what} ({value!r}) must be a constant: an initializer, a Constant, or a bound input")
        return self.constants[value]

    def optional_const(self, onnx_node: onnx.NodeProto, index: int, what: str) -> np.ndarray | None:
        if index >= len(onnx_node.input) or not onnx_node.input[index]:
            return None
        return self.const(onnx_node.input[index], what)

    def add_constant(self, name: str, array: np.ndarray) -> str:
        self.constants[name] = array
        self.types[name] = TensorType(tuple(int(d) for d in array.shape), DataType.of(array.dtype))
        return name

    def fresh(self, stem: str) -> str:
        name, i = stem, 0
        while name in self._names or name in self.types:
            i += 1
            name = f"{stem}#{i}"
        self._names.add(name)
        return name

    def emit(self, name: str, op: OpType, inputs: list[str], outputs: list[str] | None = None, **attrs: Any) -> str:
        """Append one IR node (inferring its output types) and return its first output's name."""
        node_name = self.fresh(name)
        outputs = outputs or [self.fresh(f"{node_name}:out")]
        node = make_node(node_name, op, inputs, outputs, **attrs)
        undefined = [v for v in inputs if v not in self.types]
        if undefined:
            raise GraphError(f"node {node_name!r} reads undefined value(s) {undefined}")
        try:
            out_types = infer(node, tuple(self.types[v] for v in inputs))
        except ShapeError as err:
            raise Unsupported(str(err)) from None
        self.types.update(zip(outputs, out_types, strict=True))
        self.nodes.append(node)
        return outputs[0]


def attrs_of(onnx_node: onnx.NodeProto) -> dict[str, Any]:
    """ONNX attributes as plain Python values (bytes decoded to str)."""
    out = {}
    for attr in onnx_node.attribute:
        value = helper.get_attribute_value(attr)
        out[attr.name] = value.decode() if isinstance(value, bytes) else value
    return out


def norm_axis(axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise Unsupported(f"axis {axis} out of range for rank {rank}")
    return axis + rank if axis < 0 else axis
