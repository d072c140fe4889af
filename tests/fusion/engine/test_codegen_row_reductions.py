"""Vector chains through a last-axis reduction (RMSNorm as exported: Pow, ReduceMean, Add eps, Sqrt, 1 / that,
Mul by the input, Mul by the weight; mean-centering): the per-row values stay in registers and reach the
output-shaped nodes as `.vc` broadcasts. Random shapes (hypothesis), simulated in checked (race-detecting) mode:
int8 bit-exact against the quantized reference, fp32 within 1e-5 of the reference and bit-identical to the
same nodes run as unfused kernels one after the other."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import context, run_group
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fusion.engine.candidates import enumerate_candidates
from fusion.engine.errors import CodegenError
from fusion.engine.execute import run_kernel
from fusion.engine.kernel import build_kernel, try_build
from fusion.engine.plan import Group
from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType


def _rms_graph(shape: tuple[int, ...], eps: float, weight_first: bool, reciprocal: str, seed: int):
    """RMSNorm of x over its last axis, as torch exports it; `reciprocal`: "div1" (Div(1, s)), "recip"
    (Reciprocal(s)) or "divide" (Div(x, s), no separate reciprocal)."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("rms")
    x = b.input("x", shape)
    sq = b.op(OpType.Pow, x, b.constant(np.array(2.0, np.float32)), name="pow")
    mean = b.op(OpType.ReduceMean, sq, name="mean", axes=(len(shape) - 1,), keepdims=1)
    var = b.op(OpType.Add, mean, b.constant(np.array(eps, np.float32)), name="eps")
    s = b.op(OpType.Sqrt, var, name="sqrt")
    if reciprocal == "divide":
        names = ["pow", "mean", "eps", "sqrt", "norm"]
        h = b.op(OpType.Div, x, s, name="norm")
    else:
        if reciprocal == "div1":
            r = b.op(OpType.Div, b.constant(np.array(1.0, np.float32)), s, name="inv")
        else:
            r = b.op(OpType.Reciprocal, s, name="inv")
        h = b.op(OpType.Mul, x, r, name="norm")
        names = ["pow", "mean", "eps", "sqrt", "inv", "norm"]
    w = b.constant((1.0 + 0.1 * rng.standard_normal(shape[-1])).astype(np.float32))
    h = b.op(OpType.Mul, *((w, h) if weight_first else (h, w)), name="scale")
    b.output(h)
    return b.build(), (*names, "scale")


def _check(graph, chain, shape, dtype, seed=1):
    inputs = {"x": (np.random.default_rng(seed).standard_normal(shape) * 2).astype(np.float32)}
    mc = context(graph, inputs, dtype)
    kernel, fused, env = run_group(mc, Group(chain, "chain"), inputs)
    mnemonics = [i.mnemonic for i in kernel.program.instructions()]
    assert "vc.rsum" in mnemonics and not any(m.startswith("v.") for m in mnemonics)
    out = graph.node(chain[-1]).outputs[0]
    if dtype == "int8":
        np.testing.assert_array_equal(fused.outputs[out], env[out])
    else:
        np.testing.assert_allclose(fused.outputs[out], env[out], rtol=1e-5, atol=1e-5)
        step = dict(env)
        for name in chain:
            unfused = run_kernel(mc, build_kernel(mc, Group((name,), "unfused")), step, checked=True)
            step.update(unfused.outputs)
        np.testing.assert_array_equal(fused.outputs[out], step[out])


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lead=st.lists(st.integers(1, 3), min_size=0, max_size=2),
    rows=st.integers(1, 40),
    cols=st.integers(2, 160),
    eps=st.sampled_from([1e-6, 1e-5, 0.1]),
    weight_first=st.booleans(),
    reciprocal=st.sampled_from(["div1", "recip", "divide"]),
    dtype=st.sampled_from(["fp32", "int8"]),
)
def test_rms_norm_is_one_chain_over_random_shapes(lead, rows, cols, eps, weight_first, reciprocal, dtype) -> None:
    shape = (*lead, rows, cols)
    graph, chain = _rms_graph(shape, eps, weight_first, reciprocal, seed=rows * cols)
    _check(graph, chain, shape, dtype)


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_rms_norm_chain_is_a_candidate_and_rows_longer_than_a_slot_split(dtype) -> None:
    shape = (1, 16, 128)
    graph, chain = _rms_graph(shape, 1e-6, True, "div1", seed=3)
    assert any(c.family == "chain" and c.nodes == chain for c in enumerate_candidates(graph))
    _check(graph, chain, shape, dtype)
    tall = (300, 64)  # more rows than one vector register holds: several steps, whole rows each
    graph, chain = _rms_graph(tall, 1e-5, False, "recip", seed=4)
    _check(graph, chain, tall, dtype)


def _centre_graph(shape: tuple[int, ...], axis: int, keepdims: int):
    b = GraphBuilder("centre")
    x = b.input("x", shape)
    m = b.op(OpType.ReduceMean, x, name="mean", axes=(axis,), keepdims=keepdims)
    h = b.op(OpType.Sub, x, m, name="centre")
    h = b.op(OpType.Mul, h, h, name="square")
    b.output(h)
    return b.build(), ("mean", "centre", "square")


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_a_per_row_value_is_the_second_operand_of_a_sub(dtype) -> None:
    graph, chain = _centre_graph((3, 8, 24), 2, 1)
    _check(graph, chain, (3, 8, 24), dtype)


@pytest.mark.parametrize(
    ("shape", "axis", "keepdims"),
    [((3, 8, 24), 1, 1), ((8, 8), 1, 0)],  # another axis; the last without keeping it (a row broadcast after)
)
def test_other_reductions_are_refused_with_a_reason(shape, axis, keepdims) -> None:
    graph, chain = _centre_graph(shape, axis, keepdims)
    mc = context(graph, {"x": np.ones(shape, np.float32)}, "fp32")
    with pytest.raises(CodegenError, match="last axis only"):
        build_kernel(mc, Group(chain, "chain"))


def test_a_per_row_node_with_a_tile_operand_or_a_broadcast_first_operand_is_refused() -> None:
    b = GraphBuilder("bad")
    x = b.input("x", (4, 16))
    y = b.input("y", (4, 1))
    m = b.op(OpType.ReduceSum, x, name="sum", axes=(1,), keepdims=1)
    t = b.op(OpType.Add, m, y, name="plus")  # per-row, with an external per-row tensor
    h = b.op(OpType.Mul, x, t, name="scale")
    d = b.op(OpType.Div, t, h, name="ratio")  # the per-row value first in a non-commutative op
    b.output(d)
    graph = b.build()
    inputs = {"x": np.ones((4, 16), np.float32), "y": np.ones((4, 1), np.float32)}
    mc = context(graph, inputs, "fp32")
    assert "must be a scalar constant" in try_build(mc, Group(("sum", "plus", "scale"), "chain"))
    b2 = GraphBuilder("bad2")
    x = b2.input("x", (4, 16))
    m = b2.op(OpType.ReduceSum, x, name="sum", axes=(1,), keepdims=1)
    b2.output(b2.op(OpType.Div, m, x, name="ratio"))
    graph2 = b2.build()
    mc2 = context(graph2, {"x": np.ones((4, 16), np.float32)}, "fp32")
    assert "broadcast first operand" in try_build(mc2, Group(("sum", "ratio"), "chain"))
