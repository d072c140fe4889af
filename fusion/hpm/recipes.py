"""Calibration groups: small graphs of one or a few nodes, the shapes of the groups a planner meets in real models
(GEMM epilogues, attention scores, normalizations, elementwise chains, convolutions and chains of them, whole and
gated MLPs, a conv with its pool, patch embeddings, attention with its projections, side-by-side projections,
rotary embeddings, a transposed operand read in place), with seeded shapes.

Each recipe draws its dimensions from `rng` and returns a graph whose nodes form one group. Every registered
strategy has a recipe some of whose kernels it runs (tests/fusion/hpm/test_recipes.py): a kernel of a kind no
recipe makes would be priced from other kinds' samples.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fusion.graph.builder import GraphBuilder
from fusion.graph.ir import Graph
from fusion.graph.ops import OpType

DIMS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
BATCH = (1, 2, 3, 4, 8)
UNARY = (OpType.Relu, OpType.Sigmoid, OpType.Tanh, OpType.Exp, OpType.Gelu)
BINARY = (OpType.Add, OpType.Sub, OpType.Mul)


def _dim(rng: np.random.Generator, hi: int = 256) -> int:
    return int(rng.choice([d for d in DIMS if d <= hi]))


def _act_shape(rng: np.random.Generator, hi: int = 256) -> tuple[int, ...]:
    """An activation shape: 2-D half the time, else with one or two small leading (batch, head) dims."""
    lead = tuple(int(rng.choice(BATCH)) for _ in range(int(rng.choice([0, 0, 1, 2]))))
    return (*lead, _dim(rng, hi), _dim(rng, hi))


def _w(b: GraphBuilder, rng: np.random.Generator, *shape: int) -> str:
    return b.constant((rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32))


def _unary(b: GraphBuilder, rng: np.random.Generator, x: str) -> str:
    op = UNARY[int(rng.integers(len(UNARY)))]
    return b.op(op, x, approximate="none") if op == OpType.Gelu else b.op(op, x)


def _binary(b: GraphBuilder, rng: np.random.Generator, x: str, y: str) -> str:
    return b.op(BINARY[int(rng.integers(len(BINARY)))], x, y)


def _finish(b: GraphBuilder, out: str) -> Graph:
    b.output(out)
    return b.build()


def matmul(rng: np.random.Generator) -> Graph:
    b = GraphBuilder("matmul")
    m, k, n = _dim(rng), _dim(rng), _dim(rng)
    return _finish(b, b.op(OpType.MatMul, b.input("x", (m, k)), _w(b, rng, k, n)))


def gemm_bias(rng: np.random.Generator) -> Graph:
    b = GraphBuilder("gemm_bias")
    m, k, n = _dim(rng), _dim(rng), _dim(rng)
    return _finish(b, b.op(OpType.Gemm, b.input("x", (m, k)), _w(b, rng, k, n), _w(b, rng, n)))


def matmul_act(rng: np.random.Generator) -> Graph:
    b = GraphBuilder("matmul_act")
    m, k, n = _dim(rng), _dim(rng), _dim(rng)
    h = b.op(OpType.MatMul, b.input("x", (m, k)), _w(b, rng, k, n))
    return _finish(b, _unary(b, rng, h))


def matmul_bias_act(rng: np.random.Generator) -> Graph:
    b = GraphBuilder("matmul_bias_act")
    lead = tuple(int(rng.choice(BATCH)) for _ in range(int(rng.choice([0, 1]))))
    m, k, n = _dim(rng), _dim(rng), _dim(rng)
    h = b.op(OpType.Add, b.op(OpType.MatMul, b.input("x", (*lead, m, k)), _w(b, rng, k, n)), _w(b, rng, n))
    return _finish(b, _unary(b, rng, h))


def matmul_residual(rng: np.random.Generator) -> Graph:
    b = GraphBuilder("matmul_residual")
    m, k, n = _dim(rng), _dim(rng), _dim(rng)
    h = b.op(OpType.MatMul, b.input("x", (m, k)), _w(b, rng, k, n))
    return _finish(b, b.op(OpType.Relu, b.op(OpType.Add, h, b.input("r", (m, n)))))


def attention_scores(rng: np.random.Generator) -> Graph:
    b = GraphBuilder("attention_scores")
    s, d = _dim(rng, 128), _dim(rng, 128)
    scores = b.op(OpType.MatMul, b.input("q", (s, d)), b.input("kt", (d, s)))
    scaled = b.op(OpType.Mul, scores, b.constant(np.float32(1.0 / np.sqrt(d))))
    return _finish(b, b.op(OpType.Softmax, scaled, axis=1))


def layernorm_matmul(rng: np.random.Generator) -> Graph:
    b = GraphBuilder("layernorm_matmul")
    m, k, n = _dim(rng), _dim(rng), _dim(rng)
    ln = b.op(OpType.LayerNorm, b.input("x", (m, k)), _w(b, rng, k), _w(b, rng, k), axis=1, epsilon=1e-5)
    return _finish(b, b.op(OpType.MatMul, ln, _w(b, rng, k, n)))


def unary(rng: np.random.Generator) -> Graph:
    b = GraphBuilder("unary")
    return _finish(b, _unary(b, rng, b.input("x", _act_shape(rng))))


def binary(rng: np.random.Generator) -> Graph:
    b = GraphBuilder("binary")
    shape = _act_shape(rng)
    kind = int(rng.integers(3))
    other = (b.input("y", shape), _w(b, rng, shape[-1]), b.constant(np.float32([rng.standard_normal()])))[kind]
    return _finish(b, _binary(b, rng, b.input("x", shape), other))


def elementwise_chain(rng: np.random.Generator) -> Graph:
    b = GraphBuilder("elementwise_chain")
    shape = _act_shape(rng)
    c = shape[-1]
    h = b.input("x", shape)
    for _ in range(int(rng.integers(2, 5))):
        h = _unary(b, rng, h) if rng.random() < 0.5 else _binary(b, rng, h, _w(b, rng, c))
    return _finish(b, h)


def softmax(rng: np.random.Generator) -> Graph:
    b = GraphBuilder("softmax")
    shape = _act_shape(rng)
    return _finish(b, b.op(OpType.Softmax, b.input("x", shape), axis=len(shape) - 1))


def layernorm(rng: np.random.Generator) -> Graph:
    b = GraphBuilder("layernorm")
    shape = _act_shape(rng)
    x = b.input("x", shape)
    c = shape[-1]
    return _finish(b, b.op(OpType.LayerNorm, x, _w(b, rng, c), _w(b, rng, c), axis=len(shape) - 1, epsilon=1e-5))


def transpose(rng: np.random.Generator) -> Graph:
    b = GraphBuilder("transpose")
    shape = _act_shape(rng, 128)
    perm = tuple(int(p) for p in rng.permutation(len(shape)))
    perm = perm if perm != tuple(range(len(shape))) else tuple(reversed(perm))
    return _finish(b, b.op(OpType.Transpose, b.input("x", shape), perm=perm))


def gather(rng: np.random.Generator) -> Graph:
    """Picking one slice of a packed tensor (e.g. q, k, v out of one projection)."""
    b = GraphBuilder("gather")
    shape = (int(rng.choice([2, 3, 4])), *_act_shape(rng, 128))
    index = b.constant(np.array(int(rng.integers(shape[0])), dtype=np.int64))
    return _finish(b, b.op(OpType.Gather, b.input("x", shape), index, axis=0))


def batched_matmul(rng: np.random.Generator) -> Graph:
    """Activations with batch dims times a shared weight, or times another batched activation (attention)."""
    b = GraphBuilder("batched_matmul")
    lead = tuple(int(rng.choice(BATCH)) for _ in range(int(rng.integers(1, 3))))
    m, k, n = _dim(rng, 128), _dim(rng, 128), _dim(rng, 128)
    x = b.input("x", (*lead, m, k))
    w = b.input("y", (*lead, k, n)) if rng.random() < 0.5 else _w(b, rng, k, n)
    return _finish(b, b.op(OpType.MatMul, x, w))


def attention(rng: np.random.Generator) -> Graph:
    """Scaled scores, softmax and the weighted sum over heads: the encoder's inner block."""
    b = GraphBuilder("attention")
    heads, s, d = int(rng.choice(BATCH)), _dim(rng, 64), _dim(rng, 64)
    scale = b.constant(np.float32([1.0 / np.sqrt(d)]))
    q = b.op(OpType.Mul, b.input("q", (heads, s, d)), scale)
    scores = b.op(OpType.MatMul, q, b.input("kt", (heads, d, s)))
    probs = b.op(OpType.Softmax, scores, axis=2)
    return _finish(b, b.op(OpType.MatMul, probs, b.input("v", (heads, s, d))))


