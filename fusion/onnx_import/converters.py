"""One converter per supported ONNX operator, mapping it onto IR nodes with normalised attributes.

Mapping choices (documented here once):
- Flatten, Squeeze, Unsqueeze and Reshape become IR Reshape with the concrete target shape.
- GlobalAveragePool becomes ReduceMean over the spatial axes (keepdims).
- Gemm becomes IR Gemm(A, B[, C]) with A [M,K], B [K,N]: transA/transB become Transpose nodes and alpha/beta
  become Mul by a scalar constant; constant folding then turns transposed weights back into constants.
- Conv stays one IR Conv node (1-D, 2-D or N-D, any group); its reference implementation is im2col + GEMM, and
  the lowering does the same. auto_pad is resolved into explicit pads for the concrete input shape.
- BatchNormalization (inference form only) becomes IR BatchNorm; the batchnorm pass folds it into the preceding
  Conv/Gemm/MatMul or rewrites it as Mul + Add.
- Clip's min/max, Pad's pads and value, Expand's shape, Trilu's k, ConstantOfShape's shape and Range's operands
  become attributes; Pow's constant exponent takes the base's dtype. SiLU stays x * Sigmoid(x).
- Operands that determine shapes (Reshape shape, Slice starts/ends/axes/steps, Squeeze/Unsqueeze axes, Split sizes,
  Reduce* axes, and the operands above) must be constants: initializers, Constants, bound inputs, or values the
  import folds from those and input shapes (Shape).
Attributes are read through `attributes.Attrs`, which checks their ONNX type and range.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper

from fusion.errors import GraphError
from fusion.graph.ir import MAX_RANK, DataType
from fusion.graph.ops import OpType
from fusion.onnx_import.attributes import Attrs
from fusion.onnx_import.context import ImportContext, Malformed, Unsupported, norm_axis

Converter = Callable[[ImportContext, onnx.NodeProto, Attrs, str], None]
WINDOW_LIMIT = 1 << 16  # strides, dilations, kernel sizes and pads beyond this are no real model


def _ints(array: np.ndarray | None) -> tuple[int, ...] | None:
    return None if array is None else tuple(int(v) for v in np.asarray(array).reshape(-1))


def _scalar(array: np.ndarray, what: str) -> float | int:
    if np.size(array) != 1:
        raise Unsupported(f"{what} must be a scalar, got shape {list(np.shape(array))}")
    return np.asarray(array).reshape(-1)[0].item()


def _single_output(n: onnx.NodeProto) -> None:
    if len([o for o in n.output if o]) > 1:
        raise Unsupported(f"only the first output is supported, node has {list(n.output)}")


def _input(n: onnx.NodeProto, index: int, what: str) -> str:
    if index >= len(n.input) or not n.input[index]:
        raise Malformed(f"required input {index} ({what}) is missing")
    return n.input[index]


def _onnx_dtype(code: int, what: str) -> DataType:
    try:
        return DataType.of(helper.tensor_dtype_to_np_dtype(code))
    except (GraphError, KeyError, TypeError, ValueError):
        name = onnx.TensorProto.DataType.Name(code) if code in onnx.TensorProto.DataType.values() else str(code)
        raise Unsupported(f"{what}: dtype {name} is not supported (supported: {[d.value for d in DataType]})") from None


def _same(op: OpType) -> Converter:
    def convert(cx: ImportContext, n: onnx.NodeProto, a: Attrs, base: str) -> None:
        cx.emit(base, op, list(n.input), [n.output[0]])

    return convert


def _gelu(cx: ImportContext, n: onnx.NodeProto, a: Attrs, base: str) -> None:
    approximate = a.string("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise Malformed(f"attribute 'approximate' = {approximate!r} is not 'none' or 'tanh'")
    cx.emit(base, OpType.Gelu, [n.input[0]], [n.output[0]], approximate=approximate)


def _pow(cx: ImportContext, n: onnx.NodeProto, a: Attrs, base: str) -> None:
    x, y = _input(n, 0, "X"), _input(n, 1, "Y")
    want = cx.type_of(x).dtype
    if y in cx.constants and cx.type_of(y).dtype != want:
        exponent = cx.const(y, "Pow exponent")
        y = cx.add_constant(cx.fresh(f"{base}/exponent"), exponent.astype(want.numpy), cx.deps.get(y, frozenset()))
    cx.emit(base, OpType.Pow, [x, y], [n.output[0]])


def _clip(cx: ImportContext, n: onnx.NodeProto, a: Attrs, base: str) -> None:
    low = cx.optional_const(n, 1, "Clip min")
    high = cx.optional_const(n, 2, "Clip max")
    bounds = {
        "min": -np.inf if low is None else float(_scalar(low, "Clip min")),
        "max": np.inf if high is None else float(_scalar(high, "Clip max")),
    }
    cx.emit(base, OpType.Clip, [n.input[0]], [n.output[0]], **bounds)


def _hard_sigmoid(cx: ImportContext, n: onnx.NodeProto, a: Attrs, base: str) -> None:
    cx.emit(
        base, OpType.HardSigmoid, [n.input[0]], [n.output[0]], alpha=a.float("alpha", 0.2), beta=a.float("beta", 0.5)
    )


def _cast(cx: ImportContext, n: onnx.NodeProto, a: Attrs, base: str) -> None:
    to = _onnx_dtype(a.int("to"), "Cast target")
    cx.emit(base, OpType.Cast, [n.input[0]], [n.output[0]], to=to.value)


def _softmax(cx: ImportContext, n: onnx.NodeProto, a: Attrs, base: str) -> None:
    axis = norm_axis(a.int("axis", -1), cx.rank(n.input[0]))
    cx.emit(base, OpType.Softmax, [n.input[0]], [n.output[0]], axis=axis)


def _layernorm(cx: ImportContext, n: onnx.NodeProto, a: Attrs, base: str) -> None:
    """LayerNorm; the optional Mean/InvStdDev outputs are built from ReduceMean, Sub, Mul, Add, Sqrt, Div."""
    if a.int("stash_type", 1) != 1:
        raise Unsupported(f"attribute stash_type={a.int('stash_type')} is not supported (only 1)")
    x = n.input[0]
    rank = cx.rank(x)
    axis = norm_axis(a.int("axis", -1), rank)
    eps = a.float("epsilon", 1e-5)
    cx.emit(base, OpType.LayerNorm, [v for v in n.input if v], [n.output[0]], axis=axis, epsilon=eps)
    want_mean = len(n.output) > 1 and n.output[1]
    want_inv = len(n.output) > 2 and n.output[2]
    if not (want_mean or want_inv):
        return
    axes = tuple(range(axis, rank))
    mean = cx.emit(f"{base}/mean", OpType.ReduceMean, [x], [n.output[1]] if want_mean else None, axes=axes, keepdims=1)
    if want_inv:
        centred = cx.emit(f"{base}/centre", OpType.Sub, [x, mean])
        square = cx.emit(f"{base}/square", OpType.Mul, [centred, centred])
        var = cx.emit(f"{base}/var", OpType.ReduceMean, [square], axes=axes, keepdims=1)
        eps_c = cx.add_constant(cx.fresh(f"{base}/epsilon"), np.float32(eps))
        std = cx.emit(f"{base}/std", OpType.Sqrt, [cx.emit(f"{base}/var_eps", OpType.Add, [var, eps_c])])
        one = cx.add_constant(cx.fresh(f"{base}/one"), np.float32(1.0))
        cx.emit(f"{base}/inv_std", OpType.Div, [one, std], [n.output[2]])


def _batchnorm(cx: ImportContext, n: onnx.NodeProto, a: Attrs, base: str) -> None:
    _single_output(n)
    if a.int("training_mode", 0) != 0:
        raise Unsupported("attribute training_mode=1 is not supported (only inference, 0)")
    a.float("momentum", 0.9)
    cx.emit(base, OpType.BatchNorm, list(n.input), [n.output[0]], epsilon=a.float("epsilon", 1e-5))


def _reshape_to(cx: ImportContext, n: onnx.NodeProto, base: str, shape: tuple[int, ...]) -> None:
    cx.emit(base, OpType.Reshape, [n.input[0]], [n.output[0]], shape=shape)


def _reshape(cx: ImportContext, n: onnx.NodeProto, a: Attrs, base: str) -> None:
    target = list(_ints(cx.const(_input(n, 1, "shape"), "Reshape shape")))
    copies = not a.int("allowzero", 0) and 0 in target
    src = cx.dims(n.input[0])
    if -1 in target:  # the inferred dim is computed from every dim of the input
        cx.shape(n.input[0])
    elif copies:  # a 0 copies the input's dim at its position
        cx.shape(n.input[0], tuple(i for i, d in enumerate(target) if d == 0 and i < len(src)))
    if copies:
        target = [src[i] if d == 0 and i < len(src) else d for i, d in enumerate(target)]
    if target.count(-1) > 1 or any(d < -1 for d in target):
        raise Malformed(f"Reshape shape {target} has more than one -1 or a negative dim")
    if -1 in target:
        known = int(np.prod([d for d in target if d != -1], dtype=np.int64))
        total = int(np.prod(src, dtype=np.int64))
        if known == 0 or total % known:
            raise Unsupported(f"cannot reshape {src} to {target}")
        target[target.index(-1)] = total // known
    _reshape_to(cx, n, base, tuple(target))


def _flatten(cx: ImportContext, n: onnx.NodeProto, a: Attrs, base: str) -> None:
    src = cx.shape(n.input[0])
    axis = a.int("axis", 1)
    axis = axis + len(src) if axis < 0 else axis
    if not 0 <= axis <= len(src):
        raise Malformed(f"Flatten axis {a.int('axis')} out of range for rank {len(src)}")
    _reshape_to(cx, n, base, (int(np.prod(src[:axis], dtype=np.int64)), int(np.prod(src[axis:], dtype=np.int64))))


def _axes_operand(cx: ImportContext, n: onnx.NodeProto, a: Attrs, what: str) -> tuple[int, ...] | None:
    """Axes from the opset-13+ input, or the older attribute."""
    axes = _ints(cx.optional_const(n, 1, what))
    return axes if axes is not None else a.ints("axes", None)


def _squeeze(cx: ImportContext, n: onnx.NodeProto, a: Attrs, base: str) -> None:
    src = cx.shape(n.input[0])
    axes = _axes_operand(cx, n, a, "Squeeze axes")
    axes = {norm_axis(x, len(src)) for x in axes} if axes is not None else {i for i, d in enumerate(src) if d == 1}
    if any(src[x] != 1 for x in axes):
        raise Unsupported(f"cannot squeeze axes {sorted(axes)} of shape {src}")
    _reshape_to(cx, n, base, tuple(d for i, d in enumerate(src) if i not in axes))


def _unsqueeze(cx: ImportContext, n: onnx.NodeProto, a: Attrs, base: str) -> None:
    src = cx.shape(n.input[0])
    given = _axes_operand(cx, n, a, "Unsqueeze axes") or ()
    rank = len(src) + len(given)
    axes = {norm_axis(x, rank) for x in given}
    if len(axes) != len(given):
        raise Malformed(f"Unsqueeze axes {list(given)} repeat an axis")
    rest = iter(src)
    _reshape_to(cx, n, base, tuple(1 if i in axes else next(rest) for i in range(rank)))


def _transpose(cx: ImportContext, n: onnx.NodeProto, a: Attrs, base: str) -> None:
    rank = cx.rank(n.input[0])
    perm = a.ints("perm", tuple(range(rank - 1, -1, -1)))
    cx.emit(base, OpType.Transpose, [n.input[0]], [n.output[0]], perm=perm)


def _concat(cx: ImportContext, n: onnx.NodeProto, a: Attrs, base: str) -> None:
    inputs = [v for v in n.input if v]
    axis = norm_axis(a.int("axis"), cx.rank(_input(n, 0, "inputs")))
    cx.emit(base, OpType.Concat, inputs, [n.output[0]], axis=axis)


def _split(cx: ImportContext, n: onnx.NodeProto, a: Attrs, base: str) -> None:
    rank = cx.rank(n.input[0])
    axis = norm_axis(a.int("axis", 0), rank)
    sizes = _ints(cx.optional_const(n, 1, "Split sizes"))
    if sizes is None:
        sizes = a.ints("split", None, low=0)
    if sizes is None:
        dim = cx.shape(n.input[0], (axis,))[axis]
        parts = a.int("num_outputs", len(n.output), low=1, high=max(dim, 1))
        chunk = -(-dim // parts)
        sizes = tuple(min(chunk, dim - i * chunk) for i in range(parts))
    cx.emit(base, OpType.Split, [n.input[0]], list(n.output), axis=axis, sizes=sizes)


def _slice(cx: ImportContext, n: onnx.NodeProto, a: Attrs, base: str) -> None:
    starts = _ints(cx.const(_input(n, 1, "starts"), "Slice starts"))
    ends = _ints(cx.const(_input(n, 2, "ends"), "Slice ends"))
    axes = _ints(cx.optional_const(n, 3, "Slice axes")) or tuple(range(len(starts)))
    steps = _ints(cx.optional_const(n, 4, "Slice steps")) or (1,) * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise Malformed(f"Slice starts/ends/axes/steps differ in length: {starts}, {ends}, {axes}, {steps}")
    rank = cx.rank(n.input[0])
    norm = []
    for axis, start, end, step in zip(axes, starts, ends, steps, strict=True):
        axis = norm_axis(axis, rank)
        if step == 0:
            raise Malformed("Slice step 0")
        dim = cx.dims(n.input[0])[axis]
        if start < 0 or end < 0 or max(start, end) >= dim or step < 0:  # the result depends on the dim
            cx.shape(n.input[0], (axis,))
        start = start + dim if start < 0 else start
        end = end + dim if end < 0 else end
        if step > 0:
            start, end = min(max(start, 0), dim), min(max(end, 0), dim)
        else:
            start, end = min(max(start, -1), dim - 1), min(max(end, -1), dim - 1)
        norm.append((axis, start, end, step))
    cx.emit(
        base,
        OpType.Slice,
        [n.input[0]],
        [n.output[0]],
        axes=tuple(x[0] for x in norm),
        starts=tuple(x[1] for x in norm),
        ends=tuple(x[2] for x in norm),
        steps=tuple(x[3] for x in norm),
    )


def _gather(cx: ImportContext, n: onnx.NodeProto, a: Attrs, base: str) -> None:
    data, idx = _input(n, 0, "data"), _input(n, 1, "indices")
    axis = norm_axis(a.int("axis", 0), cx.rank(data))
    _check_indices(cx, idx, cx.dims(data)[axis], "Gather")
    cx.emit(base, OpType.Gather, [data, idx], [n.output[0]], axis=axis)


def _gather_elements(cx: ImportContext, n: onnx.NodeProto, a: Attrs, base: str) -> None:
    data, idx = _input(n, 0, "data"), _input(n, 1, "indices")
    axis = norm_axis(a.int("axis", 0), cx.rank(data))
    _check_indices(cx, idx, cx.dims(data)[axis], "GatherElements")
    cx.emit(base, OpType.GatherElements, [data, idx], [n.output[0]], axis=axis)


def _check_indices(cx: ImportContext, idx: str, dim: int, op: str) -> None:
    """Constant indices must lie in [-dim, dim) (run-time ones are the caller's contract, as in ONNX)."""
    if idx in cx.constants:
        values = cx.constants[idx]
        if values.dtype.kind in "iu" and values.size and (values.min() < -dim or values.max() >= dim):
            raise Malformed(f"{op} indices range over [{values.min()}, {values.max()}], the axis has {dim}")


def _reduce(op: OpType) -> Converter:
    def convert(cx: ImportContext, n: onnx.NodeProto, a: Attrs, base: str) -> None:
        rank = cx.rank(n.input[0])
        axes = _axes_operand(cx, n, a, f"{op.value} axes")
        if not axes:
            if a.int("noop_with_empty_axes", 0):
                cx.emit(base, OpType.Identity, [n.input[0]], [n.output[0]])
                return
            axes = tuple(range(rank))
        axes = tuple(sorted({norm_axis(x, rank) for x in axes}))
        cx.emit(base, op, [n.input[0]], [n.output[0]], axes=axes, keepdims=a.int("keepdims", 1, low=0, high=1))

    return convert


def _gemm(cx: ImportContext, n: onnx.NodeProto, a: Attrs, base: str) -> None:
    lhs, rhs = _input(n, 0, "A"), _input(n, 1, "B")
    trans_a, trans_b = a.int("transA", 0, low=0, high=1), a.int("transB", 0, low=0, high=1)
    alpha, beta = a.float("alpha", 1.0), a.float("beta", 1.0)
    if trans_a:
        lhs = cx.emit(f"{base}/transA", OpType.Transpose, [lhs], perm=(1, 0))
    if trans_b:
        rhs = cx.emit(f"{base}/transB", OpType.Transpose, [rhs], perm=(1, 0))
    if alpha != 1.0:
        scale = cx.add_constant(cx.fresh(f"{base}/alpha"), np.float32(alpha))
        lhs = cx.emit(f"{base}/scaleA", OpType.Mul, [lhs, scale])
    inputs = [lhs, rhs]
    if len(n.input) > 2 and n.input[2]:
        bias = n.input[2]
        if beta != 1.0:
            scale = cx.add_constant(cx.fresh(f"{base}/beta"), np.float32(beta))
            bias = cx.emit(f"{base}/scaleC", OpType.Mul, [bias, scale])
        inputs.append(bias)
    cx.emit(base, OpType.Gemm, inputs, [n.output[0]])


def _window_attrs(cx: ImportContext, n: onnx.NodeProto, a: Attrs, kernel: tuple[int, ...]) -> dict:
    """strides/dilations/pads for the concrete input, with auto_pad resolved to explicit pads."""
    x = n.input[0]
    s = cx.rank(x) - 2
    if s < 1:
        raise Unsupported(f"needs an N,C,spatial... input, got {cx.type_of(x)}")
    strides = a.ints("strides", (1,) * s, low=1, high=WINDOW_LIMIT)
    dilations = a.ints("dilations", (1,) * s, low=1, high=WINDOW_LIMIT)
    if len(kernel) != s or len(strides) != s or len(dilations) != s:
        raise Malformed(f"kernel {kernel}, strides {strides}, dilations {dilations} do not match {s} spatial axes")
    if any(not 1 <= k <= WINDOW_LIMIT for k in kernel):
        raise Malformed(f"kernel_shape {kernel} must be positive")
    mode = a.string("auto_pad", "NOTSET")
    if mode in ("NOTSET", ""):
        pads = a.ints("pads", (0,) * (2 * s), low=0, high=WINDOW_LIMIT)
        if len(pads) != 2 * s:
            raise Malformed(f"pads {pads} must hold {2 * s} values (begins then ends)")
    elif mode == "VALID":
        pads = (0,) * (2 * s)
    elif mode in ("SAME_UPPER", "SAME_LOWER"):
        spatial = cx.shape(x, tuple(range(2, 2 + s)))[2:]
        total = [
            max(0, (-(-spatial[i] // strides[i]) - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - spatial[i])
            for i in range(s)
        ]
        small = [t // 2 for t in total]
        big = [t - t // 2 for t in total]
        pads = tuple(small + big) if mode == "SAME_UPPER" else tuple(big + small)
    else:
        raise Malformed(f"attribute 'auto_pad' = {mode!r} is not NOTSET, VALID, SAME_UPPER or SAME_LOWER")
    return dict(strides=strides, dilations=dilations, pads=pads)


def _conv(cx: ImportContext, n: onnx.NodeProto, a: Attrs, base: str) -> None:
    x, w = _input(n, 0, "X"), _input(n, 1, "W")
    kernel = a.ints("kernel_shape", cx.dims(w)[2:])
    if kernel != cx.dims(w)[2:]:
        raise Malformed(f"kernel_shape {kernel} differs from the weight's {cx.dims(w)[2:]}")
    group = a.int("group", 1, low=1, high=max(cx.dims(x)[1:2] or (1,)))
    inputs = [v for v in n.input if v]
    cx.emit(base, OpType.Conv, inputs, [n.output[0]], group=group, **_window_attrs(cx, n, a, kernel))


def _pool(op: OpType) -> Converter:
    def convert(cx: ImportContext, n: onnx.NodeProto, a: Attrs, base: str) -> None:
        _single_output(n)
        kernel = a.ints("kernel_shape")
        attrs = _window_attrs(cx, n, a, kernel)
        if a.int("storage_order", 0) != 0:
            raise Unsupported("attribute storage_order=1 is not supported")
        extra = {"count_include_pad": a.int("count_include_pad", 0, low=0, high=1)} if op == OpType.AveragePool else {}
        ceil = a.int("ceil_mode", 0, low=0, high=1)
        cx.emit(base, op, [n.input[0]], [n.output[0]], kernel=kernel, ceil_mode=ceil, **extra, **attrs)

    return convert


def _global_average_pool(cx: ImportContext, n: onnx.NodeProto, a: Attrs, base: str) -> None:
    rank = cx.rank(n.input[0])
    if rank < 3:
        raise Unsupported(f"needs an N,C,spatial... input, got {cx.type_of(n.input[0])}")
    cx.emit(base, OpType.ReduceMean, [n.input[0]], [n.output[0]], axes=tuple(range(2, rank)), keepdims=1)


def _expand(cx: ImportContext, n: onnx.NodeProto, a: Attrs, base: str) -> None:
    target = _ints(cx.const(_input(n, 1, "shape"), "Expand shape"))
    src = cx.shape(n.input[0])  # the output shape broadcasts the input's dims with the target
    if len(target) > MAX_RANK:
        raise Unsupported(f"Expand shape has {len(target)} dims (at most {MAX_RANK})")
    try:
        shape = tuple(int(d) for d in np.broadcast_shapes(src, target))
    except ValueError:
        raise Unsupported(f"input {src} does not broadcast with Expand shape {list(target)}") from None
    cx.emit(base, OpType.Expand, [n.input[0]], [n.output[0]], shape=shape)


def _constant_of_shape(cx: ImportContext, n: onnx.NodeProto, a: Attrs, base: str) -> None:
    shape = _ints(cx.const(_input(n, 0, "shape"), "ConstantOfShape shape"))
    if any(d < 0 for d in shape):
        raise Malformed(f"ConstantOfShape shape {list(shape)} has a negative dim")
    value = a.tensor("value", np.zeros(1, np.float32))
    dtype = DataType.of(value.dtype) if value.dtype != np.float64 else DataType.float32
    cx.emit(
        base, OpType.ConstantOfShape, [], [n.output[0]], shape=shape, value=_scalar(value, "value"), dtype=dtype.value
    )


def _range(cx: ImportContext, n: onnx.NodeProto, a: Attrs, base: str) -> None:
    operands = [cx.const(_input(n, i, w), f"Range {w}") for i, w in enumerate(("start", "limit", "delta"))]
    start, limit, delta = (_scalar(v, "Range operand") for v in operands)
    if delta == 0 or not all(np.isfinite([start, limit, delta])):
        raise Malformed(f"Range({start}, {limit}, {delta}) has delta 0 or a non-finite bound")
    if (limit - start) / delta > 1 << 31:
        raise Unsupported(f"Range({start}, {limit}, {delta}) is too long")
    dtype = DataType.of(operands[0].dtype)
    cx.emit(base, OpType.Range, [], [n.output[0]], start=start, limit=limit, delta=delta, dtype=dtype.value)


def _shape(cx: ImportContext, n: onnx.NodeProto, a: Attrs, base: str) -> None:
    rank = cx.rank(n.input[0])
    start, end = (min(max(v + rank if v < 0 else v, 0), rank) for v in (a.int("start", 0), a.int("end", rank)))
    cx.emit(base, OpType.Shape, [n.input[0]], [n.output[0]], start=start, end=max(start, end))


def _size(cx: ImportContext, n: onnx.NodeProto, a: Attrs, base: str) -> None:
    count = int(np.prod(cx.shape(_input(n, 0, "data")), dtype=np.int64))
    cx.add_computed(n.output[0], np.int64(count))


def _pad(cx: ImportContext, n: onnx.NodeProto, a: Attrs, base: str) -> None:
    x = _input(n, 0, "data")
    rank = cx.rank(x)
    given = _ints(cx.const(_input(n, 1, "pads"), "Pad pads"))
    value = cx.optional_const(n, 2, "Pad constant_value")
    axes = _ints(cx.optional_const(n, 3, "Pad axes"))
    axes = tuple(range(rank)) if axes is None else tuple(norm_axis(v, rank) for v in axes)
    if len(given) != 2 * len(axes):
        raise Malformed(f"Pad pads {list(given)} must hold {2 * len(axes)} values for axes {list(axes)}")
    if any(p < 0 for p in given):
        raise Unsupported(f"negative pads {list(given)} (cropping) are not supported")
    pads = [0] * (2 * rank)
    for i, axis in enumerate(axes):
        pads[axis], pads[rank + axis] = given[i], given[len(axes) + i]
    mode = a.string("mode", "constant")
    if mode not in ("constant", "reflect", "edge"):
        raise Unsupported(f"Pad mode {mode!r} (supported: constant, reflect, edge)")
    fill = 0.0 if value is None or np.size(value) == 0 else _scalar(value, "Pad constant_value")
    cx.emit(base, OpType.Pad, [x], [n.output[0]], pads=tuple(pads), mode=mode, value=fill)


def _trilu(cx: ImportContext, n: onnx.NodeProto, a: Attrs, base: str) -> None:
    k = cx.optional_const(n, 1, "Trilu k")
    k = 0 if k is None else int(_scalar(k, "Trilu k"))
    cx.emit(base, OpType.Trilu, [n.input[0]], [n.output[0]], upper=a.int("upper", 1, low=0, high=1), k=k)


def _constant(cx: ImportContext, n: onnx.NodeProto, a: Attrs, base: str) -> None:
    if "value" in a:
        value = a.tensor("value")
    elif "value_float" in a:
        value = np.float32(a.float("value_float", finite=False))
    elif "value_floats" in a:
        value = np.asarray(a.floats("value_floats"), dtype=np.float32)
    elif "value_int" in a:
        value = np.int64(a.int("value_int"))
    elif "value_ints" in a:
        value = np.asarray(a.ints("value_ints"), dtype=np.int64)
    else:
        raise Unsupported(f"Constant with attribute(s) {a.names()}")
    try:
        DataType.of(value.dtype)
    except GraphError as err:
        raise Unsupported(f"Constant: {err}") from None
    cx.add_constant(n.output[0], value)


CONVERTERS: dict[str, Converter] = {
    "Identity": _same(OpType.Identity),
    "Relu": _same(OpType.Relu),
    "Sigmoid": _same(OpType.Sigmoid),
    "Tanh": _same(OpType.Tanh),
    "Erf": _same(OpType.Erf),
    "Exp": _same(OpType.Exp),
    "Sqrt": _same(OpType.Sqrt),
    "Neg": _same(OpType.Neg),
    "Abs": _same(OpType.Abs),
    "Reciprocal": _same(OpType.Reciprocal),
    "Sin": _same(OpType.Sin),
    "Cos": _same(OpType.Cos),
    "Not": _same(OpType.Not),
    "HardSwish": _same(OpType.HardSwish),
    "HardSigmoid": _hard_sigmoid,
    "Clip": _clip,
    "Cast": _cast,
    "Gelu": _gelu,
    "Add": _same(OpType.Add),
    "Sub": _same(OpType.Sub),
    "Mul": _same(OpType.Mul),
    "Div": _same(OpType.Div),
    "Pow": _pow,
    "Equal": _same(OpType.Equal),
    "Less": _same(OpType.Less),
    "LessOrEqual": _same(OpType.LessOrEqual),
    "Greater": _same(OpType.Greater),
    "GreaterOrEqual": _same(OpType.GreaterOrEqual),
    "And": _same(OpType.And),
    "Or": _same(OpType.Or),
    "Where": _same(OpType.Where),
    "Expand": _expand,
    "MatMul": _same(OpType.MatMul),
    "Gemm": _gemm,
    "Softmax": _softmax,
    "LayerNormalization": _layernorm,
    "BatchNormalization": _batchnorm,
    "ReduceMean": _reduce(OpType.ReduceMean),
    "ReduceSum": _reduce(OpType.ReduceSum),
    "ReduceMax": _reduce(OpType.ReduceMax),
    "Transpose": _transpose,
    "Reshape": _reshape,
    "Flatten": _flatten,
    "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze,
    "Concat": _concat,
    "Split": _split,
    "Slice": _slice,
    "Gather": _gather,
    "GatherElements": _gather_elements,
    "Pad": _pad,
    "Trilu": _trilu,
    "Conv": _conv,
    "MaxPool": _pool(OpType.MaxPool),
    "AveragePool": _pool(OpType.AveragePool),
    "GlobalAveragePool": _global_average_pool,
    "Constant": _constant,
    "ConstantOfShape": _constant_of_shape,
    "Range": _range,
    "Shape": _shape,
    "Size": _size,
}


def convert_node(cx: ImportContext, n: onnx.NodeProto, base: str) -> None:
    cx.begin()
    CONVERTERS[n.op_type](cx, n, Attrs(n), base)
