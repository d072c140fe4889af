"""The kernel cache: an in-memory LRU bounded by entries and bytes, optionally backed by a shared on-disk cache.

Key: op signature of the group (structural hash of its subgraph) + shapes + dtypes + strategy/schedule + data
class + machine config hash (`kernel_key`). Thread-safe: concurrent lookups of one key compile it once (later
callers wait for the first one's result). Disk entries are written atomically (temp file + rename) as
magic | version | sha256(payload) | payload; a truncated, corrupted or stale (other version or ISA) entry is
detected, deleted and rebuilt, never loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from pathlib import Path

from assembler.binary import BinaryFormatError, from_bytes, isa_fingerprint, to_bytes
from fusion.engine.kernel import Guard, Kernel
from fusion.engine.plan import Group

MAGIC = b"DFKC"
CACHE_VERSION = 1
HEADER = len(MAGIC) + 4 + 32


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    compiles: int = 0
    disk_hits: int = 0
    disk_writes: int = 0
    disk_rejected: int = 0  # corrupted, truncated or stale entries discarded

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def kernel_key(signature: str, group: Group, guard: Guard) -> str:
    """sha256 of everything a kernel is specialised for."""
    return schedule_key(signature, group.schedule, guard)


def schedule_key(signature: str, schedule: str, guard: Guard) -> str:
    """`kernel_key` by schedule string (a pipelined pair's schedule names both groups' schedules)."""
    parts = (signature, guard.shapes, guard.dtypes, schedule, guard.sparsity, guard.config_hash, CACHE_VERSION)
    return hashlib.sha256(repr(parts).encode()).hexdigest()


class KernelCache:
    def __init__(self, max_entries: int = 256, max_bytes: int = 64 << 20, disk_dir: str | Path | None = None) -> None:
        if max_entries < 1 or max_bytes < 1:
            raise ValueError("cache bounds must be positive")
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self.disk = Path(disk_dir) if disk_dir is not None else None
        if self.disk is not None:
            self.disk.mkdir(parents=True, exist_ok=True)
        self.stats = CacheStats()
        self._entries: OrderedDict[str, Kernel] = OrderedDict()
        self._bytes = 0
        self._pending: dict[str, Future] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __contains__(self, key: str) -> bool:
        with self._lock:
            return key in self._entries

    def get_or_build(self, key: str, build: Callable[[], Kernel]) -> tuple[Kernel, bool]:
        """(kernel, hit). A miss builds once even when several threads ask at the same time."""
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                self.stats.hits += 1
                return self._entries[key], True
            pending = self._pending.get(key)
            owner = pending is None
            if owner:
                pending = Future()
                self._pending[key] = pending
                self.stats.misses += 1
        if not owner:
            return pending.result(), True
        try:
            kernel = self._load_disk(key)
            if kernel is None:
                kernel = build()
                with self._lock:
                    self.stats.compiles += 1
                self._store_disk(key, kernel)
            self.put(key, kernel)
            pending.set_result(kernel)
            return kernel, False
        except BaseException as err:
            pending.set_exception(err)
            raise
        finally:
            with self._lock:
                self._pending.pop(key, None)

    def put(self, key: str, kernel: Kernel) -> None:
        with self._lock:
            if key in self._entries:
                self._bytes -= self._entries.pop(key).nbytes
            self._entries[key] = kernel
            self._bytes += kernel.nbytes
            while len(self._entries) > self.max_entries or (self._bytes > self.max_bytes and len(self._entries) > 1):
                _, old = self._entries.popitem(last=False)
                self._bytes -= old.nbytes
                self.stats.evictions += 1

    def evict(self, key: str) -> bool:
        """Drop a kernel from memory and disk (e.g. after it failed validation)."""
        with self._lock:
            kernel = self._entries.pop(key, None)
            if kernel is not None:
                self._bytes -= kernel.nbytes
                self.stats.evictions += 1
        if self.disk is not None:
            self._path(key).unlink(missing_ok=True)
        return kernel is not None

    # --- disk ---------------------------------------------------------------------------------

    def _path(self, key: str) -> Path:
        assert self.disk is not None
        return self.disk / f"{key}.dfk"

    def _store_disk(self, key: str, kernel: Kernel) -> None:
        if self.disk is None:
            return
        payload = encode_kernel(kernel)
        blob = MAGIC + CACHE_VERSION.to_bytes(4, "little") + hashlib.sha256(payload).digest() + payload
        fd, tmp = tempfile.mkstemp(dir=self.disk, prefix=".tmp-", suffix=".dfk")
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.replace(tmp, self._path(key))
        with self._lock:
            self.stats.disk_writes += 1

    def _load_disk(self, key: str) -> Kernel | None:
        if self.disk is None:
            return None
        path = self._path(key)
        try:
            blob = path.read_bytes()
        except FileNotFoundError:
            return None
        kernel = decode_entry(blob)
        with self._lock:
            if kernel is None:
                self.stats.disk_rejected += 1
            else:
                self.stats.disk_hits += 1
        if kernel is None:
            path.unlink(missing_ok=True)
        return kernel


def encode_kernel(kernel: Kernel) -> bytes:
    meta = {
        "group": asdict(kernel.group),
        "pipelined_with": None if kernel.pipelined_with is None else asdict(kernel.pipelined_with),
        "inputs": list(kernel.inputs),
        "outputs": list(kernel.outputs),
        "guard": asdict(kernel.guard),
        "symbols": kernel.symbols,
        "compile_seconds": kernel.compile_seconds,
        "isa": isa_fingerprint().hex(),
    }
    head = json.dumps(meta).encode()
    body = to_bytes(kernel.program) if kernel.program is not None else b""
    return len(head).to_bytes(4, "little") + head + body


def decode_entry(blob: bytes) -> Kernel | None:
    """The kernel of a disk entry, or None when the entry is truncated, corrupted or stale."""
    if len(blob) < HEADER + 4 or blob[: len(MAGIC)] != MAGIC:
        return None
    if int.from_bytes(blob[4:8], "little") != CACHE_VERSION:
        return None
    payload = blob[HEADER:]
    if hashlib.sha256(payload).digest() != blob[8:HEADER]:
        return None
    try:
        size = int.from_bytes(payload[:4], "little")
        meta = json.loads(payload[4 : 4 + size])
        if meta["isa"] != isa_fingerprint().hex():
            return None
        body = payload[4 + size :]
        program = from_bytes(body, "<kernel cache>") if body else None
        gd, pair = meta["guard"], meta.get("pipelined_with")
        guard = Guard(
            tuple((k, tuple(v)) for k, v in gd["shapes"]),
            tuple((k, v) for k, v in gd["dtypes"]),
            gd["sparsity"],
            gd["config_hash"],
        )
        return Kernel(
            _group(meta["group"]),
            program,
            tuple(meta["inputs"]),
            tuple(meta["outputs"]),
            guard,
            meta["compile_seconds"],
            meta["symbols"],
            None if pair is None else _group(pair),
        )
    except (BinaryFormatError, ValueError, KeyError, TypeError, json.JSONDecodeError):
        return None


def _group(g: dict) -> Group:
    return Group(tuple(g["nodes"]), g["strategy"], g["tile_m"], g["flatten"], g["panels"], g["resident_a"])
