"""The reference interpreter is an independent oracle: it imports only the IR, the errors and the quantization
parameters/plan from dynfuse, never shape inference, passes, the importer, the assembler or the simulator."""

from __future__ import annotations

import ast
from pathlib import Path

import fusion.reference

ALLOWED = {"fusion.graph.ir", "fusion.graph.ops", "fusion.errors", "fusion.quant.params", "fusion.quant.plan"}
PROJECT = ("fusion", "isa", "assembler", "simulator", "rtl", "dynfuse")


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_reference_imports_only_ir_and_quant_params() -> None:
    package = Path(fusion.reference.__file__).parent
    for path in package.glob("*.py"):
        project = {m for m in _imports(path) if m.split(".")[0] in PROJECT and not m.startswith("fusion.reference")}
        assert project <= ALLOWED, f"{path.name} imports {sorted(project - ALLOWED)}"


def test_quant_plan_and_params_do_not_import_the_reference_or_lowering() -> None:
    package = Path(fusion.reference.__file__).parent.parent / "quant"
    allowed = {
        "fusion.errors",
        "fusion.graph.ir",
        "fusion.graph.ops",
        "fusion.quant.params",
        "fusion.quant.bias_correction",
    }
    for name in ("params.py", "plan.py", "bias_correction.py"):
        project = {m for m in _imports(package / name) if m.split(".")[0] in PROJECT}
        assert project <= allowed, name
