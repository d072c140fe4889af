"""Property: on random graphs full of removable structure, every pass and the whole pipeline keep the results,
types and output names, and the pipeline leaves no needless Identity, no BatchNorm and no transpose pair."""

from __future__ import annotations

import numpy as np
import pytest
from fusion_helpers import check_pass, op_names
from hypothesis import given, settings
from hypothesis import strategies as st

from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType
from fusion.passes.pipeline import CLEANUP_PASSES, cleanup

SHAPE = (2, 3, 4, 4)


@st.composite
def graphs(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    b = GraphBuilder("random")
    values = [b.input("x", SHAPE)]
    for _ in range(draw(st.integers(1, 12))):
        v = draw(st.sampled_from(values))
        kind = draw(
            st.sampled_from(
                ["relu", "tanh", "add0", "mul1", "id", "tpair", "bn", "const", "dup", "addv", "noops", "shape", "act"]
            )
        )
        if kind in ("relu", "tanh"):
            values.append(b.op(OpType.Relu if kind == "relu" else OpType.Tanh, v))
        elif kind == "add0":
            values.append(b.op(OpType.Add, v, b.constant(np.zeros(4, np.float32))))
        elif kind == "mul1":
            values.append(b.op(OpType.Mul, b.constant(np.float32(1)), v))
        elif kind == "id":
            values.append(b.op(OpType.Identity, v))
        elif kind == "tpair":
            perm = draw(st.permutations(range(4)))
            inverse = tuple(int(i) for i in np.argsort(perm))
            values.append(b.op(OpType.Transpose, b.op(OpType.Transpose, v, perm=perm), perm=inverse))
        elif kind == "bn":
            params = [rng.uniform(0.5, 1.5, 3).astype(np.float32) for _ in range(4)]
            values.append(b.op(OpType.BatchNorm, v, *(b.constant(p) for p in params), epsilon=1e-5))
        elif kind == "const":
            c = b.op(OpType.Sqrt, b.constant(rng.uniform(1, 2, SHAPE).astype(np.float32)))
            values.append(b.op(OpType.Mul, v, c))
        elif kind == "noops":  # exporters' float32 casts, same-shape expands, empty pads, open clips
            w = b.op(OpType.Expand, b.op(OpType.Cast, v, to="float32"), shape=SHAPE)
            w = b.op(OpType.Pad, w, pads=(0,) * 8, mode="constant", value=0.0)
            values.append(b.op(OpType.Clip, w, min=-np.inf, max=np.inf))
        elif kind == "shape":  # v * float(v.shape[3]): a shape computation the constant folder removes
            dim = b.op(OpType.Cast, b.op(OpType.Shape, v, start=3, end=4), to="float32")
            values.append(b.op(OpType.Mul, v, dim))
        elif kind == "act":
            op = draw(st.sampled_from([OpType.HardSwish, OpType.HardSigmoid, OpType.Clip, OpType.Neg, OpType.Sin]))
            attrs = {OpType.HardSigmoid: {"alpha": 0.2, "beta": 0.5}, OpType.Clip: {"min": 0.0, "max": 6.0}}
            values.append(b.op(op, v, **attrs.get(op, {})))
        elif kind == "dup":
            values.append(b.op(OpType.Add, b.op(OpType.Sigmoid, v), b.op(OpType.Sigmoid, v)))
        else:
            values.append(b.op(OpType.Add, v, draw(st.sampled_from(values))))
    b.output(values[-1])
    return b.build()


@pytest.mark.parametrize("run_pass", CLEANUP_PASSES, ids=lambda p: p.__name__)
@given(graph=graphs())
@settings(max_examples=25, deadline=None)
def test_each_pass_preserves_results(run_pass, graph) -> None:
    check_pass(graph, run_pass, atol=1e-4)


@given(graph=graphs())
@settings(max_examples=40, deadline=None)
def test_pipeline_removes_all_removable_structure(graph) -> None:
    out = check_pass(graph, cleanup, atol=1e-4)
    assert not {"BatchNorm", "Transpose", "Cast", "Expand", "Pad", "Shape"} & set(op_names(out))
    for node in out.nodes:  # an Identity survives only to give a graph input a graph output's name
        assert node.op != OpType.Identity or (node.inputs[0] in out.inputs and node.outputs[0] in out.outputs)
    assert len(out.constants) == len({(a.shape, a.tobytes()) for a in out.constants.values()})
