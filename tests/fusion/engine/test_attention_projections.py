"""The attention kernel with its Q, K and V projections computed in it (`codegen.attention_proj`) against the
reference: random sequence lengths, head dims, head and KV-head counts, masks, one packed projection or one per
operand, self- and cross-attention; int8 bit-exact, fp32 within 1e-5; every run in the simulator's checked
(race-detecting) mode; the DRAM traffic is exactly the activation, the packed weights and the output."""

from __future__ import annotations

import pytest
from attention_graphs import AttentionShape, attention_graph
from engine_helpers import context, model, reference_env
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_attention_kernel import assert_matches, build, shapes

from fusion.engine.attention_match import find_attention, find_projected_attention
from fusion.engine.codegen.attention_proj import stores_whole
from fusion.engine.errors import CodegenError
from fusion.engine.execute import run_kernel
from fusion.engine.kernel import try_build
from fusion.engine.plan import Group
from fusion.lower.views import dense
from isa.enums import DType, Unit
from simulator.run import simulate


def run(shape: AttentionShape, dtype: str, out: bool = False, config: str = "base", seed: int = 0):
    """The attention with its Q, K and V projections taken in; `out`: its output projection too (the graph's last
    MatMul)."""
    graph, inputs = attention_graph(shape, seed)
    mc = context(graph, inputs, dtype, config)
    env = reference_env(mc, inputs)
    found = find_projected_attention(graph)
    assert all(m.projections for m in found)
    (match,) = [m for m in found if (m.out_projection is not None) == out]
    assert set(match.names()) > set(find_attention(graph)[0].names())
    sub, program, names = build(mc, match.nodes(graph))
    result = simulate(program, mc.config, {names[v]: env[v] for v in sub.inputs}, checked=True)
    (out,) = sub.outputs
    return result, result.outputs[names[out]], env[out]


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
@pytest.mark.parametrize(
    "shape",
    [
        AttentionShape(seq=17, heads=2, head_dim=32, scale="none", prescale=True, fused_qkv=True),  # ViT-like
        AttentionShape(seq=16, heads=4, kv_heads=2, head_dim=16, causal=True),  # LLaMA-like GQA
        AttentionShape(seq=10, keys=6, heads=2, head_dim=8, causal=True),  # cross-attention
    ],
)
@pytest.mark.parametrize("out", [False, True])
def test_projected_attention_on_model_shapes(shape, dtype, out):
    _, got, want = run(shape, dtype, out)
    assert_matches(got, want, dtype)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shapes(24, [4, 8, 16, 24]),
    st.sampled_from(["fp32", "int8"]),
    st.booleans(),
)
def test_projected_attention_equals_the_reference(shape, dtype, out):
    """fp32 heads of up to 96 features may not fit a slot with their weights (refused, by name); int8 always fits."""
    try:
        _, got, want = run(shape, dtype, out)
    except CodegenError as err:
        assert dtype == "fp32" and "do not fit one buffer slot" in str(err), err
        assume(False)
    assert_matches(got, want, dtype)


@pytest.mark.parametrize("prescale", [True, False])
@pytest.mark.parametrize("out", [False, True])
def test_the_dram_traffic_is_the_activation_the_packed_weights_and_the_output(out, prescale):
    """int8 ViT-like self-attention: the float activation's rows once for all heads (kept in the spare bank by the
    first head's step), per head step that head's packed W_q, W_k, W_v (and its rows of W_o) and its int8 K
    (17 x 32) stored to the scratch and loaded back transposed, but for the 17th key's tile, K's row read in place
    (pre-scaled and requantized from there when K is: a tile as loaded); the int8 output once (the merged heads, or
    their projection); Q, V and (out) the merged heads never."""
    shape = AttentionShape(seq=17, heads=2, head_dim=32, scale="none", prescale=prescale, fused_qkv=True)
    result, got, want = run(shape, "int8", out)
    assert_matches(got, want, "int8")
    x_bytes, w_bytes, k_bytes = 17 * 64 * 4, 3 * 64 * 32 + (32 * 64 if out else 0), 17 * 32
    assert result.counters.dram_read_bytes == x_bytes + 2 * (w_bytes + 16 * 32)
    assert result.counters.dram_write_bytes == 17 * 64 + 2 * k_bytes


def test_a_head_beyond_one_buffer_slot_is_refused_clearly():
    with pytest.raises(CodegenError, match="do not fit one buffer slot"):
        run(AttentionShape(seq=16, heads=4, kv_heads=2, head_dim=32, causal=True), "fp32")


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_a_sequence_first_activation_of_two_batches_is_read_row_strided(dtype):
    """The bundled encoder's activation is [seq, batch, features]: a head's positions are every other row of the
    projections' input and of the output projection's output; both variants run exact and race-free."""
    graph, x = model("encoder_post_d64")
    mc = context(graph, x, dtype)
    env = reference_env(mc, x)
    found = find_projected_attention(graph)
    assert {(bool(m.projections), m.out_projection is not None) for m in found} == {(1, 0), (1, 1)}
    for match in found:
        kernel = try_build(mc, Group(match.nodes(graph), "attention_proj"), "any")
        assert not isinstance(kernel, str), kernel
        for value, got in run_kernel(mc, kernel, env, checked=True).outputs.items():
            assert_matches(got, env[value], dtype)


def test_the_output_projection_stores_y_whole_when_that_is_cheaper():
    """Hidden 64 is four output chunks. 17 rows (ViT-like): each chunk drained straight into its columns of one
    dense tile of Y's rows (`mx.drain.s`, row stride 64) and stored by one DMA: one store, exact; 128 rows alike
    (one DMA's latency instead of four); one chunk: never."""
    shape = AttentionShape(seq=17, heads=2, head_dim=32, scale="none", prescale=True, fused_qkv=True)
    graph, inputs = attention_graph(shape)
    mc = context(graph, inputs, "int8")
    (match,) = [m for m in find_projected_attention(graph) if m.out_projection is not None]
    _, program, _ = build(mc, match.nodes(graph))
    mnemonics = [i.mnemonic for i in program.instructions()]
    # Y's four chunks, each head's two key tiles' scores (17 keys) and its K's two chunks of 16 columns drained
    # into their columns of whole rows; one store of Y (and each head's K to the scratch)
    assert mnemonics.count("dma.st") == 1 + 2 and mnemonics.count("mx.drain.s") == 4 + 2 * 2 + 2 * 2
    _, got, want = run(shape, "int8", out=True)
    assert_matches(got, want, "int8")
    y = dense(0, (128, 64), DType.i8)
    assert stores_whole(mc.config, y, 17, 64, 1) and stores_whole(mc.config, y, 128, 64, 1)
    assert not stores_whole(mc.config, dense(0, (17, 16), DType.i8), 17, 16, 1)


def test_only_the_head_that_stores_hands_its_step_to_the_store_unit():
    """With the output projection the last head alone stores Y: the first head's matrix work ends with no token to
    the store unit (a push waits for every result before it, for nothing), so one pop on the store unit."""
    shape = AttentionShape(seq=17, heads=2, head_dim=32, scale="none", prescale=True, fused_qkv=True)
    graph, inputs = attention_graph(shape)
    mc = context(graph, inputs, "int8")
    (match,) = [m for m in find_projected_attention(graph) if m.out_projection is not None]
    _, program, _ = build(mc, match.nodes(graph))
    tokens = [i.values for i in program.instructions() if i.mnemonic in ("sync.push", "sync.pop")]
    # Y's push and pop, and each head's K handed to the store unit (to the scratch) and loaded back
    assert tokens.count((int(Unit.matrix), int(Unit.store))) == 2 + 2 * 2
