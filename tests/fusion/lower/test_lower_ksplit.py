"""GEMMs whose reduction dimension K is too long for one buffer slot: the lowering splits K into chunks that
pipeline steps accumulate with mx.mma into one accumulator tile. Checked (race-detecting) mode; fp32 within
FP32_TOL of the reference (the matrix unit sums the same k-slices in the same order whether K is split or not),
int8 bit-exact against the quantized reference. Each case also asserts that its tiling really splits K."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lower_helpers import check_both, check_int8

from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType
from fusion.lower.compiler import compile, load_graph
from fusion.lower.errors import MemoryPlanError
from fusion.lower.kernels.gemm import Gemm, Operand, choose_tiling
from fusion.lower.views import dense
from isa.enums import DType
from simulator.config import load_config


def _w(*shape: int, seed: int = 1) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * 0.5).astype(np.float32)


def _gemm_graph(m: int, k: int, n: int, bias: bool = True):
    b = GraphBuilder("gemm")
    consts = [b.constant(_w(k, n))] + ([b.constant(_w(n, seed=2))] if bias else [])
    b.output(b.op(OpType.Gemm if bias else OpType.MatMul, b.input("x", (m, k)), *consts))
    return b.build()


def _splits(config: str, m: int, k: int, n: int, activation: str = "a") -> bool:
    """Whether both the fp32 form and the int8 form (the `activation` operand float, quantized on the device;
    the other an int8 constant) of an m x k x n GEMM split K on this machine."""
    cfg = load_config(config)
    f32 = [dense(0, (m, k), DType.f32), dense(0, (k, n), DType.f32)]
    fp32 = Gemm(Operand(f32[0]), Operand(f32[1]), dense(0, (m, n), DType.f32))
    a, b = (
        Operand(v, 0.1) if name == activation else Operand(replace(v, dtype=DType.i8))
        for name, v in zip("ab", f32, strict=True)
    )
    int8 = Gemm(a, b, dense(0, (m, n), DType.i8), requant=(1 << 20, 24))
    return all(choose_tiling(cfg, g).chunk < k for g in (fp32, int8))


@pytest.mark.parametrize("k", [1024, 2048, 4096, 2056])
def test_gemm_with_long_k_on_base(k: int) -> None:
    m, n = 20, 40  # three column tiles, the last one partial; K=2056 ends in a partial k-slice
    assert _splits("base", m, k, n)
    check_both(_gemm_graph(m, k, n), config="base")


def test_large_m_and_n_with_long_k() -> None:
    m, k, n = 300, 2048, 72  # several row blocks and column tiles
    assert _splits("base", m, k, n)
    check_both(_gemm_graph(m, k, n, bias=False), config="base")


def test_batched_matmul_of_two_activations_with_long_k() -> None:
    b = GraphBuilder("bmm")
    b.output(b.op(OpType.MatMul, b.input("a", (2, 12, 2048)), b.input("b", (2, 2048, 24))))
    check_both(b.build(), config="base")


def test_k_heavy_gemm_on_tiny() -> None:
    m, k, n = 7, 301, 9
    assert _splits("tiny", m, k, n)
    check_both(_gemm_graph(m, k, n), config="tiny")


@settings(max_examples=8, deadline=None, derandomize=True)
@given(st.integers(1, 100), st.integers(280, 420), st.integers(1, 10), st.sampled_from(["col", "row", "full"]))
def test_split_k_any_shape_and_bias_on_tiny(m: int, k: int, n: int, bias: str) -> None:
    """Row counts past the accumulator's limit (84 rows on tiny), partial tiles and k-slices, every bias form:
    the bias is added once, after the last chunk."""
    assert _splits("tiny", m, k, n)
    b = GraphBuilder("gemm")
    bias_shape = {"col": (n,), "row": (m, 1), "full": (m, n)}[bias]
    b.output(b.op(OpType.Gemm, b.input("x", (m, k)), b.constant(_w(k, n)), b.constant(_w(*bias_shape, seed=3))))
    check_both(b.build(), config="tiny")


def test_too_small_an_accumulator_is_a_clear_error() -> None:
    cfg = replace(load_config("tiny"), acc_bytes=128)  # a buffer slot of the accumulator holds no row at all
    with pytest.raises(MemoryPlanError, match="K=301 does not fit"):
        compile(_gemm_graph(7, 301, 9), cfg, "fp32")


def test_conv_with_long_im2col_k() -> None:
    """Cin * kh * kw = 1152: the im2col GEMM's B panel (K x pixels) is longer than a buffer slot."""
    b = GraphBuilder("conv")
    attrs = {"strides": (1, 1), "pads": (1, 1, 1, 1), "dilations": (1, 1), "group": 1}
    b.output(b.op(OpType.Conv, b.input("x", (1, 128, 6, 6)), b.constant(_w(8, 128, 3, 3)), b.constant(_w(8)), **attrs))
    assert _splits("base", 8, 128 * 9, 36, activation="b")
    check_both(b.build(), config="base")


def test_stock_transformer_encoder_d256(tmp_path) -> None:
    """torch's TransformerEncoderLayer(d_model=256) with its default dim_feedforward=2048: fp32 against torch
    within 1e-4 of the output's largest magnitude, int8 bit-exact against the quantized reference."""
    torch = pytest.importorskip("torch", reason="torch (test-only dependency) is not installed: cannot export")
    pytest.importorskip("onnxscript", reason="onnxscript is needed by torch.onnx.export(dynamo=True)")
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=256, nhead=4, batch_first=True).eval()
    x = torch.randn(1, 8, 256)
    path = tmp_path / "enc256.onnx"
    torch.onnx.export(layer, (x,), str(path), dynamo=True, external_data=False, opset_version=17)
    with torch.no_grad():
        want = layer(x).numpy()
    graph = load_graph(path)
    inputs = {graph.inputs[0]: x.numpy()}
    got, _ = compile(graph, "base", "fp32").run(inputs, checked=True)
    out = got[graph.outputs[0]]
    assert np.max(np.abs(out - want)) <= 1e-4 * np.max(np.abs(want))
    check_int8(graph, inputs, "base")


def test_split_k_column_tiles_share_each_a_chunk() -> None:
    """Four column tiles in one accumulator slot read each A chunk once (A read once, not once per column tile):
    the grouped schedule is what runs here, and it matches the reference (checked mode)."""
    m, k, n = 64, 4096, 64
    cfg = load_config("base")
    f32 = Gemm(Operand(dense(0, (m, k), DType.f32)), Operand(dense(0, (k, n), DType.f32)), dense(0, (m, n), DType.f32))
    assert choose_tiling(cfg, f32).group > 1
    check_both(_gemm_graph(m, k, n), config="base")


def test_conv_split_k_groups_column_tiles() -> None:
    """A ResNet layer4-like conv (K = 2304 > a slot) on the baseline: its output-position tiles share the weight
    chunks, bit-exact in int8 and within tolerance in fp32, race-checked."""
    b = GraphBuilder("conv")
    attrs = {"strides": (1, 1), "pads": (1, 1, 1, 1), "dilations": (1, 1), "group": 1}
    w = b.constant(_w(128, 256, 3, 3))
    b.output(b.op(OpType.Conv, b.input("x", (1, 256, 7, 7)), w, b.constant(_w(128)), **attrs))
    check_both(b.build(), config="base")
