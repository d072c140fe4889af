"""Kernel inputs from the command line: .npy files and `--random-inputs SEED`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from sim_helpers import GEMM

from assembler.source import assemble
from dynfuse.cli import main
from isa import DynfuseError
from simulator.inputs import I32_RANDOM_LIMIT, parse_input_args, random_inputs

# GEMM with three more inputs nobody reads, large enough to show each dtype's distribution
KERNEL = GEMM.replace(
    ".output c", ".input bias: i32[64, 64] @ B\n.input x: f32[64, 64] @ X\n.input q: i8[64, 64] @ Q\n.output c"
).replace(".data\n", ".data\nB: .zero 16384\nX: .zero 16384\nQ: .zero 4096\n")


def test_random_inputs_cover_every_input_with_its_dtype_and_range() -> None:
    obj = assemble(KERNEL)
    given = {"w": np.ones((4, 4), np.int8)}
    first, again, other = random_inputs(obj, 3, given), random_inputs(obj, 3, given), random_inputs(obj, 4)
    assert set(first) == {"a", "w", "bias", "x", "q"}
    assert first["w"] is given["w"]
    assert all(np.array_equal(first[k], again[k]) for k in first)
    assert not np.array_equal(first["q"], other["q"])
    assert {k: v.dtype for k, v in first.items()} == {
        "a": np.int8,
        "w": np.int8,
        "bias": np.int32,
        "x": np.float32,
        "q": np.int8,
    }
    assert first["q"].min() == -128 and first["q"].max() == 127  # the full int8 range
    assert np.abs(first["bias"]).max() <= I32_RANDOM_LIMIT and np.abs(first["bias"]).max() > I32_RANDOM_LIMIT // 2
    assert abs(float(first["x"].mean())) < 0.05 and abs(float(first["x"].std()) - 1) < 0.05  # standard normal


def test_sim_random_inputs_fill_what_input_does_not_give(tmp_path, capsys) -> None:
    src = tmp_path / "k.s"
    src.write_text(KERNEL)
    w = np.arange(-8, 8, dtype=np.int8).reshape(4, 4)
    np.save(tmp_path / "w.npy", w)
    argv = ["sim", str(src), "--config", "tiny", "--input", f"w={tmp_path / 'w.npy'}", "--json"]
    assert main([*argv, "--random-inputs", "9", "--output-dir", str(tmp_path / "out")]) == 0
    a = random_inputs(assemble(KERNEL), 9)["a"]
    assert np.array_equal(np.load(tmp_path / "out" / "c.npy"), np.maximum(a.astype(np.int32) @ w, 0))
    capsys.readouterr()
    assert main([*argv, "--output-dir", str(tmp_path / "zero")]) == 0  # without it, inputs stay zero
    assert not np.load(tmp_path / "zero" / "c.npy").any()


@pytest.mark.parametrize(
    ("spec", "message"),
    [("a", "--input expects NAME=FILE.npy"), ("a=/nonexistent.npy", "No such file"), ("=x.npy", "NAME=FILE")],
)
def test_parse_input_args_rejects_bad_specs(spec: str, message: str) -> None:
    with pytest.raises(DynfuseError, match=message):
        parse_input_args([spec])


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "not a readable .npy array"),  # empty file (np.load raises EOFError)
        (b"\x93NUMPY\x01\x00", "not a readable .npy array"),  # truncated header
        (b"garbage", "not a readable .npy array"),
        (None, r"\.npz archive"),
    ],
)
def test_parse_input_args_rejects_unreadable_files(tmp_path, capsys, content: bytes | None, message: str) -> None:
    path = tmp_path / "x.npy"
    if content is None:
        np.savez(tmp_path / "x.npz", a=np.ones(3))
        path = tmp_path / "x.npz"
    else:
        path.write_bytes(content)
    with pytest.raises(DynfuseError, match=message):
        parse_input_args([f"x={path}"])
    model = Path(__file__).parents[1] / "fusion" / "models" / "mlp.onnx"
    assert main(["fuse", str(model), "--input", f"input={path}"]) == 1  # no traceback
    assert "Traceback" not in capsys.readouterr().err
