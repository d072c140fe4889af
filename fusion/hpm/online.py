"""Online learning: the measured counters of kernels the engine dispatches are appended (`FusionEngine` calls
`record` for every kernel it simulates when its cost model has one; `observe(result.records, config)` feeds the
records of a call made with another cost model); the model is retrained in a background thread every
`retrain_every` new samples and swapped in when ready, so dispatch never waits.

With `log_path`, every recorded sample is also appended to a JSON-lines file (fsync'ed, torn tail dropped),
and the samples already in it are loaded on start, so what the engine learned survives a restart.

`generation` counts the models swapped in: an engine planning with this model re-plans when it changes
(`FusionEngine` compares it with the generation its plan was made with), so a retrain that changes which kernel
is predicted fastest changes the plan of a running engine. `OnlineHpm.load` starts from a model file like
`--cost-model` does; with no usable model it predicts analytically until its first retrain.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fusion.cost.analytic import AnalyticCostModel
from fusion.cost.interface import CostEstimate, CostModel, KernelFeatures
from fusion.hpm.cost_model import HpmCostModel, load_cost_model, print_warning
from fusion.hpm.dataset import Dataset, SampleLog, feature_row, features_from_row
from fusion.hpm.errors import HpmError
from fusion.hpm.machines import config_from_json, config_to_json
from fusion.hpm.model import ALGORITHMS, TARGETS, HpmModel, train
from simulator.config import MachineConfig


class OnlineHpm:
    """A CostModel that learns from dispatched kernels. `record` is cheap (a list append, optionally one log
    line); retraining runs on a daemon thread on the calibration data plus everything recorded so far."""

    name = "hpm"

    def __init__(
        self,
        model: HpmModel | None,
        calibration: Dataset | None = None,
        retrain_every: int = 256,
        log_path: Path | None = None,
        algo: str | None = None,
    ) -> None:
        if retrain_every < 1:
            raise HpmError(f"retrain_every must be at least 1, got {retrain_every}")
        self._current: CostModel = HpmCostModel(model) if model is not None else AnalyticCostModel()
        self.retrain_every = retrain_every
        self.algo = algo or str(model.meta.get("algorithm", ALGORITHMS[0]) if model is not None else ALGORITHMS[0])
        self._features: list[KernelFeatures] = calibration.features() if calibration is not None else []
        self._configs: list[MachineConfig] = calibration.configs() if calibration is not None else []
        self._measured = {t: list(calibration.measured(t)) if calibration is not None else [] for t in TARGETS}
        # candidate groups of the calibration rows (pairs for the pairwise estimator); a dispatched kernel is
        # the one schedule of its group that ran, so each online sample is a group of its own
        self._groups: list[str] = [str(g) for g in calibration.columns["group"]] if calibration is not None else []
        self._new = 0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._log = SampleLog(log_path) if log_path is not None else None
        for record in self._log.records() if self._log is not None else []:
            self._append(features_from_row(record["row"]), config_from_json(record["row"]["config_json"]), record)
        self.retrains = 0
        self.last_error: str | None = None

    @classmethod
    def load(
        cls, name_or_path: str | Path = "hpm", warn: Callable[[str], None] = print_warning, **options: Any
    ) -> OnlineHpm:
        """Start from a model file ("hpm": $DYNFUSE_HPM_MODEL or the shipped model), resolved and checked as
        `--cost-model` resolves it; an unusable file is warned about and the analytic model starts."""
        start = load_cost_model(name_or_path, warn)
        return cls(start.model if isinstance(start, HpmCostModel) else None, **options)

    @property
    def generation(self) -> int:
        """Which model predicts: changes with every swap (what a planning engine compares)."""
        return self.retrains

    @property
    def model(self) -> HpmModel | None:
        """The current learned model (None while predicting analytically, before the first retrain)."""
        return getattr(self._current, "model", None)

    def predict(self, features: KernelFeatures, config: MachineConfig) -> CostEstimate:
        return self._current.predict(features, config)

    def predict_group(self, features: Sequence[KernelFeatures], config: MachineConfig) -> list[CostEstimate]:
        return self._current.predict_group(features, config)

    def record(self, features: KernelFeatures, config: MachineConfig, counters: Mapping[str, float]) -> None:
        """Append one measured kernel (simulator counters: needs `cycle` and `energy_total_pj`)."""
        missing = [t for t in TARGETS if t not in counters]
        if missing:
            raise HpmError(f"measured counters lack {missing}")
        with self._lock:
            self._append(features, config, {"measured": counters})
            self._new += 1
            due = self._new >= self.retrain_every and (self._thread is None or not self._thread.is_alive())
            if due:
                self._new = 0
                measured = {t: np.array(v) for t, v in self._measured.items()}
                snapshot = (list(self._features), list(self._configs), measured, list(self._groups))
                self._thread = threading.Thread(target=self._retrain, args=snapshot, daemon=True)
                self._thread.start()
        if self._log is not None:
            row = {**feature_row(features), "config_json": config_to_json(config)}
            self._log.append({"online": True, "row": row, "measured": {t: float(counters[t]) for t in TARGETS}})

    def observe(self, records: Iterable[Any], config: MachineConfig) -> int:
        """Record every simulated kernel of an engine call (`CallResult.records`: features, measured cycles and
        energy); host-side alias kernels carry no features and are skipped, and records the engine already fed to
        `record` (`learned`) are not appended twice. Returns how many of the call's kernels the model now holds."""
        count = 0
        for r in records:
            if r.features is not None and r.measured_cycles > 0:
                if not getattr(r, "learned", False):
                    self.record(r.features, config, {"cycle": r.measured_cycles, "energy_total_pj": r.energy_pj})
                count += 1
        return count

    def _append(self, features: KernelFeatures, config: MachineConfig, record: Mapping) -> None:
        self._groups.append(f"online/{len(self._features)}")
        self._features.append(features)
        self._configs.append(config)
        for t in TARGETS:
            self._measured[t].append(float(record["measured"][t]))

    def _retrain(self, features: list, configs: list, measured: dict[str, np.ndarray], groups: list[str]) -> None:
        try:
            model = train(features, configs, measured, self.algo, meta={"online_samples": len(features)}, groups=groups)
        except Exception as err:  # noqa: BLE001 - a failed background retrain keeps the old model; reported
            self.last_error = f"{type(err).__name__}: {err}"
            return
        self._current = HpmCostModel(model)  # one reference assignment: readers see the old or the new model
        self.retrains += 1

    def wait(self, timeout: float | None = None) -> bool:
        """Block until a running retrain finishes (tests, shutdown); True when none is running."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return thread is None or not thread.is_alive()

    def samples(self) -> int:
        return len(self._features)
