"""Shape and dtype inference: each operator's output types from its input types and attributes.

IR attribute conventions (the importer normalises ONNX into these; all axes are non-negative):
Softmax/Concat/Gather/Split `axis`; Split `sizes`; LayerNorm `axis`, `epsilon` (inputs X, scale[, bias]);
BatchNorm `epsilon` (inputs X, scale, bias, mean, var; channel axis 1); Transpose `perm`; Reshape `shape`
(concrete); Slice `axes`, `starts`, `ends`, `steps` (concrete, clamped: indices are range(start, end, step));
ReduceMean/ReduceSum/ReduceMax `axes`, `keepdims`; Gelu `approximate` ("none"/"tanh"); MatMul numpy matmul
semantics; Gemm A[M,K] @ B[K,N] (+ C broadcast to [M,N]); Conv/MaxPool/AveragePool `strides`, `pads` (all begins
then all ends), `dilations`, Conv `group`, pools `kernel`, `ceil_mode`, AveragePool `count_include_pad`;
Clip `min`, `max`; HardSigmoid `alpha`, `beta`; Cast `to` (a DataType value); Expand `shape` (the output shape);
ConstantOfShape `shape`, `value`, `dtype`; Range `start`, `limit`, `delta`, `dtype`; Shape `start`, `end`;
GatherElements `axis`; Pad `pads` (begins then ends), `mode`, `value`; Trilu `upper`, `k`.
Arithmetic, comparisons, Where, Concat, Slice, Gather, ReduceSum/Max and Cast also take integer and bool tensors
(the shape computations of exported transformers); the math functions need float32.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import numpy as np

from fusion.errors import ShapeError
from fusion.graph.ir import DataType, DimAssumption, Graph, Node, TensorType
from fusion.graph.ops import BINARY_BROADCAST, BOOL_RESULT, COMPARISONS_AND_LOGIC, UNARY_ELEMWISE, OpType

F32 = DataType.float32
BOOL = DataType.bool
INDEX_TYPES = (DataType.int32, DataType.int64)
# unary ops defined on integers too (shape arithmetic); the other unary ops need float32
_NUMERIC_UNARY = frozenset({OpType.Neg, OpType.Abs, OpType.Clip})
_ANY_DTYPE = frozenset({OpType.Identity, OpType.Cast})
Types = tuple[TensorType, ...]


def _fail(node: Node, message: str) -> ShapeError:
    return ShapeError(f"node {node.name!r} ({node.op.value}): {message}")


def _arity(node: Node, ins: Types, low: int, high: int) -> None:
    if not low <= len(ins) <= high:
        want = str(low) if low == high else f"{low}..{high}"
        raise _fail(node, f"takes {want} inputs, got {len(ins)}")


def _float(node: Node, ins: Types) -> None:
    bad = [str(t) for t in ins if t.dtype != F32]
    if bad:
        raise _fail(node, f"needs float32 inputs, got {', '.join(bad)}")


def broadcast_shapes(node: Node, *shapes: tuple[int, ...]) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError:
        raise _fail(node, f"shapes {' and '.join(map(str, shapes))} do not broadcast") from None


def _same_dtype(node: Node, ins: Types) -> DataType:
    if len({t.dtype for t in ins}) != 1:
        raise _fail(node, f"needs inputs of one dtype, got {', '.join(map(str, ins))}")
    return ins[0].dtype


def _unary(node: Node, ins: Types) -> Types:
    _arity(node, ins, 1, 1)
    x = ins[0]
    if node.op == OpType.Cast:
        return (TensorType(x.shape, DataType(node.attr("to"))),)
    if node.op == OpType.Not:
        if x.dtype != BOOL:
            raise _fail(node, f"needs a bool input, got {x}")
    elif node.op in _NUMERIC_UNARY:
        if x.dtype == BOOL:
            raise _fail(node, f"needs a numeric input, got {x}")
    elif node.op not in _ANY_DTYPE:
        _float(node, ins)
    return (x,)


def _binary(node: Node, ins: Types) -> Types:
    """Arithmetic on one numeric dtype (float32, or integers in shape computations); comparisons give bool."""
    _arity(node, ins, 2, 2)
    dtype = _same_dtype(node, ins)
    logic = node.op in (OpType.And, OpType.Or)
    if logic != (dtype == BOOL) or (node.op not in COMPARISONS_AND_LOGIC and dtype == DataType.int8):
        raise _fail(node, f"does not take dtype {dtype.value} ({', '.join(map(str, ins))})")
    out = BOOL if node.op in BOOL_RESULT else dtype
    return (TensorType(broadcast_shapes(node, ins[0].shape, ins[1].shape), out),)


def _where(node: Node, ins: Types) -> Types:
    _arity(node, ins, 3, 3)
    if ins[0].dtype != BOOL:
        raise _fail(node, f"condition must be bool, got {ins[0]}")
    dtype = _same_dtype(node, ins[1:])
    return (TensorType(broadcast_shapes(node, *(t.shape for t in ins)), dtype),)


def _expand(node: Node, ins: Types) -> Types:
    _arity(node, ins, 1, 1)
    shape = tuple(node.attr("shape"))
    if broadcast_shapes(node, ins[0].shape, shape) != shape:
        raise _fail(node, f"{ins[0]} does not broadcast to {shape}")
    return (TensorType(shape, ins[0].dtype),)


def _constant_of_shape(node: Node, ins: Types) -> Types:
    _arity(node, ins, 0, 0)
    return (TensorType(tuple(node.attr("shape")), DataType(node.attr("dtype"))),)


def range_length(start: float, limit: float, delta: float) -> int:
    """ONNX Range's element count: max(ceil((limit - start) / delta), 0)."""
    return max(int(np.ceil((limit - start) / delta)), 0)


