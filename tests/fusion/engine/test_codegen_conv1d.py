"""1-D convolutions (a speech encoder's Conv1d front end): the implicit GEMM as a 2-D conv of height 1, and the
whole model through `dynfuse fuse` in every policy and dtype against the reference interpreters."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from engine_helpers import context, conv_graph, run_group
from onnx import TensorProto, helper, numpy_helper

from dynfuse.cli import main
from fusion.engine.codegen.conv import pack_taps
from fusion.engine.plan import Group
from fusion.lower.compiler import load_graph
from fusion.quant.calibrate import calibrate
from fusion.reference.interpreter import run as run_reference
from fusion.reference.quantized import run_quantized


def _conv1d_graph(c: int, cout: int, length: int, pads: tuple[int, int], relu: bool):
    return conv_graph(2, c, cout, (length,), (3,), (1,), (1,), pads, 1, relu, seed=11)


def test_pack_taps_lifts_a_1d_weight_to_height_one() -> None:
    w = np.arange(4 * 3 * 5, dtype=np.float32).reshape(4, 3, 5)
    packed = pack_taps(w)
    assert packed.shape == (1, 5, 3, 4)
    np.testing.assert_array_equal(packed[0, 2], w[:, :, 2].T)


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
@pytest.mark.parametrize("case", [(8, 16, 20, (1, 1), True), (20, 12, 9, (0, 2), False)])
def test_implicit_gemm_runs_a_1d_conv(dtype: str, case: tuple) -> None:
    graph, names = _conv1d_graph(*case)
    rng = np.random.default_rng(2)
    inputs = {"x": rng.standard_normal(graph.types["x"].shape).astype(np.float32)}
    mc = context(graph, inputs, dtype)
    _, run, env = run_group(mc, Group(names, "implicit_gemm"), inputs)
    out = graph.outputs[0]
    if dtype == "int8":
        np.testing.assert_array_equal(run.outputs[out], env[out])
    else:
        np.testing.assert_allclose(run.outputs[out], env[out], rtol=1e-4, atol=1e-5)


def _speech_front_end(path: Path) -> None:
    """Conv1d(80->64, k3, s1, p1) -> GELU -> Conv1d(64->64, k3, s2, p1) -> GELU, as ONNX (Gelu written out as
    exporters do: x * 0.5 * (1 + erf(x / sqrt 2)))."""
    rng = np.random.default_rng(5)
    inits, nodes = [], []

    def const(name: str, array: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(array.astype(np.float32), name))
        return name

    def conv(x: str, cin: int, cout: int, stride: int, tag: str) -> str:
        w = const(f"{tag}_w", rng.standard_normal((cout, cin, 3)) / np.sqrt(3 * cin))
        b = const(f"{tag}_b", rng.standard_normal(cout) * 0.1)
        nodes.append(helper.make_node("Conv", [x, w, b], [f"{tag}_y"], kernel_shape=[3], pads=[1, 1], strides=[stride]))
        return f"{tag}_y"

    def gelu(x: str, tag: str) -> str:
        nodes.extend(
            [
                helper.make_node("Div", [x, const(f"{tag}_r2", np.array(np.sqrt(2.0)))], [f"{tag}_d"]),
                helper.make_node("Erf", [f"{tag}_d"], [f"{tag}_e"]),
                helper.make_node("Add", [f"{tag}_e", const(f"{tag}_one", np.array(1.0))], [f"{tag}_a"]),
                helper.make_node("Mul", [x, f"{tag}_a"], [f"{tag}_m"]),
                helper.make_node("Mul", [f"{tag}_m", const(f"{tag}_half", np.array(0.5))], [f"{tag}_y"]),
            ]
        )
        return f"{tag}_y"

    h = gelu(conv("x", 80, 64, 1, "c1"), "g1")
    h = gelu(conv(h, 64, 64, 2, "c2"), "g2")
    nodes.append(helper.make_node("Identity", [h], ["y"]))
    graph = helper.make_graph(
        nodes,
        "speech_front_end",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 80, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 16])],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
@pytest.mark.parametrize("policy", ["none", "static", "dynamic"])
def test_fuse_cli_runs_a_conv1d_front_end(tmp_path: Path, capsys, policy: str, dtype: str) -> None:
    model = tmp_path / "speech.onnx"
    _speech_front_end(model)
    x = np.random.default_rng(0).standard_normal((1, 80, 32)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    args = ["fuse", str(model), "--input", f"x={tmp_path / 'x.npy'}", "--policy", policy, "--dtype", dtype]
    code = main([*args, "--workers", "1", "--output-dir", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "Traceback" not in captured.err
    y = np.load(tmp_path / "out" / "y.npy")
    graph = load_graph(model)
    if dtype == "int8":
        want = run_quantized(graph, {"x": x}, calibrate(graph, [{"x": x}]))["y"]
        np.testing.assert_array_equal(y, want)
    else:
        want = run_reference(graph, {"x": x})["y"]
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
