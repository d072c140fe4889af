"""int8 residual Adds (`fusion.quant.plan.int8_add`): an Add of a dequantized Conv's output and an int8 value (or
another such output) is int8, at the scale of the Relu that alone reads it (folded) or its own; an Add with a
constant or another float32 operand stays float32 (a Conv read only by such Adds still dequantizes), and so does
an Add of two int8 GEMM outputs. The quantized reference's Add against
an independent emulation (each operand's real value in float32, summed, rounded half to even at the output
scale), and the unfused lowering bit-exact against the reference in race-checked mode."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType
from fusion.lower.compiler import compile
from fusion.quant.calibrate import calibrate
from fusion.quant.plan import plan_quantization
from fusion.reference.quantized import evaluate_quantized, run_quantized

CONV = {"pads": (1, 1, 1, 1), "strides": (1, 1), "dilations": (1, 1), "group": 1}


def _block(seed: int, relu: bool = True, shape: tuple[int, ...] = (1, 4, 6, 6)):
    """x -> Relu "a" (int8 from the stem conv), Conv "b" read only by the Add: y = [Relu](a + b); a second Add
    of b2 (another Conv read only by Adds) and a Sigmoid (float32) output, and a third of a Conv and a constant:
    both float32 Adds."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", shape)
    c = shape[1]

    def conv(name: str, src: str) -> str:
        w = b.constant((rng.standard_normal((c, c, 3, 3)) / 6).astype(np.float32), name=f"w{name}")
        bias = b.constant((rng.standard_normal(c) * 0.1).astype(np.float32), name=f"bias{name}")
        return b.op(OpType.Conv, src, w, bias, name=name, **CONV)

    a = b.op(OpType.Relu, conv("stem", x), name="a")
    s = b.op(OpType.Add, a, conv("b", a), name="s")
    y = b.op(OpType.Relu, s, name="y") if relu else s
    f = b.op(OpType.Add, conv("b2", a), b.op(OpType.Sigmoid, a, name="sig"), name="f")
    k = b.op(OpType.Add, conv("b3", a), b.constant(np.full((1, c, 1, 1), 0.5, np.float32), name="k0"), name="k")
    b.output(y, f, k)
    return b.build(), rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("relu", [True, False])
def test_which_adds_are_int8(relu: bool) -> None:
    graph, x = _block(0, relu)
    params = calibrate(graph, [{"x": x}])
    plan = plan_quantization(graph, params)
    assert plan.matrix["b"].dequantize and plan.scales["b"] is None, "read only by an int8 Add: float32 operand"
    assert plan.scales["s"] == params.scale("y" if relu else "s"), "int8 at the folded Relu's scale, else its own"
    if relu:
        assert plan.scales["y"] == plan.scales["s"], "the Relu keeps its input's scale (int8-preserving)"
    assert plan.matrix["b2"].dequantize and plan.scales["f"] is None, "a float32 (Sigmoid) operand: float32 Add"
    assert plan.matrix["b3"].dequantize and plan.scales["k"] is None, "a constant operand: float32 Add"


def test_an_add_of_two_int8_gemm_outputs_stays_float32() -> None:
    b = GraphBuilder()
    x = b.input("x", (2, 4))
    p = b.op(OpType.MatMul, x, b.constant(np.ones((4, 4), np.float32), name="w1"), name="p")
    q = b.op(OpType.MatMul, x, b.constant(np.eye(4, dtype=np.float32), name="w2"), name="q")
    b.output(b.op(OpType.Add, p, q, name="s"))
    graph = b.build()
    plan = plan_quantization(graph, calibrate(graph, [{"x": np.ones((2, 4), np.float32)}]))
    assert plan.scales["p"] is not None and plan.scales["q"] is not None and plan.scales["s"] is None


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**16), relu=st.booleans())
def test_the_reference_add_is_the_float32_sum_rounded_at_its_scale(seed: int, relu: bool) -> None:
    graph, x = _block(seed, relu)
    params = calibrate(graph, [{"x": x}])
    env = evaluate_quantized(graph, {"x": x}, params)
    a, b, s = env["a"], env["b"], env["s"]
    assert a.scale is not None and b.scale is None and s.scale is not None
    total = a.data.astype(np.float32) * np.float32(a.scale) + b.data  # float32 all the way
    want = np.clip(np.rint(total * np.float32(1.0 / s.scale)), -128, 127)
    np.testing.assert_array_equal(s.data.astype(np.int64), want.astype(np.int64))
    if relu:
        np.testing.assert_array_equal(env["y"].data, np.maximum(s.data, 0))


@pytest.mark.parametrize("relu", [True, False])
def test_the_unfused_int8_add_lowers_bit_exact(relu: bool) -> None:
    """The baseline's elementwise Add (operands dequantized, float32 sum, `v.qnt`) in checked mode, with a
    broadcast float32 constant Add beside it."""
    graph, x = _block(3, relu)
    model = compile(graph, "tiny", "int8", samples=[{"x": x}], cleanup=False)
    assert model.plan is not None and model.plan.scales["s"] is not None
    got, _ = model.run({"x": x}, checked=True)
    want = run_quantized(graph, {"x": x}, model.params)
    for name in graph.outputs:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
