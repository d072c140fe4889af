"""The data path is one straight line: a package may import only packages to its left (and the CLI all)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ALLOWED = {
    "isa": set(),
    "assembler": {"isa"},
    "simulator": {"isa", "assembler"},
    "rtl": {"isa", "assembler", "simulator"},
    "fusion": {"isa", "assembler", "simulator"},
}
PROJECT = set(ALLOWED) | {"dynfuse"}


def _imported_packages(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names & PROJECT


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_packages_to_its_left(package: str) -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(bad)
        for path in (ROOT / package).rglob("*.py")
        if (bad := _imported_packages(path) - ALLOWED[package] - {package})
    }
    assert not offenders, f"{package} may import only {sorted(ALLOWED[package])}: {offenders}"
