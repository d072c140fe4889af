"""Concrete input shapes for a command-line run: `--input-shape NAME=D0,D1,...` and the arrays given with `--input`.

One definition for `dynfuse graph`, `fuse`, `run` and `compile`. An exported model often declares a symbolic batch
or sequence dim ("N"); the import needs a number for it. `--input-shape` sets an input's whole shape (it may also
change a fixed dim: a re-import at other shapes); an array given for an input with symbolic or unknown dims fills
them, and must agree with the dims the model fixes. Every mistake is one FusionError line naming the input.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx

from fusion.errors import FusionError
from fusion.graph.ir import Graph
from fusion.onnx_import.importer import import_model, load

MAX_ELEMENTS = 1 << 32  # no tensor larger than the accelerator's 32-bit byte address space can run anywhere

Dims = tuple[int | str, ...]  # a declared shape: ints fixed, strings symbolic ("?" for a dim with no name)


def add_input_shape_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--input-shape",
        action="append",
        default=[],
        metavar="NAME=D0,D1,...",
        help="concrete shape for a model input, e.g. one with a symbolic batch dim (repeatable)",
    )


def parse_input_shapes(specs: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """`NAME=D0,D1,...` arguments -> {name: shape}; each dim a positive integer, the whole within MAX_ELEMENTS."""
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        name, sep, text = spec.partition("=")
        try:
            if not sep or not name:
                raise ValueError
            dims = tuple(int(d) for d in text.split(","))
        except ValueError:
            raise FusionError(f"--input-shape expects NAME=D0,D1,..., got {spec!r}") from None
        if name in shapes:
            raise FusionError(f"--input-shape {name} is given twice")
        bad = [i for i, d in enumerate(dims) if d < 1]
        if bad:
            raise FusionError(f"--input-shape {spec}: dim {bad[0]} is {dims[bad[0]]}; every dim must be >= 1")
        if math.prod(dims) > MAX_ELEMENTS:
            raise FusionError(
                f"--input-shape {spec}: {math.prod(dims)} elements, more than {MAX_ELEMENTS} (the accelerator's "
                "32-bit address space)"
            )
        shapes[name] = dims
    return shapes


def declared_inputs(proto: onnx.ModelProto) -> dict[str, Dims | None]:
    """The model's graph inputs (initializers excluded) and their declared dims; None for an input with no shape."""
    initializers = {t.name for t in proto.graph.initializer}
    declared: dict[str, Dims | None] = {}
    for info in proto.graph.input:
        if info.name in initializers:
            continue
        tensor = info.type.tensor_type
        declared[info.name] = (
            tuple(d.dim_value if d.HasField("dim_value") else d.dim_param or "?" for d in tensor.shape.dim)
            if tensor.HasField("shape")
            else None
        )
    return declared


def resolve_input_shapes(
    proto: onnx.ModelProto,
    specs: Sequence[str],
    arrays: Mapping[str, np.ndarray],
    array_option: str = "--input",
) -> dict[str, tuple[int, ...]]:
    """The `input_shapes=` for importing `proto`: each `--input-shape`, and the array's shape for every input whose
    declared dims are symbolic or unknown. `array_option` names where the arrays came from, for the errors."""
    shapes = parse_input_shapes(specs)
    declared = declared_inputs(proto)
    unknown = sorted(set(shapes) - set(declared))
    if unknown:
        raise FusionError(
            f"--input-shape {unknown[0]}: the model has no input of that name (inputs: {', '.join(declared)})"
        )
    for name, dims in declared.items():
        array = arrays.get(name)
        if name in shapes:
            if dims is not None and len(dims) != len(shapes[name]):
                raise FusionError(
                    f"--input-shape {name}={_text(shapes[name])} has rank {len(shapes[name])}, but the model's "
                    f"input {name!r} has rank {len(dims)} {_shown(dims)}"
                )
            if array is not None and np.shape(array) != shapes[name]:
                raise FusionError(
                    f"--input-shape {name}={_text(shapes[name])} disagrees with {array_option} {name}: the array's "
                    f"shape is {_shown(np.shape(array))}"
                )
        elif dims is None or any(isinstance(d, str) for d in dims):
            if array is None:
                what = "no declared shape" if dims is None else f"symbolic dims {_shown(dims)}"
                raise FusionError(
                    f"the model's input {name!r} has {what}; pass --input-shape {name}=D0,D1,... "
                    f"or {array_option} {name}=FILE.npy"
                )
            shapes[name] = _array_shape(name, dims, np.shape(array), array_option)
    _check_symbols(declared, shapes)
    return shapes


def import_with_shapes(
    model: Path, specs: Sequence[str], arrays: Mapping[str, np.ndarray], array_option: str = "--input"
) -> Graph:
    """`model` imported at the shapes `resolve_input_shapes` gives (no clean-up passes)."""
    proto = load(model)
    return import_model(proto, input_shapes=resolve_input_shapes(proto, specs, arrays, array_option))


def _array_shape(name: str, dims: Dims | None, shape: tuple[int, ...], option: str) -> tuple[int, ...]:
    if dims is not None and len(dims) != len(shape):
        raise FusionError(
            f"{option} {name}: the array's shape {_shown(shape)} has rank {len(shape)}, but the model's input "
            f"{name!r} has rank {len(dims)} {_shown(dims)}"
        )
    for axis, (want, got) in enumerate(zip(dims or shape, shape, strict=True)):
        if isinstance(want, int) and want != got:
            raise FusionError(
                f"{option} {name}: the array's shape {_shown(shape)} has {got} at dim {axis}, but the model's "
                f"input {name!r} {_shown(dims or ())} fixes dim {axis} to {want}"
            )
    return tuple(int(d) for d in shape)


def _check_symbols(declared: Mapping[str, Dims | None], shapes: Mapping[str, tuple[int, ...]]) -> None:
    """A dim name shared by inputs (ONNX: one size, e.g. the batch "N" of `ids` and `mask`) gets one value."""
    bound: dict[str, tuple[int, str, int]] = {}  # symbol -> (size, input, axis) first seen
    for name, dims in declared.items():
        for axis, (dim, size) in enumerate(zip(dims or (), shapes.get(name, ()), strict=False)):
            if not isinstance(dim, str) or dim == "?":
                continue
            first = bound.setdefault(dim, (size, name, axis))
            if first[0] != size:
                raise FusionError(
                    f"input {name!r} has {dim} = {size} at dim {axis}, but input {first[1]!r} has {dim} = {first[0]} "
                    f"at dim {first[2]}; a dim name shared by inputs is one size"
                )


def _text(shape: tuple[int, ...]) -> str:
    return ",".join(map(str, shape))


def _shown(dims: Sequence[int | str]) -> str:
    return "(" + ", ".join(map(str, dims)) + ")"
