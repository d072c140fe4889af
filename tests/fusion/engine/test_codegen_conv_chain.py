"""Layer fusion (`conv_chain`): consecutive Convs computed band by band with their halos, intermediates in the
scratchpad. Random chains (kernel sizes, strides 1/2, channels, spatial sizes with a ragged last band, band
heights) in the simulator's race-checked mode against the unfused plan's kernels and the reference (int8
bit-exact, fp32 within 1e-5); the DRAM traffic it saves; the planner taking it where it pays."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from engine_helpers import assert_reference, context, reference_env, run_group
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.bench_layer_fusion import inverted_residual
from fusion.engine.codegen.conv_chain import band_heights, band_ranges, parse_chain
from fusion.engine.conv_chain_match import find_conv_chains
from fusion.engine.engine import EngineOptions, FusionEngine
from fusion.engine.errors import CodegenError
from fusion.engine.execute import run_kernel
from fusion.engine.kernel import build_kernel, dram_forms, try_build
from fusion.engine.plan import Group, baseline_group
from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType
from fusion.lower.compiler import constant_forms
from fusion.lower.context import split_const_key, taps_form
from simulator.config import load_config

CHAIN = "conv_chain"


def chain_graph(c, hw, layers, residual=False, seed=0, batch=1):
    """Convs (cout, kernel, stride, relu) in sequence from x [batch, c, *hw] (padding k // 2, bias), then
    optionally Add(x) + Relu; returns the graph and its node names."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("chain")
    x = h = b.input("x", (batch, c, *hw))
    names, cin = [], c
    for i, (cout, k, stride, relu) in enumerate(layers):
        w = b.constant((rng.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k)).astype(np.float32), f"w{i}")
        bias = b.constant((rng.standard_normal(cout) * 0.1).astype(np.float32), f"b{i}")
        pad = k // 2
        h = b.op(
            OpType.Conv, h, w, bias, name=f"c{i}", dilations=(1, 1), group=1, pads=(pad,) * 4, strides=(stride,) * 2
        )
        names.append(f"c{i}")
        if relu:
            h = b.op(OpType.Relu, h, name=f"r{i}")
            names.append(f"r{i}")
        cin = cout
    if residual:
        h = b.op(OpType.Relu, b.op(OpType.Add, h, x, name="add"), name="relu_out")
        names += ["add", "relu_out"]
    b.output(h)
    return b.build(), tuple(names)


def _inputs(graph, seed=1):
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal(graph.types["x"].shape).astype(np.float32)}


def _check(graph, names, dtype, rows=0, wide=False, tol=1e-5):
    """The chain kernel (race-checked) against the reference, and against the unfused kernels run one by one."""
    inputs = _inputs(graph)
    mc = context(graph, inputs, dtype)
    kernel, run, env = run_group(mc, Group(names, CHAIN, rows, resident_a=wide), inputs)
    assert_reference(run.outputs, env, graph.outputs[0], dtype, tol)
    unfused = dict(env)
    for name in names:
        node = graph.node(name)
        k = build_kernel(mc, baseline_group(node))
        unfused.update(run_kernel(mc, k, unfused).outputs if k.program is not None else {})
    assert_reference(run.outputs, unfused, graph.outputs[0], dtype, tol)
    return mc, run


