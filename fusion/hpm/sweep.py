"""The calibration sweep: seeded groups -> every candidate kernel the fusion engine would weigh -> simulated.

Group `seed` fixes everything about a sample (recipe and shapes, machine, dtype, sparsity, inputs), so a
resumed sweep measures exactly the seeds missing from the log and gets the same results a single run would.
For each fusion candidate of the seed's graph (`fusion.engine.candidates`: single nodes, epilogue and chain
groups), every schedule and zero-skip twin the engine can build is generated, its `KernelFeatures` computed
by the engine (`fusion.engine.features`, the one place features are computed) and simulated: cycles, per-unit
busy/stall, DRAM bytes and energy. Rows of one candidate share a `group` key, so rankings can be scored.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fusion.engine.candidates import enumerate_candidates, schedules, zero_skip_twin
from fusion.engine.context import ModelContext
from fusion.engine.execute import run_kernel
from fusion.engine.features import kernel_features
from fusion.engine.kernel import Kernel, try_build
from fusion.engine.legality import structurally_legal
from fusion.engine.plan import Group
from fusion.engine.profile import profile_tensor
from fusion.engine.strategies import strategy_of
from fusion.graph.cost import group_cost
from fusion.graph.ir import Graph
from fusion.hpm.dataset import DATASET_NAME, LOG_NAME, MEASURED_PREFIX, SampleLog, feature_row, rows_of, write_dataset
from fusion.hpm.errors import HpmError
from fusion.hpm.machines import HELDOUT_NAME, config_to_json, grids, heldout_config, variant
from fusion.hpm.recipes import RECIPES
from fusion.hpm.sparsity import SPARSITY_LEVELS, sparse_input
from fusion.hpm.stamp import generator_hash
from fusion.quant.calibrate import calibrate
from fusion.quant.params import quantize_tensor
from fusion.reference.interpreter import evaluate
from fusion.tasks import Runner, TaskFailure, make_runner, run_tasks
from isa.errors import DynfuseError
from simulator.config import MachineConfig, load_config
from simulator.counters import COUNTER_DOCS

DTYPES = ("fp32", "int8")
MAX_ROOFLINE_CYCLES = 20_000  # keeps one group's simulations around a second
MAX_SCHEDULES = 6  # per candidate: enough to rank, few enough to sweep many shapes
MAX_DRAWS = 64
SWEEP_NAME = "sweep.json"  # the parameters a directory's seeds were drawn with


@dataclass(frozen=True)
class GroupSpec:
    seed: int
    recipe: str
    graph: Graph
    config: MachineConfig
    dtype: str
    sparsity: float
    heldout_config: bool


def pick_config(rng: np.random.Generator, bases: Sequence[str], heldout_share: float) -> MachineConfig:
    if rng.random() < heldout_share:
        return heldout_config()
    return variant(load_config(bases[int(rng.integers(len(bases)))]), rng)


def group_spec(seed: int, bases: Sequence[str], heldout_share: float) -> GroupSpec:
    """Everything about group `seed`, drawn until its roofline work fits the per-sample budget."""
    rng = np.random.default_rng(seed)
    names = sorted(RECIPES)
    for _ in range(MAX_DRAWS):
        recipe = names[int(rng.integers(len(names)))]
        graph = RECIPES[recipe](rng)
        config = pick_config(rng, bases, heldout_share)
        cost = group_cost(graph, [n.name for n in graph.nodes], config)
        if max(cost.compute_cycles, cost.memory_cycles) <= MAX_ROOFLINE_CYCLES:
            dtype = DTYPES[int(rng.integers(len(DTYPES)))]
            sparsity = float(SPARSITY_LEVELS[int(rng.integers(len(SPARSITY_LEVELS)))])
            return GroupSpec(seed, recipe, graph, config, dtype, sparsity, config.name == HELDOUT_NAME)
    raise HpmError(f"seed {seed}: no group within the work budget after {MAX_DRAWS} draws")


def group_inputs(spec: GroupSpec) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([spec.seed, 1])
    tile = spec.config.array_size
    return {v: sparse_input(rng, spec.graph.types[v].shape, spec.sparsity, tile) for v in spec.graph.inputs}


def candidate_groups(mc: ModelContext, rng: np.random.Generator) -> list[tuple[str, Group]]:
    """(candidate key, schedule) for every legal candidate: its first schedule (the engine's default) and a
    seeded sample of the others and of the zero-skip twins, at most MAX_SCHEDULES in all."""
    out = []
    for cand in enumerate_candidates(mc.graph):
        if not structurally_legal(mc, [mc.graph.node(n) for n in cand.nodes], cand.family):
            continue
        groups = [g for g in schedules(mc, cand) if not strategy_of(g).host_view]
        groups += [twin for twin in map(zero_skip_twin, groups) if twin is not None]
        if len(groups) > MAX_SCHEDULES:
            picked = rng.choice(np.arange(1, len(groups)), size=MAX_SCHEDULES - 1, replace=False)
            groups = [groups[0], *(groups[i] for i in sorted(picked))]
        out += [("+".join(cand.nodes), g) for g in groups]
    return out


def storage_env(mc: ModelContext, kernel: Kernel, env: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The kernel's inputs as it reads them from DRAM (int8 where its guard says so)."""
    out = {}
    for value, dtype in kernel.guard.dtypes:
        data = np.asarray(env[value], dtype=np.float32)
        out[value] = quantize_tensor(data, mc.scale(value)) if dtype == "int8" else data
    return out


def measure_group(seed: int, bases: Sequence[str], heldout_share: float) -> dict[str, Any]:
    """One log record: the measured candidate kernels of group `seed`, or why the group could not be measured
    (a user-facing error of the compiler or simulator is data about the sweep, not a crash of it)."""
    try:
        spec = group_spec(seed, bases, heldout_share)
        inputs = group_inputs(spec)
        params = calibrate(spec.graph, [inputs]) if spec.dtype == "int8" else None
        mc = ModelContext(spec.graph, spec.config, spec.dtype, params)
        rows, failed = measure_candidates(spec, mc, evaluate(spec.graph, inputs), np.random.default_rng([seed, 2]))
    except DynfuseError as err:
        return {"seed": seed, "error": f"{type(err).__name__}: {err}"}
    return {"seed": seed, "rows": rows, **({"failed": failed} if failed else {})}


def measure_candidates(
    spec: GroupSpec, mc: ModelContext, env: dict[str, np.ndarray], rng: np.random.Generator
) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """(rows, failures): every legal candidate's sampled schedules built and simulated on `env` (every value of
    the graph on the group's inputs), one row each; a kernel the simulator rejects costs only itself."""
    rows, failed = [], []
    for key, group in candidate_groups(mc, rng):
        head_input = spec.graph.node(group.nodes[0]).inputs[0]
        profile = profile_tensor(env[head_input], spec.config.array_size)
        kernel = try_build(mc, group, profile.sparsity)
        if isinstance(kernel, str) or kernel.program is None:
            continue
        try:
            counters = run_kernel(mc, kernel, storage_env(mc, kernel, env)).counters.as_dict()
        except DynfuseError as err:  # one bad kernel (e.g. a generator's deadlock) costs only itself
            failed.append({"group": key, "schedule": group.schedule, "error": f"{type(err).__name__}: {err}"})
            continue
        features = kernel_features(mc, kernel, profile.zero_tile_fraction)
        rows.append(_row(spec, len(rows), key, group, features, counters))
    return rows, failed


def _row(spec: GroupSpec, index: int, key: str, group: Group, features: Any, counters: dict) -> dict[str, Any]:
    return {
        "seed": spec.seed,
        "candidate": index,
        "group": f"{spec.seed}/{key}",
        "schedule": group.schedule,
        "recipe": spec.recipe,
        "config": spec.config.name,
        "config_json": config_to_json(spec.config),
        "heldout_config": spec.heldout_config,
        **feature_row(features),
        **{MEASURED_PREFIX + name: counters[name] for name, _, _ in COUNTER_DOCS},
    }


@dataclass(frozen=True)
class SweepResult:
    dataset: Path
    groups: int
    rows: int
    failed: int
    measured_now: int


def run_sweep(
    out_dir: Path,
    bases: Sequence[str],
    samples: int,
    seed: int = 0,
    jobs: int = 2,
    heldout_share: float = 0.1,
    progress: bool = True,
    runner: Runner | None = None,
) -> SweepResult:
    """Measure groups seed..seed+samples-1 not yet in `out_dir/samples.jsonl`, then write `dataset.npz`.
    The groups run on `runner` (`fusion.tasks`: Ray or local processes); default: `jobs` local processes."""
    for name in bases:
        load_config(name)  # an unknown preset is an error before any work starts
    if samples < 1:
        raise HpmError(f"--samples must be at least 1, got {samples}")
    stamp = generator_hash()  # the code this process measures with (a directory holds one code's samples)
    params = {"configs": list(bases), "heldout_share": heldout_share, "grids": grids(), "generators": stamp}
    _check_same_sweep(Path(out_dir), params)
    log = SampleLog(Path(out_dir) / LOG_NAME)
    done = log.seeds()
    pending = [s for s in range(seed, seed + samples) if s not in done]
    runner = runner or make_runner("local", jobs)
    try:
        for record in _measure(pending, tuple(bases), heldout_share, runner, progress):
            log.append(record)
    finally:
        records = [r for r in log.records() if seed <= int(r["seed"]) < seed + samples]
        rows = rows_of(records)
        meta = {**params, "seed": seed, "samples": samples}
        path = write_dataset(Path(out_dir) / DATASET_NAME, rows, meta)
    failed = sum(1 for r in records if "error" in r)
    return SweepResult(path, len(records), len(rows), failed, len(pending))


def _check_same_sweep(out_dir: Path, params: dict[str, Any]) -> None:
    """A directory resumes only the sweep it holds: seeds mean something else with other machines, grids or shares."""
    path = out_dir / SWEEP_NAME
    if path.exists():
        held = json.loads(path.read_text())
        if held != params:
            raise HpmError(f"{out_dir} holds a sweep with {held}, not {params}: resume it with those or use another -o")
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(params, sort_keys=True))


def _measure_seed(shared: tuple[tuple[str, ...], float], seed: int) -> dict[str, Any]:
    """The task of one group on the runner (`shared`: the presets and held-out share)."""
    bases, heldout_share = shared
    return measure_group(seed, bases, heldout_share)


def _measure(
    pending: list[int], bases: tuple[str, ...], heldout_share: float, runner: Runner, progress: bool
) -> Iterator[dict[str, Any]]:
    """Yields records as groups finish (any order); the caller logs each at once. A group whose worker was lost
    more than the runner's retries (or that raised a bug) is not logged: counted, and measured on the next run."""
    lost = []
    for seed, record in run_tasks(_measure_seed, pending, runner, (bases, heldout_share), "calibrating", progress):
        if isinstance(record, TaskFailure):
            lost.append(f"seed {seed}: {record.reason}")
            continue
        yield record
    if lost:
        raise HpmError(f"{len(lost)} groups not measured (run again to resume): {'; '.join(lost[:3])}")