def _range(node: Node, ins: Types) -> Types:
    _arity(node, ins, 0, 0)
    if node.attr("delta") == 0:
        raise _fail(node, "delta 0")
    length = range_length(node.attr("start"), node.attr("limit"), node.attr("delta"))
    return (TensorType((length,), DataType(node.attr("dtype"))),)


def _shape(node: Node, ins: Types) -> Types:
    _arity(node, ins, 1, 1)
    start, end = node.attr("start"), node.attr("end")
    if not 0 <= start <= end <= ins[0].rank:
        raise _fail(node, f"dims {start}:{end} out of range for {ins[0]}")
    return (TensorType((end - start,), DataType.int64),)


def _gather_elements(node: Node, ins: Types) -> Types:
    _arity(node, ins, 2, 2)
    data, idx = ins
    axis = _axis(node, data.rank)
    if idx.dtype not in INDEX_TYPES or idx.rank != data.rank:
        raise _fail(node, f"indices must be int32/int64 of rank {data.rank}, got {idx}")
    if any(i > d for k, (i, d) in enumerate(zip(idx.shape, data.shape, strict=True)) if k != axis):
        raise _fail(node, f"indices {idx} exceed data {data} off axis {axis}")
    return (TensorType(idx.shape, data.dtype),)


def _pad(node: Node, ins: Types) -> Types:
    _arity(node, ins, 1, 1)
    x, pads, mode = ins[0], node.attr("pads"), node.attr("mode")
    if len(pads) != 2 * x.rank or any(p < 0 for p in pads) or mode not in ("constant", "reflect", "edge"):
        raise _fail(node, f"pads {pads} (mode {mode!r}) do not fit {x}: one non-negative begin and end per axis")
    begin, end = pads[: x.rank], pads[x.rank :]
    if mode != "constant" and any(
        (b or e) and (d == 0 or (mode == "reflect" and max(b, e) >= d))
        for b, e, d in zip(begin, end, x.shape, strict=True)
    ):
        raise _fail(node, f"{mode} padding {pads} needs wider axes than {x}")
    return (TensorType(tuple(d + b + e for d, b, e in zip(x.shape, begin, end, strict=True)), x.dtype),)


def _trilu(node: Node, ins: Types) -> Types:
    _arity(node, ins, 1, 1)
    if ins[0].rank < 2:
        raise _fail(node, f"needs rank >= 2, got {ins[0]}")
    return (ins[0],)


def _batchnorm(node: Node, ins: Types) -> Types:
    _arity(node, ins, 5, 5)
    _float(node, ins)
    x = ins[0]
    if x.rank < 2 or any(t.shape != (x.shape[1],) for t in ins[1:]):
        raise _fail(node, f"needs X of rank >= 2 and four [C] parameters, got {[str(t) for t in ins]}")
    return (x,)


