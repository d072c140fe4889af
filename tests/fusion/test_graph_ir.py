"""The IR validates itself on construction and is immutable; the op kinds are closed and complete."""

from __future__ import annotations

import numpy as np
import pytest

from fusion.errors import GraphError
from fusion.graph.builder import GraphBuilder
from fusion.graph.hashing import extract_subgraph
from fusion.graph.ir import DataType, Graph, TensorType, make_node
from fusion.graph.ops import OP_KIND, OpKind, OpType

F = TensorType((2, 3))


def _graph(nodes, outputs=("y",), constants=None, types=None) -> Graph:
    base = {"x": F, "y": F, "z": F}
    return Graph("g", ("x",), tuple(outputs), tuple(nodes), {**base, **(types or {})}, constants or {})


def test_valid_graph_has_producers_and_consumers() -> None:
    relu = make_node("r", OpType.Relu, ["x"], ["y"])
    add = make_node("a", OpType.Add, ["y", "y"], ["z"])
    g = _graph([relu, add], outputs=("z",))
    assert g.producers["z"] is add and "x" not in g.producers
    assert g.consumers["y"] == (add,)
    assert g.node("a") is add


@pytest.mark.parametrize(
    ("nodes", "outputs", "message"),
    [
        ([make_node("r", OpType.Relu, ["z"], ["y"])], ("y",), "before it is defined"),
        ([make_node("r", OpType.Relu, ["x"], ["y"]), make_node("r", OpType.Relu, ["y"], ["z"])], ("z",), "used twice"),
        ([make_node("r", OpType.Relu, ["x"], ["x"])], ("x",), "redefines"),
        ([make_node("r", OpType.Relu, ["x"], ["y"])], ("nope",), "not defined"),
        ([make_node("r", OpType.Relu, ["x"], ["w"])], ("w",), "has no type"),
    ],
)
def test_malformed_graphs_are_rejected(nodes, outputs, message) -> None:
    with pytest.raises(GraphError, match=message):
        _graph(nodes, outputs)


def test_constants_are_read_only_copies_and_must_match_their_type() -> None:
    w = np.ones((2, 3), np.float32)
    g = _graph([make_node("a", OpType.Add, ["x", "w"], ["y"])], constants={"w": w}, types={"w": F})
    w[0, 0] = 5
    assert g.constants["w"][0, 0] == 1
    with pytest.raises(ValueError):
        g.constants["w"][0, 0] = 2
    with pytest.raises(GraphError, match="typed"):
        _graph([], ("x",), constants={"w": np.ones((3,), np.float32)}, types={"w": F})


def test_node_attributes_are_frozen_and_missing_ones_are_clear_errors() -> None:
    node = make_node("t", OpType.Transpose, ["x"], ["y"], perm=[1, 0])
    assert node.attr("perm") == (1, 0) and hash(node)
    with pytest.raises(GraphError, match="no attribute 'axis'"):
        node.attr("axis")


def test_unsupported_dtype_is_a_graph_error() -> None:
    with pytest.raises(GraphError, match="float16"):
        DataType.of(np.float16)


def test_every_op_has_a_kind_in_tvm_order() -> None:
    assert set(OP_KIND) == set(OpType)
    assert OpType.Relu.kind == OpKind.ELEMWISE
    assert OpType.Add.kind == OpKind.BROADCAST
    assert OpType.Transpose.kind == OpKind.INJECTIVE
    assert OpType.Softmax.kind == OpKind.REDUCTION
    assert OpType.Conv.kind == OpKind.OUT_ELEMWISE_FUSABLE
    assert OpKind.ELEMWISE < OpKind.BROADCAST < OpKind.INJECTIVE < OpKind.REDUCTION < OpKind.OUT_ELEMWISE_FUSABLE


def test_a_subgraph_shares_its_models_read_only_constants_and_copies_a_callers_array() -> None:
    weight = np.ones((4, 4), np.float32)
    b = GraphBuilder("g")
    x = b.input("x", (2, 4))
    y = b.op(OpType.MatMul, x, b.constant(weight, "w"), name="mm")
    b.output(b.op(OpType.Relu, y, name="relu"))
    graph = b.build()
    kept = graph.constants["w"]
    assert kept is not weight and not kept.flags.writeable  # the caller's array is copied, read-only
    weight[0, 0] = 5.0
    assert kept[0, 0] == 1.0
    sub = extract_subgraph(graph, ["mm"])
    assert sub.constants["w"] is kept  # shared, not copied again
