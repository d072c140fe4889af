"""The attention matcher: the subgraph exporters write, its layout nodes, masks recognised by their position rule."""

from __future__ import annotations

import numpy as np
import pytest
from attention_graphs import F32_MIN, AttentionShape, attention_graph
from engine_helpers import model
from hypothesis import given, settings
from hypothesis import strategies as st

from fusion.engine.attention_match import (
    PositionMask,
    affine_heads,
    find_attention,
    fit_position_mask,
    mask_of,
)
from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType


def _ops(graph, names):
    return [graph.node(n).op for n in names]


@pytest.mark.parametrize(
    "shape",
    [
        AttentionShape(),
        AttentionShape(scale="div", causal=True),
        AttentionShape(scale="none", key_len=11),
        AttentionShape(heads=4, kv_heads=2, causal=True),
        AttentionShape(heads=4, kv_heads=1, k_transposed_in_graph=False),
        AttentionShape(seq=5, keys=9, causal=True),
        AttentionShape(heads=4, kv_heads=2, fused_qkv=True, causal=True),
        AttentionShape(scale="none", prescale=True),
    ],
)
def test_the_whole_attention_with_its_layout_is_one_match(shape):
    graph, _ = attention_graph(shape)
    (m,) = find_attention(graph)
    assert _ops(graph, [m.scores, m.softmax, m.context]) == [OpType.MatMul, OpType.Softmax, OpType.MatMul]
    assert (m.scale is not None) == (shape.scale != "none")
    assert (m.q_scale is not None) == (m.k_scale is not None) == shape.prescale
    assert (m.mask is not None) == (shape.causal or bool(shape.key_len))
    split = [OpType.Split] if shape.fused_qkv else []
    assert _ops(graph, m.q_layout) == [*split, OpType.Reshape, OpType.Transpose]
    assert _ops(graph, m.out_layout) == [OpType.Transpose, OpType.Reshape]
    if shape.kv_heads and shape.kv_heads != shape.heads:  # the KV repeat is read in place, not copied
        assert OpType.Expand in _ops(graph, m.k_layout) and OpType.Expand in _ops(graph, m.v_layout)
    # the group is every node between the projections
    inner = {n.name for n in graph.nodes if n.op != OpType.MatMul or not graph.is_constant(n.inputs[1])}
    assert set(m.nodes(graph)) == inner


@pytest.mark.parametrize(
    "shape, expected",
    [
        (AttentionShape(causal=True), PositionMask(0, 16, F32_MIN)),
        (AttentionShape(seq=5, keys=9, causal=True), PositionMask(4, 9, F32_MIN)),
        (AttentionShape(key_len=11), PositionMask(None, 11, F32_MIN)),
        (AttentionShape(causal=True, key_len=7), PositionMask(0, 7, F32_MIN)),
    ],
)
def test_a_constant_mask_is_recognised_by_its_position_rule(shape, expected):
    graph, _ = attention_graph(shape)
    (m,) = find_attention(graph)
    assert mask_of(graph, graph.node(m.mask)) == expected


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 40),
    st.integers(1, 40),
    st.one_of(st.none(), st.integers(-5, 45)),
    st.integers(0, 45),
    st.sampled_from([F32_MIN, -1e9, -10000.0]),
)
def test_position_masks_round_trip(sq, sk, offset, key_len, value):
    key_len = min(key_len, sk)
    rule = PositionMask(offset, key_len, value)
    hit = rule.masked(sq, sk)
    mask = np.where(hit, np.float32(value), np.float32(0))[None, None]
    fitted = fit_position_mask(mask, sq, sk)
    assert fitted is not None
    assert (fitted.masked(sq, sk) == hit).all()  # the same masked set, however it is described
    assert fitted.value == (float(np.float32(value)) if hit.any() else 0.0)


def test_masks_without_a_position_rule_are_not_matched():
    rng = np.random.default_rng(0)
    random = np.where(rng.random((16, 16)) < 0.5, np.float32(F32_MIN), np.float32(0))
    assert fit_position_mask(random[None, None], 16, 16) is None
    per_head = np.zeros((1, 2, 16, 16), np.float32)
    per_head[0, 1, :, 10:] = F32_MIN  # head 1 padded, head 0 not
    assert fit_position_mask(per_head, 16, 16) is None
    assert fit_position_mask(np.full((1, 1, 16, 16), -np.inf, np.float32), 16, 16) is None  # not finite
    three = np.triu(np.full((16, 16), F32_MIN, np.float32), 1)
    three[0, 0] = -5.0
    assert fit_position_mask(three, 16, 16) is None


def _core(reuse_probs: bool = False, mask: np.ndarray | None = None):
    g = GraphBuilder("core")
    q = g.input("q", (1, 2, 8, 4))
    kt = g.input("kt", (1, 2, 4, 8))
    v = g.input("v", (1, 2, 8, 4))
    s = g.op(OpType.MatMul, q, kt)
    if mask is not None:
        s = g.op(OpType.Add, s, g.constant(mask))
    p = g.op(OpType.Softmax, s, axis=3)
    out = g.op(OpType.MatMul, p, v)
    g.output(out, p) if reuse_probs else g.output(out)
    return g.build()


def test_a_split_stays_outside_unless_all_its_outputs_are_read_inside():
    g = GraphBuilder("split")
    x = g.input("x", (1, 8, 12))
    q, kt_src, v, extra = g.op_multi(OpType.Split, x, n_outputs=4, axis=2, sizes=(3, 3, 3, 3))
    kt = g.op(OpType.Transpose, kt_src, perm=(0, 2, 1))
    p = g.op(OpType.Softmax, g.op(OpType.MatMul, q, kt), axis=2)
    g.output(g.op(OpType.MatMul, p, v), extra)
    (m,) = find_attention(g.build())
    assert m.q_layout == () and m.v_layout == () and _ops(g.build(), m.k_layout) == [OpType.Transpose]


def test_attention_whose_probabilities_escape_is_not_matched():
    assert len(find_attention(_core())) == 1
    assert find_attention(_core(reuse_probs=True)) == []
    rng = np.random.default_rng(1)
    assert find_attention(_core(mask=rng.standard_normal((1, 1, 8, 8)).astype(np.float32))) == []


def test_affine_heads_finds_strides_and_refuses_others():
    idx = np.arange(2 * 3 * 4).reshape(2, 3, 4).transpose(0, 2, 1)  # (2, 4, 3): rows stride 1, cols stride 4
    maps = affine_heads(idx)
    assert maps is not None and (maps.row_stride, maps.col_stride) == (1, 4) and list(maps.bases) == [0, 12]
    assert affine_heads(np.array([[0, 1], [2, 4]])) is None


def test_a_head_split_shared_by_q_k_and_v_is_absorbed_whole():
    """PyTorch's MultiheadAttention export: one in-projection, one head split, three slab Gathers (Q, K, V) and
    the Q/K pre-scales; every node between the projections is one attention (nothing shared left outside)."""
    graph, _ = model("encoder_post_d64")
    (m,) = find_attention(graph)
    ops = _ops(graph, m.nodes(graph))
    assert ops.count(OpType.Gather) == 3 and m.q_scale is not None and m.k_scale is not None
    sources = {v for n in m.nodes(graph) for v in graph.node(n).inputs} - {
        v for n in m.nodes(graph) for v in graph.node(n).outputs
    }
    live = {v for v in sources if not graph.is_constant(v)}
    assert len(live) == 1  # everything is read from the in-projection's output