@st.composite
def chains(draw):
    """A chain of 2-3 Convs: channels that fill at least 1/16 of the array, 1x1 or 3x3 kernels, the first conv of
    stride 1 or 2; spatial sizes whose band split leaves a ragged last band."""
    c = draw(st.sampled_from([8, 16, 24, 32]))
    n = draw(st.integers(2, 3))
    layers = []
    for i in range(n):
        cout = draw(st.sampled_from([8, 16, 24, 40]))
        k = draw(st.sampled_from([1, 3]))
        stride = draw(st.sampled_from([1, 2])) if i == 0 else 1
        layers.append((cout, k, stride, draw(st.booleans()) if i < n - 1 else False))
    hw = (draw(st.integers(3, 13)), draw(st.integers(3, 13)))
    return c, hw, layers


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=chains(), band=st.sampled_from([0, 1, 2, 3]), wide=st.booleans())
def test_random_chains_match_the_reference_and_unfused(dtype: str, case: tuple, band: int, wide: bool) -> None:
    c, hw, layers = case
    graph, names = chain_graph(c, hw, layers)
    cfg = load_config("base")
    nodes = [graph.node(n) for n in names]
    if not band_heights(graph, cfg, None, nodes):  # a stage under 1/N of the array: not chained
        with pytest.raises(CodegenError):
            parse_chain(graph, nodes, cfg)
        return
    out_rows = graph.types[graph.outputs[0]].shape[2]
    _check(graph, names, dtype, min(band, out_rows), wide)


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_a_resnet_basic_block_with_its_residual(dtype: str) -> None:
    """3x3 -> ReLU -> 3x3 + x -> ReLU, 64 channels at 16x16 (resnet18's layer1 at 64x64), bands of 3 rows: the
    ragged last band and both image edges."""
    graph, names = chain_graph(64, (16, 16), [(64, 3, 1, True), (64, 3, 1, False)], residual=True)
    _check(graph, names, dtype, 3)
    _check(graph, names, dtype, 0, True)  # wide bands: every buffer slot holds one band (12 rows in fp32)


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_a_bottleneck_of_three_convs_with_a_strided_middle(dtype: str) -> None:
    graph, names = chain_graph(32, (12, 10), [(16, 1, 1, True), (16, 3, 2, True), (48, 1, 1, False)])
    _check(graph, names, dtype)


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
@pytest.mark.parametrize("wide", [False, True])
def test_a_batch_of_two_images_runs_band_by_band_per_image(dtype: str, wide: bool) -> None:
    graph, names = chain_graph(16, (7, 9), [(16, 3, 1, True), (32, 3, 1, False)], residual=False, batch=2)
    _check(graph, names, dtype, 3, wide)


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_a_chain_ending_at_a_conv_only_an_add_reads(dtype: str) -> None:
    """A downsampling block's main path: its last Conv is read only by an Add of another tensor, so the int8 plan
    dequantizes it per channel (float32 out); the chain without the Add writes that float32 value exactly."""
    rng = np.random.default_rng(2)
    b = GraphBuilder("main_path")
    x = b.input("x", (1, 16, 9, 9))
    attrs = {"dilations": (1, 1), "group": 1, "pads": (1, 1, 1, 1)}
    w0 = b.constant((rng.standard_normal((32, 16, 3, 3)) / 12).astype(np.float32), "w0")
    w1 = b.constant((rng.standard_normal((32, 32, 3, 3)) / 17).astype(np.float32), "w1")
    h = b.op(
        OpType.Conv, x, w0, b.constant(rng.standard_normal(32).astype(np.float32)), name="c0", strides=(2, 2), **attrs
    )
    h = b.op(OpType.Conv, b.op(OpType.Relu, h, name="r0"), w1, name="c1", strides=(1, 1), **attrs)
    b.output(b.op(OpType.Add, h, b.input("skip", (1, 32, 5, 5)), name="add"))
    graph = b.build()
    inputs = {v: rng.standard_normal(graph.types[v].shape).astype(np.float32) for v in graph.inputs}
    mc = context(graph, inputs, dtype)
    assert dtype == "fp32" or mc.qplan.matrix["c1"].dequantize
    _, run, env = run_group(mc, Group(("c0", "r0", "c1"), CHAIN), inputs)
    assert_reference(run.outputs, env, "c1", "fp32" if dtype == "fp32" else "int8", 1e-5)


