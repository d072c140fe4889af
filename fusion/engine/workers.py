"""The compile pool: candidate kernels generated, assembled, linked and counted in worker processes.

Code generation is pure Python (the GIL serialises threads), so planning uses processes. Each worker holds the
model's `ModelContext` and turns a `Group` into its `Kernel` and static `KernelFeatures`; results come back
pickled (~0.1 ms for a 150 KB fp32 kernel). Where the platform can fork, workers are forked: a pool starts in a
few milliseconds with the context already in memory, and the user's `__main__` is not re-imported (spawned
workers would re-run an unguarded script). All workers fork when the pool is made (a first no-op task), which
the engine does before any of its planning threads exist. Pricing stays in the parent: the cost model may be
learning online.

Bounds: a pool never has more workers than the cores this process may run on (`available_cores`), and each
worker watches its parent's pid and exits when the parent is gone (killed, SIGTERM during planning): no orphans.
(PR_SET_PDEATHSIG would fire when the parent *thread* that forked exits, and the engine may be driven from
short-lived threads.)
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor

from fusion.cost.interface import KernelFeatures
from fusion.engine.context import ModelContext
from fusion.engine.features import kernel_features
from fusion.engine.kernel import Kernel, try_build
from fusion.engine.plan import Group

Built = tuple[Kernel | str, KernelFeatures | None]

_context: ModelContext | None = None  # the worker's model (set by `_install`)
MIN_PARALLEL_CORES = 4  # below this, forked builders do not beat building in-process (bench/results/fusion.md)
PARENT_POLL_SECONDS = 0.2  # how often a worker checks that its parent is alive


def default_workers() -> int:
    """One worker per core this process may run on, from MIN_PARALLEL_CORES cores up; 1 (no pool) below: on
    2 cores the parent's planning threads and the two builders share the cores, each build runs ~1.5x slower
    than alone, and only the largest plans gain (`python bench/bench_fusion.py` reports both)."""
    cores = available_cores()
    return cores if cores >= MIN_PARALLEL_CORES else 1


def available_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def build_and_count(mc: ModelContext, group: Group, sparsity: str, zero_fraction: float) -> Built:
    """The group's kernel (or the generator's refusal) and its features: the unit of work of a worker."""
    built = try_build(mc, group, sparsity)
    if isinstance(built, str):
        return built, None
    return built, kernel_features(mc, built, zero_fraction)


def capped(workers: int) -> int:
    """At most one worker per available core (asking for more only adds processes competing for them)."""
    return max(1, min(workers, available_cores()))


def _install(mc: ModelContext, parent: int) -> None:
    global _context
    _context = mc
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True, name="parent-watch").start()


def _exit_with_parent(parent: int) -> None:
    """Exit when the parent is gone (the worker is re-parented): a worker must not outlive the engine."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_SECONDS)
    os._exit(1)


def _build(group: Group, sparsity: str, zero_fraction: float) -> Built:
    assert _context is not None, "compile worker started without a model context"
    return build_and_count(_context, group, sparsity, zero_fraction)


class CompilePool:
    """`workers` processes (capped at the available cores) building kernels of one model context; `submit`
    returns a future of `Built`."""

    def __init__(self, mc: ModelContext, workers: int) -> None:
        methods = multiprocessing.get_all_start_methods()
        context = multiprocessing.get_context("fork" if "fork" in methods else None)
        self.workers = capped(workers)
        self._executor = ProcessPoolExecutor(
            self.workers, mp_context=context, initializer=_install, initargs=(mc, os.getpid())
        )
        self._executor.submit(int).result()  # forks every worker now (see the module docstring)

    def submit(self, group: Group, sparsity: str, zero_fraction: float) -> Future[Built]:
        return self._executor.submit(_build, group, sparsity, zero_fraction)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