def conv_relu(rng: np.random.Generator) -> Graph:
    b = GraphBuilder("conv_relu")
    c, o, hw = _dim(rng, 32), _dim(rng, 32), _dim(rng, 16)
    k = int(rng.choice([1, 3]))
    attrs = {"strides": (1, 1), "pads": (k // 2,) * 4, "dilations": (1, 1), "group": 1}
    h = b.op(OpType.Conv, b.input("x", (1, c, hw, hw)), _w(b, rng, o, c, k, k), _w(b, rng, o), **attrs)
    return _finish(b, b.op(OpType.Relu, h))


def conv_block(rng: np.random.Generator) -> Graph:
    """Two consecutive Convs (ReLU between): a ResNet basic block (3x3, 3x3 + the residual) or a pointwise pair,
    the groups layer fusion (`conv_chain`) runs."""
    b = GraphBuilder("conv_block")
    c, hw, k = int(rng.choice([8, 16, 24, 32])), _dim(rng, 16), int(rng.choice([1, 3]))
    attrs = {"strides": (1, 1), "pads": (k // 2,) * 4, "dilations": (1, 1), "group": 1}
    x = b.input("x", (1, c, hw, hw))
    h = b.op(OpType.Relu, b.op(OpType.Conv, x, _w(b, rng, c, c, k, k), _w(b, rng, c), **attrs))
    h = b.op(OpType.Conv, h, _w(b, rng, c, c, k, k), _w(b, rng, c), **attrs)
    return _finish(b, b.op(OpType.Relu, b.op(OpType.Add, h, x)) if rng.random() < 0.5 else h)


def conv_pool(rng: np.random.Generator) -> Graph:
    """A Conv (+ ReLU) + MaxPool, a CNN stem: the pool in the conv kernel's last pass (`codegen.conv_pool`). The
    pool window always fits the conv's output."""
    b = GraphBuilder("conv_pool")
    c, o, hw = int(rng.choice([3, 8, 16])), _dim(rng, 32), int(rng.choice([8, 12, 16]))
    k, stride = int(rng.choice([1, 3, 5, 7])), int(rng.choice([1, 2]))
    attrs = {"strides": (stride, stride), "pads": (k // 2,) * 4, "dilations": (1, 1), "group": 1}
    h = b.op(OpType.Conv, b.input("x", (1, c, hw, hw)), _w(b, rng, o, c, k, k), _w(b, rng, o), **attrs)
    window, pool_stride = int(rng.choice([2, 3])), int(rng.choice([1, 2]))
    pool = {"kernel": (window,) * 2, "strides": (pool_stride,) * 2, "pads": (window // 2,) * 4, "dilations": (1, 1)}
    return _finish(b, b.op(OpType.MaxPool, b.op(OpType.Relu, h) if rng.random() < 0.7 else h, ceil_mode=0, **pool))


def patch_embed(rng: np.random.Generator) -> Graph:
    """A ViT patch embedding: Conv (kernel = stride = patch) -> Reshape to tokens -> Transpose [-> class token
    Concat -> position Add [-> LayerNorm]] (`codegen.patch_embed`)."""
    b = GraphBuilder("patch_embed")
    c, patch, grid, cout = int(rng.choice([1, 3])), int(rng.choice([2, 4, 8])), int(rng.choice([2, 4])), _dim(rng, 64)
    size = patch * grid
    attrs = {"strides": (patch, patch), "pads": (0,) * 4, "dilations": (1, 1), "group": 1}
    h = b.op(
        OpType.Conv, b.input("x", (1, c, size, size)), _w(b, rng, cout, c, patch, patch), _w(b, rng, cout), **attrs
    )
    h = b.op(OpType.Transpose, b.op(OpType.Reshape, h, shape=(1, cout, grid * grid)), perm=(0, 2, 1))
    tail = int(rng.integers(3))
    if tail:
        h = b.op(OpType.Concat, _w(b, rng, 1, 1, cout), h, axis=1)
        h = b.op(OpType.Add, h, _w(b, rng, 1, grid * grid + 1, cout))
    if tail == 2:
        h = b.op(OpType.LayerNorm, h, _w(b, rng, cout), _w(b, rng, cout), axis=2, epsilon=1e-6)
    return _finish(b, h)


def mlp(rng: np.random.Generator) -> Graph:
    """A transformer MLP: [residual Add + LayerNorm] -> GEMM + bias -> activation -> GEMM + bias [+ residual], the
    group the `mlp` strategy runs with its hidden activation on chip."""
    b = GraphBuilder("mlp")
    m, d, hidden = _dim(rng, 64), int(rng.choice([16, 32, 64, 128])), int(rng.choice([32, 64, 128, 256]))
    x = b.input("x", (m, d))
    if rng.random() < 0.5:
        x = b.op(OpType.Add, x, b.input("r", (m, d)))
        x = b.op(OpType.LayerNorm, x, _w(b, rng, d), _w(b, rng, d), axis=1, epsilon=1e-5)
    h = b.op(OpType.Add, b.op(OpType.MatMul, x, _w(b, rng, d, hidden)), _w(b, rng, hidden))
    h = b.op(OpType.Gelu, h, approximate="none") if rng.random() < 0.5 else b.op(OpType.Relu, h)
    y = b.op(OpType.Add, b.op(OpType.MatMul, h, _w(b, rng, hidden, d)), _w(b, rng, d))
    return _finish(b, b.op(OpType.Add, y, x) if rng.random() < 0.5 else y)


def gated(rng: np.random.Generator) -> Graph:
    """A gated MLP's first half (LLaMA's): act(x @ Wg) * (x @ Wu), act SiLU, GELU or none (`codegen.gated`)."""
    b = GraphBuilder("gated")
    lead = tuple(int(rng.choice(BATCH)) for _ in range(int(rng.choice([0, 1]))))
    m, k, n = _dim(rng, 64), _dim(rng, 128), int(rng.choice([16, 32, 64, 128]))
    x = b.input("x", (*lead, m, k))
    g = b.op(OpType.MatMul, x, _w(b, rng, k, n))
    act = int(rng.integers(3))
    if act == 0:
        g = b.op(OpType.Mul, g, b.op(OpType.Sigmoid, g))
    elif act == 1:
        g = b.op(OpType.Gelu, g, approximate="tanh")
    return _finish(b, b.op(OpType.Mul, g, b.op(OpType.MatMul, x, _w(b, rng, k, n))))


def _split_heads(b: GraphBuilder, v: str, rows: int, heads: int, d: int, perm: tuple[int, ...]) -> str:
    return b.op(OpType.Transpose, b.op(OpType.Reshape, v, shape=(1, rows, heads, d)), perm=perm)


def siblings(rng: np.random.Generator) -> Graph:
    """Two or three projections of one activation (Q, K, V), each output kept whole or split into heads
    (`codegen.siblings`); widths are whole array tiles as in real models."""
    b = GraphBuilder("siblings")
    m, k, d = _dim(rng, 64), int(rng.choice([16, 32, 64, 128])), int(rng.choice([16, 32]))
    x = b.input("x", (1, m, k))
    outs = []
    for _ in range(int(rng.choice([2, 3]))):
        heads = int(rng.choice([1, 2, 4]))
        h = b.op(OpType.MatMul, x, _w(b, rng, k, heads * d))
        outs.append(_split_heads(b, h, m, heads, d, (0, 2, 1, 3)) if rng.random() < 0.5 else h)
    b.output(*outs)
    return b.build()


def attention_proj(rng: np.random.Generator) -> Graph:
    """Self-attention with its projections: Q/K/V (one packed projection Split in three, or one each), head
    split, scaled scores, softmax, weighted sum, head merge [and output projection] (`codegen.attention_proj`)."""
    b = GraphBuilder("attention_proj")
    s, heads, d = int(rng.choice([8, 16, 17, 32, 64])), int(rng.choice([1, 2, 4])), int(rng.choice([8, 16, 32]))
    width = heads * d
    x = b.input("x", (1, s, width))
    if rng.random() < 0.5:
        packed = b.op(OpType.MatMul, x, _w(b, rng, width, 3 * width))
        q, k, v = b.op_multi(OpType.Split, packed, n_outputs=3, axis=2, sizes=(width,) * 3)
    else:
        q, k, v = (b.op(OpType.MatMul, x, _w(b, rng, width, width)) for _ in range(3))
    q = _split_heads(b, q, s, heads, d, (0, 2, 1, 3))
    k = _split_heads(b, k, s, heads, d, (0, 2, 3, 1))
    v = _split_heads(b, v, s, heads, d, (0, 2, 1, 3))
    scores = b.op(OpType.Mul, b.op(OpType.MatMul, q, k), b.constant(np.float32(1 / np.sqrt(d))))
    ctx = b.op(OpType.MatMul, b.op(OpType.Softmax, scores, axis=3), v)
    out = b.op(OpType.Reshape, b.op(OpType.Transpose, ctx, perm=(0, 2, 1, 3)), shape=(1, s, width))
    return _finish(b, b.op(OpType.MatMul, out, _w(b, rng, width, width)) if rng.random() < 0.5 else out)


def rotary(rng: np.random.Generator) -> Graph:
    """Rotary position embedding of a head's rows: x * cos + Concat(-x[.., h:], x[.., :h]) * sin, lanes moved by
    last-axis Slice and Concat (`codegen.rotary`, the `segment_chain` strategy)."""
    b = GraphBuilder("rotary")
    lead = tuple(int(rng.choice(BATCH)) for _ in range(int(rng.integers(1, 3))))
    s, d = _dim(rng, 128), int(rng.choice([8, 16, 32, 64, 128]))
    x = b.input("x", (*lead, s, d))
    rank, half = len(lead) + 2, d // 2
    angle = rng.uniform(0, 2 * np.pi, (s, d)).astype(np.float32)
    cut = {"axes": (rank - 1,), "steps": (1,)}
    lo = b.op(OpType.Slice, x, starts=(0,), ends=(half,), **cut)
    hi = b.op(OpType.Slice, x, starts=(half,), ends=(d,), **cut)
    rot = b.op(OpType.Concat, b.op(OpType.Neg, hi), lo, axis=rank - 1)
    xc = b.op(OpType.Mul, x, b.constant(np.cos(angle)))
    return _finish(b, b.op(OpType.Add, xc, b.op(OpType.Mul, rot, b.constant(np.sin(angle)))))


def transposed_operand(rng: np.random.Generator) -> Graph:
    """A MatMul of two activations reading one through a Transpose (attention's K^T): the layout load reads it
    in place (`codegen.absorbed_layout`, the `transpose_load` strategy)."""
    b = GraphBuilder("transposed_operand")
    heads, s, d = int(rng.choice(BATCH)), _dim(rng, 128), _dim(rng, 64)
    kt = b.op(OpType.Transpose, b.input("k", (heads, s, d)), perm=(0, 2, 1))
    return _finish(b, b.op(OpType.MatMul, b.input("q", (heads, _dim(rng, 128), d)), kt))


RECIPES: dict[str, Callable[[np.random.Generator], Graph]] = {
    f.__name__: f
    for f in (
        matmul,
        gemm_bias,
        matmul_act,
        matmul_bias_act,
        matmul_residual,
        attention_scores,
        layernorm_matmul,
        unary,
        binary,
        elementwise_chain,
        softmax,
        layernorm,
        transpose,
        gather,
        batched_matmul,
        attention,
        conv_relu,
        conv_block,
        conv_pool,
        patch_embed,
        mlp,
        gated,
        siblings,
        attention_proj,
        rotary,
        transposed_operand,
    )
}
