"""A budgeted search of the space (`dynfuse explore --search N`): Optuna's TPE proposes machines, their points run
on the task runner like a grid's (same journal, so a resumed search re-uses every point it already ran).

A trial is a machine; its value is the objective of its best design (over the space's policies and dtypes,
figures summed over the models), best meaning feasible first, then lowest objective. A machine that is invalid or
cannot run a model is a failed trial (TPE ignores those). Trials are asked in batches of SEARCH_BATCH whatever
the worker count, and the sampler is seeded, so the same command proposes the same machines on any runner.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from fusion.explore.errors import ExploreError
from fusion.explore.objective import Constraint, Objective
from fusion.explore.pareto import Design, designs
from fusion.explore.point import Settings, evaluate_point
from fusion.explore.run import Evaluate, SweepOutcome, load_models, machine_points, measure, plot
from fusion.explore.space import Space
from fusion.explore.store import read_rows, write_table
from fusion.tasks import Runner, session

SEARCH_BATCH = 4  # trials proposed together (fixed: the proposals must not depend on the runner)
MAX_TRIALS = 10_000
SEARCH_NAME = "search.parquet"


@dataclass(frozen=True)
class Trial:
    number: int
    machine: dict[str, Any]
    design: Design | None  # its best design; None: the machine is invalid or could not run every model
    value: float
    violation: float  # the largest constraint violation (<= 0: feasible)

    @property
    def feasible(self) -> bool:
        return self.design is not None and self.violation <= 0


@dataclass(frozen=True)
class SearchOutcome:
    sweep: SweepOutcome
    trials: list[Trial]
    table: Path

    def best(self) -> Trial | None:
        done = [t for t in self.trials if t.design is not None]
        return min(done, key=lambda t: (not t.feasible, t.value, t.number), default=None)


def _score(found: Sequence[Design], objective: Objective, constraints: Sequence[Constraint]) -> tuple:
    """(value, violation, design) of the best design: feasible first, then the lowest objective."""
    scored = []
    for design in found:
        metrics = design.metrics()
        violation = max((c.violation(metrics) for c in constraints), default=0.0)
        value = objective(metrics)
        scored.append((max(violation, 0.0), math.inf if math.isnan(value) else value, design))
    return min(scored, key=lambda s: (s[0], s[1]), default=(math.inf, math.inf, None))


def run_search(
    model_paths: Sequence[Path],
    space: Space,
    out: Path,
    runner: Runner,
    trials: int,
    objective: Objective,
    constraints: Sequence[Constraint] = (),
    seed: int = 0,
    inputs: Mapping[str, np.ndarray] | None = None,
    validate: str = "first:1",
    progress: bool = True,
    evaluate: Evaluate = evaluate_point,
) -> SearchOutcome:
    try:
        import optuna
    except ImportError:
        raise ExploreError('--search needs Optuna: pip install "dynfuse[explore]"') from None
    if not 1 <= trials <= MAX_TRIALS:
        raise ExploreError(f"--search must be between 1 and {MAX_TRIALS}, got {trials}")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    models = load_models(model_paths, inputs or {})
    settings = Settings(models, validate)
    modern = hasattr(optuna.trial.Trial, "set_constraint")  # Optuna >= 5; before, a sampler's constraints_func
    sampler = optuna.samplers.TPESampler(
        seed=seed,
        n_startup_trials=min(10, max(2, trials // 3)),
        constraints_func=(lambda t: [t.user_attrs["violation"]]) if constraints and not modern else None,
    )
    study = optuna.create_study(direction="minimize", sampler=sampler)
    done: list[Trial] = []
    rows: dict[str, dict[str, Any]] = {}
    measured, failures = 0, []
    with session(runner):  # one Ray for all batches
        while len(done) < trials:
            batch = [study.ask() for _ in range(min(SEARCH_BATCH, trials - len(done)))]
            machines = [_suggest(t, space) for t in batch]
            points = {
                t.number: machine_points(models, space, m, validate) for t, m in zip(batch, machines, strict=True)
            }
            label = f"trials {len(done) + 1}-{len(done) + len(batch)}/{trials}"
            todo = [p for ps in points.values() for p in ps]
            found, now, lost = measure(todo, settings, out, runner, evaluate, label, progress)
            rows.update(found)
            measured, failures = measured + now, failures + lost
            for trial, machine in zip(batch, machines, strict=True):
                mine = [found[p.key] for p in points[trial.number] if p.key in found]
                violation, value, design = _score(designs(mine, models=len(models)), objective, constraints)
                if design is None:
                    study.tell(trial, state=optuna.trial.TrialState.FAIL)
                    done.append(Trial(trial.number, machine, None, math.nan, math.inf))
                    continue
                if constraints and modern:
                    trial.set_constraint("violation", violation)
                elif constraints:
                    trial.set_user_attr("violation", violation)
                study.tell(trial, value)
                done.append(Trial(trial.number, machine, design, value, violation))
    table = write_table(out, read_rows(out))
    mine = [rows[k] for k in dict.fromkeys(rows)]
    sweep = SweepOutcome(table, plot(mine, out, space), len(mine), measured, mine, failures)
    return SearchOutcome(sweep, done, _write_trials(done, Path(out) / SEARCH_NAME))


def _suggest(trial: Any, space: Space) -> dict[str, Any]:
    """The trial's machine: each axis by index (ordered, so TPE sees neighbouring values as close)."""
    return {
        axis.field: axis.values[trial.suggest_int(axis.field, 0, len(axis.values) - 1)] if len(axis.values) > 1
        else axis.values[0]
        for axis in space.axes
    }  # fmt: skip


def _write_trials(trials: Sequence[Trial], path: Path) -> Path:
    table = pa.Table.from_pylist(
        [
            {
                "trial": t.number,
                "feasible": t.feasible,
                "value": None if math.isnan(t.value) else t.value,
                "violation": None if math.isinf(t.violation) else t.violation,
                "policy": t.design.policy if t.design else None,
                "dtype": t.design.dtype if t.design else None,
                **{k: float(v) for k, v in t.machine.items()},
            }
            for t in trials
        ]
    )
    pq.write_table(table, path)
    return path
