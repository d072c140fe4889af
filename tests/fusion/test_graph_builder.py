"""The builder infers types as it goes and refuses graphs it cannot type."""

from __future__ import annotations

import numpy as np
import pytest

from fusion.errors import GraphError
from fusion.graph.builder import GraphBuilder
from fusion.graph.ir import TensorType
from fusion.graph.ops import OpType


def test_builder_types_every_value_and_drops_nothing() -> None:
    b = GraphBuilder("mlp")
    x = b.input("x", (4, 16))
    h = b.op(OpType.Gemm, x, b.constant(np.ones((16, 8), np.float32)), b.constant(np.zeros(8, np.float32)))
    y = b.op(OpType.Relu, h, name="act")
    a, c = b.op_multi(OpType.Split, y, n_outputs=2, axis=1, sizes=(3, 5))
    b.output(a, c)
    g = b.build()
    assert g.types[h] == TensorType((4, 8)) and g.types[a].shape == (4, 3) and g.types[c].shape == (4, 5)
    assert [n.op for n in g.nodes] == [OpType.Gemm, OpType.Relu, OpType.Split]
    assert g.node("act").outputs == ("act",) and len(g.constants) == 2


def test_builder_errors() -> None:
    b = GraphBuilder()
    x = b.input("x", (2,))
    with pytest.raises(GraphError, match="undefined"):
        b.op(OpType.Add, x, "ghost")
    with pytest.raises(GraphError, match="already defined"):
        b.input("x", (3,))
    with pytest.raises(GraphError, match="no outputs"):
        b.build()
