"""Hand-built transformer-like graphs (BERT/GPT-style blocks) of any shape, for planner tests and benches.

The ops and layouts are those exporters write: per-head Reshape + Transpose of Q/K/V, Q @ K^T scaled by a Mul,
Softmax, the head merge back, a biased output projection with a residual Add and LayerNorm, and an FFN
(MatMul + bias Add + Gelu/Relu, MatMul + bias Add, residual, LayerNorm); pre- or post-LayerNorm.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fusion.graph.builder import GraphBuilder
from fusion.graph.ir import Graph
from fusion.graph.ops import OpType


@dataclass(frozen=True)
class BlockShape:
    batch: int = 1
    seq: int = 16
    dim: int = 64
    heads: int = 2
    ffn: int = 2  # FFN width as a multiple of dim
    layers: int = 1
    pre_norm: bool = False
    act: str = "gelu"  # "gelu" or "relu"


def _linear(g: GraphBuilder, rng: np.random.Generator, x: str, k: int, n: int) -> str:
    w = g.constant((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32))
    return g.op(OpType.Add, g.op(OpType.MatMul, x, w), g.constant((0.1 * rng.standard_normal(n)).astype(np.float32)))


def _norm(g: GraphBuilder, rng: np.random.Generator, x: str, d: int) -> str:
    gamma = g.constant((1 + 0.1 * rng.standard_normal(d)).astype(np.float32))
    beta = g.constant((0.1 * rng.standard_normal(d)).astype(np.float32))
    return g.op(OpType.LayerNorm, x, gamma, beta, axis=2, epsilon=1e-5)


def _attention(g: GraphBuilder, rng: np.random.Generator, x: str, s: BlockShape) -> str:
    dh = s.dim // s.heads

    def heads(v: str, perm: tuple[int, ...]) -> str:
        return g.op(OpType.Transpose, g.op(OpType.Reshape, v, shape=(s.batch, s.seq, s.heads, dh)), perm=perm)

    q = heads(_linear(g, rng, x, s.dim, s.dim), (0, 2, 1, 3))
    k = heads(_linear(g, rng, x, s.dim, s.dim), (0, 2, 3, 1))
    v = heads(_linear(g, rng, x, s.dim, s.dim), (0, 2, 1, 3))
    scores = g.op(OpType.Mul, g.op(OpType.MatMul, q, k), g.constant(np.float32(1 / np.sqrt(dh))))
    ctx = g.op(OpType.MatMul, g.op(OpType.Softmax, scores, axis=3), v)
    merged = g.op(OpType.Reshape, g.op(OpType.Transpose, ctx, perm=(0, 2, 1, 3)), shape=(s.batch, s.seq, s.dim))
    return _linear(g, rng, merged, s.dim, s.dim)


def _ffn(g: GraphBuilder, rng: np.random.Generator, x: str, s: BlockShape) -> str:
    h = _linear(g, rng, x, s.dim, s.ffn * s.dim)
    h = g.op(OpType.Gelu, h, approximate="none") if s.act == "gelu" else g.op(OpType.Relu, h)
    return _linear(g, rng, h, s.ffn * s.dim, s.dim)


def transformer(shape: BlockShape, seed: int = 0) -> tuple[Graph, dict[str, np.ndarray]]:
    """`shape.layers` encoder blocks and seeded standard-normal inputs."""
    if shape.dim % shape.heads:
        raise ValueError(f"dim {shape.dim} is not a multiple of heads {shape.heads}")
    rng = np.random.default_rng(seed)
    g = GraphBuilder(f"transformer_s{shape.seq}_d{shape.dim}_h{shape.heads}")
    x = g.input("x", (shape.batch, shape.seq, shape.dim))
    for _ in range(shape.layers):
        for sub in (_attention, _ffn):
            if shape.pre_norm:
                x = g.op(OpType.Add, x, sub(g, rng, _norm(g, rng, x, shape.dim), shape))
            else:
                x = _norm(g, rng, g.op(OpType.Add, sub(g, rng, x, shape), x), shape.dim)
    g.output(x)
    graph = g.build()
    return graph, {"x": rng.standard_normal((shape.batch, shape.seq, shape.dim)).astype(np.float32)}
