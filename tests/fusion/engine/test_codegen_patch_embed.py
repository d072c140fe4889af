"""The patch-embedding GEMM (`patch_embed`): a patchify Conv + its token Reshape + Transpose as one kernel over the
input's own rows. Random patch sizes, channels, image sizes (odd patch counts, leftover rows and columns), batch,
bias or none, race-checked, against the numpy reference (fp32 within 1e-5) and the quantized reference (int8
bit-exact); its matrix work and DRAM traffic counted from the kernel."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import assert_reference, context, run_group
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fusion.engine.candidates import enumerate_candidates
from fusion.engine.codegen.patch_embed import find_patch_embeds, pack_patch_weights, patchify
from fusion.engine.errors import CodegenError
from fusion.engine.features import kernel_features
from fusion.engine.plan import Group
from fusion.graph.builder import GraphBuilder
from fusion.graph.ir import Graph
from fusion.graph.ops import OpType

PATCH = "patch_embed"


def patch_graph(n, c, cout, size, patch, bias, seed=0, tail=True) -> Graph:
    """x[n, c, *size] -> Conv(kernel = stride = patch) -> Reshape(n, cout, patches) -> Transpose(0, 2, 1)
    (`size`/`patch` of length 1: a 1-D conv, no Reshape) -> Relu, so the tokens are not the graph output."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("patchify")
    x = b.input("x", (n, c, *size))
    w = b.constant((rng.standard_normal((cout, c, *patch)) / np.sqrt(c * np.prod(patch))).astype(np.float32), "w")
    args = [x, w]
    if bias:
        args.append(b.constant((rng.standard_normal(cout) * 0.1).astype(np.float32), "b"))
    zeros = (0,) * (2 * len(patch))
    h = b.op(OpType.Conv, *args, name="conv", strides=patch, pads=zeros, dilations=(1,) * len(patch), group=1)
    if len(patch) == 2:
        out = [s // p for s, p in zip(size, patch, strict=True)]
        h = b.op(OpType.Reshape, h, name="flat", shape=(n, cout, out[0] * out[1]))
    h = b.op(OpType.Transpose, h, name="tokens", perm=(0, 2, 1))
    b.output(b.op(OpType.Relu, h, name="relu") if tail else h)
    return b.build()


def _run(graph: Graph, dtype: str, seed: int = 1):
    rng = np.random.default_rng(seed)
    inputs = {"x": rng.standard_normal(graph.types["x"].shape).astype(np.float32)}
    mc = context(graph, inputs, dtype)
    (names,) = find_patch_embeds(graph)
    kernel, run, env = run_group(mc, Group(names, PATCH), inputs)  # race-checked
    assert_reference(run.outputs, env, "tokens", dtype, 1e-5)
    return mc, kernel, run


@st.composite
def patchify_shapes(draw):
    two_d = draw(st.booleans())
    dims = 2 if two_d else 1
    patch = tuple(draw(st.integers(1, 16)) for _ in range(dims))
    out = tuple(draw(st.integers(1, 5)) for _ in range(dims))
    extra = tuple(draw(st.integers(0, p - 1)) for p in patch)  # rows/columns past the last patch
    size = tuple(o * p + e for o, p, e in zip(out, patch, extra, strict=True))
    return draw(st.integers(1, 2)), draw(st.integers(1, 4)), draw(st.integers(1, 40)), size, patch


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=patchify_shapes(), bias=st.booleans())
def test_every_patchify_conv_matches_the_reference(dtype: str, shape: tuple, bias: bool) -> None:
    _run(patch_graph(*shape, bias), dtype)


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_vit_patch_embedding_is_one_preload_per_channel_row_and_cout_tile(dtype: str) -> None:
    """ViT at 32x32, patch 8, 3 -> 64 channels, 16 patches: 3 x 8 preloads per Cout tile of 16, each followed by
    one matmul of all 16 patches; the input read once, the weight once, only the tokens written."""
    graph = patch_graph(1, 3, 64, (32, 32), (8, 8), True)
    mc, kernel, run = _run(graph, dtype)
    feats = kernel_features(mc, kernel, zero_tile_fraction=0.0)
    assert feats.preloads == 4 * 3 * 8
    assert feats.matmuls == 4 * 3 * 8 and feats.matmul_rows == 4 * 3 * 8 * 16
    es = 1 if dtype == "int8" else 4
    assert run.dram_write_bytes == 16 * 64 * es
    table = 64 * 8 if dtype == "int8" else 0  # int8: the per-channel requantizer
    assert run.dram_read_bytes == 3 * 32 * 32 * 4 + 64 * 3 * 64 * es + 64 * 4 + table


def test_an_odd_token_count_and_leftover_pixels() -> None:
    """197-token-like odd shapes: 7 x 3 patches of 5 x 6 from a 37 x 20 image (2 rows and 2 columns unused)."""
    _run(patch_graph(1, 3, 20, (37, 20), (5, 6), True), "int8")


def test_pack_patch_weights_holds_a_steps_weights_contiguously() -> None:
    w = np.arange(20 * 3 * 2 * 4, dtype=np.float32).reshape(20, 3, 2, 4)
    flat = pack_patch_weights(w, 16)
    assert flat.size == w.size
    # second Cout tile (channels 16..19, width 4), input channel 2, kernel row 1: a [kw, width] tile
    start = 16 * 3 * 2 * 4 + (2 * 2 + 1) * 4 * 4
    np.testing.assert_array_equal(flat[start : start + 16].reshape(4, 4), w[16:20, 2, 1, :].T)


def _conv(strides=(4, 4), pads=(0, 0, 0, 0), group=1) -> Graph:
    b = GraphBuilder("conv")
    x = b.input("x", (1, 6, 8, 8))
    w = b.constant(np.ones((12, 6 // group, 4, 4), np.float32), "w")
    b.output(b.op(OpType.Conv, x, w, name="conv", strides=strides, pads=pads, dilations=(1, 1), group=group))
    return b.build()


def test_only_non_overlapping_unpadded_patches_are_taken() -> None:
    graph = patch_graph(1, 3, 16, (8, 8), (4, 4), False)
    assert find_patch_embeds(graph) == [("conv", "flat", "tokens")]
    assert any(c.family == PATCH for c in enumerate_candidates(graph))
    assert find_patch_embeds(_conv()) == []  # NCHW out: no token layout to absorb
    for graph, reason in (
        (_conv(strides=(2, 2)), "non-overlapping"),
        (_conv(pads=(1, 1, 1, 1)), "non-overlapping"),
        (_conv(group=3), "grouped"),
    ):
        with pytest.raises(CodegenError, match=reason):
            patchify(graph, context(graph, {}, "fp32").config, graph.node("conv"))


def test_a_patch_wider_than_the_array_is_refused_with_its_reason() -> None:
    graph = patch_graph(1, 1, 16, (40,), (20,), False)
    mc = context(graph, {}, "fp32")
    with pytest.raises(CodegenError, match="patch width 20 exceeds the array's 16"):
        patchify(graph, mc.config, graph.node("conv"))
