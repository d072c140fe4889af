"""The learned model's quality, in the suite: trained on a small seeded sweep, it must beat the analytic model on
kernels it never saw (whole seeds held out: their shapes and every candidate), in error and in the regret of its
ranking."""

from __future__ import annotations

from pathlib import Path

import pytest

from fusion.hpm.dataset import Dataset, load_dataset
from fusion.hpm.evaluate import evaluate, split
from fusion.hpm.model import train_on
from fusion.hpm.sweep import run_sweep

GROUPS = 240  # ~40 s; ~120 held-out candidate groups to rank (at 120 the learned margin was within noise)


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
    # measured (generators and analytic model of 2026-11-24 10:10 UTC, the flow-shop fill): cycle MAPE 3.9% vs
    # 6.3%, energy 0.37% vs 0.95%, regret 0.72% vs 1.51%, tau 0.896 vs 0.901 on 441 kernels in 117 groups. The
    # analytic model now ranks as well as the learned one here (a tau gap of 0.005 over 117 groups is noise; on
    # `make hpm`'s 1181 held-out groups the learned model's tau is 0.912 vs 0.841): what the planner pays for a
    # wrong ranking is the regret, which must stay lower; the bars leave room for generator changes, not for a tie
    assert hpm.cycle_mape < 0.8 * analytic.cycle_mape  # error: a fifth below the analytic model's at least
    assert hpm.energy_mape < 0.8 * analytic.energy_mape
    assert hpm.mean_regret < 0.8 * analytic.mean_regret
    assert hpm.kendall_tau > analytic.kendall_tau - 0.02  # and no worse a ranking beyond noise
