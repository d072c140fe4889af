"""Fuzzing kernel-cache entries: damaged bytes (with and without a recomputed checksum) and damaged metadata
under a valid checksum. Decoding never raises; a lookup through a directory holding the damaged entry never
raises and returns a kernel of the right key (the damaged one rejected and rebuilt, or a faithful one)."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from fuzz_helpers import fuzz, mutate_bytes, pick

from fusion.engine.cache import CACHE_VERSION, HEADER, MAGIC, KernelCache, decode_entry, encode_kernel
from fusion.engine.emit_asm import RecordingCache
from fusion.engine.engine import EngineOptions, FusionEngine

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fusion" / "engine"))
from engine_helpers import linear_relu_graph  # noqa: E402 - the engine tests' graph builders

KEY = "f" * 64


@pytest.fixture(scope="module")
def kernels():
    """Every kernel the engine builds for a small int8 Linear+ReLU (fused, baselines)."""
    graph = linear_relu_graph(m=16, k=32, n=32)
    cache = RecordingCache()
    engine = FusionEngine(graph, "tiny", "int8", EngineOptions(workers=1), cache=cache)
    engine.run({"x": np.random.default_rng(0).standard_normal((16, 32)).astype(np.float32)})
    return list(cache.used.values())


def _sealed(payload: bytes) -> bytes:
    return MAGIC + CACHE_VERSION.to_bytes(4, "little") + hashlib.sha256(payload).digest() + payload


JUNK = [None, 0, -1, 2**40, 1.5, "x", "", [], {}, [1, 2], {"a": 1}, True, [[0, [1]]]]


def _damaged_meta(payload: bytes, rng: np.random.Generator) -> bytes:
    size = int.from_bytes(payload[:4], "little")
    meta, body = json.loads(payload[4 : 4 + size]), payload[4 + size :]
    for _ in range(int(rng.integers(1, 4))):
        node, path = meta, []
        while isinstance(node, dict) and node and rng.random() < 0.7:
            key = pick(rng, sorted(node))
            path.append((node, key))
            node = node[key]
        if path:
            parent, key = path[-1]
            if rng.random() < 0.2:
                del parent[key]
            else:
                parent[key] = pick(rng, JUNK)
    head = json.dumps(meta).encode()
    if rng.random() < 0.3:
        body = mutate_bytes(body, rng)
    return len(head).to_bytes(4, "little") + head + body


def test_fuzz_cache_entries(tmp_path: Path, kernels) -> None:
    def case(rng: np.random.Generator) -> str:
        kernel = pick(rng, kernels)
        blob = _sealed(encode_kernel(KEY, kernel))
        kind = int(rng.integers(0, 3))
        if kind == 0:
            blob = mutate_bytes(blob, rng)
        elif kind == 1:
            blob = _sealed(mutate_bytes(blob[HEADER:], rng))
        else:
            blob = _sealed(_damaged_meta(blob[HEADER:], rng))
        decoded = decode_entry(blob, KEY)
        (tmp_path / f"{KEY}.dfk").write_bytes(blob)
        got, _ = KernelCache(disk_dir=tmp_path).get_or_build(KEY, lambda: kernel)
        assert got.program is None or got.program.instructions() is not None
        return "rejected" if decoded is None else "decoded"

    counts = fuzz("cache entries", case, ())
    assert counts["rejected"]
