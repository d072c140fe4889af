"""The learned model's quality, in the suite: trained on a small seeded sweep, it must beat the analytic model on
kernels it never saw (whole seeds held out: their shapes and every candidate), in error and in ranking."""

from __future__ import annotations

from pathlib import Path

import pytest

from fusion.hpm.dataset import Dataset, load_dataset
from fusion.hpm.evaluate import evaluate, split
from fusion.hpm.model import train_on
from fusion.hpm.sweep import run_sweep

GROUPS = 120  # ~10 s of simulation; ~25 held-out seeds with ~40 candidate groups to rank


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    out: Path = tmp_path_factory.mktemp("hpm_quality")
    run_sweep(out, ["base", "tiny"], GROUPS, seed=5000, jobs=1, heldout_share=0.0, progress=False)
    return load_dataset(out)


def test_the_learned_model_beats_the_analytic_one_on_held_out_kernels(sweep: Dataset) -> None:
    train = sweep.subset(split(sweep)["train"])
    model = train_on(train)
    scores = evaluate(sweep, model, sets=("heldout_kernels",)).sets["heldout_kernels"]
    hpm, analytic = scores["hpm"], scores["analytic"]
    assert hpm.samples >= 100 and hpm.groups >= 15, "enough held-out kernels and groups to compare on"
    # measured (code of 2026-11-23 18:30): cycle MAPE 7.0% vs 10.6%, energy 0.58% vs 0.92%, tau 0.871 vs 0.776,
    # regret 0.44% vs 0.56% on 163 kernels in 46 groups; the bars leave room for generator changes, not for a tie
    assert hpm.cycle_mape < 0.8 * analytic.cycle_mape  # error: a fifth below the analytic model's at least
    assert hpm.energy_mape < 0.8 * analytic.energy_mape
    assert hpm.kendall_tau > analytic.kendall_tau + 0.03  # ranking of each group's schedules
    assert hpm.mean_regret <= analytic.mean_regret
