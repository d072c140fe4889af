"""The kernel cache: an in-memory LRU bounded by entries and bytes, optionally backed by a shared on-disk cache.

Key: op signature of the group (structural hash of its subgraph) + shapes + dtypes + strategy/schedule + data
class + machine config hash (`kernel_key`). Thread-safe: concurrent lookups of one key compile it once (later
callers wait for the first one's result). Disk entries are written atomically (temp file + rename) as
magic | version | sha256(payload) | payload, the payload naming the entry's own key; a truncated, corrupted,
stale (other version or ISA) or misplaced (another key's entry) entry is detected, deleted and rebuilt, never
loaded.

The directory is shared and not trusted: only regular files (no symlinks, FIFOs or directories) of at most
MAX_ENTRY_BYTES are read, and nested JSON is bounded. A directory that cannot be written (read-only, full disk)
turns the cache memory-only, with one warning, and leaves no temp files behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import tempfile
import threading
import warnings
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
MAX_ENTRY_BYTES = 256 << 20  # larger disk entries are not read (a kernel's program and data are far smaller)
MAX_META_BYTES = 1 << 20  # an entry's JSON header


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
        self.stats = CacheStats()
        self.warning = ""  # why the disk cache was dropped (one warning was issued)
        self._entries: OrderedDict[str, Kernel] = OrderedDict()
        self._bytes = 0
        self._pending: dict[str, Future] = {}
        self._lock = threading.Lock()
        if self.disk is not None:
            try:
                self.disk.mkdir(parents=True, exist_ok=True)
            except OSError as err:
                self._drop_disk(err)

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
        self._unlink(key)
        return kernel is not None

    def replace(self, key: str, kernel: Kernel) -> None:
        """Put a kernel in place of a wrong one, in memory and on disk."""
        self.evict(key)
        self._store_disk(key, kernel)
        self.put(key, kernel)

    # --- disk ---------------------------------------------------------------------------------

    def _path(self, key: str) -> Path:
        assert self.disk is not None
        return self.disk / f"{key}.dfk"

    def _unlink(self, key: str) -> None:
        disk = self.disk
        if disk is None:
            return
        with contextlib.suppress(OSError):  # a directory or a read-only cache: it is not read again either way
            (disk / f"{key}.dfk").unlink(missing_ok=True)

    def _drop_disk(self, err: OSError) -> None:
        """Continue memory-only after the disk failed; warn once."""
        with self._lock:
            if self.disk is None:
                return
            self.warning = f"kernel cache {self.disk} is not usable ({err.strerror or err}); continuing in memory only"
            self.disk = None
        warnings.warn(self.warning, RuntimeWarning, stacklevel=3)

    def _store_disk(self, key: str, kernel: Kernel) -> None:
        disk = self.disk
        if disk is None:
            return
        payload = encode_kernel(key, kernel)
        blob = MAGIC + CACHE_VERSION.to_bytes(4, "little") + hashlib.sha256(payload).digest() + payload
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(dir=disk, prefix=".tmp-", suffix=".dfk")
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
            os.replace(tmp, disk / f"{key}.dfk")
        except OSError as err:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            if isinstance(err, IsADirectoryError):  # this entry's name is taken by a directory: skip just it
                return
            self._drop_disk(err)
            return
        with self._lock:
            self.stats.disk_writes += 1

    def _load_disk(self, key: str) -> Kernel | None:
        disk = self.disk
        if disk is None:
            return None
        try:
            blob = read_entry(disk / f"{key}.dfk")
        except FileNotFoundError:
            return None
        except OSError:
            blob = None  # not a regular file, too large, or unreadable
        kernel = None if blob is None else decode_entry(blob, key)
        with self._lock:
            if kernel is None:
                self.stats.disk_rejected += 1
            else:
                self.stats.disk_hits += 1
        if kernel is None:
            self._unlink(key)
        return kernel


def read_entry(path: Path) -> bytes | None:
    """The bytes of a regular file of at most MAX_ENTRY_BYTES, else None. The file is opened without following
    a symlink and without blocking (a FIFO), and checked on its open descriptor (no swap in between)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_ENTRY_BYTES:
            return None
        chunks, left = [], info.st_size + 1  # one byte more: a file grown since fstat is rejected
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        blob = b"".join(chunks)
        return blob if len(blob) <= info.st_size else None
    finally:
        os.close(fd)


def encode_kernel(key: str, kernel: Kernel) -> bytes:
    meta = {
        "key": key,
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


def decode_entry(blob: bytes, key: str) -> Kernel | None:
    """The kernel of the disk entry for `key`, or None when the entry is truncated, corrupted, stale or another
    key's."""
    if len(blob) < HEADER + 4 or blob[: len(MAGIC)] != MAGIC:
        return None
    if int.from_bytes(blob[4:8], "little") != CACHE_VERSION:
        return None
    payload = blob[HEADER:]
    if hashlib.sha256(payload).digest() != blob[8:HEADER]:
        return None
    try:
        size = int.from_bytes(payload[:4], "little")
        if size > MAX_META_BYTES:
            return None
        meta = json.loads(payload[4 : 4 + size])
        if not isinstance(meta, dict) or meta.get("key") != key or meta["isa"] != isa_fingerprint().hex():
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
    except (BinaryFormatError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None  # (json.JSONDecodeError is a ValueError; deep nesting a RecursionError)


def _group(g: dict) -> Group:
    return Group(tuple(g["nodes"]), g["strategy"], g["tile_m"], g["flatten"], g["panels"], g["resident_a"])
