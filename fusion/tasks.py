"""The one task runner of the sweeps (`dynfuse explore`, `dynfuse hpm calibrate`): Ray tasks or local processes.

A sweep is a list of independent items and a pure function `fn(shared, item) -> result`; the result of an item
does not depend on where or when it runs, so the caller may log results in completion order and a resumed or
re-scheduled sweep gets the same data. `shared` (models, settings) is sent once: `ray.put` on Ray, inherited by
forked workers locally.

Backends:
- `ray`: one Ray task per item. A local Ray is started for the sweep (and stopped after it) unless one is already
  running in this process or `address` names a cluster to join. A task whose worker process dies (killed, OOM,
  `os._exit`) is re-run by Ray up to `max_retries` times; an exception raised by `fn` is not retried (it would
  raise again: `fn` is pure).
- `local`: a process pool of at most the cores this process may use. A worker that dies breaks the pool and
  loses every item in flight; those are re-run one at a time on a new pool, so the item that kills its worker is
  found and charged an attempt (up to `max_retries` re-runs), and the others are not.
- `inline`: one worker, in this process (nothing to parallelise).

Either way every item yields exactly one outcome: its result, or a `TaskFailure` saying why (an exception of
`fn`, or a worker lost more than `max_retries` times). Failures are not results: callers report them and do not
log them, so a resumed sweep tries those items again.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from fusion.engine.workers import available_cores
from fusion.errors import FusionError

T = TypeVar("T")
BACKENDS = ("auto", "ray", "local")
MAX_RETRIES = 3  # re-runs of an item whose worker died (Ray's default for tasks)
PARENT_POLL_SECONDS = 0.5  # how often a local worker checks that the sweep that started it is alive


class TaskError(FusionError):
    """A runner that cannot be set up as asked (Ray missing, bad worker count, cluster unreachable)."""


@dataclass(frozen=True)
class TaskFailure:
    """An item that produced no result, and why."""

    item: Any
    reason: str


@dataclass(frozen=True)
class Runner:
    backend: str  # "ray", "local" or "inline"
    workers: int  # items in flight at once
    address: str | None = None  # Ray cluster to join ("auto", "ray://host:10001", "host:6379"); None: local Ray
    max_retries: int = MAX_RETRIES

    def describe(self) -> str:
        where = f" at {self.address}" if self.address else ""
        return f"{self.backend}{where}, {self.workers} worker{'s' * (self.workers != 1)}"


def ray_available() -> bool:
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def make_runner(backend: str = "auto", workers: int | None = None, address: str | None = None) -> Runner:
    """The runner a command's `--backend/--workers/--address` ask for. `auto`: Ray when it is installed and there
    is something to parallelise (more than one worker, or a cluster to join), else local processes. Without
    `address`, workers are capped at this machine's cores (a cluster's own CPUs bound its tasks)."""
    if backend not in BACKENDS:
        raise TaskError(f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    cores = available_cores()
    if workers is not None and workers < 1:
        raise TaskError(f"--workers must be >= 1, got {workers}")
    if address is not None and backend == "local":
        raise TaskError("--address joins a Ray cluster: it cannot be used with --backend local")
    want = workers or cores
    if backend == "auto":
        backend = "ray" if ray_available() and (address is not None or min(want, cores) > 1) else "local"
    if backend == "ray" and not ray_available():
        raise TaskError('Ray is not installed: pip install "dynfuse[ray]" (or use --backend local)')
    if address is None:
        want = min(want, cores)
    if backend == "local" and want == 1:
        return Runner("inline", 1)
    return Runner(backend, want, address)


def run_tasks(
    fn: Callable[[Any, T], Any],
    items: Sequence[T],
    runner: Runner,
    shared: Any = None,
    label: str = "running",
    progress: bool = True,
) -> Iterator[tuple[T, Any]]:
    """(item, fn(shared, item) or TaskFailure) for every item, in completion order, with a progress bar."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    run = {"ray": _on_ray, "local": _on_processes, "inline": _inline}[runner.backend]
    columns = (TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, disable=not progress or not items) as bar:
        task = bar.add_task(label, total=len(items))
        for outcome in run(fn, list(items), runner, shared):
            yield outcome
            bar.advance(task)


def _describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"


def _inline(fn: Callable, items: list, runner: Runner, shared: Any) -> Iterator[tuple[Any, Any]]:
    for item in items:
        try:
            result = fn(shared, item)
        except Exception as err:  # a bug in fn costs its item, reported by the caller
            result = TaskFailure(item, _describe(err))
        yield item, result


# --- local processes ---------------------------------------------------------------------------------------

_shared: Any = None  # the sweep's shared data in a local worker (set by `_install`)


def _install(shared: Any, parent: int) -> None:
    """A local worker's start: the sweep's shared data, and a watch on the parent process (a sweep killed with
    SIGKILL cannot stop its workers; they notice they were re-parented and exit instead of lingering)."""
    global _shared
    _shared = shared

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _call(fn: Callable, item: Any) -> Any:
    return fn(_shared, item)


