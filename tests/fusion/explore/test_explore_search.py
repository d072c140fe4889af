"""`dynfuse explore --search N`: a seeded TPE search whose best trial is the best of what it measured."""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow.parquet as pq
from explore_helpers import MLP, write_space

from dynfuse.cli import main
from fusion.explore.pareto import designs
from fusion.explore.search import SEARCH_NAME
from fusion.explore.store import read_table

SPACE = 'preset = "tiny"\n[fields]\narray_size = [4, 8, 16]\nvector_lanes = [4, 8]\nspad_banks = [2, 3]\n'


def search(tmp_path: Path, out: str, constraint: str) -> int:
    argv = ["explore", str(MLP), "--space", str(write_space(tmp_path, SPACE)), "-o", str(tmp_path / out),
            "--search", "6", "--objective", "cycles * area_mm2", "--constraint", constraint, "--seed", "3",
            "--backend", "local", "--workers", "1", "--no-progress"]  # fmt: skip
    return main(argv)


def test_search_is_seeded_and_its_best_is_the_best_feasible_design(tmp_path: Path, capsys) -> None:
    assert search(tmp_path, "a", "area_mm2 <= 1.0") == 0
    printed = capsys.readouterr().out
    trials = pq.read_table(tmp_path / "a" / SEARCH_NAME).to_pylist()
    assert len(trials) == 6
    found = designs(read_table(tmp_path / "a").to_pylist())
    feasible = [d for d in found if d.area_mm2 <= 1.0]
    assert feasible, "the space has machines under 1 mm^2"
    best = min(d.cycles * d.area_mm2 for d in feasible)
    values = [t["value"] for t in trials if t["feasible"]]
    assert math.isclose(min(values), best, rel_tol=1e-9), "the best trial is the best feasible design it measured"
    assert "best: trial" in printed
    invalid = [t for t in trials if t["spad_banks"] == 3]
    assert all(t["value"] is None and not t["feasible"] for t in invalid), "an invalid machine is a failed trial"
    assert search(tmp_path, "b", "area_mm2 <= 1.0") == 0
    again = pq.read_table(tmp_path / "b" / SEARCH_NAME).to_pylist()
    assert again == trials, "same seed, same trials"
