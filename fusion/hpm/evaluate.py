"""Held-out evaluation of a cost model on calibration data, side by side with the analytic model.

The split is a pure function of the dataset: rows measured on the held-out machine form one test set; of
the others, whole seeds (a seed fixes the recipe's shapes and its every candidate) are held out by a hash of
the seed, so test kernels and shapes were never seen in training. Ranking quality is scored within each
candidate group (the schedules of one set of nodes): Kendall tau of predicted vs measured cycles, and the
regret of taking the predicted best instead of the measured best.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from fusion.cost.analytic import AnalyticCostModel
from fusion.hpm.dataset import Dataset
from fusion.hpm.errors import HpmError
from fusion.hpm.metrics import grouped, mape
from fusion.hpm.model import HpmModel

TEST_FRACTION = 0.2
Predictor = Callable[[Dataset], tuple[np.ndarray, np.ndarray]]


def _seed_bucket(seed: int) -> float:
    digest = hashlib.sha256(f"hpm-split-{seed}".encode()).digest()
    return int.from_bytes(digest[:8], "little") / 2**64


def split(ds: Dataset, test_fraction: float = TEST_FRACTION) -> dict[str, np.ndarray]:
    """Boolean masks: "train", "heldout_kernels", "heldout_config"."""
    held_config = ds.columns["heldout_config"].astype(bool)
    held_seed = np.array([_seed_bucket(int(s)) < test_fraction for s in ds.columns["seed"]], dtype=bool)
    return {
        "train": ~held_config & ~held_seed,
        "heldout_kernels": ~held_config & held_seed,
        "heldout_config": held_config,
    }


def hpm_predictor(model: HpmModel) -> Predictor:
    return lambda ds: model.predict_many(ds.features(), ds.configs(), list(ds.columns["group"]))


def analytic_predictor(ds: Dataset) -> tuple[np.ndarray, np.ndarray]:
    model = AnalyticCostModel()
    pairs = [model.predict(f, c) for f, c in zip(ds.features(), ds.configs(), strict=True)]
    return np.array([p.cycles for p in pairs]), np.array([p.energy_pj for p in pairs])


@dataclass(frozen=True)
class Scores:
    samples: int
    cycle_mape: float
    energy_mape: float
    kendall_tau: float
    mean_regret: float
    groups: int

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def score(ds: Dataset, cycles: np.ndarray, energy: np.ndarray) -> Scores:
    measured = ds.measured("cycle")
    tau, regret, groups = grouped(ds.columns["group"], cycles, measured)
    return Scores(len(ds), mape(cycles, measured), mape(energy, ds.measured("energy_total_pj")), tau, regret, groups)


@dataclass(frozen=True)
class Evaluation:
    sets: dict[str, dict[str, Scores]]  # set name -> model name -> scores
    predictions: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]  # set -> model -> (cycles, energy)
    subsets: dict[str, Dataset]

    def as_dict(self) -> dict[str, dict[str, dict[str, float | int]]]:
        return {s: {m: sc.as_dict() for m, sc in models.items()} for s, models in self.sets.items()}


def evaluate(ds: Dataset, model: HpmModel, sets: tuple[str, ...] = ("heldout_kernels", "heldout_config")) -> Evaluation:
    masks = split(ds)
    predictors: dict[str, Predictor] = {"hpm": hpm_predictor(model), "analytic": analytic_predictor}
    scores: dict[str, dict[str, Scores]] = {}
    preds: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    subsets = {}
    for name in sets:
        sub = ds.subset(masks[name])
        if len(sub) == 0:
            raise HpmError(f"the dataset has no {name.replace('_', ' ')} rows (sweep more samples)")
        subsets[name] = sub
        preds[name] = {m: p(sub) for m, p in predictors.items()}
        scores[name] = {m: score(sub, *preds[name][m]) for m in predictors}
    return Evaluation(scores, preds, subsets)


def write_plots(ev: Evaluation, out_dir: Path) -> list[Path]:
    """Predicted vs measured cycles (log-log, both models) and cycle MAPE by op type, per test set, as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, sub in ev.subsets.items():
        measured = sub.measured("cycle")
        fig, ax = plt.subplots(figsize=(5.5, 5))
        for model, marker in (("analytic", "x"), ("hpm", ".")):
            ax.scatter(measured, ev.predictions[name][model][0], s=8, marker=marker, alpha=0.6, label=model)
        lo, hi = measured.min(), measured.max()
        ax.plot([lo, hi], [lo, hi], "k--", lw=1)
        ax.set(xscale="log", yscale="log", xlabel="measured cycles", ylabel="predicted cycles", title=name)
        ax.legend()
        written.append(_save(fig, out_dir / f"pred_vs_measured_{name}.png"))
        heads = np.array([str(o).split(",")[0] for o in sub.columns["ops"]])
        ops = sorted(set(heads))
        fig, ax = plt.subplots(figsize=(max(6, len(ops) * 0.6), 4))
        x = np.arange(len(ops))
        for offset, model in ((-0.2, "analytic"), (0.2, "hpm")):
            pred = ev.predictions[name][model][0]
            errors = [100 * mape(pred[heads == op], measured[heads == op]) for op in ops]
            ax.bar(x + offset, errors, width=0.4, label=model)
        ax.set_xticks(x, ops, rotation=45, ha="right")
        ax.set(ylabel="cycle MAPE (%)", yscale="log", title=f"error by op type ({name})")
        ax.legend()
        fig.tight_layout()
        written.append(_save(fig, out_dir / f"error_by_op_{name}.png"))
        plt.close("all")
    return written


def _save(fig: object, path: Path) -> Path:
    fig.savefig(path, dpi=110)  # type: ignore[attr-defined]
    return path
