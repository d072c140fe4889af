"""Shape-only subgraphs (attention masks, causal masks, position ids built from Shape) fold to constants at import
for the shapes at hand, and re-typing the graph for other shapes (with_input_shapes) keeps what stays valid and
refuses, naming the node, what was folded for the old shapes: never a silently wrong result."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from fusion.errors import ShapeError
from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType
from fusion.graph.shapes import with_input_shapes
from fusion.onnx_import.importer import import_model
from fusion.passes.constant_fold import fold_constants
from fusion.passes.pipeline import cleanup
from fusion.reference.interpreter import run

RNG = np.random.default_rng(3)
F, I64 = TensorProto.FLOAT, TensorProto.INT64
S, H = 6, 8
SHAPE_OPS = {"Shape", "ConstantOfShape", "Range", "Equal", "Less", "LessOrEqual", "Not", "Cast", "Trilu", "Where"}


def _c(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


def _n(op, ins, outs, **attrs):
    return helper.make_node(op, ins, outs, name=outs[0], **attrs)


def _model(nodes, inits, batch="B"):
    graph = helper.make_graph(
        nodes,
        "masks",
        [helper.make_tensor_value_info("x", F, [batch, S, H])],
        [helper.make_tensor_value_info("y", F, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _ort(model, x):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(["y"], {"x": x})[0]


def _position_ids_model():
    """x + pos_emb[range(seq_len)] with seq_len read from Shape(x): depends on dim 1 of x only."""
    nodes = [
        _n("Shape", ["x"], ["shape"]),
        _n("Gather", ["shape", "one"], ["seq"], axis=0),
        _n("Range", ["zero", "seq", "one"], ["pos"]),
        _n("Unsqueeze", ["pos", "ax0"], ["pos2"]),
        _n("Gather", ["table", "pos2"], ["emb"], axis=0),
        _n("Add", ["x", "emb"], ["y"]),
    ]
    inits = [
        _c("one", np.int64(1)),
        _c("zero", np.int64(0)),
        _c("ax0", np.array([0], np.int64)),
        _c("table", RNG.standard_normal((32, H)).astype(np.float32)),
    ]
    return _model(nodes, inits)


def _mask_model():
    """BERT-style padding mask from ConstantOfShape(Shape(x)[0:2]) plus a causal mask (Trilu, LessOrEqual on
    Range), applied to x @ x^T scores: depends on dims 0 and 1 of x."""
    ones = numpy_helper.from_array(np.ones(1, np.int64))
    nodes = [
        _n("Shape", ["x"], ["shape"]),
        _n("Slice", ["shape", "s0", "s2"], ["bs"]),
        _n("ConstantOfShape", ["bs"], ["attn"], value=ones),
        _n("Unsqueeze", ["attn", "ax12"], ["attn4"]),
        _n("Cast", ["attn4"], ["attnf"], to=F),
        _n("Sub", ["onef", "attnf"], ["inv"]),
        _n("Mul", ["inv", "neg"], ["pad_bias"]),
        _n("Gather", ["shape", "one"], ["seq"], axis=0),
        _n("Range", ["zero", "seq", "one"], ["r"]),
        _n("Unsqueeze", ["r", "ax0"], ["row"]),
        _n("Unsqueeze", ["r", "ax1"], ["col"]),
        _n("LessOrEqual", ["row", "col"], ["keep"]),
        _n("Not", ["keep"], ["drop"]),
        _n("Where", ["drop", "neg", "zerof"], ["causal"]),
        _n("Trilu", ["causal"], ["causal_t"], upper=1),
        _n("Add", ["pad_bias", "causal_t"], ["bias"]),
        _n("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
        _n("MatMul", ["x", "xt"], ["scores"]),
        _n("Unsqueeze", ["scores", "ax1"], ["scores4"]),
        _n("Add", ["scores4", "bias"], ["masked"]),
        _n("Softmax", ["masked"], ["y"], axis=-1),
    ]
    inits = [
        _c("s0", np.array([0], np.int64)),
        _c("s2", np.array([2], np.int64)),
        _c("ax12", np.array([1, 2], np.int64)),
        _c("ax0", np.array([0], np.int64)),
        _c("ax1", np.array([1], np.int64)),
        _c("one", np.int64(1)),
        _c("zero", np.int64(0)),
        _c("onef", np.float32(1.0)),
        _c("zerof", np.float32(0.0)),
        _c("neg", np.float32(-1e4)),
    ]
    return _model(nodes, inits)


def _x(batch, seq=S):
    return RNG.standard_normal((batch, seq, H)).astype(np.float32)


def test_mask_subgraph_folds_at_import_and_matches_onnxruntime() -> None:
    model = _mask_model()
    graph = import_model(model, input_shapes={"x": (2, S, H)})
    assert not {n.op.value for n in graph.nodes} & SHAPE_OPS, [n.op.value for n in graph.nodes]
    x = _x(2)
    np.testing.assert_allclose(run(graph, {"x": x})["y"], _ort(model, x), rtol=1e-5, atol=1e-6)
    assert {(a.value, a.axis) for a in graph.assumptions} >= {("x", 0), ("x", 1)}


def test_position_ids_depend_on_the_sequence_dim_only() -> None:
    model = _position_ids_model()
    graph = cleanup(import_model(model, input_shapes={"x": (2, S, H)}))
    assert {n.op for n in graph.nodes} == {OpType.Add}
    assert {(a.value, a.axis, a.size) for a in graph.assumptions} == {("x", 1, S)}
    bigger = with_input_shapes(graph, {"x": (5, S, H)})  # another batch size keeps the folded ids valid
    x = _x(5)
    np.testing.assert_allclose(run(bigger, {"x": x})["y"], _ort(model, x), rtol=1e-6)
    with pytest.raises(ShapeError, match=r"node 'y'.*dim 1 of 'x' = 6.*import the model again"):
        with_input_shapes(graph, {"x": (2, S + 1, H)})


def test_a_batch_dependent_mask_refuses_another_batch_naming_the_node() -> None:
    graph = import_model(_mask_model(), input_shapes={"x": (2, S, H)})
    with pytest.raises(ShapeError, match=r"dim 0 of 'x' = 2"):
        with_input_shapes(graph, {"x": (3, S, H)})


def test_a_divisor_folded_from_the_sequence_length_is_never_silently_stale() -> None:
    """mean over the sequence written as ReduceSum / Shape(x)[1]: at another sequence length the folded divisor
    would be wrong while every shape still fits; the re-typing refuses instead."""
    nodes = [
        _n("ReduceSum", ["x", "ax1"], ["total"], keepdims=0),
        _n("Shape", ["x"], ["shape"]),
        _n("Gather", ["shape", "one"], ["seq"], axis=0),
        _n("Cast", ["seq"], ["seqf"], to=F),
        _n("Div", ["total", "seqf"], ["y"]),
    ]
    model = _model(nodes, [_c("ax1", np.array([1], np.int64)), _c("one", np.int64(1))])
    graph = cleanup(import_model(model, input_shapes={"x": (2, S, H)}))
    x = _x(2)
    np.testing.assert_allclose(run(graph, {"x": x})["y"], _ort(model, x), rtol=1e-5)
    assert with_input_shapes(graph, {"x": (4, S, H)}).types["y"].shape == (4, H)
    with pytest.raises(ShapeError, match=r"node 'y'.*dim 1 of 'x'"):
        with_input_shapes(graph, {"x": (2, 2 * S, H)})


def test_a_resolved_reshape_target_is_not_reused_for_other_dims() -> None:
    """Reshape(x, [0, -1]) resolved to (2, 48): an input of the same size but other dims must not reuse it."""
    model = _model([_n("Reshape", ["x", "target"], ["y"])], [_c("target", np.array([0, -1], np.int64))])
    graph = import_model(model, input_shapes={"x": (2, S, H)})
    with pytest.raises(ShapeError, match="dim 0 of 'x' = 2"):
        with_input_shapes(graph, {"x": (4, S // 2, H)})  # same element count


def test_constant_fold_pass_folds_shape_and_records_the_assumption() -> None:
    b = GraphBuilder("g")
    x = b.input("x", (2, 3))
    s = b.op(OpType.Shape, x, start=1, end=2)
    sf = b.op(OpType.Cast, s, to="float32")
    b.output(b.op(OpType.Mul, x, sf))
    folded = fold_constants(b.build())
    assert [n.op for n in folded.nodes] == [OpType.Mul]
    np.testing.assert_allclose(run(folded, {"x": np.ones((2, 3), np.float32)})[folded.outputs[0]], 3.0)
    assert with_input_shapes(folded, {"x": (5, 3)}).types[folded.outputs[0]].shape == (5, 3)
    with pytest.raises(ShapeError, match="dim 1 of 'x' = 3"):
        with_input_shapes(folded, {"x": (2, 4)})


def test_assumptions_survive_the_cleanup_passes_and_pickling() -> None:
    import pickle

    graph = cleanup(import_model(_mask_model(), input_shapes={"x": (2, S, H)}))
    assert graph.assumptions
    assert pickle.loads(pickle.dumps(graph)).assumptions == graph.assumptions


def test_a_slice_reaching_past_a_smaller_dim_is_refused_at_re_typing() -> None:
    """x[:, 0:5] imported for seq 6 (no clamping, so no assumption) cannot run at seq 4: a ShapeError names the
    node instead of an IndexError at run time."""
    model = _model(
        [_n("Slice", ["x", "s", "e", "a"], ["y"])],
        [_c("s", np.array([0], np.int64)), _c("e", np.array([5], np.int64)), _c("a", np.array([1], np.int64))],
    )
    graph = import_model(model, input_shapes={"x": (2, S, H)})
    assert with_input_shapes(graph, {"x": (3, S, H)}).types["y"].shape == (3, 5, H)
    with pytest.raises(ShapeError, match=r"'y'.*reaches outside"):
        with_input_shapes(graph, {"x": (2, 4, H)})


def _shape_dependent_models() -> dict:
    """Small models whose import resolves something against the input's dims."""
    i64 = lambda name, v: _c(name, np.array(v, np.int64))  # noqa: E731
    return {
        "position_ids": _position_ids_model(),
        "masks": _mask_model(),
        "reshape_copy_infer": _model([_n("Reshape", ["x", "t"], ["y"])], [i64("t", [0, -1])]),
        "reshape_copy": _model([_n("Reshape", ["x", "t"], ["y"])], [i64("t", [0, 0, 2, H // 2])]),
        "flatten": _model([_n("Flatten", ["x"], ["y"], axis=2)], []),
        "slice_to_end": _model(
            [_n("Slice", ["x", "s", "e", "a"], ["y"])], [i64("s", [1]), i64("e", [2**62]), i64("a", [1])]
        ),
        "slice_from_back": _model(
            [_n("Slice", ["x", "s", "e", "a"], ["y"])], [i64("s", [-2]), i64("e", [-1]), i64("a", [1])]
        ),
        "split_even": _model([_n("Split", ["x"], ["y", "z"], axis=2)], []),
        "expand_from_shape": _model(
            [_n("Shape", ["x"], ["s"]), _n("Expand", ["b", "s"], ["e"]), _n("Add", ["x", "e"], ["y"])],
            [_c("b", RNG.standard_normal((1, 1, H)).astype(np.float32))],
        ),
        "constant_reshape": _model([_n("Reshape", ["x", "t"], ["y"])], [i64("t", [-1, H])]),
    }


def _symbolic_sequence(models: dict) -> dict:
    for model in models.values():
        model.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "T"
    return models


MODELS = _symbolic_sequence(_shape_dependent_models())


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(sorted(MODELS)),
    st.tuples(st.integers(1, 3), st.integers(2, 5)),
    st.tuples(st.integers(1, 3), st.integers(2, 5)),
)
def test_re_typing_is_refused_or_equal_to_a_fresh_import(name, first, second) -> None:
    """The oracle: importing the model afresh at the new shapes. Whenever with_input_shapes accepts the new shapes,
    the re-typed graph computes exactly what the fresh import does (and onnxruntime)."""
    model = MODELS[name]
    seq_first, seq_second = first[1] * 2, second[1] * 2  # even, for the Split
    graph = cleanup(import_model(model, input_shapes={"x": (first[0], seq_first, H)}))
    shape = (second[0], seq_second, H)
    try:
        retyped = with_input_shapes(graph, {"x": shape})
    except ShapeError:
        return
    x = RNG.standard_normal(shape).astype(np.float32)
    fresh = run(import_model(model, input_shapes={"x": shape}), {"x": x})
    got = run(retyped, {"x": x})
    for out in graph.outputs:
        np.testing.assert_array_equal(got[out], fresh[out])
    np.testing.assert_allclose(got["y"], _ort(model, x), rtol=1e-5, atol=1e-6)
