"""A grid sweep: every (machine, model, dtype, policy) of the space not yet in the directory's journal, run on the
task runner (Ray or local processes), logged as each finishes; then the Parquet table and the Pareto plot."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fusion.explore.errors import ExploreError
from fusion.explore.pareto import Design, designs, front, plot_front
from fusion.explore.point import ERROR, INVALID, Model, Point, Settings, evaluate_point, make_point
from fusion.explore.space import Space, Value
from fusion.explore.store import journal, read_rows, write_table
from fusion.lower.compiler import load_graph
from fusion.tasks import Runner, TaskFailure, run_tasks

PLOT_NAME = "pareto.png"
Evaluate = Callable[[Settings, Point], dict[str, Any]]


@dataclass(frozen=True)
class SweepOutcome:
    """What one run of `dynfuse explore` did."""

    table: Path
    plot: Path | None
    points: int  # in the space (this run's)
    measured_now: int
    rows: list[dict[str, Any]]  # this run's points' rows (earlier runs' included)
    failures: list[TaskFailure] = field(default_factory=list)

    def count(self, status: str) -> int:
        return sum(1 for r in self.rows if r["status"] == status)

    def designs(self) -> list[Design]:
        return designs(self.rows)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def load_models(paths: Sequence[Path], given: Mapping[str, np.ndarray]) -> dict[str, Model]:
    """Each model with its inputs: a given array by input name (shared by every model having that input), else
    standard-normal values seeded by the model file's hash and the input's name (the same on every machine)."""
    models: dict[str, Model] = {}
    used: set[str] = set()
    for path in paths:
        path = Path(path)
        if not path.exists():
            raise ExploreError(f"no such model file: {path}")
        sha = _digest(path.read_bytes())
        graph = load_graph(path)
        inputs = {}
        for name in graph.inputs:
            if name in given:
                inputs[name] = given[name]
                used.add(name)
            else:
                seed = int(hashlib.sha256(f"{sha}/{name}".encode()).hexdigest()[:16], 16)
                inputs[name] = np.random.default_rng(seed).standard_normal(graph.types[name].shape).astype(np.float32)
        name = path.stem if path.stem not in models else f"{path.stem}-{sha[:6]}"
        if name in models:
            raise ExploreError(f"{path}: the same model is given twice")
        inputs_sha = _digest(b"".join(v.tobytes() + str(v.shape).encode() for _, v in sorted(inputs.items())))
        models[name] = Model(name, sha, graph, inputs, inputs_sha)
    unused = sorted(set(given) - used)
    if unused:
        raise ExploreError(f"--input {unused[0]}: no model has an input of that name")
    return models


def machine_points(
    models: Mapping[str, Model], space: Space, overrides: dict[str, Value], validate: str
) -> list[Point]:
    return [
        make_point(model, policy, dtype, space.preset, overrides, validate)
        for model in models.values()
        for dtype in space.dtypes
        for policy in space.policies
    ]


def measure(
    points: Iterable[Point],
    settings: Settings,
    out: Path,
    runner: Runner,
    evaluate: Evaluate = evaluate_point,
    label: str = "exploring",
    progress: bool = True,
) -> tuple[dict[str, dict[str, Any]], int, list[TaskFailure]]:
    """Rows of `points` by key: those in `out`'s journal as they are, the others run now and logged as each
    finishes. Returns (rows, measured now, failures)."""
    log = journal(out)
    log.path.touch()
    rows = {r["key"]: r for r in read_rows(out)}
    pending = list({p.key: p for p in points if p.key not in rows}.values())
    failures: list[TaskFailure] = []
    measured = 0
    for _, result in run_tasks(evaluate, pending, runner, settings, label, progress):
        if isinstance(result, TaskFailure):
            failures.append(result)
            continue
        log.append(result)
        rows[result["key"]] = result
        measured += 1
    return rows, measured, failures


def run_explore(
    model_paths: Sequence[Path],
    space: Space,
    out: Path,
    runner: Runner,
    inputs: Mapping[str, np.ndarray] | None = None,
    validate: str = "first:1",
    progress: bool = True,
    evaluate: Evaluate = evaluate_point,
) -> SweepOutcome:
    """The grid sweep. `evaluate` is the per-point function (tests wrap it to inject worker faults)."""
    models = load_models(model_paths, inputs or {})
    points = [p for overrides in space.grid() for p in machine_points(models, space, overrides, validate)]
    journal(out).path.touch()  # a sweep directory from the start
    rows: dict[str, dict[str, Any]] = {}
    measured, failures = 0, []
    try:
        rows, measured, failures = measure(points, Settings(models, validate), out, runner, evaluate, progress=progress)
    finally:  # an interrupted sweep still leaves the table of what it finished
        table = write_table(out, read_rows(out))
    mine = [rows[p.key] for p in points if p.key in rows]
    return SweepOutcome(table, plot(mine, out, space), len(points), measured, mine, failures)


def plot(rows: list[dict[str, Any]], out: Path, space: Space) -> Path | None:
    found = designs(rows)
    if not found:
        return None
    return plot_front(found, Path(out) / PLOT_NAME, f"{Path(space.source).name} ({space.preset})")


def summary(outcome: SweepOutcome, base: dict[str, Any]) -> list[str]:
    """Lines for the user: counts, where the results are, the Pareto designs."""
    found = outcome.designs()
    lines = [
        f"{outcome.table}: {outcome.points} points ({outcome.measured_now} measured now), "
        f"{outcome.count(INVALID)} invalid machines, {outcome.count(ERROR)} could not run"
    ]
    if outcome.plot:
        lines.append(f"{outcome.plot}: Pareto front of {len(found)} designs")
    for design, best in zip(found, front(found), strict=True):
        if best:
            lines.append(
                f"  pareto: {design.policy} {design.dtype} [{design.label(base)}]: {design.cycles} cycles, "
                f"{design.energy_pj / 1e6:.3f} uJ, {design.area_mm2:.3f} mm^2"
            )
    for failure in outcome.failures:
        lines.append(f"  not measured (retried on the next run): {failure.item.key}: {failure.reason}")
    return lines
