"""Where zoo exports live and what names them: one directory per (model, size, seed, exporter version).

Exports are cached outside git ($DYNFUSE_ZOO_CACHE, default ~/.cache/dynfuse/zoo). The key hashes everything
an export depends on (the seed, the zoo's own sources, the versions of torch, torchvision, transformers, onnx,
onnxscript and onnxruntime), so a changed builder or a new torch gives a new directory instead of a stale file.
No torch import here: a cache hit costs a hash of three small files.
"""

from __future__ import annotations

import hashlib
import os
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCES = ("registry.py", "builders.py", "export.py")
PACKAGES = ("torch", "torchvision", "transformers", "onnx", "onnxscript", "onnxruntime")
MODEL, INPUT, OUTPUT = "model.onnx", "x.npy", "y.npy"
DEFAULT_SEED = 0


def cache_root() -> Path:
    return Path(os.environ.get("DYNFUSE_ZOO_CACHE") or Path.home() / ".cache" / "dynfuse" / "zoo")


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "absent"


def cache_key(name: str, size: str, seed: int) -> str:
    digest = hashlib.sha256(f"{name}\0{size}\0{seed}\0".encode())
    for source in SOURCES:
        digest.update((HERE / source).read_bytes())
    for package in PACKAGES:
        digest.update(f"{package}={_version(package)}\0".encode())
    return digest.hexdigest()[:16]


def entry_dir(name: str, size: str, seed: int, root: Path | None = None) -> Path:
    return (root or cache_root()) / f"{name}-{size}-s{seed}-{cache_key(name, size, seed)}"


def is_complete(directory: Path) -> bool:
    return all((directory / part).is_file() for part in (MODEL, INPUT, OUTPUT))
