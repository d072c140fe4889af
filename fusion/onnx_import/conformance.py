"""ONNX backend node tests as an external conformance suite for the importer and the reference interpreter.

The onnx wheel ships the generators of its node tests, not their data: `generate_node_tests` writes the cases
whose operators dynfuse supports into a directory (model.onnx + test_data_set_*/input_*.pb, output_*.pb).
`run_case` imports one case, runs it through a runner (the reference interpreter by default), and compares
with the expected outputs at the ONNX backend's tolerance (rtol 1e-3, atol 1e-6 here).

    dynfuse onnx-conformance [--cache DIR]    # prints the pass count per operator
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from fusion.errors import GraphError, UnsupportedModelError
from fusion.graph.ir import Graph
from fusion.onnx_import.converters import CONVERTERS
from fusion.onnx_import.importer import import_model
from fusion.reference.interpreter import run

RTOL, ATOL = 1e-3, 1e-6
SUPPORTED_OPS = frozenset(CONVERTERS)
Runner = Callable[[Graph, Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]


def model_ops(model: onnx.ModelProto) -> frozenset[str]:
    return frozenset(n.op_type for n in model.graph.node)


def generate_node_tests(out_dir: Path, ops: frozenset[str] = SUPPORTED_OPS) -> Path:
    """Write the backend node tests built only from `ops` into out_dir/node/<case>/; returns out_dir/node."""
    import onnx.backend.test.case.node as node_test
    import onnx.backend.test.cmd_tools as cmd_tools

    def selected() -> list:
        return [c for c in node_test.collect_testcases(None) if c.model is not None and model_ops(c.model) <= ops]

    cmd_tools.model_test.collect_testcases = selected
    cmd_tools.generate_data(argparse.Namespace(output=str(out_dir)))
    return out_dir / "node"


def ensure_node_tests(cache: Path, ops: frozenset[str] = SUPPORTED_OPS) -> Path:
    """cache/node-<hash of ops> with the generated cases, generating them once per supported-operator set (a
    new converter brings its cases in); safe when parallel workers race to do it (each generates into its own
    temporary directory and the first rename wins)."""
    digest = hashlib.sha256(" ".join(sorted(ops)).encode()).hexdigest()[:12]
    final = cache / f"node-{digest}"
    if final.exists():
        return final
    cache.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=cache, prefix="generating-"))
    try:
        generate_node_tests(scratch, ops)
        os.rename(scratch / "node", final)
    except OSError:
        if not final.exists():
            raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return final


@dataclass(frozen=True)
class CaseResult:
    """Outcome of one case: status is "pass", "fail" or "skip"; reason says why for the last two."""

    name: str
    ops: frozenset[str]
    status: str
    reason: str = ""


def _read(path: Path) -> np.ndarray:
    return numpy_helper.to_array(onnx.load_tensor(str(path)))


def _data_sets(case_dir: Path, model: onnx.ModelProto) -> list[tuple[dict[str, np.ndarray], list[np.ndarray]]]:
    sets = []
    names = [i.name for i in model.graph.input]
    for ds in sorted(case_dir.glob("test_data_set_*")):
        ins = [_read(ds / f"input_{i}.pb") for i in range(len(list(ds.glob("input_*.pb"))))]
        outs = [_read(ds / f"output_{i}.pb") for i in range(len(list(ds.glob("output_*.pb"))))]
        sets.append((dict(zip(names, ins, strict=True)), outs))
    return sets


def _compare(got: Mapping[str, np.ndarray], graph: Graph, expected: list[np.ndarray]) -> str:
    for name, want in zip(graph.outputs, expected, strict=True):
        value = np.asarray(got[name])
        if value.shape != want.shape:
            return f"output {name!r}: shape {value.shape}, expected {want.shape}"
        if not np.allclose(value, want, rtol=RTOL, atol=ATOL, equal_nan=True):
            worst = float(np.max(np.abs(value.astype(np.float64) - want.astype(np.float64))))
            return f"output {name!r}: max abs error {worst:.3g} beyond rtol {RTOL} atol {ATOL}"
    return ""


def run_case(case_dir: Path, runner: Runner = run) -> CaseResult:
    """Import and run one case; integer and scalar inputs are bound as constants (they are shapes, axes,
    indices, or operands like Clip's bounds and Pad's fill value that dynfuse takes as attributes)."""
    model = onnx.load(str(case_dir / "model.onnx"))
    ops = model_ops(model)
    non_tensor = [v.name for v in (*model.graph.input, *model.graph.output) if not v.type.HasField("tensor_type")]
    if non_tensor:
        return CaseResult(case_dir.name, ops, "skip", f"non-tensor (sequence/optional) values {non_tensor}")
    for inputs, expected in _data_sets(case_dir, model):
        bind = {k: v for k, v in inputs.items() if v.dtype.kind in "iu" or v.ndim == 0}
        try:
            graph = import_model(model, bind=bind)
        except UnsupportedModelError as err:
            return CaseResult(case_dir.name, ops, "skip", "; ".join(p.reason for p in err.problems))
        except GraphError as err:  # the import disagrees with the model's declared types
            return CaseResult(case_dir.name, ops, "fail", str(err))
        try:
            got = runner(graph, {k: v for k, v in inputs.items() if k not in bind})
        except Exception as err:  # a crash of the runner is a conformance failure, reported not raised
            return CaseResult(case_dir.name, ops, "fail", f"{type(err).__name__}: {err}")
        mismatch = _compare(got, graph, expected)
        if mismatch:
            return CaseResult(case_dir.name, ops, "fail", mismatch)
    return CaseResult(case_dir.name, ops, "pass")


def run_all(node_dir: Path, runner: Runner = run) -> list[CaseResult]:
    return [run_case(d, runner) for d in sorted(node_dir.iterdir()) if (d / "model.onnx").exists()]


def per_op_counts(results: list[CaseResult]) -> dict[str, Counter]:
    """Operator -> Counter of statuses over the cases using it (a multi-op case counts for each of its ops)."""
    table: dict[str, Counter] = {}
    for r in results:
        for op in r.ops:
            table.setdefault(op, Counter())[r.status] += 1
    return dict(sorted(table.items()))


def format_table(results: list[CaseResult]) -> str:
    lines = [f"{'operator':<20} {'pass':>5} {'skip':>5} {'fail':>5}"]
    for op, c in per_op_counts(results).items():
        lines.append(f"{op:<20} {c['pass']:>5} {c['skip']:>5} {c['fail']:>5}")
    total = Counter(r.status for r in results)
    lines.append(f"{'all cases':<20} {total['pass']:>5} {total['skip']:>5} {total['fail']:>5}")
    return "\n".join(lines)
