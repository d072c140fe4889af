"""The sweep's machine grids: valid variants, the held-out machine off every grid, grids part of a sweep's identity."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fusion.hpm import machines
from fusion.hpm.errors import HpmError
from fusion.hpm.machines import heldout_config, variant
from fusion.hpm.sweep import run_sweep
from simulator.config import load_config


def test_heldout_machine_is_on_no_grid() -> None:
    held = heldout_config()
    assert held.array_size not in machines.ARRAY_SIZES
    assert held.vector_lanes not in machines.LANES
    assert held.dram_bytes_per_cycle not in machines.BANDWIDTHS
    for base in ("base", "tiny"):
        assert held.dram_latency != load_config(base).dram_latency  # variants keep their preset's latency
        spads = {max(machines.MIN_SPAD, int(load_config(base).spad_bytes * s)) for s in machines.SPAD_SCALES}
        assert held.spad_bytes not in spads


def test_variants_cover_the_grids_with_valid_machines() -> None:
    rng = np.random.default_rng(0)
    drawn = [variant(load_config(("base", "tiny")[i % 2]), rng) for i in range(400)]
    assert {c.array_size for c in drawn} == set(machines.ARRAY_SIZES)
    assert {c.vector_lanes for c in drawn} == set(machines.LANES)
    assert {c.dram_bytes_per_cycle for c in drawn} == set(machines.BANDWIDTHS)
    # lane counts and array sizes that are not powers of two: partly filled vector beats and array tiles
    assert any(c.vector_lanes & (c.vector_lanes - 1) for c in drawn)
    assert any(c.array_size & (c.array_size - 1) for c in drawn)
    assert all(c.acc_bytes >= 8 * c.array_size**2 * 4 for c in drawn)


def test_a_directory_resumes_only_the_grids_it_was_drawn_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_sweep(tmp_path, ["base"], 1, jobs=1, progress=False)
    monkeypatch.setattr(machines, "LANES", (*machines.LANES, 64))
    with pytest.raises(HpmError, match="holds a sweep"):
        run_sweep(tmp_path, ["base"], 2, jobs=1, progress=False)
