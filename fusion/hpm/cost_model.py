"""The HPM as a `CostModel` for the planner, and `load_cost_model`, the `--cost-model` resolver.

`load_cost_model("analytic")` is the timing-rule model; `load_cost_model("hpm")` the model file named by
$DYNFUSE_HPM_MODEL, else the model shipped in the package (`fusion/hpm/data/`) — never a file found in the
current directory, which anyone able to write there could plant; any other argument is a model file's path. A model
file that does not parse or is stale (other schema or kernel generators) gives a one-line warning and the analytic
model; a file that is not an HPM model is an error (`fusion.hpm.modelfile`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from fusion.cost.analytic import AnalyticCostModel
from fusion.cost.interface import CostEstimate, CostModel, KernelFeatures
from fusion.hpm.errors import ModelFileError, UnusableModelError
from fusion.hpm.model import HpmModel
from fusion.hpm.modelfile import load_model
from simulator.config import MachineConfig

MODEL_ENV = "DYNFUSE_HPM_MODEL"
SHIPPED_MODEL = Path(__file__).resolve().parent / "data" / "hpm.npz"  # `make hpm` writes it
COST_MODELS = ("analytic", "hpm")
MEMO_ENTRIES = 65_536  # a long-running engine sees new shapes; the memo restarts rather than grows without end


class HpmCostModel:
    """Predictions of a trained HpmModel, memoised per (features, machine) and per group of schedules: the
    planner asks about the same candidates many times."""

    name = "hpm"

    def __init__(self, model: HpmModel) -> None:
        self.model = model
        self._memo: dict[tuple[KernelFeatures, MachineConfig], CostEstimate] = {}
        self._groups: dict[tuple[tuple[KernelFeatures, ...], MachineConfig], list[CostEstimate]] = {}

    def predict(self, features: KernelFeatures, config: MachineConfig) -> CostEstimate:
        key = (features, config)
        if key not in self._memo:
            if len(self._memo) >= MEMO_ENTRIES:
                self._memo.clear()
            cycles, energy = self.model.predict_many([features], [config])
            self._memo[key] = CostEstimate(float(cycles[0]), float(energy[0]))
        return self._memo[key]

    def predict_group(self, features: Sequence[KernelFeatures], config: MachineConfig) -> list[CostEstimate]:
        key = (tuple(features), config)
        if key not in self._groups:
            if len(self._groups) >= MEMO_ENTRIES:
                self._groups.clear()
            cycles, energy = self.model.predict_many(features, [config] * len(features), [0] * len(features))
            self._groups[key] = [CostEstimate(float(c), float(e)) for c, e in zip(cycles, energy, strict=True)]
        return self._groups[key]

    def predict_many(
        self, features: Sequence[KernelFeatures], configs: Sequence[MachineConfig]
    ) -> tuple[np.ndarray, np.ndarray]:
        return self.model.predict_many(features, configs)


def default_model_path() -> Path:
    """$DYNFUSE_HPM_MODEL when set (and not empty), else the shipped model."""
    return Path(os.environ.get(MODEL_ENV) or SHIPPED_MODEL)


def print_warning(message: str) -> None:
    print(f"warning: {' '.join(message.split())}", file=sys.stderr)


def load_cost_model(name_or_path: str | Path, warn: Callable[[str], None] = print_warning) -> CostModel:
    """ "analytic", "hpm" (the default model file), or the path of a model file; an unusable model file is
    `warn`ed about (one line) and the analytic model returned."""
    text = str(name_or_path)
    if text == "analytic":
        return AnalyticCostModel()
    path = default_model_path() if text == "hpm" else Path(text)
    if not path.exists():
        hint = f" (set ${MODEL_ENV} or train one with `dynfuse hpm train DATA -o {path}`)" if text == "hpm" else ""
        raise ModelFileError(
            f"no HPM model file at {path}{hint}; cost models: {', '.join(COST_MODELS)} or a model path"
        )
    try:
        return HpmCostModel(load_model(path))
    except UnusableModelError as err:
        warn(f"{err}; planning with the analytic cost model")
        return AnalyticCostModel()
