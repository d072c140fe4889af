"""The model zoo: real architectures (torchvision, transformers) exported with seeded random weights.

The zoo is the project's measure: the tests run every model at its small input, `bench/bench_zoo.py` measures
them, and docs/zoo.md says how to add one. Use it as

    from bench.zoo import NAMES, zoo_model
    entry = zoo_model("resnet18")            # size="small" (tests) or "full" (bench only, where a model has it)
    entry.onnx_path, entry.input, entry.reference_output   # model.onnx, x (float32), onnxruntime's y for x

Each model has one float input `x` and one output `y`. Exports live outside git ($DYNFUSE_ZOO_CACHE, default
~/.cache/dynfuse/zoo) under a key of the seed, the zoo's sources and the exporters' versions; a miss runs
`python -m bench.zoo.export` in a child process (torch stays out of the caller), byte-identical for one seed;
`prefetch()` exports every missing model in one child.
`registry.SPECS` lists the models with their input shapes; `registry.spec(name).sizes` the sizes each has.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench.zoo.cache import DEFAULT_SEED, INPUT, MODEL, OUTPUT, cache_root, entry_dir, is_complete
from bench.zoo.registry import NAMES, SPECS, ZooSpec, spec

__all__ = [
    "DEFAULT_SEED",
    "NAMES",
    "SPECS",
    "ZooEntry",
    "ZooExportError",
    "ZooSpec",
    "cache_root",
    "prefetch",
    "spec",
    "zoo_model",
]

ROOT = Path(__file__).resolve().parents[2]
EXPORT_TIMEOUT_S = 900


class ZooExportError(RuntimeError):
    """The export process failed (torch, torchvision or transformers missing, or the exporter refused)."""


@dataclass(frozen=True, eq=False)
class ZooEntry:
    """One exported model at one size: its ONNX file, the input `x` and onnxruntime's output `y` for it."""

    name: str
    size: str
    onnx_path: Path
    input: np.ndarray = field(repr=False)
    reference_output: np.ndarray = field(repr=False)


def _export_in_child(names: list[str], size: str, seed: int) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))))
    command = [sys.executable, "-W", "ignore", "-m", "bench.zoo.export", *names, "--size", size, "--seed", str(seed)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=EXPORT_TIMEOUT_S)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise ZooExportError(f"exporting zoo model(s) {', '.join(names)} ({size}) failed:\n{tail}")


def prefetch(names: tuple[str, ...] = NAMES, size: str = "small", seed: int = DEFAULT_SEED) -> None:
    """Export every missing model of `names` that has `size`, in one child process (torch imported once)."""
    missing = [n for n in names if size in spec(n).sizes and not is_complete(entry_dir(n, size, seed))]
    if missing:
        _export_in_child(missing, size, seed)


def zoo_model(name: str, size: str = "small", seed: int = DEFAULT_SEED) -> ZooEntry:
    """The export of `name` at `size`, exported first if the cache does not have it."""
    spec(name).shape(size)  # a KeyError naming the zoo or the sizes, before any export
    directory = entry_dir(name, size, seed)
    if not is_complete(directory):
        _export_in_child([name], size, seed)
    return ZooEntry(
        name,
        size,
        directory / MODEL,
        np.load(directory / INPUT, allow_pickle=False),
        np.load(directory / OUTPUT, allow_pickle=False),
    )
