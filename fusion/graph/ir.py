"""The graph IR as frozen data: a Graph is a topologically ordered tuple of Nodes over named values.

Every value (graph input, constant, node output) has a concrete TensorType: a graph is specialised to the
input shapes it was built or imported for. Constants are read-only numpy arrays.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any

import numpy as np

from fusion.errors import GraphError
from fusion.graph.ops import OpType


class DataType(enum.Enum):
    """Element types a graph value can have."""

    float32 = "float32"
    int8 = "int8"
    int32 = "int32"
    int64 = "int64"
    bool = "bool"  # comparisons, masks and Where conditions (shape subgraphs; folded or on the vector unit)

    @property
    def numpy(self) -> np.dtype:
        return np.dtype(self.value)

    @property
    def size(self) -> int:
        return self.numpy.itemsize

    @classmethod
    def of(cls, dtype: np.dtype | type) -> DataType:
        name = np.dtype(dtype).name
        try:
            return cls(name)
        except ValueError:
            raise GraphError(f"dtype {name} is not supported (supported: {[d.value for d in cls]})") from None


MAX_RANK = 32  # numpy allows 64; no model has more than a handful


@dataclass(frozen=True)
class TensorType:
    """Concrete shape and element type of one value."""

    shape: tuple[int, ...]
    dtype: DataType = DataType.float32

    def __post_init__(self) -> None:
        if any(not isinstance(d, int) or d < 0 for d in self.shape):
            raise GraphError(f"shape {self.shape} must be non-negative integers")
        if len(self.shape) > MAX_RANK:
            raise GraphError(f"a tensor of rank {len(self.shape)} exceeds the supported rank {MAX_RANK}")

    @property
    def size(self) -> int:
        return math.prod(self.shape)  # exact: an int64 product would wrap for absurd shapes

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.size

    @property
    def rank(self) -> int:
        return len(self.shape)

    def __str__(self) -> str:
        return f"{self.dtype.value}[{','.join(map(str, self.shape))}]"


AttrValue = int | float | str | tuple[int, ...] | tuple[float, ...]


def freeze_attrs(attrs: Mapping[str, Any]) -> tuple[tuple[str, AttrValue], ...]:
    """Sorted (name, value) pairs with lists turned into tuples, so nodes hash and compare by value."""
    out = []
    for key, value in sorted(attrs.items()):
        if isinstance(value, list | tuple | np.ndarray):
            value = tuple(v.item() if isinstance(v, np.generic) else v for v in value)
        elif isinstance(value, np.generic):
            value = value.item()
        if not isinstance(value, int | float | str | tuple):
            raise GraphError(f"attribute {key!r} has unsupported type {type(value).__name__}")
        out.append((key, value))
    return tuple(out)


_MISSING = object()


@dataclass(frozen=True)
class Node:
    """One operator application. `inputs`/`outputs` are value names; attrs are sorted (name, value) pairs."""

    name: str
    op: OpType
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: tuple[tuple[str, AttrValue], ...] = ()

    def attr(self, key: str, default: Any = _MISSING) -> Any:
        for name, value in self.attrs:
            if name == key:
                return value
        if default is _MISSING:
            raise GraphError(f"node {self.name!r} ({self.op.value}) has no attribute {key!r}")
        return default

    @property
    def attr_dict(self) -> dict[str, AttrValue]:
        return dict(self.attrs)


def make_node(name: str, op: OpType, inputs: Iterable[str], outputs: Iterable[str], **attrs: Any) -> Node:
    return Node(name, op, tuple(inputs), tuple(outputs), freeze_attrs(attrs))


@dataclass(frozen=True)
class DimAssumption:
    """A fact a graph was specialised under: dim `axis` of value `value` was `size` when node `node` was made
    (an attribute or folded constant computed from that dim, e.g. a Reshape target or a mask built from Shape).
    Re-typing the graph for other input shapes must keep every such fact true (see shapes.with_input_shapes)."""

    node: str
    value: str
    axis: int
    size: int

    def __str__(self) -> str:
        return f"node {self.node!r} was built for dim {self.axis} of {self.value!r} = {self.size}"


def _readonly(array: np.ndarray) -> np.ndarray:
    """A read-only copy, or the array itself when it is one already (owns its data, not writeable: another
    graph's constant), so subgraphs share their model's weights instead of copying them."""
    if array.flags.owndata and not array.flags.writeable:
        return array
    out = np.array(array, copy=True)
    out.setflags(write=False)
    return out


@dataclass(frozen=True, eq=False)
class Graph:
    """A dataflow graph. Nodes are in topological order; `types` covers every value, constants included."""

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    nodes: tuple[Node, ...]
    types: Mapping[str, TensorType]
    constants: Mapping[str, np.ndarray] = field(default_factory=dict)
    assumptions: tuple[DimAssumption, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "types", MappingProxyType(dict(self.types)))
        object.__setattr__(self, "assumptions", tuple(self.assumptions))
        object.__setattr__(self, "constants", MappingProxyType({k: _readonly(v) for k, v in self.constants.items()}))
        self._validate()

    def __reduce__(self) -> tuple:
        """Pickles as its fields (the read-only mapping views and cached indexes are rebuilt): graphs travel to
        the engine's compile workers."""
        fields = (
            self.name,
            self.inputs,
            self.outputs,
            self.nodes,
            dict(self.types),
            dict(self.constants),
            self.assumptions,
        )
        return (Graph, fields)

    def _validate(self) -> None:
        defined: set[str] = set()
        for name in (*self.inputs, *self.constants):
            if name in defined:
                raise GraphError(f"graph {self.name!r}: value {name!r} is defined twice")
            defined.add(name)
        for name, array in self.constants.items():
            self._check_type(name)
            want = self.types[name]
            if array.shape != want.shape or DataType.of(array.dtype) != want.dtype:
                raise GraphError(f"constant {name!r} is {array.dtype}{list(array.shape)} but typed {want}")
        node_names: set[str] = set()
        for node in self.nodes:
            if node.name in node_names:
                raise GraphError(f"graph {self.name!r}: node name {node.name!r} is used twice")
            node_names.add(node.name)
            for value in node.inputs:
                if value not in defined:
                    raise GraphError(f"node {node.name!r} reads {value!r} before it is defined")
            for value in node.outputs:
                if value in defined:
                    raise GraphError(f"node {node.name!r} redefines value {value!r}")
                self._check_type(value)
                defined.add(value)
        for name in self.inputs:
            self._check_type(name)
        for name in self.outputs:
            if name not in defined:
                raise GraphError(f"graph output {name!r} is not defined")

    def _check_type(self, name: str) -> None:
        if name not in self.types:
            raise GraphError(f"graph {self.name!r}: value {name!r} has no type")

    @cached_property
    def producers(self) -> Mapping[str, Node]:
        """Value name -> the node that writes it (graph inputs and constants have none)."""
        return MappingProxyType({out: node for node in self.nodes for out in node.outputs})

    @cached_property
    def consumers(self) -> Mapping[str, tuple[Node, ...]]:
        """Value name -> nodes reading it, in graph order (each node once)."""
        table: dict[str, list[Node]] = {}
        for node in self.nodes:
            for value in dict.fromkeys(node.inputs):
                table.setdefault(value, []).append(node)
        return MappingProxyType({k: tuple(v) for k, v in table.items()})

    @cached_property
    def _position(self) -> Mapping[str, int]:
        """Node name -> its index in `nodes` (graph order)."""
        return MappingProxyType({node.name: i for i, node in enumerate(self.nodes)})

    def node(self, name: str) -> Node:
        i = self._position.get(name)
        if i is None:
            raise GraphError(f"graph {self.name!r} has no node {name!r}")
        return self.nodes[i]

    def in_order(self, names: Iterable[str]) -> tuple[str, ...]:
        """The named nodes (each once) in graph order: a group's or a pair's nodes as one subgraph's, without a
        walk over the whole graph. Unknown names: GraphError."""
        wanted = set(names)
        missing = wanted - self._position.keys()
        if missing:
            raise GraphError(f"graph {self.name!r} has no node(s) {sorted(missing)}")
        return tuple(sorted(wanted, key=self._position.__getitem__))

    def is_constant(self, value: str) -> bool:
        return value in self.constants

    def input_types(self, node: Node) -> tuple[TensorType, ...]:
        return tuple(self.types[v] for v in node.inputs)

    def output_types(self, node: Node) -> tuple[TensorType, ...]:
        return tuple(self.types[v] for v in node.outputs)
