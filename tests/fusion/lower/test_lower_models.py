"""The exported end-to-end models (MLP, post-norm and pre-norm TransformerEncoderLayer, ResNet basic block)
compiled unfused and run on the simulator in checked mode: fp32 within FP32_TOL of the reference (and of
torch's stored output), int8 bit-exact against the quantized reference and within quantization error of fp32."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from lower_helpers import check_fp32, check_int8

from assembler.objfile import ObjectFile
from fusion.lower.compiler import load_graph
from isa.enums import Extension

MODELS = Path(__file__).resolve().parents[1] / "models"
CASES = [("mlp", "tiny"), ("encoder_post_d64", "base"), ("encoder_pre_d64", "base"), ("resnet_block", "tiny")]


def _model(name: str):
    data = np.load(MODELS / f"{name}.npz")
    graph = load_graph(MODELS / f"{name}.onnx")
    return graph, {graph.inputs[0]: data["input"]}, data["output"]


def _one_kernel_per_node(program: ObjectFile, graph) -> None:
    assert program.extensions() == {Extension.base}
    ops = [k.attr("op") for k in program.kernels if k.attr("op") not in ("inputs", "outputs")]
    assert ops == [n.op.value for n in graph.nodes if n.op.value not in ("Reshape", "Identity")]


@pytest.mark.parametrize(("name", "config"), CASES)
def test_fp32_matches_reference_and_torch(name, config) -> None:
    graph, inputs, torch_out = _model(name)
    model, counters = check_fp32(graph, inputs, config)
    got, _ = model.run(inputs)
    np.testing.assert_allclose(got[graph.outputs[0]], torch_out, rtol=1e-4, atol=1e-4)
    _one_kernel_per_node(model.program, graph)
    assert counters.cycle >= counters.roofline_bound_cycles > 0


@pytest.mark.parametrize(("name", "config"), CASES)
def test_int8_bit_exact_and_close_to_fp32(name, config) -> None:
    graph, inputs, torch_out = _model(name)
    model = check_int8(graph, inputs, config)
    got, counters = model.run(inputs)
    out = got[graph.outputs[0]]
    assert np.max(np.abs(out - torch_out)) <= 0.05 * np.max(np.abs(torch_out))
    assert counters.macs_int8 > 0 and counters.macs_fp32 == 0
