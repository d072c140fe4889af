"""Kernel input tensors for a run: from `NAME=FILE.npy` arguments, or seeded random values of each declared dtype.

Shared by `dynfuse sim` and `dynfuse cosim`, so a newcomer can run any program without preparing .npy files.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from assembler.objfile import ObjectFile
from isa.enums import DType
from isa.errors import DynfuseError

I32_RANDOM_LIMIT = 1000  # random i32 inputs stay small: biases and residuals, not wrap-around tests


def parse_input_args(specs: Iterable[str]) -> dict[str, np.ndarray]:
    """`NAME=FILE.npy` command-line arguments -> {name: array}."""
    inputs = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise DynfuseError(f"--input expects NAME=FILE.npy, got {spec!r}")
        if name in inputs:
            raise DynfuseError(f"--input {name} is given twice")
        try:
            array = np.load(path, allow_pickle=False)
        except (OSError, ValueError, EOFError) as err:
            raise DynfuseError(f"--input {name}: {path} is not a readable .npy array ({err or 'empty file'})") from None
        if not isinstance(array, np.ndarray):
            array.close()
            raise DynfuseError(f"--input {name}: {path} is an .npz archive; pass one array as a .npy file")
        inputs[name] = array
    return inputs


def random_inputs(obj: ObjectFile, seed: int, given: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Every kernel `.input` not in `given` filled with seeded values; `given` ones are kept as they are.

    i8: the full range; i32: [-1000, 1000]; f32: standard normal. Same seed, same values.
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise DynfuseError(f"the random-input seed must be a non-negative integer, got {seed!r}")
    rng = np.random.default_rng(seed)
    inputs = dict(given or {})
    for decl in (t for k in obj.kernels for t in k.inputs):
        if decl.name in inputs:
            continue
        if decl.dtype is DType.f32:
            inputs[decl.name] = rng.standard_normal(decl.shape).astype(np.float32)
        elif decl.dtype is DType.i32:
            inputs[decl.name] = rng.integers(
                -I32_RANDOM_LIMIT, I32_RANDOM_LIMIT, decl.shape, endpoint=True, dtype=np.int32
            )
        else:
            info = np.iinfo(decl.dtype.numpy)
            inputs[decl.name] = rng.integers(info.min, info.max, decl.shape, endpoint=True, dtype=decl.dtype.numpy)
    return inputs
