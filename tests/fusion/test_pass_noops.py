"""No-op removal drops nodes that forward their input unchanged, and nothing else."""

from __future__ import annotations

import numpy as np
from fusion_helpers import check_pass, op_names

from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType
from fusion.passes.noops import remove_noops


def test_noops_are_removed() -> None:
    b = GraphBuilder()
    x = b.input("x", (2, 3))
    v = b.op(OpType.Identity, x)
    v = b.op(OpType.Reshape, v, shape=(2, 3))
    v = b.op(OpType.Transpose, v, perm=(0, 1))
    v = b.op(OpType.Slice, v, axes=(0, 1), starts=(0, 0), ends=(2, 3), steps=(1, 1))
    v = b.op(OpType.Add, v, b.constant(np.zeros(3, np.float32)))
    v = b.op(OpType.Mul, b.constant(np.float32(1)), v)
    v = b.op(OpType.Div, v, b.constant(np.ones((1, 3), np.float32)))
    v = b.op(OpType.Concat, v, axis=0)
    b.output(b.op(OpType.Relu, v))
    out = check_pass(b.build(), remove_noops)
    assert op_names(out) == ["Relu"] and out.nodes[0].inputs == ("x",)


def test_lookalikes_are_kept() -> None:
    b = GraphBuilder()
    x = b.input("x", (2, 3))
    kept = [
        b.op(OpType.Reshape, x, shape=(3, 2)),
        b.op(OpType.Transpose, x, perm=(1, 0)),
        b.op(OpType.Slice, x, axes=(1,), starts=(0,), ends=(3,), steps=(2,)),
        b.op(OpType.Add, x, b.constant(np.zeros((2, 2, 3), np.float32))),  # broadcasting changes the shape
        b.op(OpType.Sub, b.constant(np.zeros(3, np.float32)), x),  # 0 - x is not x
        b.op(OpType.Mul, x, b.constant(np.full(3, 2, np.float32))),
    ]
    b.output(*kept, b.op(OpType.Identity, x))  # an Identity that is a graph output keeps its name
    g = b.build()
    out = check_pass(g, remove_noops)
    assert op_names(out) == op_names(g)


def test_noop_before_a_graph_output_hands_its_name_to_the_producer() -> None:
    b = GraphBuilder()
    x = b.input("x", (2, 3))
    r = b.op(OpType.Relu, x, name="relu")
    b.output(b.op(OpType.Identity, r, name="out"), b.op(OpType.Tanh, r))
    out = check_pass(b.build(), remove_noops)
    assert op_names(out) == ["Relu", "Tanh"]
    assert out.node("relu").outputs == ("out",) and out.nodes[1].inputs == ("out",)


def test_shape_preserving_casts_expands_pads_and_open_clips_are_removed() -> None:
    b = GraphBuilder()
    x = b.input("x", (2, 3))
    v = b.op(OpType.Cast, x, to="float32")
    v = b.op(OpType.Expand, v, shape=(2, 3))
    v = b.op(OpType.Pad, v, pads=(0, 0, 0, 0), mode="constant", value=0.0)
    v = b.op(OpType.Clip, v, min=-np.inf, max=np.inf)
    b.output(b.op(OpType.Relu, v))
    out = check_pass(b.build(), remove_noops)
    assert op_names(out) == ["Relu"] and out.nodes[0].inputs == ("x",)


def test_working_casts_expands_pads_and_clips_are_kept() -> None:
    b = GraphBuilder()
    x = b.input("x", (2, 3))
    v = b.op(OpType.Expand, x, shape=(4, 2, 3))
    v = b.op(OpType.Pad, v, pads=(0, 0, 1, 0, 0, 0), mode="edge", value=0.0)
    v = b.op(OpType.Clip, v, min=0.0, max=np.inf)
    v = b.op(OpType.Cast, b.op(OpType.Cast, v, to="int64"), to="float32")
    b.output(v)
    out = check_pass(b.build(), remove_noops)
    assert op_names(out) == ["Expand", "Pad", "Clip", "Cast", "Cast"]
