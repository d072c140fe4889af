"""The patch-embedding GEMM (`patch_embed`): a patchify Conv + its token Reshape + Transpose as one kernel over the
input's own rows, optionally with the class-token Concat and the chain after it (position embedding Add,
LayerNorm). Random patch sizes, channels, image sizes (odd patch counts, leftover rows and columns), batch, bias,
class tokens and schedules, race-checked, against the numpy reference (fp32 within 1e-5) and the quantized
reference (int8: integer outputs bit-exact, float outputs within 1e-5); matrix work and DRAM traffic counted."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import context, run_group
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fusion.engine.candidates import enumerate_candidates
from fusion.engine.codegen.patch_embed import find_patch_embeds, pack_patch_weights, patchify
from fusion.engine.errors import CodegenError
from fusion.engine.features import kernel_features
from fusion.engine.kernel import build_kernel
from fusion.engine.plan import Group
from fusion.graph.builder import GraphBuilder
from fusion.graph.ir import Graph
from fusion.graph.ops import OpType

PATCH = "patch_embed"
TAILS = ("none", "concat", "add", "layernorm")  # how much of a ViT's embedding follows the tokens


def patch_graph(n, c, cout, size, patch, bias, seed=0, tail="none", classes=(1, 0)) -> Graph:
    """x[n, c, *size] -> Conv(kernel = stride = patch) -> Reshape(n, cout, patches) -> Transpose(0, 2, 1)
    (`size`/`patch` of length 1: a 1-D conv, no Reshape) [-> Concat(class rows before, tokens, rows after)
    -> Add(position embedding) -> LayerNorm], then a Relu of the last value (plus, after a LayerNorm, the sum it
    normalised: a value read outside the kernel, as a pre-LN block's residual)."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("patchify")
    x = b.input("x", (n, c, *size))
    w = b.constant((rng.standard_normal((cout, c, *patch)) / np.sqrt(c * np.prod(patch))).astype(np.float32), "w")
    args = [x, w]
    if bias:
        args.append(b.constant((rng.standard_normal(cout) * 0.1).astype(np.float32), "b"))
    zeros = (0,) * (2 * len(patch))
    h = b.op(OpType.Conv, *args, name="conv", strides=patch, pads=zeros, dilations=(1,) * len(patch), group=1)
    out = [s // p for s, p in zip(size, patch, strict=True)]
    if len(patch) == 2:
        h = b.op(OpType.Reshape, h, name="flat", shape=(n, cout, out[0] * out[1]))
    h = b.op(OpType.Transpose, h, name="tokens", perm=(0, 2, 1))
    if tail != "none":
        rows = [
            b.constant(rng.standard_normal((n, k, cout)).astype(np.float32), f"cls{i}")
            for i, k in enumerate(classes)
            if k
        ]
        before = rows[:1] if classes[0] else []
        h = b.op(OpType.Concat, *before, h, *rows[len(before) :], name="cat", axis=1)
    total = int(np.prod(out)) + sum(classes)
    if tail in ("add", "layernorm"):
        pos = b.constant(rng.standard_normal((1, total, cout)).astype(np.float32), "pos")
        h = b.op(OpType.Add, h, pos, name="add")
    if tail == "layernorm":
        gamma = b.constant((1 + 0.1 * rng.standard_normal(cout)).astype(np.float32), "gamma")
        beta = b.constant((0.1 * rng.standard_normal(cout)).astype(np.float32), "beta")
        ln = b.op(OpType.LayerNorm, h, gamma, beta, name="ln", axis=2, epsilon=1e-6)
        h = b.op(OpType.Add, b.op(OpType.Relu, ln, name="relu"), h, name="residual")
    else:
        h = b.op(OpType.Relu, h, name="relu")
    b.output(h)
    return b.build()


def _group(graph: Graph, tail: str) -> tuple[str, ...]:
    """The candidate ending at the requested tail (`find_patch_embeds` lists every prefix)."""
    last = {"none": "tokens", "concat": "cat", "add": "add", "layernorm": "ln"}[tail]
    (names,) = [m for m in find_patch_embeds(graph) if m[-1] == last]
    return names


def _run(graph: Graph, dtype: str, tail: str = "none", resident: bool = False, seed: int = 1):
    rng = np.random.default_rng(seed)
    inputs = {"x": rng.standard_normal(graph.types["x"].shape).astype(np.float32)}
    mc = context(graph, inputs, dtype)
    kernel, run, env = run_group(mc, Group(_group(graph, tail), PATCH, resident_a=resident), inputs)  # checked
    assert run.outputs, "the kernel stored nothing"
    for value, got in run.outputs.items():
        if got.dtype == np.float32:
            np.testing.assert_allclose(got, env[value], rtol=1e-5, atol=1e-5, err_msg=value)
        else:
            np.testing.assert_array_equal(got, env[value], err_msg=value)
    return mc, kernel, run


@st.composite
def patchify_shapes(draw):
    dims = draw(st.sampled_from((1, 2)))
    patch = tuple(draw(st.integers(1, 16)) for _ in range(dims))
    out = tuple(draw(st.integers(1, 5)) for _ in range(dims))
    extra = tuple(draw(st.integers(0, p - 1)) for p in patch)  # rows/columns past the last patch
    size = tuple(o * p + e for o, p, e in zip(out, patch, extra, strict=True))
    return draw(st.integers(1, 2)), draw(st.integers(1, 4)), draw(st.integers(1, 40)), size, patch


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
@settings(max_examples=16, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shape=patchify_shapes(),
    bias=st.booleans(),
    tail=st.sampled_from(TAILS),
    classes=st.sampled_from(((1, 0), (2, 0), (1, 1), (0, 1))),
    resident=st.booleans(),
)
# (fits a slot with one channel's regrouped rows per step, not with every channel's)
@example(shape=(1, 4, 3, (45, 70), (9, 14)), bias=False, tail="add", classes=(1, 0), resident=False)
# (two channels of one-pixel patches, a Concat tail: channel 0 regrouped by its own step)
@example(shape=(1, 2, 1, (1,), (1,)), bias=False, tail="concat", classes=(1, 0), resident=False)
def test_every_patchify_conv_and_embedding_tail_matches_the_reference(dtype, shape, bias, tail, classes, resident):
    graph = patch_graph(*shape, bias, tail=tail, classes=classes)
    try:
        _run(graph, dtype, tail, resident)
    except CodegenError as err:  # the resident schedule refuses what does not fit; nothing else may refuse
        assert resident and "resident" in str(err)


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
@pytest.mark.parametrize("resident", [False, True])
def test_vit_patch_embedding_is_one_preload_and_matmul_per_channel_row_and_cout_tile(dtype, resident) -> None:
    """ViT at 32x32, patch 8, 3 -> 64 channels, 16 patches: 3 x 8 preloads per Cout tile of 16, each followed by
    one matmul of all 16 patches; the input read once, the weight once, only the tokens written."""
    graph = patch_graph(1, 3, 64, (32, 32), (8, 8), True)
    mc, kernel, run = _run(graph, dtype, resident=resident)
    feats = kernel_features(mc, kernel, zero_tile_fraction=0.0)
    assert feats.preloads == feats.matmuls == 4 * 3 * 8 and feats.matmul_rows == 4 * 3 * 8 * 16
    es = 1 if dtype == "int8" else 4
    assert run.dram_write_bytes == 16 * 64 * es
    table = 64 * 8 if dtype == "int8" else 0  # int8: the per-channel requantizer
    assert run.dram_read_bytes == 3 * 32 * 32 * 4 + 64 * 3 * 64 * es + 64 * 4 + table


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_vit_embedding_stores_only_the_sum_and_its_layernorm(dtype) -> None:
    """Conv .. Concat(class token) + position Add + LayerNorm as one kernel: it writes the two values read
    outside (the sum, for the residual, and the LayerNorm), 17 x 64 float32 each, and no token tensor."""
    graph = patch_graph(1, 3, 64, (32, 32), (8, 8), True, tail="layernorm")
    _, _, run = _run(graph, dtype, "layernorm", resident=True)
    assert set(run.outputs) == {"add", "ln"}
    assert run.dram_write_bytes == 2 * 17 * 64 * 4


def test_an_odd_token_count_and_leftover_pixels() -> None:
    """Odd shapes: 7 x 3 patches of 5 x 6 from a 37 x 20 image (2 rows and 2 columns unused), two batches."""
    _run(patch_graph(2, 3, 20, (37, 20), (5, 6), True, tail="layernorm", classes=(1, 1)), "int8", "layernorm")


def test_a_large_image_runs_in_bands_with_weights_per_step() -> None:
    """Patch 16 on a 112 x 112 image, 20 output channels, fp32: the image does not fit a slot beside its regrouped
    copy, so it runs in bands of patch rows (rotating over the slots) with each step's weights loaded by it."""
    graph = patch_graph(1, 3, 20, (112, 112), (16, 16), False)
    mc = context(graph, {}, "fp32")
    with pytest.raises(CodegenError, match="resident"):
        build_kernel(mc, Group(_group(graph, "none"), PATCH, resident_a=True))
    _run(graph, "fp32")


def test_pack_patch_weights_holds_a_kernel_rows_weights_of_every_cout_tile_contiguously() -> None:
    w = np.arange(20 * 3 * 2 * 4, dtype=np.float32).reshape(20, 3, 2, 4)
    flat = pack_patch_weights(w, 16).reshape(3 * 2, 20 * 4)  # [C * ph, Cout * pw]
    row = flat[2 * 2 + 1]  # input channel 2, kernel row 1
    np.testing.assert_array_equal(row[: 16 * 4].reshape(4, 16), w[:16, 2, 1, :].T)  # Cout tile 0: [pw, 16]
    np.testing.assert_array_equal(row[16 * 4 :].reshape(4, 4), w[16:, 2, 1, :].T)  # tile 1: [pw, 4]


def _conv(strides=(4, 4), pads=(0, 0, 0, 0), group=1) -> Graph:
    b = GraphBuilder("conv")
    x = b.input("x", (1, 6, 8, 8))
    w = b.constant(np.ones((12, 6 // group, 4, 4), np.float32), "w")
    b.output(b.op(OpType.Conv, x, w, name="conv", strides=strides, pads=pads, dilations=(1, 1), group=group))
    return b.build()


def test_only_non_overlapping_unpadded_patches_are_taken() -> None:
    graph = patch_graph(1, 3, 16, (8, 8), (4, 4), False, tail="layernorm")
    found = find_patch_embeds(graph)
    assert ("conv", "flat", "tokens") in found and ("conv", "flat", "tokens", "cat", "add", "ln") in found
    assert any(c.family == PATCH for c in enumerate_candidates(graph))
    assert find_patch_embeds(_conv()) == []  # NCHW out: no token layout to absorb
    for bad, reason in (
        (_conv(strides=(2, 2)), "non-overlapping"),
        (_conv(pads=(1, 1, 1, 1)), "non-overlapping"),
        (_conv(group=3), "grouped"),
    ):
        with pytest.raises(CodegenError, match=reason):
            patchify(bad, context(bad, {}, "fp32").config, bad.node("conv"))


def test_a_patch_wider_than_the_array_is_refused_with_its_reason() -> None:
    graph = patch_graph(1, 1, 16, (40,), (20,), False)
    mc = context(graph, {}, "fp32")
    with pytest.raises(CodegenError, match="patch width 20 exceeds the array's 16"):
        patchify(graph, mc.config, graph.node("conv"))


def test_a_token_tail_wider_than_a_vector_register_is_refused() -> None:
    """The tail holds an image's [T, Cout] in one register (4096 elements on base): 65 x 64 is refused, the
    kernel without the tail still builds (the planner then runs the Concat and the chain apart)."""
    graph = patch_graph(1, 3, 64, (64, 64), (8, 8), False, tail="add")
    mc = context(graph, {}, "fp32")
    with pytest.raises(CodegenError, match="exceed a vector register"):
        build_kernel(mc, Group(_group(graph, "add"), PATCH))
    build_kernel(mc, Group(_group(graph, "none"), PATCH))
