"""`Graph.in_order` and `Graph.node`: a group's nodes in graph order and a node by name, from the graph's index
(the planner asks for every pair and overlap key it prices)."""

from __future__ import annotations

import pickle

import pytest

from fusion.errors import GraphError
from fusion.graph.ir import Graph, TensorType, make_node
from fusion.graph.ops import OpType

F = TensorType((2, 3))


def _chain() -> Graph:
    names = ("a", "b", "c", "d")
    values = ("x", "v1", "v2", "v3", "y")
    nodes = tuple(make_node(n, OpType.Relu, [values[i]], [values[i + 1]]) for i, n in enumerate(names))
    return Graph("g", ("x",), ("y",), nodes, dict.fromkeys(values, F))


def test_in_order_is_graph_order_each_node_once() -> None:
    g = _chain()
    assert g.in_order(["d", "b", "d", "a"]) == ("a", "b", "d")
    assert g.in_order(iter(("c",))) == ("c",)
    assert g.in_order([]) == ()
    assert [g.node(n).name for n in g.in_order(n.name for n in reversed(g.nodes))] == ["a", "b", "c", "d"]


def test_unknown_nodes_are_refused() -> None:
    g = _chain()
    with pytest.raises(GraphError, match=r"no node\(s\) \['e'\]"):
        g.in_order(["a", "e"])
    with pytest.raises(GraphError, match="no node 'e'"):
        g.node("e")


def test_the_index_is_rebuilt_after_pickling() -> None:
    g = _chain()
    assert g.node("c").name == "c"  # the index is built
    copy = pickle.loads(pickle.dumps(g))
    assert copy.in_order(["d", "a"]) == ("a", "d") and copy.node("b").inputs == ("v1",)
