"""On Ray: the same tables as on local processes, for `dynfuse explore` and `dynfuse hpm calibrate`; a worker
killed mid-sweep loses and duplicates nothing. One local Ray for the module."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from explore_helpers import MLP, die_once_on, rows_without_timing, write_space

from fusion.explore.objective import parse_objective
from fusion.explore.pareto import METRIC_NAMES
from fusion.explore.run import run_explore
from fusion.explore.search import run_search
from fusion.explore.space import load_space
from fusion.explore.store import JOURNAL_NAME
from fusion.hpm.dataset import load_dataset
from fusion.hpm.sweep import run_sweep
from fusion.tasks import Runner


@pytest.fixture(scope="module")
def ray_instance():
    ray = pytest.importorskip("ray")
    import explore_helpers
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(explore_helpers)  # the fault-injecting point function
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
    cloudpickle.unregister_pickle_by_value(explore_helpers)


def test_explore_on_ray_equals_local_processes_even_when_a_worker_is_killed(ray_instance, tmp_path: Path) -> None:
    space = load_space(write_space(tmp_path))
    local = run_explore([MLP], space, tmp_path / "local", Runner("local", 2), progress=False)
    killer = functools.partial(die_once_on, str(tmp_path))
    on_ray = run_explore([MLP], space, tmp_path / "ray", Runner("ray", 2), progress=False, evaluate=killer)
    assert (tmp_path / "killed").exists(), "a worker was killed mid-sweep"
    assert on_ray.failures == [] and on_ray.measured_now == local.measured_now == 8
    keys = [json.loads(line)["key"] for line in (tmp_path / "ray" / JOURNAL_NAME).read_text().splitlines()]
    assert len(keys) == len(set(keys)) == 8, "nothing lost, nothing duplicated"
    assert rows_without_timing(tmp_path / "ray") == rows_without_timing(tmp_path / "local")


def test_a_command_joins_a_running_cluster_and_leaves_it_running(ray_instance, tmp_path: Path) -> None:
    space = write_space(tmp_path)
    address = ray_instance.get_runtime_context().gcs_address
    cmd = [sys.executable, "-m", "dynfuse", "explore", str(MLP), "--space", str(space), "-o", str(tmp_path / "joined"),
           "--address", address, "--no-progress"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "8 points (8 measured now), 4 invalid machines" in done.stdout
    run_explore([MLP], load_space(space), tmp_path / "local", Runner("local", 2), progress=False)
    assert rows_without_timing(tmp_path / "joined") == rows_without_timing(tmp_path / "local")
    assert ray_instance.get(ray_instance.remote(lambda: 7).remote()) == 7, "the cluster outlives the command"


def test_search_on_ray_proposes_and_finds_what_it_does_locally(ray_instance, tmp_path: Path) -> None:
    space = load_space(
        write_space(tmp_path, 'preset = "tiny"\n[fields]\narray_size = [4, 8, 16]\nvector_lanes = [4, 8]\n')
    )
    objective = parse_objective("cycles * area_mm2", METRIC_NAMES)
    got = {
        name: run_search([MLP], space, tmp_path / name, runner, 5, objective, seed=1, progress=False)
        for name, runner in (("ray", Runner("ray", 2)), ("local", Runner("local", 2)))
    }
    trials = {name: [(t.number, t.machine, t.value) for t in found.trials] for name, found in got.items()}
    assert trials["ray"] == trials["local"] and len(trials["ray"]) == 5


def test_calibration_on_ray_equals_local_processes(ray_instance, tmp_path: Path) -> None:
    on_ray = run_sweep(tmp_path / "ray", ["tiny"], 3, seed=40, progress=False, runner=Runner("ray", 2))
    local = run_sweep(tmp_path / "local", ["tiny"], 3, seed=40, progress=False, runner=Runner("local", 2))
    assert (on_ray.groups, on_ray.rows) == (local.groups, local.rows) and on_ray.rows > 0
    a, b = load_dataset(tmp_path / "ray"), load_dataset(tmp_path / "local")
    assert a.columns.keys() == b.columns.keys()
    for name in a.columns:
        np.testing.assert_array_equal(a.columns[name], b.columns[name], err_msg=name)