def _axis(node: Node, rank: int, key: str = "axis") -> int:
    axis = node.attr(key)
    if not 0 <= axis < max(rank, 1):
        raise _fail(node, f"{key} {axis} out of range for rank {rank}")
    return axis


def _softmax(node: Node, ins: Types) -> Types:
    _arity(node, ins, 1, 1)
    _float(node, ins)
    _axis(node, ins[0].rank)
    return (ins[0],)


def _layernorm(node: Node, ins: Types) -> Types:
    _arity(node, ins, 2, 3)
    _float(node, ins)
    x = ins[0]
    norm_shape = x.shape[_axis(node, x.rank) :]
    for t in ins[1:]:
        if broadcast_shapes(node, norm_shape, t.shape) != norm_shape:
            raise _fail(node, f"scale/bias {t} does not broadcast to normalised shape {norm_shape}")
    return (x,)


def _transpose(node: Node, ins: Types) -> Types:
    _arity(node, ins, 1, 1)
    perm = node.attr("perm")
    if sorted(perm) != list(range(ins[0].rank)):
        raise _fail(node, f"perm {perm} is not a permutation of {ins[0].rank} axes")
    return (TensorType(tuple(ins[0].shape[p] for p in perm), ins[0].dtype),)


def _reshape(node: Node, ins: Types) -> Types:
    _arity(node, ins, 1, 1)
    shape = tuple(node.attr("shape"))
    if int(np.prod(shape, dtype=np.int64)) != ins[0].size:
        raise _fail(node, f"cannot reshape {ins[0]} ({ins[0].size} elements) to {shape}")
    return (TensorType(shape, ins[0].dtype),)


def _concat(node: Node, ins: Types) -> Types:
    if not ins:
        raise _fail(node, "needs at least one input")
    first = ins[0]
    axis = _axis(node, first.rank)
    for t in ins[1:]:
        same = t.rank == first.rank and all(
            a == b for i, (a, b) in enumerate(zip(t.shape, first.shape, strict=True)) if i != axis
        )
        if not same or t.dtype != first.dtype:
            raise _fail(node, f"cannot concatenate {first} and {t} on axis {axis}")
    shape = list(first.shape)
    shape[axis] = sum(t.shape[axis] for t in ins)
    return (TensorType(tuple(shape), first.dtype),)


def _split(node: Node, ins: Types) -> Types:
    _arity(node, ins, 1, 1)
    axis = _axis(node, ins[0].rank)
    sizes = node.attr("sizes")
    if sum(sizes) != ins[0].shape[axis] or len(sizes) != len(node.outputs):
        raise _fail(node, f"sizes {sizes} do not split axis {axis} of {ins[0]} into {len(node.outputs)} outputs")
    shape = list(ins[0].shape)
    return tuple(TensorType((*shape[:axis], s, *shape[axis + 1 :]), ins[0].dtype) for s in sizes)


def _slice(node: Node, ins: Types) -> Types:
    _arity(node, ins, 1, 1)
    shape = list(ins[0].shape)
    for axis, start, end, step in zip(
        node.attr("axes"), node.attr("starts"), node.attr("ends"), node.attr("steps"), strict=True
    ):
        if not 0 <= axis < len(shape) or step == 0:
            raise _fail(node, f"bad slice axis {axis} / step {step} for {ins[0]}")
        picked = range(start, end, step)
        if picked and not (min(picked[0], picked[-1]) >= 0 and max(picked[0], picked[-1]) < shape[axis]):
            raise _fail(node, f"slice {start}:{end}:{step} of axis {axis} reaches outside {ins[0]}")
        shape[axis] = len(picked)
    return (TensorType(tuple(shape), ins[0].dtype),)


def _gather(node: Node, ins: Types) -> Types:
    _arity(node, ins, 2, 2)
    data, idx = ins
    if idx.dtype not in INDEX_TYPES:
        raise _fail(node, f"indices must be int32/int64, got {idx}")
    axis = _axis(node, data.rank)
    return (TensorType(data.shape[:axis] + idx.shape + data.shape[axis + 1 :], data.dtype),)


