"""Which input dims a folded constant was computed from.

A value's Deps is a frozenset of (value name, axis) pairs every element depends on, or, for small values, an
object array of such sets, one per element: Shape(x)[1] then depends on dim 1 of x only, so position ids built
from the sequence length do not stop the batch size from changing. Elementwise ops union per element (with
broadcasting); ops that only move elements (Gather, Slice, Concat, Reshape, ...) are traced by running their
reference kernel on element ids; anything else depends on everything its inputs depend on.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fusion.graph.ir import Node
from fusion.graph.ops import BINARY_BROADCAST, UNARY_ELEMWISE, OpType
from fusion.reference.kernels import evaluate_node

Deps = frozenset | np.ndarray
NONE: frozenset = frozenset()
ELEMENTWISE_LIMIT = 4096  # element-level tracking for values up to this size; larger ones collapse to one set
_MOVING = {  # op -> indices of the inputs whose elements it moves
    OpType.Identity: (0,),
    OpType.Reshape: (0,),
    OpType.Transpose: (0,),
    OpType.Slice: (0,),
    OpType.Split: (0,),
    OpType.Expand: (0,),
    OpType.Gather: (0,),
    OpType.Concat: None,  # all
}
_union2 = np.frompyfunc(lambda a, b: a | b, 2, 1)


def _objects(deps: Deps) -> np.ndarray:
    if isinstance(deps, np.ndarray):
        return deps
    out = np.empty((), dtype=object)
    out[()] = deps
    return out


def union(*deps: Deps) -> frozenset:
    """Everything the given Deps depend on, as one set."""
    out: set = set()
    for d in deps:
        if isinstance(d, np.ndarray):
            for s in d.reshape(-1):
                out |= s
        else:
            out |= d
    return frozenset(out)


def shape_deps(value: str, start: int, end: int) -> np.ndarray:
    """Deps of Shape(value)[start:end]: element i depends on dim start + i."""
    out = np.empty(end - start, dtype=object)
    for i in range(end - start):
        out[i] = frozenset({(value, start + i)})
    return out


def _elementwise(deps: Sequence[Deps]) -> np.ndarray:
    result = _objects(deps[0])
    for d in deps[1:]:
        result = _union2(result, _objects(d))
    return np.asarray(result, dtype=object)


def _moved(node: Node, args: tuple, deps: Sequence[Deps], traced: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """Per-output Deps of an op that moves elements, by running it on element ids."""
    table: list[frozenset] = []
    traced_args = list(args)
    for i in traced:
        size = int(np.prod(np.shape(args[i]), dtype=np.int64))
        traced_args[i] = np.arange(len(table), len(table) + size, dtype=np.int64).reshape(np.shape(args[i]))
        table.extend(np.broadcast_to(_objects(deps[i]), np.shape(args[i])).reshape(-1))
    ids = evaluate_node(node, tuple(traced_args), tuple(() for _ in node.outputs))
    lookup = np.empty(len(table), dtype=object)
    lookup[:] = table
    return tuple(lookup[np.asarray(i, dtype=np.int64)] for i in ids)


def propagate(node: Node, args: tuple, deps: Sequence[Deps], extra: frozenset) -> list[Deps]:
    """Deps of each output of `node` folded from `args` (whose Deps are `deps`), plus `extra` on every element
    (dims the node's attributes were computed from)."""
    count = len(node.outputs)
    if not extra and not any(union(d) for d in deps):
        return [NONE] * count
    small = all(np.size(a) <= ELEMENTWISE_LIMIT for a in args if a is not None)
    traced = _MOVING.get(node.op, ())
    if traced is None:
        traced = tuple(range(len(args)))
    if small and (node.op in UNARY_ELEMWISE or node.op in BINARY_BROADCAST or node.op == OpType.Where):
        outs: tuple = (_elementwise(deps),)
    elif small and traced and node.op in _MOVING:
        rest = union(*(d for i, d in enumerate(deps) if i not in traced))
        outs = tuple(_union2(o, _objects(rest)) if rest else o for o in _moved(node, args, deps, traced))
    else:
        outs = (union(*deps),) * count
    if not extra:
        return list(outs)
    return [_union2(o, _objects(extra)) if isinstance(o, np.ndarray) else o | extra for o in outs]
