"""The compile pool: kernels built in worker processes equal those built in-process, plans do not depend on the
pool, and the workers go away with the engine's context."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from engine_helpers import context, gemm_graph, model

from fusion.engine.engine import EngineOptions, FusionEngine
from fusion.engine.errors import EngineError
from fusion.engine.plan import Group
from fusion.engine.workers import CompilePool, available_cores, build_and_count

ROOT = Path(__file__).resolve().parents[3]


def test_worker_builds_equal_in_process_builds() -> None:
    graph = gemm_graph(m=8)  # short: the swapped orientation applies too
    mc = context(graph, {}, "fp32")
    groups = [Group(("mm", "add_bias", "add_res", "relu"), "epilogue", panels=2), Group(("mm", "add_bias"), "swapped")]
    pool = CompilePool(mc, 2)
    try:
        assert pool._executor.submit(os.getpid).result() != os.getpid()  # a separate process
        for group in groups:
            (kernel, feats), (want, want_feats) = (
                pool.submit(group, "any", 0.0).result(),
                build_and_count(mc, group, "any", 0.0),
            )
            assert not isinstance(kernel, str), kernel
            assert kernel.program.text == want.program.text and kernel.program.data == want.program.data
            assert feats == want_feats
        refusal, feats = pool.submit(Group(("add_bias", "relu"), "epilogue"), "any", 0.0).result()
        assert isinstance(refusal, str) and feats is None  # a generator's refusal travels back as its reason
    finally:
        pool.close()


@pytest.mark.parametrize("dtype", ["int8", "fp32"])
def test_plans_do_not_depend_on_the_pool(dtype: str) -> None:
    graph, x = model("encoder_post_d64")
    serial = FusionEngine(graph, "base", dtype, EngineOptions(workers=1))
    pooled = FusionEngine(graph, "base", dtype, EngineOptions(workers=2))
    a, b = serial.run(x), pooled.run(x)
    assert serial._pool is None and pooled._pool is not None
    assert serial.plan.choices == pooled.plan.choices
    assert serial.plan_evaluations == pooled.plan_evaluations  # the same schedules built, none pruned differently
    assert a.cycles == b.cycles
    pooled.close()
    assert pooled._pool is None


def test_a_new_context_replaces_the_workers() -> None:
    graph, x = model("mlp")
    engine = FusionEngine(graph, "base", "int8", EngineOptions(workers=2))
    engine.run(x)
    first = engine._pool
    engine._set_context(engine.mc.params)  # as an int8 range drift's re-calibration does
    assert engine._pool is None and first._executor._shutdown_thread
    engine.run(x)
    assert engine._pool is not None and engine._pool is not first
    engine.close()


def test_an_unguarded_script_from_stdin_plans_with_workers() -> None:
    """Workers are forked: the user's __main__ (here a script read from stdin, with no `if __name__` guard) is
    not re-imported in them, as spawned workers would."""
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(ROOT / "tests" / "fusion" / "engine")!r})
        from engine_helpers import model
        from fusion.engine.engine import EngineOptions, FusionEngine
        graph, x = model("mlp")
        engine = FusionEngine(graph, "base", "fp32", EngineOptions(workers=2))
        print(engine.run(x).cycles > 0, engine._pool is not None)
        """
    )
    done = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True"]


def test_workers_are_capped_at_the_available_cores() -> None:
    mc = context(gemm_graph(m=8), {}, "fp32")
    pool = CompilePool(mc, 1_000_000)
    try:
        assert pool.workers == available_cores()
        pids = {pool._executor.submit(os.getpid).result() for _ in range(20)}
        assert len(pids) <= available_cores()
    finally:
        pool.close()
    with pytest.raises(EngineError, match="workers must be an integer >= 1"):
        EngineOptions(workers=0)


def _children(pid: int) -> set[int]:
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.add(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists() or available_cores() < 2, reason="needs Linux /proc, 2 cores")
def test_sigterm_during_planning_leaves_no_orphan_workers() -> None:
    model_path = ROOT / "tests" / "fusion" / "models" / "encoder_post_d128.onnx"
    proc = subprocess.Popen(
        [sys.executable, "-m", "dynfuse.cli", "fuse", str(model_path), "--workers", "4"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    workers: set[int] = set()
    deadline = time.monotonic() + 60
    while len(workers) < 2 and time.monotonic() < deadline and proc.poll() is None:
        workers = _children(proc.pid)
        time.sleep(0.05)
    assert len(workers) >= 2, "the compile workers never started"
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in workers), "orphaned compile workers"
