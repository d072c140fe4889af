"""`dynfuse fuse/run/compile/graph` on models with symbolic input dims: the shape from `--input-shape` or from the
`--input` array, checked against the reference interpreter; every mistake is one error line, exit 1."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from assembler.binary import load, to_bytes
from dynfuse.cli import main
from fusion.lower.compiler import compile
from fusion.onnx_import.importer import import_model
from fusion.reference.interpreter import run as reference


def _save(tmp_path, name: str, x_dims: list, y_dims: list, d_in: int, d_out: int):
    """x -> MatMul(w) + b -> Relu -> y, with `x_dims` as declared (symbolic dims as strings)."""
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((d_in, d_out)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(d_out).astype(np.float32), "b")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
        helper.make_node("Add", ["h", "b"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["y"], name="relu"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, x_dims)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, y_dims)
    graph = helper.make_graph(nodes, name, [x], [y], [w, b])
    path = tmp_path / f"{name}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.fixture
def batch_model(tmp_path):
    return _save(tmp_path, "batch", ["N", 8], ["N", 4], 8, 4)


@pytest.fixture
def seq_model(tmp_path):
    return _save(tmp_path, "seq", [2, "T", 8], [2, "T", 8], 8, 8)


def _npy(tmp_path, shape: tuple[int, ...], seed: int = 2):
    path = tmp_path / f"x_{'x'.join(map(str, shape))}.npy"
    np.save(path, np.random.default_rng(seed).standard_normal(shape).astype(np.float32))
    return path


def _want(model, x_path) -> np.ndarray:
    x = np.load(x_path)
    return reference(import_model(model, input_shapes={"x": x.shape}), {"x": x})["y"]


@pytest.mark.parametrize(("fixture", "shape"), [("batch_model", (3, 8)), ("seq_model", (2, 5, 8))])
@pytest.mark.parametrize("with_shape_option", [False, True])
@pytest.mark.parametrize("command", ["fuse", "run"])
def test_symbolic_dims_from_the_array_or_the_option(request, tmp_path, fixture, shape, with_shape_option, command):
    model, x = request.getfixturevalue(fixture), _npy(tmp_path, shape)
    out = tmp_path / "out"
    shape_args = ["--input-shape", "x=" + ",".join(map(str, shape))] if with_shape_option else []
    argv = [command, str(model), "--input", f"x={x}", *shape_args, "--output-dir", str(out)]
    assert main(argv) == 0
    got = np.load(out / "y.npy")
    assert got.shape == (*shape[:-1], 4 if fixture == "batch_model" else 8)
    np.testing.assert_allclose(got, _want(model, x), rtol=1e-4, atol=1e-4)


def test_fuse_with_input_shape_alone_draws_inputs_of_that_shape(batch_model, tmp_path) -> None:
    out = tmp_path / "out"
    assert main(["fuse", str(batch_model), "--input-shape", "x=6,8", "--output-dir", str(out)]) == 0
    assert np.load(out / "y.npy").shape == (6, 4)


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_compile_at_the_given_shape(batch_model, tmp_path, dtype) -> None:
    binary, x = tmp_path / "m.bin", _npy(tmp_path, (5, 8))
    argv = ["compile", str(batch_model), "-o", str(binary), "--dtype", dtype]
    if dtype == "fp32":
        argv += ["--input-shape", "x=5,8"]
        samples = None
    else:
        argv += ["--calibrate", f"x={x}"]  # the calibration array gives the shape
        samples = [{"x": np.load(x)}]
    assert main(argv) == 0
    want = compile(import_model(batch_model, input_shapes={"x": (5, 8)}), "base", dtype, samples=samples)
    assert to_bytes(load(binary)) == to_bytes(want.program)
    if dtype == "fp32":
        other = compile(import_model(batch_model, input_shapes={"x": (3, 8)}), "base", dtype)
        assert to_bytes(other.program) != to_bytes(want.program)  # the shape reaches the binary


def test_graph_command_shares_the_option(batch_model, capsys) -> None:
    assert main(["graph", str(batch_model), "--input-shape", "x=7,8"]) == 0
    assert "float32[7,4]" in capsys.readouterr().out
    assert main(["graph", str(batch_model), "--input-shape", "x=0,8"]) == 1
    assert "dim 0 is 0" in capsys.readouterr().err


def _error(capsys, argv: list[str]) -> str:
    assert main(argv) == 1
    captured = capsys.readouterr()
    err = captured.err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err + captured.out
    return err


@pytest.mark.parametrize("command", ["fuse", "run", "compile"])
def test_input_shape_mistakes_are_one_line_errors(batch_model, tmp_path, capsys, command) -> None:
    m = str(batch_model)
    base = [command, m, *(["-o", str(tmp_path / "m.bin")] if command == "compile" else [])]
    cases = {
        "bogus=1,8": "--input-shape bogus: the model has no input of that name (inputs: x)",
        "x=-1,8": "dim 0 is -1; every dim must be >= 1",
        "x=0,8": "dim 0 is 0",
        "x=65536,65536,2": "more than 4294967296",
        "x=3,8,1": "--input-shape x=3,8,1 has rank 3, but the model's input 'x' has rank 2 (N, 8)",
        "x=3,a": "--input-shape expects NAME=D0,D1,..., got 'x=3,a'",
        "3,8": "--input-shape expects NAME=D0,D1,..., got '3,8'",
    }
    for spec, message in cases.items():
        assert message in _error(capsys, [*base, "--input-shape", spec])
    twice = _error(capsys, [*base, "--input-shape", "x=3,8", "--input-shape", "x=4,8"])
    assert "--input-shape x is given twice" in twice
    hint = "--calibrate" if command == "compile" else "--input"
    neither = _error(capsys, base)
    assert f"the model's input 'x' has symbolic dims (N, 8); pass --input-shape x=D0,D1,... or {hint} x=FILE.npy" in (
        neither
    )


@pytest.mark.parametrize("command", ["fuse", "run"])
def test_array_mistakes_are_one_line_errors(seq_model, tmp_path, capsys, command) -> None:
    m = str(seq_model)
    wrong_batch = _error(capsys, [command, m, "--input", f"x={_npy(tmp_path, (3, 5, 8))}"])
    assert (
        "--input x: the array's shape (3, 5, 8) has 3 at dim 0, but the model's input 'x' (2, T, 8) fixes dim 0 to 2"
        in (wrong_batch)
    )
    wrong_rank = _error(capsys, [command, m, "--input", f"x={_npy(tmp_path, (2, 5))}"])
    assert (
        "--input x: the array's shape (2, 5) has rank 2, but the model's input 'x' has rank 3 (2, T, 8)" in wrong_rank
    )
    disagree = _error(capsys, [command, m, "--input-shape", "x=2,6,8", "--input", f"x={_npy(tmp_path, (2, 5, 8))}"])
    assert "--input-shape x=2,6,8 disagrees with --input x: the array's shape is (2, 5, 8)" in disagree


def test_a_dim_name_shared_by_inputs_is_one_size(tmp_path, capsys) -> None:
    w = numpy_helper.from_array(np.random.default_rng(1).standard_normal((8, 4)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"), helper.make_node("Add", ["h", "r"], ["y"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])
    r = helper.make_tensor_value_info("r", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    model = tmp_path / "two.onnx"
    graph = helper.make_graph(nodes, "two", [x, r], [y], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(model))
    xs, rs, out = _npy(tmp_path, (3, 8)), _npy(tmp_path, (3, 4), seed=3), tmp_path / "out"
    assert main(["fuse", str(model), "--input", f"x={xs}", "--input", f"r={rs}", "--output-dir", str(out)]) == 0
    inputs = {"x": np.load(xs), "r": np.load(rs)}
    want = reference(import_model(model, input_shapes={"x": (3, 8), "r": (3, 4)}), inputs)["y"]
    np.testing.assert_allclose(np.load(out / "y.npy"), want, rtol=1e-4, atol=1e-4)
    err = _error(capsys, ["fuse", str(model), "--input", f"x={xs}", "--input-shape", "r=5,4"])
    assert "input 'r' has N = 5 at dim 0, but input 'x' has N = 3 at dim 0; a dim name shared by inputs is" in err
