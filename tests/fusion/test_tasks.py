"""The task runner: every item exactly once, whatever the backend; a worker that dies is retried, a bug is not.

Faults are real: a task kills its own worker process (`os._exit`), which Ray and the process pool see as a lost
worker. Ray shares one local instance per module (the runner uses an instance that is already running).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fusion.tasks import Runner, TaskError, TaskFailure, make_runner, run_tasks


def square(shared: dict, item: int) -> int:
    """Kills its worker the first time it runs an item listed in `shared["die_once"]` (a marker file remembers),
    every time for `shared["die_always"]`, and raises for `shared["raise"]`."""
    if item in shared.get("die_always", ()):
        os._exit(3)
    if item in shared.get("die_once", ()):
        marker = Path(shared["markers"]) / str(item)
        if not marker.exists():
            marker.write_text("died once")
            os._exit(3)
    if item == shared.get("raise"):
        raise ValueError(f"bad item {item}")
    return item * item


def outcomes(runner: Runner, shared: dict, items: list[int]) -> dict[int, object]:
    got = list(run_tasks(square, items, runner, shared, progress=False))
    assert sorted(i for i, _ in got) == sorted(items), "every item exactly once"
    return dict(got)


@pytest.mark.parametrize("runner", [Runner("inline", 1), Runner("local", 2)], ids=["inline", "local"])
def test_every_item_once_and_a_bug_is_a_failure_not_a_crash(runner: Runner) -> None:
    got = outcomes(runner, {"raise": 5}, list(range(9)))
    assert {i: v for i, v in got.items() if i != 5} == {i: i * i for i in range(9) if i != 5}
    assert isinstance(got[5], TaskFailure) and "ValueError: bad item 5" in got[5].reason


def test_a_killed_local_worker_is_retried_and_only_the_culprit_charged(tmp_path: Path) -> None:
    shared = {"die_once": [3, 6], "die_always": [8], "markers": str(tmp_path)}
    got = outcomes(Runner("local", 2, max_retries=2), shared, list(range(12)))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["3", "6"], "the faults really happened"
    assert {i: v for i, v in got.items() if i != 8} == {i: i * i for i in range(12) if i != 8}
    assert isinstance(got[8], TaskFailure) and "died 3 times" in got[8].reason


def test_runner_choice_is_bounded_by_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("fusion.tasks.available_cores", lambda: 2)
    assert make_runner("local", 16) == Runner("local", 2)
    assert make_runner("local", 1) == Runner("inline", 1)
    assert make_runner("ray", 16).workers == 2
    assert make_runner("ray", 16, address="auto").workers == 16, "a cluster's CPUs bound its own tasks"
    with pytest.raises(TaskError, match="--workers"):
        make_runner("local", 0)
    with pytest.raises(TaskError, match="--address"):
        make_runner("local", 2, address="auto")
    monkeypatch.setattr("fusion.tasks.ray_available", lambda: False)
    assert make_runner("auto", 2) == Runner("local", 2), "without Ray: local processes"
    with pytest.raises(TaskError, match="Ray is not installed"):
        make_runner("ray", 2)


@pytest.fixture(scope="module")
def ray_instance():
    ray = pytest.importorskip("ray")
    import test_tasks
    from ray import cloudpickle  # Ray's own copy pickles the tasks

    cloudpickle.register_pickle_by_value(test_tasks)  # workers cannot import the test module by name
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
    cloudpickle.unregister_pickle_by_value(test_tasks)


def test_ray_tasks_equal_local_ones_and_a_killed_worker_is_retried(ray_instance, tmp_path: Path) -> None:
    items = list(range(10))
    shared = {"die_once": [4], "markers": str(tmp_path), "raise": 7}
    on_ray = outcomes(Runner("ray", 2), shared, items)
    assert (tmp_path / "4").exists(), "the worker running item 4 was killed"
    local = outcomes(Runner("local", 2), {"raise": 7}, items)
    assert {i: v for i, v in on_ray.items() if i != 7} == {i: v for i, v in local.items() if i != 7}
    assert isinstance(on_ray[7], TaskFailure) and "bad item 7" in on_ray[7].reason, "a bug is not retried"


def test_local_workers_exit_when_the_sweep_is_killed(tmp_path: Path) -> None:
    """SIGKILL the process running a local sweep: its pool workers notice and exit (no orphans)."""
    script = tmp_path / "sweep.py"
    script.write_text(
        "import os, sys, time\n"
        "from fusion.tasks import Runner, run_tasks\n"
        "def slow(shared, item):\n"
        "    open(os.path.join(shared, f'{os.getpid()}'), 'w').close()\n"
        "    time.sleep(60)\n"
        "list(run_tasks(slow, [1, 2], Runner('local', 2), sys.argv[1], progress=False))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}  # this tree's fusion
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=env)
    deadline = time.monotonic() + 60
    while (
        time.monotonic() < deadline and len(pids := [int(p.name) for p in tmp_path.iterdir() if p.name.isdigit()]) < 2
    ):
        time.sleep(0.05)
    assert len(pids) == 2, "both workers started"
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in pids), "the workers outlived the sweep"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie has exited (its parent, init, reaps it)
        return f.read().split(")")[-1].split()[0] != "Z"