def test_intermediates_never_touch_dram() -> None:
    """DRAM traffic: the chain input (read once per band with its halo rows), the weights (once per band), the
    padded tile rows past the image edges (zeros), the output through its scratch; the unfused kernels also write
    and re-read the intermediate (and its padded and channels-last copies)."""
    graph, names = chain_graph(32, (16, 16), [(32, 3, 1, True), (32, 3, 1, False)])
    mc, run = _check(graph, names, "fp32", 4)
    z_rows = [4] * 4
    halo_rows = sum(min(16, o0 + r + 2) - max(0, o0 - 2) for o0, r in zip(range(0, 16, 4), z_rows, strict=True))
    x_reads = 32 * 16 * halo_rows * 4
    weights = 2 * (32 * 32 * 9 + 32) * 4 * 4
    out = 32 * 16 * 16 * 4
    edges = 4 * 18 * 32 * 4  # one padded row of each stage's tile at the top and at the bottom
    assert run.dram_read_bytes == x_reads + weights + edges + out
    assert run.dram_write_bytes == 2 * out  # the scratch and the NCHW output: no intermediate
    inputs = _inputs(graph)
    env = reference_env(mc, inputs)
    unfused = sum(
        r.dram_read_bytes + r.dram_write_bytes
        for r in (run_kernel(mc, build_kernel(mc, baseline_group(graph.node(n))), env) for n in names)
    )
    assert run.dram_read_bytes + run.dram_write_bytes < unfused


def test_band_ranges_cover_each_stages_halo() -> None:
    graph, names = chain_graph(16, (9, 9), [(16, 3, 2, True), (16, 3, 1, False)])
    chain = parse_chain(graph, [graph.node(n) for n in names], load_config("base"))
    # last stage rows [2, 4) of 5: its 3x3 (pad 1) reads stage-0 rows 1..4; stage 0 (3x3/2, pad 1) computes them
    assert band_ranges(chain, 2, 2) == [(1, 5), (2, 4)]
    assert band_ranges(chain, 0, 5) == [(0, 5), (0, 5)]


def test_the_candidate_finder_takes_chains_whose_intermediates_stay_inside() -> None:
    graph, _ = chain_graph(16, (8, 8), [(16, 3, 1, True), (16, 3, 1, False)], residual=True)
    assert find_conv_chains(graph) == [("c0", "r0", "c1"), ("c0", "r0", "c1", "add", "relu_out")]
    b = GraphBuilder("shared")  # the intermediate also read outside: no chain
    x = b.input("x", (1, 16, 8, 8))
    w = b.constant(np.ones((16, 16, 1, 1), np.float32), "w")
    h = b.op(OpType.Conv, x, w, name="c0", dilations=(1, 1), group=1, pads=(0,) * 4, strides=(1, 1))
    y = b.op(OpType.Conv, h, w, name="c1", dilations=(1, 1), group=1, pads=(0,) * 4, strides=(1, 1))
    b.output(b.op(OpType.Add, y, h, name="add"))
    assert find_conv_chains(b.build()) == []


def test_refusals_name_the_reason() -> None:
    graph, names = chain_graph(16, (8, 8), [(16, 3, 1, True)])
    with pytest.raises(CodegenError, match="at least two"):
        parse_chain(graph, [graph.node(n) for n in names], load_config("base"))
    graph, names = chain_graph(16, (8, 8), [(16, 3, 1, True), (16, 3, 1, False)])
    mc = context(graph, _inputs(graph), "fp32")
    with pytest.raises(CodegenError, match="does not fit"):
        build_kernel(mc, Group(names, CHAIN, 9))


def _separately(graph, inputs, config) -> int:
    """The block's cycles as separate kernels on `config`: each Conv (+ Relu) by its fastest conv schedule, the
    residual Add + Relu as one chain kernel."""
    mc = context(graph, inputs, "fp32", config)
    env = reference_env(mc, inputs)
    total = run_kernel(mc, build_kernel(mc, Group(("add", "relu_out"), "chain")), env).cycles
    for nodes in (("c0", "r0"), ("c1",)):
        runs = [try_build(mc, Group(nodes, s)) for s in ("implicit_gemm", "implicit_packed", "implicit_stationary")]
        total += min(run_kernel(mc, k, env).cycles for k in runs if not isinstance(k, str))
    return total


