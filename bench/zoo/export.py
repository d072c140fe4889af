"""Export zoo models to ONNX with their input and onnxruntime's output (the export process: imports torch).

    python -m bench.zoo.export                      # every model at every size into the cache
    python -m bench.zoo.export resnet18 --size full
    python -m bench.zoo.export bert --out /tmp/bert  # one export into a chosen directory

Each export is `model.onnx` (input `x`, output `y`, opset 17, weights inside), `x.npy` (a seeded standard-normal
input) and `y.npy` (onnxruntime's output for it, single-threaded). The same seed gives the same bytes. The
legacy exporter (`dynamo=False`) handles every model but torchvision's ViT, whose fused attention needs
`dynamo=True` (TOOLCHAIN.md).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from bench.zoo.cache import DEFAULT_SEED, INPUT, MODEL, OUTPUT, entry_dir, is_complete
from bench.zoo.registry import NAMES, SIZES, spec

# an export under another key is removed only when no process has used it for this long: two environments with
# other torch/transformers versions (a CI venv beside the system's) keep their own keys, and one exporting must not
# delete the files the other is reading
STALE_AFTER_S = 24 * 3600


def sample_input(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def reference_output(model_path: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    (y,) = session.run(["y"], {"x": x})
    return np.ascontiguousarray(y, dtype=np.float32)


def export_onnx(name: str, shape: tuple[int, ...], seed: int, path: Path) -> None:
    import torch

    from bench.zoo.builders import build

    model = build(name, seed)
    example = (torch.zeros(shape, dtype=torch.float32),)
    common = {"input_names": ["x"], "output_names": ["y"], "opset_version": 17}
    with torch.no_grad():
        if spec(name).exporter == "dynamo":
            program = torch.onnx.export(model, example, dynamo=True, external_data=False, **common)
            program.save(str(path))
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # "legacy exporter": chosen, see above
                torch.onnx.export(model, example, str(path), dynamo=False, **common)


def export(name: str, size: str, seed: int, out: Path) -> Path:
    """Write the export of `name` at `size` into `out` (created atomically; an existing `out` is kept)."""
    shape = spec(name).shape(size)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        export_onnx(name, shape, seed, staging / MODEL)
        x = sample_input(shape, seed)
        np.save(staging / INPUT, x)
        np.save(staging / OUTPUT, reference_output(staging / MODEL, x))
        try:
            os.replace(staging, out)
        except OSError:  # another process finished the same export first: keep its (identical) files
            if not is_complete(out):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def prune_stale(name: str, size: str, seed: int, keep: Path, now: float | None = None) -> None:
    """Remove this model's exports under other keys (another zoo source, exporter or package version) that no
    process has used for `STALE_AFTER_S` (`ensure` marks an entry used)."""
    cutoff = (time.time() if now is None else now) - STALE_AFTER_S
    for stale in keep.parent.glob(f"{name}-{size}-s{seed}-*"):
        if stale != keep and stale.is_dir() and stale.stat().st_mtime < cutoff:
            shutil.rmtree(stale, ignore_errors=True)


def ensure(name: str, size: str, seed: int = DEFAULT_SEED, force: bool = False) -> Path:
    """The cache directory of the export, exporting first when missing (or when `force`); marked used."""
    directory = entry_dir(name, size, seed)
    if force:
        shutil.rmtree(directory, ignore_errors=True)
    if is_complete(directory):
        os.utime(directory)
    else:
        export(name, size, seed, directory)
        prune_stale(name, size, seed, directory)
    return directory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.zoo.export", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"models (default: all): {', '.join(NAMES)}")
    parser.add_argument("--size", choices=(*SIZES, "all"), default="all")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--force", action="store_true", help="export again even when the cache has it")
    parser.add_argument("--out", type=Path, help="export one model at one size into this directory")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(NAMES))
    if unknown:
        parser.error(f"unknown zoo model(s) {', '.join(unknown)} (the zoo: {', '.join(NAMES)})")
    names = args.names or list(NAMES)
    jobs = [(n, s) for n in names for s in spec(n).sizes if args.size in ("all", s)]
    if args.out is not None and len(jobs) != 1:
        parser.error("--out takes exactly one model at one size")
    for name, size in jobs:
        start = time.perf_counter()
        if args.out is not None:
            shutil.rmtree(args.out, ignore_errors=True)
            directory = export(name, size, args.seed, args.out)
        else:
            directory = ensure(name, size, args.seed, args.force)
        print(f"{name} {size}: {directory} ({time.perf_counter() - start:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
