"""The fused attention kernel against the reference: random sequence lengths, head dims, head and KV-head counts
and masks; int8 bit-exact, fp32 within 1e-5; every run in the simulator's checked (race-detecting) mode."""

from __future__ import annotations

import numpy as np
import pytest
from attention_graphs import AttentionShape, attention_graph
from engine_helpers import context, reference_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fusion.engine.attention_match import find_attention
from fusion.engine.codegen.attention import attention_steps
from fusion.engine.errors import CodegenError
from fusion.engine.kernel import Guard, link_program, storage_dtypes
from fusion.engine.strategies import REGISTRY
from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType
from fusion.lower import constant_forms, emit_phases, plan_dram
from simulator.run import simulate


def build(mc, names):
    """The attention group's program over its own DRAM image (constants, the generated mask's positions, the
    packed weights of projections taken in, the scratch K round-trips through)."""
    sub = mc.subgraph(names)
    forms = constant_forms(sub, mc.qplan)
    more, scratch = REGISTRY["attention_proj"].dram_forms(mc, sub, forms)  # the strategies' own forms, scratch
    forms.update(more)
    data, addresses, _ = plan_dram(sub, mc.qplan, mc.config, forms, whole_program=True, scratch=scratch)
    shapes = tuple((v, sub.types[v].shape) for v in sub.inputs)
    guard = Guard(shapes, storage_dtypes(mc, sub, sub.inputs), "any", mc.config_hash)

    def body(b, em, cx):
        emit_phases(b, em, [attention_steps(cx, sub.nodes)])

    program, names = link_program(mc, sub, guard, (data, addresses), "attention", ("attention", "attention"), body)
    return sub, program, names


def run(shape: AttentionShape, dtype: str, config: str = "base", seed: int = 0):
    graph, inputs = attention_graph(shape, seed)
    mc = context(graph, inputs, dtype, config)
    env = reference_env(mc, inputs)
    (match,) = find_attention(graph)
    sub, program, names = build(mc, match.nodes(graph))
    result = simulate(program, mc.config, {names[v]: env[v] for v in sub.inputs}, checked=True)
    (out,) = sub.outputs
    return result, result.outputs[names[out]], env[out]


def assert_matches(got, want, dtype):
    if dtype == "int8":
        assert got.dtype == np.int8 and np.array_equal(got, want), np.abs(got.astype(int) - want).max()
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def shapes(longest: int, dims: list[int]):
    """Random attention shapes of at most `longest` queries and keys, head dims from `dims`, consistent (KV heads
    dividing the heads, a padding length within the keys)."""

    def consistent(s: AttentionShape) -> AttentionShape:
        kv = s.kv_heads if s.kv_heads and s.heads % s.kv_heads == 0 else 0
        key_len = s.key_len if s.key_len <= (s.keys or s.seq) else 0
        return AttentionShape(**{**s.__dict__, "kv_heads": kv, "key_len": key_len})

    return st.builds(
        AttentionShape,
        batch=st.integers(1, 2),
        seq=st.integers(1, longest),
        keys=st.one_of(st.just(0), st.integers(1, longest)),
        heads=st.sampled_from([1, 2, 4]),
        kv_heads=st.sampled_from([0, 1, 2]),
        head_dim=st.sampled_from(dims),
        scale=st.sampled_from(["mul", "div", "none"]),
        causal=st.booleans(),
        key_len=st.integers(0, longest),
        k_transposed_in_graph=st.booleans(),
        fused_qkv=st.booleans(),
        prescale=st.booleans(),
    ).map(consistent)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes(40, [4, 8, 16, 24, 40]), st.sampled_from(["fp32", "int8"]))
def test_attention_kernel_equals_the_reference(shape, dtype):
    _, got, want = run(shape, dtype)
    assert_matches(got, want, dtype)


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
@pytest.mark.parametrize(
    "shape",
    [
        AttentionShape(seq=17, heads=2, head_dim=32, scale="none", prescale=True),  # ViT-like: 17 tokens
        AttentionShape(seq=16, heads=4, kv_heads=2, head_dim=32, causal=True),  # LLaMA-like GQA
        AttentionShape(seq=100, heads=1, head_dim=64, causal=True),  # several query blocks
        AttentionShape(seq=10, keys=6, heads=2, head_dim=8, causal=True),  # rows 0-3 see no key: uniform rows
        AttentionShape(seq=12, keys=20, heads=2, kv_heads=1, head_dim=8, causal=True, key_len=15),
    ],
)
def test_attention_kernel_on_model_shapes(shape, dtype):
    _, got, want = run(shape, dtype)
    assert_matches(got, want, dtype)