def _reduce(node: Node, ins: Types) -> Types:
    """ReduceMean needs float32; ReduceSum/ReduceMax keep an integer dtype (shape computations)."""
    _arity(node, ins, 1, 1)
    if node.op == OpType.ReduceMean:
        _float(node, ins)
    elif ins[0].dtype in (BOOL, DataType.int8):
        raise _fail(node, f"does not take dtype {ins[0].dtype.value} ({ins[0]})")
    axes = node.attr("axes")
    if any(not 0 <= a < ins[0].rank for a in axes):
        raise _fail(node, f"axes {axes} out of range for {ins[0]}")
    if node.op == OpType.ReduceMax and any(ins[0].shape[a] == 0 for a in axes):
        raise _fail(node, f"cannot take the maximum over an empty axis of {ins[0]}")
    keep = node.attr("keepdims")
    shape = tuple(1 if i in axes else d for i, d in enumerate(ins[0].shape) if keep or i not in axes)
    return (TensorType(shape, ins[0].dtype),)


def _matmul(node: Node, ins: Types) -> Types:
    _arity(node, ins, 2, 2)
    _float(node, ins)
    a, b = (t.shape for t in ins)
    if not a or not b:
        raise _fail(node, "MatMul inputs must have rank >= 1")
    a2 = (1, *a) if len(a) == 1 else a
    b2 = (*b, 1) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise _fail(node, f"inner dimensions differ: {a} @ {b}")
    rows = a2[-2:-1] if len(a) > 1 else ()
    cols = b2[-1:] if len(b) > 1 else ()
    return (TensorType((*broadcast_shapes(node, a2[:-2], b2[:-2]), *rows, *cols)),)


def _gemm(node: Node, ins: Types) -> Types:
    _arity(node, ins, 2, 3)
    _float(node, ins)
    a, b = ins[0].shape, ins[1].shape
    if len(a) != 2 or len(b) != 2 or a[1] != b[0]:
        raise _fail(node, f"needs A[M,K] and B[K,N], got {a} and {b}")
    out = (a[0], b[1])
    if len(ins) == 3 and broadcast_shapes(node, ins[2].shape, out) != out:
        raise _fail(node, f"bias {ins[2].shape} does not broadcast to {out}")
    return (TensorType(out),)


