"""The decomposed layer normalisation (ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div [, Mul, Add]) becomes
one LayerNorm, with the same results as onnx's own reference runtime."""

from __future__ import annotations

import numpy as np
import pytest
from fusion_helpers import check_pass, op_names
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType
from fusion.onnx_import.importer import import_model
from fusion.passes.layernorm import fuse_layernorm
from fusion.reference.interpreter import run

RNG = np.random.default_rng(5)


def _decomposed_onnx(with_affine: bool):
    consts = {
        "two": np.float32(2.0),
        "eps": np.float32(1e-5),
        "gamma": RNG.uniform(0.5, 1.5, 16).astype(np.float32),
        "beta": RNG.standard_normal(16).astype(np.float32),
    }
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["m"], axes=[-1]),
        helper.make_node("Sub", ["x", "m"], ["d"]),
        helper.make_node("Pow", ["d", "two"], ["p"]),
        helper.make_node("ReduceMean", ["p"], ["v"], axes=[-1]),
        helper.make_node("Add", ["v", "eps"], ["e"]),
        helper.make_node("Sqrt", ["e"], ["s"]),
        helper.make_node("Div", ["d", "s"], ["n" if with_affine else "y"]),
    ]
    if with_affine:
        nodes += [helper.make_node("Mul", ["n", "gamma"], ["g"]), helper.make_node("Add", ["g", "beta"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "ln",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5, 16])],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("with_affine", [False, True])
def test_decomposed_layernorm_from_onnx_becomes_one_node(with_affine) -> None:
    model = _decomposed_onnx(with_affine)
    out = check_pass(import_model(model), fuse_layernorm, atol=1e-5)
    assert op_names(out) == ["LayerNorm"]
    x = RNG.standard_normal((2, 5, 16)).astype(np.float32)
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    np.testing.assert_allclose(run(out, {"x": x})["y"], want, rtol=1e-5, atol=1e-5)


def test_mul_square_form_matches_and_shared_intermediates_block_it() -> None:
    for expose in (False, True):
        b = GraphBuilder()
        x = b.input("x", (4, 8))
        m = b.op(OpType.ReduceMean, x, axes=(1,), keepdims=1)
        d = b.op(OpType.Sub, x, m)
        v = b.op(OpType.ReduceMean, b.op(OpType.Mul, d, d), axes=(1,), keepdims=1)
        s = b.op(OpType.Sqrt, b.op(OpType.Add, b.constant(np.float32(1e-3)), v))
        b.output(b.op(OpType.Div, d, s))
        if expose:
            b.output(d)  # the centred value is needed elsewhere: the pattern must stay
        out = check_pass(b.build(), fuse_layernorm)
        assert ("LayerNorm" in op_names(out)) is not expose
