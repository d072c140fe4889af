"""State shared by the ONNX converters while one model is imported: known value types, constants, emitted nodes.

Nodes whose inputs are all constants (and Shape, which needs only its input's type) are folded as they are
emitted, by the reference kernels: the shape computations of exported transformers (mask and position-id
construction from Shape, ConstantOfShape, Range, Equal, Where, Expand, ...) become constants for the shapes at
hand, so the operands Reshape, Expand or Slice need as constants are constants. Every folded value remembers
which input dims it was computed from (`provenance`); a run-time node built from such a value, or from an
attribute resolved against a dim (a Flatten or Reshape target), records DimAssumptions on the graph so
re-typing it for other shapes refuses what would be silently wrong.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fusion.errors import GraphError, ShapeError
from fusion.graph.ir import DataType, DimAssumption, Node, TensorType, make_node
from fusion.graph.ops import TYPE_ONLY, OpType
from fusion.graph.shapes import infer
from fusion.onnx_import.provenance import NONE, Deps, propagate, shape_deps, union
from fusion.reference.kernels import evaluate_node

# folding stops at constants this large (elements): such a node stays in the graph and runs at run time
FOLD_LIMIT = 1 << 24


class Unsupported(Exception):
    """Raised inside a converter for a feature (attribute value, dtype, non-constant operand) dynfuse lacks."""


class Malformed(Unsupported):
    """The model itself is invalid: a required input or attribute is missing or has the wrong type or range."""


class Consequence(Unsupported):
    """A node needs the value of a placeholder (an output of a node that failed): not a problem of its own."""


@dataclass
class ImportContext:
    """Mutable scratch state of one import; the importer turns it into a frozen Graph at the end."""

    keep: frozenset[str] = frozenset()  # graph outputs: always written by a node, never folded away
    placeholders: set[str] = field(default_factory=set)  # typed outputs of nodes that failed to convert
    types: dict[str, TensorType] = field(default_factory=dict)
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)
    deps: dict[str, Deps] = field(default_factory=dict)
    assumptions: list[DimAssumption] = field(default_factory=list)
    _names: set[str] = field(default_factory=set)
    _read: Deps = NONE  # input dims the current ONNX node's attributes were computed from

    def begin(self) -> None:
        """Start converting one ONNX node."""
        self._read = NONE

    def type_of(self, value: str) -> TensorType:
        if value not in self.types:
            raise Malformed(f"value {value!r} is read before it is defined")
        return self.types[value]

    def rank(self, value: str) -> int:
        return self.type_of(value).rank

    def dims(self, value: str) -> tuple[int, ...]:
        """The shape of `value`, for checks that do not shape what the node computes."""
        return self.type_of(value).shape

    def shape(self, value: str, axes: tuple[int, ...] | None = None) -> tuple[int, ...]:
        """The shape of `value`, recording that the node being converted is built from `axes` of it (all)."""
        shape = self.type_of(value).shape
        if value not in self.constants:
            picked = range(len(shape)) if axes is None else axes
            self._read = union(self._read, frozenset((value, a) for a in picked))
        else:
            self._read = union(self._read, self.deps.get(value, NONE))
        return shape

    def const(self, value: str, what: str) -> np.ndarray:
        """The value of a constant operand (initializer, Constant node, folded value or bound input)."""
        if value in self.placeholders:
            raise Consequence(f"{what} ({value!r}) comes from a node that failed to convert")
        if value not in self.constants:
            raise Unsupported(
                f"{what} ({value!r}) must be a constant: an initializer, a Constant, a bound input, or computed "
                "from those and input shapes"
            )
        self._read = union(self._read, self.deps.get(value, NONE))
        return self.constants[value]

    def optional_const(self, onnx_node: Any, index: int, what: str) -> np.ndarray | None:
        if index >= len(onnx_node.input) or not onnx_node.input[index]:
            return None
        return self.const(onnx_node.input[index], what)

    def add_constant(self, name: str, array: np.ndarray, deps: Deps = NONE) -> str:
        array = np.asarray(array)
        self.constants[name] = array
        self.types[name] = TensorType(tuple(int(d) for d in array.shape), DataType.of(array.dtype))
        if union(deps):
            self.deps[name] = deps
        return name

    def add_computed(self, name: str, array: np.ndarray) -> str:
        """A constant the converter computed from what it read (constants, input dims) so far."""
        return self.add_constant(name, array, self._read)

    def fresh(self, stem: str) -> str:
        name, i = stem, 0
        while name in self._names or name in self.types:
            i += 1
            name = f"{stem}#{i}"
        self._names.add(name)
        return name

    def emit(self, name: str, op: OpType, inputs: list[str], outputs: list[str] | None = None, **attrs: Any) -> str:
        """Add one IR node (inferring its output types), or its folded value; return its first output's name."""
        node_name = self.fresh(name)
        outputs = outputs or [self.fresh(f"{node_name}:out")]
        node = make_node(node_name, op, inputs, outputs, **attrs)
        undefined = [v for v in inputs if v not in self.types]
        if undefined:
            raise GraphError(f"node {node_name!r} reads undefined value(s) {undefined}")
        try:
            out_types = infer(node, tuple(self.types[v] for v in inputs))
        except ShapeError as err:  # the problem names the ONNX node; drop the IR node's name
            raise Unsupported(str(err).removeprefix(f"node {node_name!r} ({op.value}): ")) from None
        if self._foldable(node, out_types):
            self._fold(node, out_types)
        else:
            self.types.update(zip(outputs, out_types, strict=True))
            self.nodes.append(node)
            self._assume(node_name, union(self._read, *(self.deps.get(v, NONE) for v in inputs)))
        return outputs[0]

    def _foldable(self, node: Node, out_types: tuple[TensorType, ...]) -> bool:
        if self.keep & set(node.outputs) or any(t.size > FOLD_LIMIT for t in out_types):
            return False
        if node.op in TYPE_ONLY:
            return True
        return bool(node.inputs) and all(v in self.constants for v in node.inputs)

    def _fold(self, node: Node, out_types: tuple[TensorType, ...]) -> None:
        args = tuple(self.constants.get(v) for v in node.inputs)
        if node.op == OpType.Shape:  # needs only the type of its (possibly run-time) input
            args = (np.broadcast_to(np.int8(0), self.types[node.inputs[0]].shape),)
        values = evaluate_node(node, args, tuple(t.shape for t in out_types))
        if node.op == OpType.Shape and node.inputs[0] not in self.constants:
            out_deps = [shape_deps(node.inputs[0], node.attr("start"), node.attr("end"))]
        else:
            out_deps = propagate(node, args, [self.deps.get(v, NONE) for v in node.inputs], self._read)
        for name, value, t, d in zip(node.outputs, values, out_types, out_deps, strict=True):
            self.add_constant(name, np.asarray(value, dtype=t.dtype.numpy), d)

    def _assume(self, node_name: str, deps: Deps) -> None:
        for value, axis in sorted(union(deps)):
            self.assumptions.append(DimAssumption(node_name, value, axis, self.types[value].shape[axis]))


def norm_axis(axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise Unsupported(f"axis {axis} out of range for rank {rank}")
    return axis + rank if axis < 0 else axis
