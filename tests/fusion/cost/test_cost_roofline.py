"""The model roofline: one number per (model, machine, dtype), counted from first principles, and printed the
same by `dynfuse fuse --report`, `--compare` and `--json` whatever the policy."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from dynfuse.cli import main
from fusion.cost.roofline import model_roofline
from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType
from fusion.lower.compiler import load_graph
from simulator.config import load_config

# Linear(32, 64) -> ReLU -> Linear(64, 64) -> GELU -> Linear(64, 10), batch 4
MLP = Path(__file__).resolve().parents[1] / "models" / "mlp.onnx"


def test_mlp_roofline_from_first_principles() -> None:
    """MACs and bytes by hand (fp32: the three Linear layers' weights and biases, x and y; the GELU's scalar
    constants are gone once the clean-up recognises the GELU), and the weights found in the ONNX file itself."""
    weights = 4 * (32 * 64 + 64 + 64 * 64 + 64 + 64 * 10 + 10)
    proto = onnx.load(str(MLP))
    tensors = [numpy_helper.to_array(t) for t in proto.graph.initializer if t.data_type == onnx.TensorProto.FLOAT]
    assert sum(t.nbytes for t in tensors if t.size > 1) == weights
    io = 4 * (4 * 32 + 4 * 10)
    config = load_config("base")
    bound = model_roofline(load_graph(MLP), config, None)
    assert bound.macs == 4 * (32 * 64 + 64 * 64 + 64 * 10)
    assert bound.compulsory_bytes == weights + io
    assert bound.cycles == max(bound.macs / config.peak_macs_per_cycle, (weights + io) / config.dram_bytes_per_cycle)


def _cli(capsys, *argv: str) -> str:
    assert main(["fuse", str(MLP), "--validate", "off", *argv]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_report_compare_and_json_print_one_bound(capsys, dtype: str) -> None:
    reports = json.loads(_cli(capsys, "--dtype", dtype, "--compare", "none,static,dynamic", "--json"))
    bounds = {r["roofline_cycles"] for r in reports}
    assert len(bounds) == 1, f"policies disagree on the roofline: {bounds}"
    (bound,) = bounds
    for r in reports:
        assert r["roofline_fraction"] == pytest.approx(bound / r["cycles"], abs=1e-4)
        assert r["dram_bytes"] >= r["compulsory_bytes"]
    assert len({r["cycles"] for r in reports}) > 1, "the policies should differ in cycles, not in the bound"
    text = _cli(capsys, "--dtype", dtype, "--compare", "none,static,dynamic", "--report")
    printed = {float(v) for v in re.findall(r"roofline bound (\d+) cycles", text)}
    assert printed == {float(round(bound))}
    fractions = re.findall(r"total: (\d+) cycles \(([\d.]+)% of roofline\)", text)
    assert len(fractions) == 3
    for cycles, percent in fractions:
        assert float(percent) == pytest.approx(100 * bound / int(cycles), abs=0.06)
    rows = {line.split()[0]: line.split() for line in text.splitlines() if line.split()[:1] in (["none"], ["dynamic"])}
    for r in reports:
        if r["policy"] in rows:
            assert float(rows[r["policy"]][2].rstrip("%")) == pytest.approx(100 * r["roofline_fraction"], abs=0.06)
    graph = load_graph(MLP)
    if dtype == "fp32":
        assert bound == pytest.approx(model_roofline(graph, load_config("base"), None).cycles, abs=0.05)
    assert np.isfinite(bound) and bound > 0


def test_a_conv_weight_counts_once_whatever_forms_the_kernels_keep() -> None:
    """The baseline keeps a Conv weight both as a matrix and tap-major (`constant_forms`): the same elements in
    two orders, of which a kernel reads one, so the bound counts the weight once."""
    b = GraphBuilder("conv")
    x = b.input("x", (1, 8, 10, 10))
    w = b.constant(np.ones((16, 8, 3, 3), np.float32), "w")
    bias = b.constant(np.ones(16, np.float32), "b")
    b.output(b.op(OpType.Conv, x, w, bias, name="conv", dilations=(1, 1), group=1, pads=(1, 1, 1, 1), strides=(1, 1)))
    graph = b.build()
    io = 4 * (8 * 10 * 10 + 16 * 10 * 10)
    assert model_roofline(graph, load_config("base"), None).compulsory_bytes == 4 * (16 * 8 * 9 + 16) + io
