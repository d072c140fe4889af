"""MaxPool on the vector unit in the baseline compiler (the frame kernels of `frame_pool`, and shifted `v.max`
over bands of the padded input where they do not apply): 1-D and 2-D, strides, dilations, asymmetric padding,
ceil mode, against the numpy reference (fp32) and the quantized reference (int8 bit-exact), compiled and
simulated in checked mode on `tiny` (bands of rows, blocks of channels)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lower_helpers import check_both

from assembler.disasm import disassemble
from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType
from fusion.lower.compiler import compile as compile_model


def _graph(c, spatial, kernel, strides, dilations, pads, ceil, relu_before):
    b = GraphBuilder("pool")
    x = b.input("x", (2, c, *spatial))
    if relu_before:  # an int8 input (the Relu's output) as well as a float graph input
        x = b.op(OpType.Relu, x, name="relu")
    attrs = {"kernel": kernel, "strides": strides, "pads": pads, "dilations": dilations, "ceil_mode": int(ceil)}
    b.output(b.op(OpType.MaxPool, x, name="pool", **attrs))
    return b.build()


@st.composite
def pools(draw):
    s = draw(st.sampled_from([1, 2]))
    kernel = tuple(draw(st.sampled_from([1, 2, 3])) for _ in range(s))
    dilations = tuple(draw(st.sampled_from([1, 2])) for _ in range(s))
    pads = tuple(draw(st.integers(0, (k - 1) // 1 if k > 1 else 0)) for k in kernel for _ in range(1)) * 2
    spatial = tuple(draw(st.integers((k - 1) * d + 1, 12)) for k, d in zip(kernel, dilations, strict=True))
    strides = tuple(draw(st.sampled_from([1, 2, 3])) for _ in range(s))
    return (
        draw(st.sampled_from([1, 6])),
        spatial,
        kernel,
        strides,
        dilations,
        pads,
        draw(st.booleans()),
        draw(st.booleans()),
    )


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=pools())
def test_every_max_pool_variant_matches_the_references(case: tuple) -> None:
    check_both(_graph(*case))


def test_max_pool_is_shifted_vector_max_without_window_copies() -> None:
    """An odd height with a row stride of 2 has no frame (`frame_pool`): the padded-band kernel runs it."""
    graph = _graph(16, (25, 24), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), False, False)
    model = compile_model(graph, "base", "fp32")
    text = disassemble(model.program)
    x = np.random.default_rng(0).standard_normal((2, 16, 25, 24)).astype(np.float32)
    _, counters = model.run({"x": x}, checked=True)
    maxes = text.count("v.max ")
    assert maxes and maxes % 8 == 0  # each step: 9 taps, 8 shifted maxima over its whole tile
    assert counters.dram_read_bytes < 9 * x.nbytes  # not one window copy per tap