def test_the_planner_takes_the_chain_where_bandwidth_is_scarce() -> None:
    """resnet18's layer1 block at 64x64 (fp32): the chain's saved intermediate round trips pay more the less
    bandwidth the machine has (on `base` the two convs' weights, 147 KiB each and re-read by every band,
    dominate its traffic); at 4 DRAM bytes per cycle the planner takes it, and it measures fewer cycles than the
    separate kernels."""
    graph, names = chain_graph(64, (16, 16), [(64, 3, 1, True), (64, 3, 1, False)], residual=True)
    inputs = _inputs(graph)
    scarce = replace(load_config("base"), name="base_bw4", dram_bytes_per_cycle=4)
    engine = FusionEngine(graph, scarce, "fp32", EngineOptions(policy="dynamic", workers=1), samples=[inputs])
    result = engine.run(inputs)
    (group,) = engine.plan.groups
    assert group.strategy == CHAIN and len(result.records) == 1
    gains = []
    for config in (load_config("base"), scarce):
        mc = context(graph, inputs, "fp32", config)
        chained = run_kernel(mc, build_kernel(mc, group), reference_env(mc, inputs)).cycles
        gains.append(1 - chained / _separately(graph, inputs, config))
    assert gains[1] > max(gains[0], 0.0)


@st.composite
def inverted_residuals(draw):
    """MobileNetV2 inverted residuals: channels, expansion, output channels (the block input's for a residual),
    stride, spatial size (ragged last bands), ReLU6 or ReLU between the stages, a 3x3 or 5x5 depthwise kernel,
    the weights' gain (whether the Clips bind or are the int8 requantization clamp)."""
    c = draw(st.sampled_from([8, 16, 24]))
    expand = draw(st.sampled_from([1, 2, 3, 6]))
    stride = draw(st.sampled_from([1, 2]))
    cout = draw(st.sampled_from([c, 16, 32]))
    hw = (draw(st.integers(3, 12)), draw(st.integers(3, 12)))
    return (
        c,
        hw,
        expand,
        cout,
        stride,
        draw(st.booleans()),
        draw(st.sampled_from([3, 5])),
        draw(st.sampled_from([0.5, 1.5])),
    )


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=inverted_residuals(), band=st.sampled_from([0, 1, 2, 3]), wide=st.booleans(), seed=st.integers(0, 3))
def test_random_inverted_residuals_match_the_reference_and_unfused(
    dtype: str, case: tuple, band: int, wide: bool, seed: int
) -> None:
    """int8 bit-exact (the Clips between stages dequantize, clip and requantize at the next Conv's input scale,
    the project Conv read only by the Add is dequantized per channel), fp32 within 1e-4."""
    c, hw, expand, cout, stride, relu6, k, gain = case
    graph, names = inverted_residual(c, hw, expand, cout, stride, seed=seed, relu6=relu6, dw_kernel=k, gain=gain)
    out_rows = graph.types[graph.outputs[0]].shape[2]
    mc = context(graph, _inputs(graph), dtype)
    layouts = {w for _, w in band_heights(graph, mc.config, mc.qplan, [graph.node(n) for n in names])}
    if wide not in layouts:
        # fp32 5x5: a channel block's 25 diagonal [16, 16] weight tiles exceed a step's third of a bank (wide
        # bands' step halves hold them)
        assert (dtype, k, wide) == ("fp32", 5, False)
        with pytest.raises(CodegenError, match="does not fit"):
            build_kernel(mc, Group(names, CHAIN, resident_a=wide))
        wide = True
    _check(graph, names, dtype, min(band, out_rows), wide, tol=1e-4)


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_an_inverted_residual_of_two_images_and_a_depthwise_head(dtype: str) -> None:
    """A batch of two 6x-expanded blocks (MobileNetV2's features.3 at 64x64 scaled down); then a chain starting at
    the depthwise Conv (features.1: depthwise -> Clip -> project), its input read straight into the depthwise
    stage's tile."""
    graph, names = inverted_residual(16, (8, 8), 6, 16, 1, batch=2)
    _check(graph, names, dtype, 3, tol=1e-4)
    graph, names = inverted_residual(16, (9, 9), 2, 24, 2)
    _check(graph, names[2:], dtype, 2, tol=1e-4)


