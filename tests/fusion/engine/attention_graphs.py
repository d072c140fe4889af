"""Attention subgraphs as exporters write them, of any shape, for the attention matcher and kernel tests.

x (B, S, H*D) -> Q/K/V projections -> head split (Reshape, Transpose) -> [GQA: Reshape, Expand, Reshape of the
KV heads] -> Q @ K^T -> [scale] -> [+ mask: causal (float32 min above the diagonal) and/or key padding] ->
Softmax -> @ V -> head merge (Transpose, Reshape).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fusion.graph.builder import GraphBuilder
from fusion.graph.ir import Graph
from fusion.graph.ops import OpType

F32_MIN = float(np.finfo(np.float32).min)


@dataclass(frozen=True)
class AttentionShape:
    batch: int = 1
    seq: int = 16
    keys: int = 0  # 0: self-attention (keys = seq); else a separate key/value input of this length
    heads: int = 2
    kv_heads: int = 0  # 0: = heads; else grouped-query attention
    head_dim: int = 16
    scale: str = "mul"  # "mul", "div" or "none"
    causal: bool = False
    key_len: int = 0  # 0: no padding mask; else keys >= key_len masked
    k_transposed_in_graph: bool = True  # K^T by one Transpose (0, 2, 3, 1) of the split heads
    fused_qkv: bool = False  # self-attention: one projection, Split into Q, K, V (GPT-2's c_attn)
    prescale: bool = False  # Q and K^T each multiplied by head_dim ** -0.25 before the scores (ViT's export)


def attention_graph(s: AttentionShape, seed: int = 0) -> tuple[Graph, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    kv = s.kv_heads or s.heads
    keys = s.keys or s.seq
    d = s.head_dim
    g = GraphBuilder(f"attention_b{s.batch}_s{s.seq}_k{keys}_h{s.heads}_kv{kv}_d{d}")
    x = g.input("x", (s.batch, s.seq, s.heads * d))
    mem = g.input("mem", (s.batch, keys, s.heads * d)) if s.keys else x

    def proj(src: str, n: int) -> str:
        w = g.constant((rng.standard_normal((s.heads * d, n)) / np.sqrt(s.heads * d)).astype(np.float32))
        return g.op(OpType.MatMul, src, w)

    def split(v: str, rows: int, heads: int, perm: tuple[int, ...]) -> str:
        return g.op(OpType.Transpose, g.op(OpType.Reshape, v, shape=(s.batch, rows, heads, d)), perm=perm)

    def repeat(v: str, rows: int, last: int) -> str:
        if kv == s.heads:
            return v
        rep = s.heads // kv
        u = g.op(OpType.Reshape, v, shape=(s.batch, kv, 1, rows, last))
        e = g.op(OpType.Expand, u, shape=(s.batch, kv, rep, rows, last))
        return g.op(OpType.Reshape, e, shape=(s.batch, s.heads, rows, last))

    if s.fused_qkv and not s.keys:
        sizes = (s.heads * d, kv * d, kv * d)
        q_src, k_src, v_src = g.op_multi(OpType.Split, proj(x, sum(sizes)), n_outputs=3, axis=2, sizes=sizes)
    else:
        q_src, k_src, v_src = proj(x, s.heads * d), proj(mem, kv * d), proj(mem, kv * d)
    q = split(q_src, s.seq, s.heads, (0, 2, 1, 3))
    if s.k_transposed_in_graph and kv == s.heads:
        k = split(k_src, keys, kv, (0, 2, 3, 1))
    else:
        k = g.op(OpType.Transpose, repeat(split(k_src, keys, kv, (0, 2, 1, 3)), keys, d), perm=(0, 1, 3, 2))
    v = repeat(split(v_src, keys, kv, (0, 2, 1, 3)), keys, d)
    if s.prescale:
        c = g.constant(np.float32(d**-0.25))
        q, k = g.op(OpType.Mul, q, c), g.op(OpType.Mul, k, c)
    scores = g.op(OpType.MatMul, q, k)
    if s.scale == "mul":
        scores = g.op(OpType.Mul, scores, g.constant(np.float32(1 / np.sqrt(d))))
    elif s.scale == "div":
        scores = g.op(OpType.Div, scores, g.constant(np.float32(np.sqrt(d))))
    if s.causal or s.key_len:
        i = np.arange(s.seq)[:, None]
        j = np.arange(keys)[None, :]
        hit = np.zeros((s.seq, keys), dtype=bool)
        if s.causal:
            hit |= j > i + (keys - s.seq)
        if s.key_len:
            hit |= j >= s.key_len
        mask = np.where(hit, np.float32(F32_MIN), np.float32(0)).astype(np.float32)[None, None]
        scores = g.op(OpType.Add, scores, g.constant(mask))
    ctx = g.op(OpType.MatMul, g.op(OpType.Softmax, scores, axis=3), v)
    merged = g.op(OpType.Reshape, g.op(OpType.Transpose, ctx, perm=(0, 2, 1, 3)), shape=(s.batch, s.seq, s.heads * d))
    g.output(proj(merged, s.heads * d))
    graph = g.build()
    inputs = {"x": rng.standard_normal((s.batch, s.seq, s.heads * d)).astype(np.float32)}
    if s.keys:
        inputs["mem"] = rng.standard_normal((s.batch, keys, s.heads * d)).astype(np.float32)
    return graph, inputs
