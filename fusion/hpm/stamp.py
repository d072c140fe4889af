"""The generator stamp: which kernel generators and timing rules a calibration measured.

A model learns how the simulator times the programs the generators emit, so it is only as current as both. The
stamp is a SHA-256 over the code of `GENERATOR_SOURCES` (paths relative to the installed packages' root): each
Python file's syntax tree with docstrings removed, so comments, docstrings and formatting do not make a model
stale, while any change to what a generator emits, to the features computed from its programs, or to the
simulator's timing and energy rules does. A sweep records the stamp of the code it ran (`sweep.json` and the
dataset's meta), a trained model carries its dataset's, and loading a model compares it with the code's own.
"""

from __future__ import annotations

import ast
import hashlib
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the directory holding the fusion, simulator and isa packages
GENERATOR_SOURCES = (
    "fusion/engine/codegen",  # fused kernel generators
    "fusion/engine/kernel.py",  # the program shell every group kernel is linked into
    "fusion/engine/features.py",  # KernelFeatures counted from the generated program
    "fusion/lower/kernels",  # unfused (baseline) kernel generators
    "fusion/lower/emitter.py",
    "simulator/timing.py",  # what the measured cycles and energy depend on
    "simulator/units",
    "simulator/energy.py",
    "isa/table.py",  # latencies
)


def _code(text: str) -> str:
    """The syntax tree without docstrings, as text (comments are not in the tree)."""
    tree = ast.parse(text)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                node.body = body[1:] or [ast.Pass()]  # type: ignore[attr-defined]
    return ast.dump(tree, annotate_fields=False)


def source_files(root: Path = ROOT) -> list[Path]:
    files: list[Path] = []
    for entry in GENERATOR_SOURCES:
        path = root / entry
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return files


@cache
def generator_hash(root: Path = ROOT) -> str:
    """16 hex digits naming the generator and timing code under `root` (computed once per process)."""
    digest = hashlib.sha256()
    for path in source_files(root):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(_code(path.read_text(encoding="utf-8")).encode() + b"\0")
    return digest.hexdigest()[:16]


if __name__ == "__main__":
    print(generator_hash())