def window_output(size: int, kernel: int, stride: int, dilation: int, pad_begin: int, pad_end: int, ceil: bool) -> int:
    """Output length of a sliding window (ONNX rule: with ceil_mode a window may not start in the end padding)."""
    span = (kernel - 1) * dilation + 1
    room = size + pad_begin + pad_end - span
    if room < 0:
        return 0
    out = (-(-room // stride) if ceil else room // stride) + 1
    if ceil and (out - 1) * stride >= size + pad_begin:
        out -= 1
    return out


def spatial_output(node: Node, spatial: tuple[int, ...], kernel: tuple[int, ...]) -> tuple[int, ...]:
    n = len(spatial)
    strides, pads, dil = node.attr("strides"), node.attr("pads"), node.attr("dilations")
    if not len(kernel) == len(strides) == len(dil) == n or len(pads) != 2 * n:
        raise _fail(node, f"window attributes do not match {n} spatial axes")
    ceil = bool(node.attr("ceil_mode", 0))
    out = tuple(window_output(spatial[i], kernel[i], strides[i], dil[i], pads[i], pads[n + i], ceil) for i in range(n))
    if any(o <= 0 for o in out):
        raise _fail(node, f"window {kernel} does not fit input {spatial} with pads {pads}")
    return out


def _conv(node: Node, ins: Types) -> Types:
    _arity(node, ins, 2, 3)
    _float(node, ins)
    x, w = ins[0].shape, ins[1].shape
    group = node.attr("group")
    if len(x) < 3 or len(w) != len(x) or x[1] != w[1] * group or w[0] % group:
        raise _fail(node, f"X {x} and W {w} do not match for group {group}")
    if len(ins) == 3 and ins[2].shape != (w[0],):
        raise _fail(node, f"bias must be [{w[0]}], got {ins[2].shape}")
    return (TensorType((x[0], w[0], *spatial_output(node, x[2:], w[2:]))),)


def _pool(node: Node, ins: Types) -> Types:
    _arity(node, ins, 1, 1)
    _float(node, ins)
    x = ins[0].shape
    if len(x) < 3:
        raise _fail(node, f"needs N,C,spatial... input, got {x}")
    return (TensorType((*x[:2], *spatial_output(node, x[2:], node.attr("kernel")))),)


RULES: dict[OpType, Callable[[Node, Types], Types]] = {
    **{op: _unary for op in UNARY_ELEMWISE},
    **{op: _binary for op in BINARY_BROADCAST},
    OpType.BatchNorm: _batchnorm,
    OpType.Transpose: _transpose,
    OpType.Reshape: _reshape,
    OpType.Concat: _concat,
    OpType.Split: _split,
    OpType.Slice: _slice,
    OpType.Gather: _gather,
    OpType.GatherElements: _gather_elements,
    OpType.Where: _where,
    OpType.Expand: _expand,
    OpType.ConstantOfShape: _constant_of_shape,
    OpType.Range: _range,
    OpType.Shape: _shape,
    OpType.Pad: _pad,
    OpType.Trilu: _trilu,
    OpType.ReduceMean: _reduce,
    OpType.ReduceSum: _reduce,
    OpType.ReduceMax: _reduce,
    OpType.Softmax: _softmax,
    OpType.LayerNorm: _layernorm,
    OpType.MatMul: _matmul,
    OpType.Gemm: _gemm,
    OpType.Conv: _conv,
    OpType.MaxPool: _pool,
    OpType.AveragePool: _pool,
}

if set(RULES) != set(OpType):
    raise AssertionError(f"shape rules missing for {set(OpType) - set(RULES)}")


def infer(node: Node, ins: Types) -> Types:
    """Output types of `node` given its input types; raises ShapeError naming the node when they do not fit."""
    outs = RULES[node.op](node, ins)
    if len(outs) != len(node.outputs):
        raise _fail(node, f"produces {len(outs)} outputs but names {len(node.outputs)}")
    return outs


def with_input_shapes(graph: Graph, shapes: Mapping[str, tuple[int, ...]]) -> Graph:
    """The graph re-typed for other input shapes (e.g. another batch size): every node's output types inferred
    again in order; ShapeError naming the first node the new shapes do not fit (a Reshape to a fixed size, a
    weight of another width), or a node built at import from a dim the new shapes change (`graph.assumptions`:
    a folded shape computation, a resolved Reshape/Flatten target). A value an assumption names that no longer
    exists (removed by a pass) cannot be checked: then any change of input shapes is refused."""
    unknown = set(shapes) - set(graph.inputs)
    if unknown:
        raise ShapeError(f"graph {graph.name!r} has no input(s) {sorted(unknown)}")
    types = dict(graph.types)
    for name, shape in shapes.items():
        types[name] = TensorType(tuple(int(d) for d in shape), graph.types[name].dtype)
    changed = [v for v in graph.inputs if types[v] != graph.types[v]]
    facts = graph.assumptions if changed else ()
    _check_assumptions([f for f in facts if f.value in shapes], types, shapes)  # first: the clearest message
    for node in graph.nodes:
        outs = infer(node, tuple(types[v] for v in node.inputs))
        types.update(zip(node.outputs, outs, strict=True))
    _check_assumptions(facts, types, shapes)
    return Graph(graph.name, graph.inputs, graph.outputs, graph.nodes, types, dict(graph.constants), graph.assumptions)


def _check_assumptions(
    facts: Iterable[DimAssumption], types: Mapping[str, TensorType], shapes: Mapping[str, tuple[int, ...]]
) -> None:
    for fact in facts:
        now = types.get(fact.value)
        if now is None or now.rank <= fact.axis or now.shape[fact.axis] != fact.size:
            seen = "no longer exists" if now is None else f"is {now}"
            raise ShapeError(
                f"{fact}, but at input shapes {dict(shapes)} {fact.value!r} {seen}: the value was folded for the "
                "model's own shapes; import the model again with input_shapes= for these shapes"
            )


def verify(graph: Graph) -> None:
    """Re-infer every node and check the graph's recorded types agree (passes are tested with this)."""
    for node in graph.nodes:
        got = infer(node, graph.input_types(node))
        if got != graph.output_types(node):
            raise _fail(
                node, f"recorded types {[str(t) for t in graph.output_types(node)]} but infers {[str(t) for t in got]}"
            )
