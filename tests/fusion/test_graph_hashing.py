"""The structural hash identifies a computation: blind to names and node order, sensitive to anything else."""

from __future__ import annotations

import gc
import hashlib

import numpy as np

from fusion.graph import hashing
from fusion.graph.builder import GraphBuilder
from fusion.graph.hashing import extract_subgraph, structural_hash, subgraph_hash
from fusion.graph.ops import OpType

W = np.arange(12, dtype=np.float32).reshape(4, 3)


def _graph(prefix: str = "", swap: bool = False, w: np.ndarray = W, shape=(2, 4), perm=(1, 0)):
    b = GraphBuilder(prefix + "g")
    x = b.input(prefix + "x", shape)
    wc = b.constant(w, name=prefix + "w")

    def left():
        return b.op(OpType.Relu, b.op(OpType.MatMul, x, wc, name=prefix + "mm"), name=prefix + "r")

    def right():
        return b.op(OpType.Transpose, x, perm=perm, name=prefix + "t")

    first, second = (right(), left())[::-1] if swap else (left(), right())
    b.output(first, second)
    return b.build()


def test_hash_ignores_names_and_independent_node_order() -> None:
    assert structural_hash(_graph()) == structural_hash(_graph(prefix="other_", swap=True))


def test_hash_sees_attributes_constants_and_shapes() -> None:
    base = structural_hash(_graph())
    assert structural_hash(_graph(perm=(0, 1))) != base
    assert structural_hash(_graph(w=W + 1)) != base
    assert structural_hash(_graph(shape=(3, 4))) != base


def test_identical_subgraphs_hash_equal_and_extract_cleanly() -> None:
    b = GraphBuilder()
    x = b.input("x", (2, 4))
    outs = []
    for i in range(2):
        h = b.op(OpType.MatMul, x if i == 0 else outs[-1], b.constant(np.eye(4, dtype=np.float32)), name=f"mm{i}")
        outs.append(b.op(OpType.Relu, h, name=f"relu{i}"))
    b.output(outs[-1])
    g = b.build()
    assert subgraph_hash(g, ["mm0", "relu0"]) == subgraph_hash(g, ["mm1", "relu1"])
    assert subgraph_hash(g, ["mm0", "relu0"]) != subgraph_hash(g, ["mm0"])
    sub = extract_subgraph(g, ["mm1", "relu1"])
    assert sub.inputs == ("relu0",) and sub.outputs == ("relu1",) and len(sub.constants) == 1


def test_content_digest_is_kept_only_for_read_only_arrays_while_they_live() -> None:
    """A read-only array owning its data (a graph constant) is hashed once; a writeable one every time."""
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    frozen = data.copy()
    frozen.setflags(write=False)
    assert hashing.content_digest(frozen) == hashlib.sha256(frozen.tobytes()).hexdigest()
    assert (
        id(frozen) in hashing._CONTENT
        and hashing.content_digest(frozen.T) == hashlib.sha256(frozen.T.tobytes()).hexdigest()
    )
    before = hashing.content_digest(data)
    data[0, 0] = 99.0  # writeable: never memoised
    assert hashing.content_digest(data) != before and id(data) not in hashing._CONTENT
    key = id(frozen)
    del frozen
    gc.collect()
    assert key not in hashing._CONTENT
