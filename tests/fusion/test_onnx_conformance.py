"""ONNX backend node tests (generated from the onnx wheel's own generators) through import -> reference.

Data is generated once per onnx version into pytest's cache (~3 s, only cases built from supported operators).
Every case must pass or be skipped for a stated unsupported feature (dtype, training mode, extra outputs, an
opset before 13, empty tensors, Pad's wrap mode).
"""

from __future__ import annotations

import onnx
import pytest

from fusion.onnx_import.conformance import SUPPORTED_OPS, ensure_node_tests, format_table, per_op_counts, run_all


@pytest.fixture(scope="session")
def node_test_dir(request: pytest.FixtureRequest):
    return ensure_node_tests(request.config.cache.mkdir(f"onnx_node_tests_{onnx.__version__}"))


@pytest.fixture(scope="session")
def results(node_test_dir):
    return run_all(node_test_dir)


def test_no_supported_case_fails(results) -> None:
    print("\n" + format_table(results))
    print("\n".join(f"skipped {r.name}: {r.reason}" for r in results if r.status == "skip"))
    failures = [f"{r.name}: {r.reason}" for r in results if r.status == "fail"]
    assert not failures, "\n".join(failures)


def test_every_supported_op_passes_some_case(results) -> None:
    """... that has a case at an opset dynfuse imports (And, Or, Not have only opset-1/7 cases; test_onnx_ops
    checks them against onnxruntime)."""
    counts = per_op_counts(results)
    old_only = {op for op in SUPPORTED_OPS if all(r.reason.startswith("opset") for r in results if op in r.ops)}
    missing = sorted(op for op in SUPPORTED_OPS - old_only if counts.get(op, {}).get("pass", 0) == 0)
    assert not missing, f"supported operators with no passing backend case: {missing}"
    assert sum(r.status == "pass" for r in results) >= 450


def test_skips_state_an_unsupported_feature(results) -> None:
    for r in results:
        if r.status == "skip":
            stated = (
                "dtype",
                "float32",
                "output",
                "training_mode",
                "non-tensor",
                "opset",
                "zero-size",
                "empty",
                "mode",
            )
            assert any(word in r.reason for word in stated), r
