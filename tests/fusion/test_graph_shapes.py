"""Shape inference agrees with the shapes numpy actually produces, and bad shapes name the node at fault."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, mutually_broadcastable_shapes

from fusion.errors import ShapeError
from fusion.graph.builder import GraphBuilder
from fusion.graph.ir import DataType
from fusion.graph.ops import OpType
from fusion.graph.shapes import window_output
from fusion.reference.interpreter import evaluate


def _check(builder: GraphBuilder, out: str) -> None:
    """Recorded types of every value equal the shapes of the arrays the reference computes."""
    builder.output(out)
    graph = builder.build()
    rng = np.random.default_rng(0)
    env = evaluate(graph, {v: rng.standard_normal(graph.types[v].shape).astype(np.float32) for v in graph.inputs})
    for name, value in env.items():
        assert value.shape == graph.types[name].shape, name


@given(mutually_broadcastable_shapes(num_shapes=2, max_dims=4, max_side=4), st.sampled_from(["Add", "Mul", "Sub"]))
def test_broadcast_binary(shapes, op) -> None:
    b = GraphBuilder()
    x, y = b.input("x", shapes.input_shapes[0]), b.input("y", shapes.input_shapes[1])
    out = b.op(OpType[op], x, y)
    assert b.type_of(out).shape == shapes.result_shape
    _check(b, out)


@given(mutually_broadcastable_shapes(signature=np.matmul.signature, max_dims=2, max_side=5))
def test_matmul(shapes) -> None:
    b = GraphBuilder()
    a, c = (b.input(n, s) for n, s in zip("ac", shapes.input_shapes, strict=True))
    out = b.op(OpType.MatMul, a, c)
    assert b.type_of(out).shape == shapes.result_shape
    _check(b, out)


@given(array_shapes(min_dims=1, max_dims=4, max_side=4), st.data())
@settings(max_examples=60)
def test_injective_and_reductions(shape, data) -> None:
    rank = len(shape)
    b = GraphBuilder()
    x = b.input("x", shape)
    perm = data.draw(st.permutations(range(rank)))
    t = b.op(OpType.Transpose, x, perm=perm)
    axes = tuple(sorted(data.draw(st.sets(st.integers(0, rank - 1), min_size=1))))
    r = b.op(OpType.ReduceMean, t, axes=axes, keepdims=data.draw(st.sampled_from([0, 1])))
    axis = data.draw(st.integers(0, rank - 1))
    dim = shape[axis]
    start, end = data.draw(st.integers(0, dim)), data.draw(st.integers(-1, dim))
    step = data.draw(st.sampled_from([1, 2, -1, -2]))
    s = b.op(
        OpType.Slice, x, axes=(axis,), starts=(min(start, dim - 1) if step < 0 else start,), ends=(end,), steps=(step,)
    )
    flat = b.op(OpType.Reshape, x, shape=(int(np.prod(shape)),))
    idx = b.constant(np.array([[0, -1]], np.int64))
    g = b.op(OpType.Gather, x, idx, axis=axis)
    c = b.op(OpType.Concat, x, x, axis=axis)
    parts = b.op_multi(OpType.Split, c, n_outputs=2, axis=axis, sizes=(dim, dim))
    b.output(r, s, flat, g, *parts)
    _check(b, b.op(OpType.Softmax, x, axis=axis))


@given(
    st.integers(1, 12),
    st.integers(1, 4),
    st.integers(1, 3),
    st.integers(1, 2),
    st.integers(0, 2),
    st.integers(0, 2),
    st.booleans(),
)
def test_window_output_matches_counting_windows(size, kernel, stride, dilation, pb, pe, ceil) -> None:
    """Enumerate window starts (padded coordinates): floor mode keeps windows that fit; ceil mode also keeps a
    partial last one, then drops the last window if it starts in the end padding (ONNX / PyTorch rule)."""
    span = (kernel - 1) * dilation + 1
    padded = size + pb + pe
    if padded < span:
        assert window_output(size, kernel, stride, dilation, pb, pe, ceil) == 0
        return
    slack = stride - 1 if ceil else 0
    starts = [s for s in range(0, padded + stride, stride) if s + span <= padded + slack]
    if ceil and starts[-1] >= size + pb:
        starts.pop()
    assert window_output(size, kernel, stride, dilation, pb, pe, ceil) == len(starts)


def test_errors_name_the_node() -> None:
    b = GraphBuilder()
    x, y = b.input("x", (2, 3)), b.input("y", (4, 5))
    with pytest.raises(ShapeError, match=r"'mm'.*inner dimensions"):
        b.op(OpType.MatMul, x, y, name="mm")
    with pytest.raises(ShapeError, match="do not broadcast"):
        b.op(OpType.Add, x, y)
    with pytest.raises(ShapeError, match="cannot reshape"):
        b.op(OpType.Reshape, x, shape=(5,))
    i = b.input("i", (2, 3), DataType.int32)
    with pytest.raises(ShapeError, match="float32"):
        b.op(OpType.Relu, i)
