"""Constant selections that are views (`fusion.engine.views.slab_offset`): a Gather or Slice whose elements are one
contiguous run of the input. Random shapes, axes, indices and slices against the reference interpreter on
np.arange data (which also says whether the selection is contiguous: the offset must be found exactly then), and
a class-token select feeding a GEMM run as an address offset in one program, equal to host execution and the
reference in both dtypes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fusion.engine.engine import EngineOptions, FusionEngine
from fusion.engine.validation import ValidationPolicy
from fusion.engine.views import apply_view, is_view, slab_offset
from fusion.graph.builder import GraphBuilder
from fusion.graph.ir import DataType, Graph
from fusion.graph.ops import OpType
from fusion.reference.interpreter import evaluate


@st.composite
def selections(draw) -> Graph:
    """x[shape] -> a Gather (scalar or 1-D constant index, any axis) or a Slice (some axes, any steps)."""
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=4)))
    b = GraphBuilder("select")
    x = b.input("x", shape)
    if draw(st.booleans()):
        axis = draw(st.integers(0, len(shape) - 1))
        dim = shape[axis]
        index = draw(
            st.integers(-dim, dim - 1)
            | st.lists(st.integers(-dim, dim - 1), min_size=1, max_size=3)
            | st.integers(0, dim - 1).flatmap(lambda s: st.integers(1, dim - s).map(lambda n: list(range(s, s + n))))
        )
        idx = b.constant(np.asarray(index, dtype=np.int64), "idx")
        b.output(b.op(OpType.Gather, x, idx, name="sel", axis=axis))
    else:
        axes = draw(st.lists(st.integers(0, len(shape) - 1), min_size=1, max_size=len(shape), unique=True))
        starts, ends, steps = [], [], []
        for a in axes:
            start = draw(st.integers(0, shape[a] - 1))
            starts.append(start)
            ends.append(draw(st.integers(start + 1, shape[a])))
            steps.append(draw(st.sampled_from((1, 1, 2))))
        b.output(
            b.op(
                OpType.Slice,
                x,
                name="sel",
                axes=tuple(axes),
                starts=tuple(starts),
                ends=tuple(ends),
                steps=tuple(steps),
            )
        )
    return b.build()


@settings(max_examples=200, deadline=None)
@given(graph=selections())
def test_a_selection_is_a_view_exactly_when_its_elements_are_one_contiguous_run(graph: Graph) -> None:
    node = graph.node("sel")
    data = np.arange(int(np.prod(graph.types["x"].shape))).reshape(graph.types["x"].shape)
    want = evaluate(graph, {"x": data.astype(np.float32)})["sel"].astype(np.int64)
    flat = want.ravel()
    contiguous = flat.size > 0 and (flat == np.arange(flat[0], flat[0] + flat.size)).all()
    offset = slab_offset(graph, node)
    assert (offset is not None) == contiguous and is_view(graph, node) == contiguous
    if contiguous:
        assert offset == flat[0]
        np.testing.assert_array_equal(apply_view(graph, node, data), want)


def test_a_gather_of_computed_indices_or_a_reversing_slice_is_no_view() -> None:
    b = GraphBuilder("not_views")
    x = b.input("x", (1, 6, 4))
    b.output(b.op(OpType.Gather, x, b.input("i", (1,), DataType.int64), name="computed", axis=1))
    b.output(b.op(OpType.Slice, x, name="reversed", axes=(1,), starts=(4,), ends=(1,), steps=(-1,)))
    graph = b.build()
    assert not is_view(graph, graph.node("computed")) and not is_view(graph, graph.node("reversed"))


def _class_token_graph(rows: int, k: int, n: int, index: int) -> Graph:
    """x[1, rows, k] -> Relu -> Gather(axis 1, `index`) -> Gemm(W[k, n], bias): a ViT's head on its class token."""
    rng = np.random.default_rng(5)
    b = GraphBuilder("class_token_head")
    h = b.op(OpType.Relu, b.input("x", (1, rows, k)), name="relu")
    token = b.op(OpType.Gather, h, b.constant(np.asarray(index, np.int64), "idx"), name="select", axis=1)
    w = b.constant((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), "w")
    bias = b.constant((0.1 * rng.standard_normal(n)).astype(np.float32), "bias")
    b.output(b.op(OpType.Gemm, token, w, bias, name="head"))
    return b.build()


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
@pytest.mark.parametrize("index", [0, 5, -1])
def test_a_class_token_select_is_an_address_offset_in_one_program(dtype: str, index: int) -> None:
    graph = _class_token_graph(17, 48, 10, index)
    x = np.random.default_rng(6).standard_normal((1, 17, 48)).astype(np.float32)
    off = ValidationPolicy("off")
    host = FusionEngine(graph, "base", dtype, EngineOptions(validation=off, execution="host")).run({"x": x})
    prog = FusionEngine(graph, "base", dtype, EngineOptions(validation=off, execution="program")).run({"x": x})
    selects = [r for r in host.records if r.nodes == ("select",)]
    assert len(selects) == 1 and selects[0].measured_cycles == 0  # a view: no kernel
    np.testing.assert_array_equal(prog.outputs["head"], host.outputs["head"])
    want = evaluate(graph, {"x": x})["head"]
    tol = 1e-5 if dtype == "fp32" else 0.05 * np.abs(want).max()  # int8: the quantized reference's error
    np.testing.assert_allclose(host.outputs["head"], want, rtol=tol, atol=tol)
