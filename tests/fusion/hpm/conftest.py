"""One small seeded sweep shared by the HPM tests (measured once per session)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fusion.hpm.dataset import Dataset, load_dataset
from fusion.hpm.sweep import run_sweep

SMALL_SWEEP_GROUPS = 24


@pytest.fixture(scope="session")
def small_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("hpm_sweep")
    run_sweep(out, ["base", "tiny"], SMALL_SWEEP_GROUPS, seed=100, jobs=1, heldout_share=0.3, progress=False)
    return out


@pytest.fixture(scope="session")
def small_dataset(small_sweep: Path) -> Dataset:
    return load_dataset(small_sweep)
