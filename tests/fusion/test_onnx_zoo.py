"""Every zoo model (real torchvision / transformers exports, see bench/zoo) imports, cleans up to a small set of
run-time operators the accelerator lowers, and the reference interpreter matches onnxruntime's output."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from fusion.graph.ops import OpType
from fusion.onnx_import.importer import import_model
from fusion.passes.pipeline import cleanup
from fusion.reference.interpreter import run

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # `bench` is a directory of the project, not an installed package

from bench.zoo import NAMES, prefetch, zoo_model  # noqa: E402

TOLERANCE = 1e-4  # of max |y|
# what data flows through at run time after cleanup: matrix ops, vector-unit elementwise ops, normalisations,
# layout moves; no shape computation (Shape, Range, Cast, comparisons, Where, ...) survives the import
RUN_TIME_OPS = {
    OpType.MatMul,
    OpType.Gemm,
    OpType.Conv,
    OpType.MaxPool,
    OpType.AveragePool,
    OpType.Add,
    OpType.Sub,
    OpType.Mul,
    OpType.Div,
    OpType.Pow,
    OpType.Relu,
    OpType.Clip,
    OpType.Sigmoid,
    OpType.Gelu,
    OpType.Sqrt,
    OpType.Neg,
    OpType.HardSwish,
    OpType.HardSigmoid,
    OpType.Softmax,
    OpType.LayerNorm,
    OpType.ReduceMean,
    OpType.Reshape,
    OpType.Transpose,
    OpType.Concat,
    OpType.Split,
    OpType.Slice,
    OpType.Gather,
    OpType.Expand,
}


@pytest.fixture(scope="module")
def cleaned() -> dict:
    prefetch(NAMES, "small")
    out = {}
    for name in NAMES:
        entry = zoo_model(name)
        out[name] = (entry, cleanup(import_model(entry.onnx_path)))
    return out


@pytest.mark.parametrize("name", NAMES)
def test_zoo_model_matches_onnxruntime_with_lowerable_run_time_ops(cleaned, name) -> None:
    entry, graph = cleaned[name]
    ops = Counter(n.op for n in graph.nodes)
    assert set(ops) <= RUN_TIME_OPS, f"{name}: {sorted(op.value for op in set(ops) - RUN_TIME_OPS)}"
    got = run(graph, {"x": entry.input})["y"]
    want = entry.reference_output
    assert got.shape == want.shape
    error = float(np.max(np.abs(got - want))) / float(np.max(np.abs(want)))
    assert error < TOLERANCE, f"{name}: max error {error:.2e} of max |y|"


def test_transformer_specifics(cleaned) -> None:
    """GPT-2's gelu_new becomes one tanh-approximated Gelu; LLaMA's float32 casts disappear and its rotary
    embedding keeps Neg/Slice/Concat on data; BERT's mask construction leaves nothing at run time."""
    gpt2 = cleaned["gpt2"][1]
    gelus = [n for n in gpt2.nodes if n.op == OpType.Gelu]
    assert gelus and all(n.attr("approximate") == "tanh" for n in gelus)
    assert not {OpType.Pow} & {n.op for n in gpt2.nodes}
    llama_ops = {n.op for n in cleaned["llama"][1].nodes}
    assert {OpType.Neg, OpType.Slice, OpType.Concat, OpType.Expand, OpType.Sigmoid} <= llama_ops
    bert_ops = {n.op for n in cleaned["bert"][1].nodes}
    assert bert_ops <= {OpType.MatMul, OpType.Add, OpType.Mul, OpType.Gelu, OpType.LayerNorm, OpType.Softmax,
                        OpType.Reshape, OpType.Transpose}  # fmt: skip
    assert OpType.Clip in {n.op for n in cleaned["mobilenet_v2"][1].nodes}
    assert any(n.op == OpType.Conv and len(cleaned["whisper_encoder"][1].types[n.inputs[0]].shape) == 3
               for n in cleaned["whisper_encoder"][1].nodes)  # fmt: skip


def test_a_real_model_lists_every_unsupported_node_of_every_layer(monkeypatch) -> None:
    """GPT-2 with Tanh, Softmax and Split made unknown: one error names each of them in both layers (the
    importer goes on past each unknown node with outputs typed by ONNX shape inference)."""
    import onnx

    from fusion.errors import UnsupportedModelError
    from fusion.onnx_import import converters

    path = zoo_model("gpt2").onnx_path
    wanted = {n.name for n in onnx.load(str(path)).graph.node if n.op_type in ("Tanh", "Softmax", "Split")}
    for op in ("Tanh", "Softmax", "Split"):
        monkeypatch.delitem(converters.CONVERTERS, op)
    with pytest.raises(UnsupportedModelError) as info:
        import_model(path)
    assert {p.node for p in info.value.problems} == wanted and len(wanted) == 6
    assert {p.node.split("/")[2] for p in info.value.problems} == {"h.0", "h.1"}
