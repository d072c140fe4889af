"""A small builder for writing graphs by hand in tests and notebooks.

b = GraphBuilder("mlp")
x = b.input("x", (4, 16))
h = b.op(OpType.Relu, b.op(OpType.Gemm, x, b.constant(w1), b.constant(b1)))
b.output(h)
graph = b.build()
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fusion.errors import GraphError
from fusion.graph.assemble import assemble, constant_type
from fusion.graph.ir import DataType, Graph, Node, TensorType, make_node
from fusion.graph.ops import OpType
from fusion.graph.shapes import infer


class GraphBuilder:
    """Accumulates inputs, constants and nodes; types are inferred as each node is added."""

    def __init__(self, name: str = "graph") -> None:
        self.name = name
        self._inputs: dict[str, TensorType] = {}
        self._constants: dict[str, np.ndarray] = {}
        self._nodes: list[Node] = []
        self._outputs: list[str] = []
        self._types: dict[str, TensorType] = {}
        self._count = 0

    def _fresh(self, stem: str) -> str:
        self._count += 1
        return f"{stem}_{self._count}"

    def _define(self, name: str, ttype: TensorType) -> str:
        if name in self._types:
            raise GraphError(f"value {name!r} is already defined")
        self._types[name] = ttype
        return name

    def input(self, name: str, shape: tuple[int, ...], dtype: DataType = DataType.float32) -> str:
        self._inputs[name] = TensorType(tuple(shape), dtype)
        return self._define(name, self._inputs[name])

    def constant(self, array: np.ndarray | float, name: str | None = None) -> str:
        array = np.asarray(array, dtype=np.float32) if np.isscalar(array) else np.asarray(array)
        name = name or self._fresh("const")
        self._constants[name] = array
        return self._define(name, constant_type(array))

    def op_multi(
        self, op: OpType, *inputs: str, n_outputs: int, name: str | None = None, **attrs: Any
    ) -> tuple[str, ...]:
        name = name or self._fresh(op.value.lower())
        outputs = tuple(f"{name}:{i}" if n_outputs > 1 else name for i in range(n_outputs))
        node = make_node(name, op, inputs, outputs, **attrs)
        missing = [v for v in inputs if v not in self._types]
        if missing:
            raise GraphError(f"node {name!r} reads undefined value(s) {missing}")
        for out, ttype in zip(outputs, infer(node, tuple(self._types[v] for v in inputs)), strict=True):
            self._define(out, ttype)
        self._nodes.append(node)
        return outputs

    def op(self, op: OpType, *inputs: str, name: str | None = None, **attrs: Any) -> str:
        return self.op_multi(op, *inputs, n_outputs=1, name=name, **attrs)[0]

    def type_of(self, value: str) -> TensorType:
        return self._types[value]

    def output(self, *values: str) -> None:
        self._outputs.extend(values)

    def build(self) -> Graph:
        if not self._outputs:
            raise GraphError(f"graph {self.name!r} has no outputs; call output() first")
        return assemble(self.name, self._inputs, self._constants, self._nodes, self._outputs)