def test_the_candidate_finder_takes_inverted_residuals() -> None:
    """Every run of 2-3 Convs through the Clips; a run ending at a Clip is taken without it."""
    graph, _ = inverted_residual(16, (8, 8), 6, 16, 1)
    assert find_conv_chains(graph) == [
        ("c0", "a0", "c1"),
        ("c0", "a0", "c1", "a1", "c2"),
        ("c0", "a0", "c1", "a1", "c2", "add"),
        ("c1", "a1", "c2"),
    ]
    b = GraphBuilder("grouped")  # a grouped Conv that is not depthwise: no chain through it
    x = b.input("x", (1, 16, 8, 8))
    attrs = {"dilations": (1, 1), "pads": (0,) * 4, "strides": (1, 1)}
    h = b.op(OpType.Conv, x, b.constant(np.ones((16, 8, 1, 1), np.float32)), name="c0", group=2, **attrs)
    b.output(b.op(OpType.Conv, h, b.constant(np.ones((16, 16, 1, 1), np.float32)), name="c1", group=1, **attrs))
    assert find_conv_chains(b.build()) == []


def test_a_clip_the_chain_cannot_absorb_is_refused_by_name() -> None:
    graph, names = inverted_residual(16, (8, 8), 6, 16, 1)
    nodes = [graph.node(n) for n in names[:4]]  # ends at the depthwise Conv's Clip
    with pytest.raises(CodegenError, match="a1.*last Conv"):
        parse_chain(graph, nodes, load_config("base"))


def test_fused_conv_kernels_carry_no_baseline_tap_major_weight() -> None:
    """A fused conv kernel's DRAM image holds its own packing of each Conv weight, not the baseline's tap-major
    copy (`constant_forms(conv_taps=False)`); the baseline's one-Conv kernel keeps it."""
    graph, names = chain_graph(16, (8, 8), [(16, 3, 1, True), (16, 3, 1, False)])
    for dtype in ("fp32", "int8"):
        mc = context(graph, _inputs(graph), dtype)
        taps = {k for k in constant_forms(graph, mc.qplan) if split_const_key(k)[0] == taps_form(mc.int8)}
        assert len(taps) == 2
        for group in (Group(names, CHAIN), Group(("c0", "r0"), "implicit_gemm")):
            forms, _ = dram_forms(mc, mc.subgraph(group.nodes), group)
            assert not taps & forms.keys() and forms  # (the kernels' packings: the chain tests run them)
        forms, _ = dram_forms(mc, mc.subgraph(("c1",)), baseline_group(graph.node("c1")))
        assert len(taps & forms.keys()) == 1


def test_int8_clips_that_are_the_drains_clamp_at_the_next_convs_scale_need_no_pass() -> None:
    """Both ReLU6s below every int8 value (gain 0.5) and each next Conv's input scale its producer's output scale:
    the drained rows are the next stage's int8 input as they are (no clip, no rescale pass), still bit-exact."""
    graph, names = inverted_residual(16, (6, 6), 3, 16, 1, seed=0, gain=0.5)
    mc = context(graph, _inputs(graph), "int8")
    for conv, nxt in (("c0", "c1"), ("c1", "c2")):
        assert mc.qplan.scales[graph.node(conv).outputs[0]] == mc.qplan.matrix[nxt].input_scale
    _check(graph, names, "int8", 2)


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_an_inverted_residual_whose_input_is_a_conv_output(dtype: str) -> None:
    """MobileNetV2's block input is a Conv's output read by the expand Conv and the Add: int8 in the quantized
    plan, so the residual is dequantized (f32(q) x f32(scale)) before the float32 Add, as the reference."""
    graph, names = inverted_residual(16, (8, 8), 6, 16, 1, stem=True)
    _check(graph, names, dtype, 3, tol=1e-4)
