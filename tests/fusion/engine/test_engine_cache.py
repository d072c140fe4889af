"""The kernel cache: LRU bounds and counters, compile-once under concurrency, and the on-disk cache's integrity."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
from engine_helpers import context, linear_relu_graph

from fusion.engine.cache import KernelCache, decode_entry
from fusion.engine.kernel import build_kernel
from fusion.engine.plan import Group


@pytest.fixture(scope="module")
def kernels():
    graph = linear_relu_graph(m=16, k=32, n=32)
    mc = context(graph, {"x": np.ones((16, 32), np.float32)}, "fp32")
    groups = [Group(("fc", "relu"), "epilogue", panels=p) for p in (1, 2)] + [Group(("fc",), "unfused")]
    return [build_kernel(mc, g) for g in groups]


def test_lru_bounded_by_entries(kernels) -> None:
    cache = KernelCache(max_entries=2)
    for i, k in enumerate(kernels):
        cache.get_or_build(f"k{i}", lambda k=k: k)
    assert len(cache) == 2 and "k0" not in cache and cache.stats.evictions == 1
    _, hit = cache.get_or_build("k1", lambda: kernels[1])
    assert hit and cache.stats.hits == 1 and cache.stats.misses == 3


def test_lru_bounded_by_bytes_and_recency(kernels) -> None:
    budget = kernels[0].nbytes + max(kernels[1].nbytes, kernels[2].nbytes)
    cache = KernelCache(max_entries=10, max_bytes=budget)
    cache.get_or_build("a", lambda: kernels[0])
    cache.get_or_build("b", lambda: kernels[1])
    cache.get_or_build("a", lambda: kernels[0])  # a is now the most recent
    cache.get_or_build("c", lambda: kernels[2])
    assert "a" in cache and "b" not in cache and cache.nbytes <= budget


def test_concurrent_misses_build_once(kernels) -> None:
    cache = KernelCache()
    calls = []

    def slow_build():
        calls.append(1)
        time.sleep(0.05)
        return kernels[0]

    results = []
    threads = [
        threading.Thread(target=lambda: results.append(cache.get_or_build("same", slow_build))) for _ in range(6)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(results) == 6
    assert all(k is kernels[0] for k, _ in results)


def test_disk_entries_round_trip_and_are_shared(tmp_path: Path, kernels) -> None:
    first = KernelCache(disk_dir=tmp_path)
    first.get_or_build("key", lambda: kernels[0])
    assert first.stats.disk_writes == 1 and not list(tmp_path.glob(".tmp-*"))
    second = KernelCache(disk_dir=tmp_path)  # another process's view of the same directory
    loaded, hit = second.get_or_build("key", lambda: pytest.fail("must load from disk"))
    assert not hit and second.stats.disk_hits == 1
    assert loaded.program.text == kernels[0].program.text and loaded.guard == kernels[0].guard


@pytest.mark.parametrize("damage", ["truncate", "flip", "stale_version", "garbage"])
def test_damaged_disk_entries_are_discarded_and_rebuilt(tmp_path: Path, kernels, damage: str) -> None:
    KernelCache(disk_dir=tmp_path).get_or_build("key", lambda: kernels[0])
    (path,) = tmp_path.glob("*.dfk")
    blob = bytearray(path.read_bytes())
    if damage == "truncate":
        blob = blob[: len(blob) // 2]
    elif damage == "flip":
        blob[-10] ^= 0xFF
    elif damage == "stale_version":
        blob[4:8] = (99).to_bytes(4, "little")
    else:
        blob = bytearray(b"not a cache entry")
    path.write_bytes(bytes(blob))
    assert decode_entry(bytes(blob), "key") is None
    cache = KernelCache(disk_dir=tmp_path)
    built = []
    kernel, _ = cache.get_or_build("key", lambda: built.append(1) or kernels[0])
    assert built == [1] and cache.stats.disk_rejected == 1 and kernel is kernels[0]
    assert decode_entry(path.read_bytes(), "key") is not None  # rewritten, valid again
