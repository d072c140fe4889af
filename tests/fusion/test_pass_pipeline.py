"""The clean-up pipeline on real models: same results, fewer nodes, no BatchNorm left, idempotent."""

from __future__ import annotations

import pytest
from fusion_helpers import MODEL_NAMES, MODELS_DIR, check_pass, op_names

from fusion.graph.hashing import structural_hash
from fusion.graph.ops import OpType
from fusion.onnx_import.importer import import_model
from fusion.passes.pipeline import cleanup


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_cleanup_preserves_results_and_is_idempotent(name) -> None:
    graph = import_model(MODELS_DIR / f"{name}.onnx")
    out = check_pass(graph, cleanup, atol=1e-4)
    assert len(out.nodes) <= len(graph.nodes)
    assert OpType.BatchNorm.value not in op_names(out)
    assert structural_hash(cleanup(out)) == structural_hash(out)


def test_resnet_block_becomes_conv_relu_conv_add_relu() -> None:
    out = cleanup(import_model(MODELS_DIR / "resnet_block.onnx"))
    assert op_names(out) == ["Conv", "Relu", "Conv", "Add", "Relu"]
