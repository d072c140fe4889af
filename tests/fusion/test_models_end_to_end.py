"""Exported models (MLP, post/pre-norm TransformerEncoderLayer, ResNet basic block) through import, clean-up and
the reference, against torch's outputs (stored beside each model), onnx's ReferenceEvaluator, and int8.

Tolerances: fp32 reference within atol 1e-4 + rtol 1e-4 of torch and of onnx; int8 reference within 5% of the
fp32 output's largest magnitude (max abs error), with scales calibrated on 8 random inputs plus the test input.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from fusion_helpers import MODEL_NAMES, MODELS_DIR
from onnx.reference import ReferenceEvaluator

from fusion.onnx_import.importer import import_model
from fusion.passes.pipeline import cleanup
from fusion.quant.calibrate import calibrate
from fusion.reference.interpreter import run
from fusion.reference.quantized import run_quantized


def _load(name: str):
    data = np.load(MODELS_DIR / f"{name}.npz")
    return MODELS_DIR / f"{name}.onnx", data["input"], data["output"]


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_fp32_reference_matches_torch_and_onnx(name) -> None:
    path, x, torch_out = _load(name)
    graph = cleanup(import_model(path))
    got = run(graph, {graph.inputs[0]: x})[graph.outputs[0]]
    np.testing.assert_allclose(got, torch_out, rtol=1e-4, atol=1e-4)
    (onnx_out,) = ReferenceEvaluator(onnx.load(str(path))).run(None, {graph.inputs[0]: x})
    np.testing.assert_allclose(got, onnx_out, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_int8_reference_is_within_quantization_error(name) -> None:
    path, x, _ = _load(name)
    graph = cleanup(import_model(path))
    rng = np.random.default_rng(0)
    samples = [{graph.inputs[0]: rng.standard_normal(x.shape).astype(np.float32)} for _ in range(8)]
    params = calibrate(graph, [*samples, {graph.inputs[0]: x}])
    want = run(graph, {graph.inputs[0]: x})[graph.outputs[0]]
    got = run_quantized(graph, {graph.inputs[0]: x}, params)[graph.outputs[0]]
    error = np.max(np.abs(got - want)) / np.max(np.abs(want))
    assert error < 0.05, f"{name}: int8 error {error:.3%} of max |output|"
    assert error > 0, "int8 results identical to fp32: quantization is not happening"


def test_model_files_are_small() -> None:
    for name in MODEL_NAMES:
        assert (MODELS_DIR / f"{name}.onnx").stat().st_size < 1 << 20


def test_export_script_reproduces_the_committed_models(tmp_path) -> None:
    """Re-export with torch and check the fresh files compute what the committed ones do."""
    pytest.importorskip("torch", reason="torch (test-only dependency) is not installed: cannot re-export models")
    pytest.importorskip("onnxscript", reason="onnxscript is needed by torch.onnx.export(dynamo=True)")
    import importlib.util

    spec = importlib.util.spec_from_file_location("export_models", MODELS_DIR / "export_models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    chosen = {k: v for k, v in module.models().items() if k in ("mlp", "resnet_block")}
    for name, (model, shape) in chosen.items():
        fresh = import_model(module.export(name, model, shape, tmp_path))
        _, x, torch_out = _load(name)
        np.testing.assert_allclose(np.load(tmp_path / f"{name}.npz")["output"], torch_out, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(run(fresh, {fresh.inputs[0]: x})[fresh.outputs[0]], torch_out, rtol=1e-4, atol=1e-4)
