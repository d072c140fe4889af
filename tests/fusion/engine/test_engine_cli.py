"""`dynfuse fuse`: report, JSON, comparison, output files and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from engine_helpers import MODELS

from dynfuse.cli import main
from fusion.engine.strategies import NAMES


def _input(tmp_path: Path) -> str:
    x = np.load(MODELS / "mlp.npz")["input"]
    np.save(tmp_path / "x.npy", x)
    return f"input={tmp_path / 'x.npy'}"


def test_fuse_report_lists_groups_and_totals(tmp_path: Path, capsys) -> None:
    code = main(["fuse", str(MODELS / "mlp.onnx"), "--input", _input(tmp_path), "--policy", "dynamic", "--report"])
    out = capsys.readouterr().out
    assert code == 0
    assert "policy dynamic" in out and "roofline bound" in out and "cache" in out
    groups = out.split("pipelined with\n", 1)[1].split("total:", 1)[0].splitlines()
    assert groups and all(line[45:].split()[0].split(",")[0] in NAMES for line in groups)  # each group's strategy
    assert "validations run" in out


@pytest.mark.parametrize("execution", ["program", "host"])
def test_fuse_json_and_output_dir(tmp_path: Path, capsys, execution: str) -> None:
    args = ["fuse", str(MODELS / "mlp.onnx"), "--input", _input(tmp_path), "--json", "--dtype", "int8"]
    assert main([*args, "--execution", execution, "--output-dir", str(tmp_path / "out")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["policy"] == "dynamic" and report["cycles"] > 0 and report["roofline_cycles"] > 0
    # a program's cycles are its kernels' shares and the driver's (its final halt, any on-chip dispatch code)
    driver = report["program"]["driver_cycles"] if execution == "program" else 0
    assert report["cycles"] == sum(g["measured_cycles"] for g in report["groups"]) + driver
    assert (tmp_path / "out" / "linear_2.npy").exists()


def test_fuse_compare_side_by_side(tmp_path: Path, capsys) -> None:
    args = ["fuse", str(MODELS / "mlp.onnx"), "--input", _input(tmp_path), "--compare", "none,static,dynamic"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert all(p in out for p in ("none", "static", "dynamic", "vs none"))


def test_fuse_errors_are_one_line(tmp_path: Path, capsys) -> None:
    assert main(["fuse", str(tmp_path / "missing.onnx")]) != 0
    assert main(["fuse", str(MODELS / "mlp.onnx"), "--compare", "none,bogus"]) != 0
    assert main(["fuse", str(MODELS / "mlp.onnx"), "--input", "input=/nonexistent.npy"]) != 0
    assert main(["fuse", str(MODELS / "mlp.onnx"), "--validate", "sometimes"]) != 0
    assert main(["fuse", str(MODELS / "mlp.onnx"), "--workers", "0"]) != 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "missing.onnx" in err and "bogus" in err and "--workers must be >= 1" in err


def test_report_text_lists_only_refusals_of_nodes_never_fused(tmp_path: Path, capsys) -> None:
    """The text report leaves out refused candidates whose nodes the plan fused in another way (e.g. an int8
    epilogue refused for its rounding, then fused by the swapped GEMM's chain); the JSON keeps every refusal."""
    model = MODELS / "encoder_post_d64.onnx"
    assert main(["fuse", str(model), "--dtype", "int8", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    fused = [set(g["nodes"]) for g in report["groups"] if len(g["nodes"]) > 1]
    covered = [r for r in report["rejected"] if any(set(r["nodes"]) <= nodes for nodes in fused)]
    assert covered  # there are such refusals in the JSON...
    assert main(["fuse", str(model), "--dtype", "int8", "--report"]) == 0
    text = capsys.readouterr().out.split("fusions refused")[-1]
    assert not any(f"  {'+'.join(r['nodes'])}: " in text for r in covered)  # ...but not in the text
