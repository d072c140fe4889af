"""ONNX backend node tests routed through compile -> simulate (checked mode, base machine, fp32), compared
with ONNX's expected outputs at the conformance harness's tolerance.

A case the importer cannot take is skipped by the harness; a case whose graph uses an operator form the
lowering has no kernel for (UnsupportedOpError / UnsupportedTypeError) is counted as unsupported. Most are so
by design (BY_DESIGN: comparisons, logic and shape generators on run-time data, which real models only use in
shape subgraphs folded at import; integer and bool tensors; a Where condition or Pow exponent computed at run
time; Sin/Cos, for which the ISA has no instruction); at most a few others may be. Every other case must pass,
and every operator the lowering supports must run in some case. The per-operator table is printed (pytest -s).
"""

from __future__ import annotations

from collections import Counter

import onnx
import pytest

from fusion.graph.ops import BOOL_RESULT, TYPE_ONLY, OpType
from fusion.lower.compiler import compile, supported_ops
from fusion.onnx_import.conformance import ensure_node_tests, format_table, per_op_counts, run_all

UNSUPPORTED = ("UnsupportedOpError", "UnsupportedTypeError")
NO_KERNEL = frozenset({*BOOL_RESULT, *TYPE_ONLY, OpType.GatherElements, OpType.Sin, OpType.Cos})
BY_DESIGN = (
    *(f"({op.value}: no kernel generator)" for op in NO_KERNEL),
    "only float32 tensors",
    "only float32 data flows",
    "Where needs a constant condition",
    "Pow needs a one-element constant exponent",
    "has no log",
)


EXERCISED: set[str] = set()  # IR operators of every graph the runner compiled and simulated


def _runner(graph, inputs):
    model = compile(graph, "base", "fp32", cleanup=False)
    outputs, _ = model.run(inputs, checked=True)
    EXERCISED.update(n.op.value for n in graph.nodes)
    return outputs


@pytest.fixture(scope="module")
def results(request: pytest.FixtureRequest):
    node_dir = ensure_node_tests(request.config.cache.mkdir(f"onnx_node_tests_{onnx.__version__}"))
    return run_all(node_dir, _runner)


def test_no_supported_case_fails(results) -> None:
    print("\n" + format_table(results))
    unsupported = [r for r in results if r.status == "fail" and r.reason.startswith(UNSUPPORTED)]
    print("\n".join(f"unsupported by the lowering: {r.name}: {r.reason}" for r in unsupported))
    failures = [f"{r.name}: {r.reason}" for r in results if r.status == "fail" and r not in unsupported]
    assert not failures, "\n".join(failures)
    others = [r.name for r in unsupported if not any(reason in r.reason for reason in BY_DESIGN)]
    assert len(others) <= 8, others
    assert Counter(r.status for r in results)["pass"] >= 200
    assert per_op_counts(results)["Conv"]["pass"] > 0


NO_FLOAT_CASE = frozenset({OpType.Trilu})  # ONNX's Trilu cases are all int64 (test_lower_recipes covers it)


def test_every_lowered_operator_runs_in_some_case(results) -> None:
    missing = sorted(op.value for op in supported_ops() - NO_FLOAT_CASE if op.value not in EXERCISED)
    assert not missing, f"lowered operators no backend case exercised: {missing}"
