"""The reference's windowed kernels (im2col conv, pools) and non-linear ops against PyTorch as an independent oracle."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType
from fusion.reference.interpreter import run

torch = pytest.importorskip("torch", reason="torch (test-only dependency) is not installed")
F = torch.nn.functional


def _run_one(op: OpType, x: np.ndarray, *consts: np.ndarray, **attrs) -> np.ndarray:
    b = GraphBuilder()
    inp = b.input("x", x.shape)
    out = b.op(op, inp, *(b.constant(c) for c in consts), **attrs)
    b.output(out)
    return run(b.build(), {"x": x})[out]


@st.composite
def conv_cases(draw):
    group = draw(st.sampled_from([1, 2]))
    c, m = group * draw(st.integers(1, 3)), group * draw(st.integers(1, 3))
    k = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    stride = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    dil = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    pad = draw(st.integers(0, 2))
    size = (draw(st.integers(4, 8)), draw(st.integers(4, 8)))
    return group, c, m, k, stride, dil, pad, size


@given(conv_cases(), st.booleans())
@settings(max_examples=40, deadline=None)
def test_conv_matches_torch(case, with_bias) -> None:
    group, c, m, k, stride, dil, pad, size = case
    assume(all(s + 2 * pad >= (kk - 1) * d + 1 for s, kk, d in zip(size, k, dil, strict=True)))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, c, *size)).astype(np.float32)
    w = rng.standard_normal((m, c // group, *k)).astype(np.float32)
    bias = rng.standard_normal(m).astype(np.float32)
    consts = (w, bias) if with_bias else (w,)
    got = _run_one(OpType.Conv, x, *consts, strides=stride, dilations=dil, pads=(pad,) * 4, group=group)
    want = F.conv2d(
        torch.tensor(x), torch.tensor(w), torch.tensor(bias) if with_bias else None, stride, pad, dil, group
    )
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-4)


@given(st.integers(1, 3), st.integers(1, 2), st.integers(0, 1), st.booleans(), st.booleans(), st.integers(5, 9))
@settings(max_examples=40, deadline=None)
def test_pools_match_torch(k, stride, pad, ceil, include_pad, size) -> None:
    pad = min(pad, k // 2)  # torch requires pad <= kernel / 2
    x = np.random.default_rng(1).standard_normal((1, 2, size, size + 1)).astype(np.float32)
    common = dict(kernel=(k, k), strides=(stride, stride), pads=(pad,) * 4, ceil_mode=int(ceil))
    got_max = _run_one(OpType.MaxPool, x, dilations=(1, 1), **common)
    got_avg = _run_one(OpType.AveragePool, x, dilations=(1, 1), count_include_pad=int(include_pad), **common)
    t = torch.tensor(x)
    np.testing.assert_allclose(got_max, F.max_pool2d(t, k, stride, pad, ceil_mode=ceil).numpy())
    want_avg = F.avg_pool2d(t, k, stride, pad, ceil_mode=ceil, count_include_pad=include_pad)
    np.testing.assert_allclose(got_avg, want_avg.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("op", "attrs", "torch_fn"),
    [
        (OpType.Gelu, {"approximate": "none"}, lambda t: F.gelu(t)),
        (OpType.Gelu, {"approximate": "tanh"}, lambda t: F.gelu(t, approximate="tanh")),
        (OpType.Sigmoid, {}, torch.sigmoid),
        (OpType.Tanh, {}, torch.tanh),
        (OpType.Erf, {}, torch.erf),
        (OpType.Softmax, {"axis": 1}, lambda t: torch.softmax(t, 1)),
    ],
)
def test_nonlinear_ops_match_torch(op, attrs, torch_fn) -> None:
    x = (np.random.default_rng(2).standard_normal((4, 33)) * 4).astype(np.float32)
    np.testing.assert_allclose(_run_one(op, x, **attrs), torch_fn(torch.tensor(x)).numpy(), rtol=1e-5, atol=2e-6)


def test_layernorm_and_batchnorm_match_torch() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 4, 5, 6)).astype(np.float32)
    scale, bias = rng.standard_normal((2, 6 * 5)).astype(np.float32).reshape(2, 5, 6)
    got = _run_one(OpType.LayerNorm, x, scale, bias, axis=2, epsilon=1e-5)
    want = F.layer_norm(torch.tensor(x), (5, 6), torch.tensor(scale), torch.tensor(bias), 1e-5)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-5)
    mean, var = rng.standard_normal(4).astype(np.float32), rng.uniform(0.5, 2, 4).astype(np.float32)
    g, b = rng.standard_normal(4).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    got = _run_one(OpType.BatchNorm, x, g, b, mean, var, epsilon=1e-3)
    want = F.batch_norm(torch.tensor(x), *map(torch.tensor, (mean, var, g, b)), training=False, eps=1e-3)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-5)
