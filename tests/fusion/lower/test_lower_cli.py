"""`dynfuse compile` and `dynfuse run` through `dynfuse.cli.main`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from assembler.binary import load
from dynfuse.cli import main
from fusion.lower.compiler import load_graph
from fusion.reference.interpreter import run
from isa.enums import Extension

MLP = Path(__file__).resolve().parents[1] / "models" / "mlp.onnx"


def _x(tmp_path: Path) -> tuple[Path, np.ndarray]:
    x = np.random.default_rng(3).standard_normal((4, 32)).astype(np.float32)
    path = tmp_path / "x.npy"
    np.save(path, x)
    return path, x


def test_compile_writes_a_base_isa_binary(tmp_path, capsys) -> None:
    out = tmp_path / "mlp.bin"
    assert main(["compile", str(MLP), "--config", "base", "--dtype", "int8", "-o", str(out)]) == 0
    program = load(out)
    assert program.extensions() == {Extension.base}
    assert [k.attr("op") for k in program.kernels] == ["inputs", "Gemm", "Relu", "Gemm", "Gelu", "Gemm", "outputs"]
    assert "5 kernels" in capsys.readouterr().out


def test_run_prints_outputs_and_writes_them(tmp_path, capsys) -> None:
    x_path, x = _x(tmp_path)
    outdir = tmp_path / "out"
    assert main(["run", str(MLP), "--input", f"input={x_path}", "--output-dir", str(outdir), "--config", "tiny"]) == 0
    text = capsys.readouterr().out
    assert "output linear_2: shape [4, 10]" in text and "cycle" in text and "roofline_bound_cycles" in text
    graph = load_graph(MLP)
    want = run(graph, {"input": x})["linear_2"]
    np.testing.assert_allclose(np.load(outdir / "linear_2.npy"), want, rtol=0, atol=1e-5)


def test_run_json_counters_int8(tmp_path, capsys) -> None:
    x_path, _ = _x(tmp_path)
    assert main(["run", str(MLP), "--input", f"input={x_path}", "--dtype", "int8", "--json", "--checked"]) == 0
    report = json.loads(capsys.readouterr().out)
    counters = report["counters"]
    assert report["dtype"] == "int8" and counters["macs_int8"] > 0 and counters["cycle"] > 0


def test_output_names_are_sanitised_for_files(tmp_path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("out/relu:0", TensorProto.FLOAT, [2, 3])
    model = helper.make_model(
        helper.make_graph([helper.make_node("Relu", ["x"], ["out/relu:0"])], "g", [x], [y]),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    path = tmp_path / "relu.onnx"
    onnx.save(model, path)
    data = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    np.save(tmp_path / "x.npy", data)
    assert main(["run", str(path), "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", str(tmp_path / "o")]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "o" / "out_relu_0.npy"), np.maximum(data, 0))


def test_missing_input_is_a_clear_error(tmp_path, capsys) -> None:
    assert main(["run", str(MLP)]) == 1
    err = capsys.readouterr().err
    assert "missing ['input']" in err and "Traceback" not in err


def test_unsupported_op_is_a_clear_error(tmp_path, capsys) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])
    e = helper.make_tensor_value_info("e", TensorProto.FLOAT, [3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])
    model = helper.make_model(
        helper.make_graph([helper.make_node("Pow", ["x", "e"], ["y"])], "g", [x, e], [y]),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    path = tmp_path / "pow.onnx"
    onnx.save(model, path)
    assert main(["compile", str(path), "-o", str(tmp_path / "pow.bin")]) == 1
    err = capsys.readouterr().err
    assert "cannot lower node" in err and "Pow" in err and "Traceback" not in err


def test_missing_model_file(tmp_path, capsys) -> None:
    assert main(["run", str(tmp_path / "nope.onnx")]) == 1
    assert "no such model file" in capsys.readouterr().err
