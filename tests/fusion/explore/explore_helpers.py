"""A tiny space over the bundled MLP, shared by the exploration tests (a few seconds per sweep)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fusion.explore.point import TIMING_COLUMNS, Point, Settings, evaluate_point
from fusion.explore.store import read_table

ROOT = Path(__file__).resolve().parents[3]
MLP = ROOT / "tests" / "fusion" / "models" / "mlp.onnx"
# 4 machines, 2 of them invalid (3 banks), x 2 policies: 8 points, 4 simulated
TINY_SPACE = 'preset = "tiny"\npolicies = ["none", "dynamic"]\n[fields]\narray_size = [4, 8]\nspad_banks = [2, 3]\n'


def write_space(directory: Path, text: str = TINY_SPACE, name: str = "space.toml") -> Path:
    path = directory / name
    path.write_text(text)
    return path


def rows_without_timing(out: Path) -> list[dict[str, Any]]:
    """The table's rows minus the measured planning time (the one figure that varies between runs)."""
    return [{k: v for k, v in r.items() if k not in TIMING_COLUMNS} for r in read_table(out).to_pylist()]


def die_once_on(markers: str, settings: Settings, point: Point) -> dict:
    """The real point evaluation, except that the worker running the array-8 dynamic point kills itself the first
    time (a marker file remembers), as an OOM kill or a lost node would."""
    marker = Path(markers) / "killed"
    if dict(point.overrides).get("array_size") == 8 and point.policy == "dynamic" and not marker.exists():
        marker.write_text(point.key)
        os._exit(9)
    return evaluate_point(settings, point)