def test_the_tiny_machine_tiles_everything():
    """array 4, vector registers of 256: head dim, keys and values in many tiles, query rows in blocks."""
    shape = AttentionShape(seq=30, heads=2, kv_heads=1, head_dim=12, causal=True, scale="div")
    for dtype in ("fp32", "int8"):
        _, got, want = run(shape, dtype, config="tiny")
        assert_matches(got, want, dtype)


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_keys_beyond_a_buffer_slot_stream_through_it(dtype):
    """tiny (a 5 KiB buffer slot): K and V of a head (150 keys x 16, 9.4 KiB each in fp32) loaded block by block
    inside the step, in the same buffers; GQA and a padding mask on top."""
    shape = AttentionShape(seq=6, keys=150, heads=2, kv_heads=1, head_dim=16, key_len=130)
    _, got, want = run(shape, dtype, config="tiny")
    assert_matches(got, want, dtype)


def test_the_value_chunks_accumulate_apart_and_drain_after_the_last():
    """BERT's head dim 64 is four value chunks: their products into four accumulator regions, one after another
    through the array, and the four drains after the last (not a drain waiting between them)."""
    shape = AttentionShape(seq=16, heads=2, head_dim=64)
    graph, inputs = attention_graph(shape)
    mc = context(graph, inputs, "fp32")
    (match,) = find_attention(graph)
    _, program, _ = build(mc, match.nodes(graph))
    matrix = [i.mnemonic for i in program.instructions() if i.mnemonic.startswith("mx.")]
    product = matrix[-12:]  # the last head's product: four (preload, matmul) pairs, four drains
    assert product == ["mx.preload", "mx.mm"] * 4 + ["mx.drain"] * 4, product
    result, got, want = run(shape, "fp32")
    assert_matches(got, want, "fp32")


def test_the_mask_is_generated_not_loaded():
    """The kernel's DRAM reads are its Q/K/V sources and the positions vector, never the Sq x Sk mask."""
    shape = AttentionShape(seq=32, heads=2, head_dim=16, causal=True)
    result, got, want = run(shape, "fp32")
    assert_matches(got, want, "fp32")
    qkv = 3 * 32 * 2 * 16 * 4  # three projections' outputs (B, S, H*D) in float32, each read once
    assert result.counters.dram_read_bytes <= qkv + 32 * 4 + 64 * 16  # + positions, + burst rounding


@pytest.mark.parametrize(
    "shape",
    [
        AttentionShape(seq=5, keys=300, heads=2, kv_heads=1, head_dim=8, key_len=280),
        AttentionShape(seq=20, keys=270, heads=1, head_dim=12, causal=True, scale="div"),
    ],
)
def test_rows_longer_than_a_vector_register_run_the_online_softmax(shape):
    """tiny (vector registers of 256): 270-300 keys a row, scores in key blocks with a running max and sum."""
    _, got, want = run(shape, "fp32", config="tiny")
    assert_matches(got, want, "fp32")


def test_int8_rows_longer_than_a_vector_register_are_refused_clearly():
    """The online softmax sums a row in blocks, not as the reference does: no int8 kernel rather than an inexact one."""
    shape = AttentionShape(seq=2, keys=300, heads=1, head_dim=4)
    graph, inputs = attention_graph(shape)
    mc = context(graph, inputs, "int8", "tiny")
    (match,) = find_attention(graph)
    with pytest.raises(CodegenError, match="not bit-exact"):
        build(mc, match.nodes(graph))


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_graph_inputs_as_q_kt_v_are_read_as_they_are(dtype):
    """Q, K^T (materialized: keys contiguous) and V as float graph inputs: no layout nodes, batch and heads as
    leading dims, a Div scale; on the int8 path each is quantized on the way in as the unfused MatMul does."""
    g = GraphBuilder("core")
    q, kt, v = g.input("q", (2, 3, 20, 24)), g.input("kt", (2, 3, 24, 20)), g.input("v", (2, 3, 20, 40))
    scores = g.op(OpType.Div, g.op(OpType.MatMul, q, kt), g.constant(np.float32(5.0)))
    g.output(g.op(OpType.MatMul, g.op(OpType.Softmax, scores, axis=3), v))
    graph = g.build()
    rng = np.random.default_rng(0)
    inputs = {k: rng.standard_normal(graph.types[k].shape).astype(np.float32) for k in ("q", "kt", "v")}
    mc = context(graph, inputs, dtype)
    env = reference_env(mc, inputs)
    (match,) = find_attention(graph)
    sub, program, names = build(mc, match.nodes(graph))
    result = simulate(program, mc.config, {names[x]: env[x] for x in sub.inputs}, checked=True)
    (out,) = sub.outputs
    assert_matches(result.outputs[names[out]], env[out], dtype)