def _pool(workers: int, shared: Any) -> ProcessPoolExecutor:
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else None)
    return ProcessPoolExecutor(workers, mp_context=context, initializer=_install, initargs=(shared, os.getpid()))


def _on_processes(fn: Callable, items: list, runner: Runner, shared: Any) -> Iterator[tuple[Any, Any]]:
    todo = list(range(len(items) - 1, -1, -1))  # indices, popped from the end: submission in item order
    suspects: list[int] = []  # in flight when a worker died: each re-run alone, so only the culprit is charged
    attempts = [0] * len(items)
    pool = _pool(runner.workers, shared)
    running: dict[Future, int] = {}
    try:
        while todo or suspects or running:
            if suspects and not running:
                i = suspects.pop()
                running[pool.submit(_call, fn, items[i])] = i
            while todo and not suspects and len(running) < runner.workers:
                i = todo.pop()
                running[pool.submit(_call, fn, items[i])] = i
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            broken = False
            for fut in done:
                try:
                    result = fut.result()
                except BrokenProcessPool:
                    broken = True
                    continue
                except Exception as err:
                    result = TaskFailure(items[running[fut]], _describe(err))
                yield items[running.pop(fut)], result
            if not broken:
                continue
            pool.shutdown(wait=True, cancel_futures=True)
            lost = sorted(running.values(), reverse=True)
            running.clear()
            pool = _pool(runner.workers, shared)
            if len(lost) > 1:
                suspects.extend(lost)
                continue
            (i,) = lost
            attempts[i] += 1
            if attempts[i] > runner.max_retries:
                yield items[i], TaskFailure(items[i], f"worker process died {attempts[i]} times running it alone")
            else:
                suspects.append(i)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


# --- Ray ---------------------------------------------------------------------------------------------------


@contextmanager
def ray_session(runner: Runner) -> Iterator[Any]:
    """Ray, initialised for the sweep: an instance already running in this process is used as it is (a notebook,
    a test module); otherwise the cluster at `address` is joined, or a local Ray of `workers` CPUs is started.
    What this function started or joined, it leaves (a joined cluster keeps running)."""
    import logging

    import ray

    if ray.is_initialized():
        yield ray
        return
    try:
        if runner.address is not None:
            ray.init(address=runner.address, logging_level=logging.WARNING, log_to_driver=False)
        else:
            ray.init(
                num_cpus=runner.workers, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False
            )
    except (ConnectionError, RuntimeError, ValueError) as err:
        where = runner.address or "a local Ray"
        raise TaskError(f"could not start or join Ray ({where}): {err}") from None
    try:
        yield ray
    finally:
        ray.shutdown()


def _call_with(fn: Callable, shared: Any, item: Any) -> Any:
    """A Ray task: `fn` is any picklable callable (a partial, a callable object), sent once by reference."""
    return fn(shared, item)


@contextmanager
def session(runner: Runner) -> Iterator[None]:
    """Keeps the runner's Ray (if any) up across several `run_tasks` calls (a search's batches): one start."""
    if runner.backend != "ray":
        yield
        return
    with ray_session(runner):
        yield


def _on_ray(fn: Callable, items: list, runner: Runner, shared: Any) -> Iterator[tuple[Any, Any]]:
    with ray_session(runner) as ray:
        from ray.exceptions import RayTaskError

        remote = ray.remote(num_cpus=1, max_retries=runner.max_retries, retry_exceptions=False)(_call_with)
        fn_ref, shared_ref = ray.put(fn), ray.put(shared)
        in_flight = max(runner.workers, int(ray.cluster_resources().get("CPU", 1))) * 2
        todo = list(reversed(items))
        running: dict[Any, Any] = {}
        try:
            while todo or running:
                while todo and len(running) < in_flight:
                    item = todo.pop()
                    running[remote.remote(fn_ref, shared_ref, item)] = item
                (ref,), _ = ray.wait(list(running), num_returns=1)
                item = running.pop(ref)
                try:
                    result = ray.get(ref)
                except RayTaskError as err:  # fn raised: not retried, it would raise again
                    result = TaskFailure(item, _describe(err.cause) if err.cause else str(err))
                except ray.exceptions.RayError as err:  # the worker was lost more than max_retries times
                    result = TaskFailure(item, f"{type(err).__name__} after {runner.max_retries} retries")
                yield item, result
        finally:
            for ref in running:
                ray.cancel(ref, force=True)


def add_runner_options(parser: argparse.ArgumentParser) -> None:
    """`--workers/--address/--backend`: where a sweep's items run (`dynfuse explore`, `dynfuse hpm calibrate`)."""
    parser.add_argument("--workers", type=int, help="items run at once (default and maximum: this machine's cores)")
    parser.add_argument("--address", help="join this Ray cluster (e.g. auto, HOST:6379) instead of a local Ray")
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default="auto",
        help="ray, local processes, or auto: Ray when installed and there is more than one worker or an --address",
    )


def worker_count_note(runner: Runner, asked: int | None) -> str:
    """A line for the user when fewer workers run than asked (capped at the machine's cores)."""
    if asked is not None and asked > runner.workers:
        return f"note: {asked} workers asked, {runner.workers} used (the cores this machine gives this process)"
    return ""
