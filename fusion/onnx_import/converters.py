"""One converter per supported ONNX operator, mapping it onto IR nodes with normalised attributes.

Mapping choices (documented here once):
- Flatten, Squeeze, Unsqueeze and Reshape become IR Reshape with the concrete target shape.
- GlobalAveragePool becomes ReduceMean over the spatial axes (keepdims).
- Gemm becomes IR Gemm(A, B[, C]) with A [M,K], B [K,N]: transA/transB become Transpose nodes and alpha/beta
  become Mul by a scalar constant; constant folding then turns transposed weights back into constants.
- Conv stays one IR Conv node (2-D or N-D, any group); its reference implementation is im2col + GEMM, and the
  lowering does the same. auto_pad is resolved into explicit pads for the concrete input shape.
- BatchNormalization (inference form only) becomes IR BatchNorm; the batchnorm pass folds it into the preceding
  Conv/Gemm/MatMul or rewrites it as Mul + Add.
- Operands that determine shapes (Reshape shape, Slice starts/ends/axes/steps, Squeeze/Unsqueeze axes, Split sizes,
  ReduceMean axes) must be constants.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx

from fusion.graph.ops import OpType
from fusion.onnx_import.context import ImportContext, Unsupported, attrs_of, norm_axis

Converter = Callable[[ImportContext, onnx.NodeProto, dict[str, Any], str], None]


def _ints(array: np.ndarray | None) -> tuple[int, ...] | None:
    return None if array is None else tuple(int(v) for v in np.asarray(array).reshape(-1))


def _reject(attrs: dict[str, Any], **allowed: Any) -> None:
    """Unsupported unless every named attribute has its allowed value (or is absent)."""
    for key, ok in allowed.items():
        if key in attrs and attrs[key] != ok:
            raise Unsupported(f"attribute {key}={attrs[key]!r} is not supported (only {ok!r})")


def _single_output(n: onnx.NodeProto) -> None:
    if len([o for o in n.output if o]) > 1:
        raise Unsupported(f"only the first output is supported, node has {list(n.output)}")


def _same(op: OpType) -> Converter:
    def convert(cx: ImportContext, n: onnx.NodeProto, a: dict[str, Any], base: str) -> None:
        cx.emit(base, op, list(n.input), [n.output[0]])

    return convert


def _gelu(cx: ImportContext, n: onnx.NodeProto, a: dict[str, Any], base: str) -> None:
    cx.emit(base, OpType.Gelu, [n.input[0]], [n.output[0]], approximate=a.get("approximate", "none"))


def _softmax(cx: ImportContext, n: onnx.NodeProto, a: dict[str, Any], base: str) -> None:
    axis = norm_axis(a.get("axis", -1), cx.type_of(n.input[0]).rank)
    cx.emit(base, OpType.Softmax, [n.input[0]], [n.output[0]], axis=axis)


def _layernorm(cx: ImportContext, n: onnx.NodeProto, a: dict[str, Any], base: str) -> None:
    """LayerNorm; the optional Mean/InvStdDev outputs are built from ReduceMean, Sub, Mul, Add, Sqrt, Div."""
    _reject(a, stash_type=1)
    x = n.input[0]
    rank = cx.type_of(x).rank
    axis = norm_axis(a.get("axis", -1), rank)
    eps = float(a.get("epsilon", 1e-5))
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


def _batchnorm(cx: ImportContext, n: onnx.NodeProto, a: dict[str, Any], base: str) -> None:
    _single_output(n)
    _reject(a, training_mode=0)
    cx.emit(base, OpType.BatchNorm, list(n.input), [n.output[0]], epsilon=float(a.get("epsilon", 1e-5)))


def _reshape_to(cx: ImportContext, n: onnx.NodeProto, base: str, shape: tuple[int, ...]) -> None:
    cx.emit(base, OpType.Reshape, [n.input[0]], [n.output[0]], shape=shape)


def _reshape(cx: ImportContext, n: onnx.NodeProto, a: dict[str, Any], base: str) -> None:
    src = cx.shape(n.input[0])
    target = list(_ints(cx.const(n.input[1], "Reshape shape")))
    if not a.get("allowzero", 0):
        target = [src[i] if d == 0 and i < len(src) else d for i, d in enumerate(target)]
    if target.count(-1) > 1:
        raise Unsupported(f"Reshape shape {target} has more than one -1")
    if -1 in target:
        known = int(np.prod([d for d in target if d != -1], dtype=np.int64))
        total = int(np.prod(src, dtype=np.int64))
        if known == 0 or total % known:
            raise Unsupported(f"cannot reshape {src} to {target}")
        target[target.index(-1)] = total // known
    _reshape_to(cx, n, base, tuple(target))


def _flatten(cx: ImportContext, n: onnx.NodeProto, a: dict[str, Any], base: str) -> None:
    src = cx.shape(n.input[0])
    axis = a.get("axis", 1)
    axis = axis + len(src) if axis < 0 else axis
    _reshape_to(cx, n, base, (int(np.prod(src[:axis], dtype=np.int64)), int(np.prod(src[axis:], dtype=np.int64))))


def _axes_operand(cx: ImportContext, n: onnx.NodeProto, a: dict[str, Any], what: str) -> tuple[int, ...] | None:
    """Axes from the opset-13+ input, or the older attribute."""
    axes = _ints(cx.optional_const(n, 1, what))
    return axes if axes is not None else (tuple(a["axes"]) if "axes" in a else None)


def _squeeze(cx: ImportContext, n: onnx.NodeProto, a: dict[str, Any], base: str) -> None:
    src = cx.shape(n.input[0])
    axes = _axes_operand(cx, n, a, "Squeeze axes")
    axes = {norm_axis(x, len(src)) for x in axes} if axes is not None else {i for i, d in enumerate(src) if d == 1}
    if any(src[x] != 1 for x in axes):
        raise Unsupported(f"cannot squeeze axes {sorted(axes)} of shape {src}")
    _reshape_to(cx, n, base, tuple(d for i, d in enumerate(src) if i not in axes))


def _unsqueeze(cx: ImportContext, n: onnx.NodeProto, a: dict[str, Any], base: str) -> None:
    src = cx.shape(n.input[0])
    given = _axes_operand(cx, n, a, "Unsqueeze axes") or ()
    rank = len(src) + len(given)
    axes = {norm_axis(x, rank) for x in given}
    rest = iter(src)
    _reshape_to(cx, n, base, tuple(1 if i in axes else next(rest) for i in range(rank)))


def _transpose(cx: ImportContext, n: onnx.NodeProto, a: dict[str, Any], base: str) -> None:
    rank = cx.type_of(n.input[0]).rank
    perm = tuple(a.get("perm", range(rank - 1, -1, -1)))
    cx.emit(base, OpType.Transpose, [n.input[0]], [n.output[0]], perm=perm)


def _concat(cx: ImportContext, n: onnx.NodeProto, a: dict[str, Any], base: str) -> None:
    axis = norm_axis(a["axis"], cx.type_of(n.input[0]).rank)
    cx.emit(base, OpType.Concat, list(n.input), [n.output[0]], axis=axis)


def _split(cx: ImportContext, n: onnx.NodeProto, a: dict[str, Any], base: str) -> None:
    shape = cx.shape(n.input[0])
    axis = norm_axis(a.get("axis", 0), len(shape))
    sizes = _ints(cx.optional_const(n, 1, "Split sizes"))
    if sizes is None and "split" in a:
        sizes = tuple(a["split"])
    if sizes is None:
        parts = a.get("num_outputs", len(n.output))
        chunk = -(-shape[axis] // parts)
        sizes = tuple(min(chunk, shape[axis] - i * chunk) for i in range(parts))
    cx.emit(base, OpType.Split, [n.input[0]], list(n.output), axis=axis, sizes=sizes)


def _slice(cx: ImportContext, n: onnx.NodeProto, a: dict[str, Any], base: str) -> None:
    shape = cx.shape(n.input[0])
    starts = _ints(cx.const(n.input[1], "Slice starts"))
    ends = _ints(cx.const(n.input[2], "Slice ends"))
    axes = _ints(cx.optional_const(n, 3, "Slice axes")) or tuple(range(len(starts)))
    steps = _ints(cx.optional_const(n, 4, "Slice steps")) or (1,) * len(starts)
    norm = []
    for axis, start, end, step in zip(axes, starts, ends, steps, strict=True):
        axis = norm_axis(axis, len(shape))
        dim = shape[axis]
        if step == 0:
            raise Unsupported("Slice step 0")
        start = start + dim if start < 0 else start
        end = end + dim if end < 0 else end
        if step > 0:
            start, end = min(max(start, 0), dim), min(max(end, 0), dim)
        else:
            start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
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


def _gather(cx: ImportContext, n: onnx.NodeProto, a: dict[str, Any], base: str) -> None:
    axis = norm_axis(a.get("axis", 0), cx.type_of(n.input[0]).rank)
    cx.emit(base, OpType.Gather, list(n.input), [n.output[0]], axis=axis)


def _reduce_mean(cx: ImportContext, n: onnx.NodeProto, a: dict[str, Any], base: str) -> None:
    rank = cx.type_of(n.input[0]).rank
    axes = _axes_operand(cx, n, a, "ReduceMean axes")
    if not axes:
        if a.get("noop_with_empty_axes", 0):
            cx.emit(base, OpType.Identity, [n.input[0]], [n.output[0]])
            return
        axes = tuple(range(rank))
    axes = tuple(sorted({norm_axis(x, rank) for x in axes}))
    cx.emit(base, OpType.ReduceMean, [n.input[0]], [n.output[0]], axes=axes, keepdims=int(a.get("keepdims", 1)))


def _gemm(cx: ImportContext, n: onnx.NodeProto, a: dict[str, Any], base: str) -> None:
    lhs, rhs = n.input[0], n.input[1]
    if a.get("transA", 0):
        lhs = cx.emit(f"{base}/transA", OpType.Transpose, [lhs], perm=(1, 0))
    if a.get("transB", 0):
        rhs = cx.emit(f"{base}/transB", OpType.Transpose, [rhs], perm=(1, 0))
    alpha, beta = float(a.get("alpha", 1.0)), float(a.get("beta", 1.0))
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


def _window_attrs(cx: ImportContext, a: dict[str, Any], spatial: tuple[int, ...], kernel: tuple[int, ...]) -> dict:
    """strides/dilations/pads for the concrete input, with auto_pad resolved to explicit pads."""
    s = len(spatial)
    strides = tuple(a.get("strides", (1,) * s))
    dilations = tuple(a.get("dilations", (1,) * s))
    mode = a.get("auto_pad", "NOTSET")
    if mode in ("NOTSET", ""):
        pads = tuple(a.get("pads", (0,) * (2 * s)))
    elif mode == "VALID":
        pads = (0,) * (2 * s)
    elif mode in ("SAME_UPPER", "SAME_LOWER"):
        total = [
            max(0, (-(-spatial[i] // strides[i]) - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - spatial[i])
            for i in range(s)
        ]
        small = [t // 2 for t in total]
        big = [t - t // 2 for t in total]
        pads = tuple(small + big) if mode == "SAME_UPPER" else tuple(big + small)
    else:
        raise Unsupported(f"auto_pad={mode!r}")
    return dict(strides=strides, dilations=dilations, pads=pads)


def _conv(cx: ImportContext, n: onnx.NodeProto, a: dict[str, Any], base: str) -> None:
    x, w = cx.shape(n.input[0]), cx.shape(n.input[1])
    kernel = tuple(a.get("kernel_shape", w[2:]))
    inputs = [v for v in n.input if v]
    cx.emit(
        base, OpType.Conv, inputs, [n.output[0]], group=int(a.get("group", 1)), **_window_attrs(cx, a, x[2:], kernel)
    )


def _max_pool(cx: ImportContext, n: onnx.NodeProto, a: dict[str, Any], base: str) -> None:
    _single_output(n)
    kernel = tuple(a["kernel_shape"])
    attrs = _window_attrs(cx, a, cx.shape(n.input[0])[2:], kernel)
    cx.emit(
        base, OpType.MaxPool, [n.input[0]], [n.output[0]], kernel=kernel, ceil_mode=int(a.get("ceil_mode", 0)), **attrs
    )


def _average_pool(cx: ImportContext, n: onnx.NodeProto, a: dict[str, Any], base: str) -> None:
    kernel = tuple(a["kernel_shape"])
    attrs = _window_attrs(cx, a, cx.shape(n.input[0])[2:], kernel)
    cx.emit(
        base,
        OpType.AveragePool,
        [n.input[0]],
        [n.output[0]],
        kernel=kernel,
        ceil_mode=int(a.get("ceil_mode", 0)),
        count_include_pad=int(a.get("count_include_pad", 0)),
        **attrs,
    )


def _global_average_pool(cx: ImportContext, n: onnx.NodeProto, a: dict[str, Any], base: str) -> None:
    rank = cx.type_of(n.input[0]).rank
    cx.emit(base, OpType.ReduceMean, [n.input[0]], [n.output[0]], axes=tuple(range(2, rank)), keepdims=1)


def _constant(cx: ImportContext, n: onnx.NodeProto, a: dict[str, Any], base: str) -> None:
    if "value" in a:
        value = onnx.numpy_helper.to_array(a["value"])
    elif "value_float" in a or "value_floats" in a:
        value = np.asarray(a.get("value_float", a.get("value_floats")), dtype=np.float32)
    elif "value_int" in a or "value_ints" in a:
        value = np.asarray(a.get("value_int", a.get("value_ints")), dtype=np.int64)
    else:
        raise Unsupported(f"Constant with attribute(s) {sorted(a)}")
    cx.add_constant(n.output[0], value)


CONVERTERS: dict[str, Converter] = {
    "Identity": _same(OpType.Identity),
    "Relu": _same(OpType.Relu),
    "Sigmoid": _same(OpType.Sigmoid),
    "Tanh": _same(OpType.Tanh),
    "Erf": _same(OpType.Erf),
    "Exp": _same(OpType.Exp),
    "Sqrt": _same(OpType.Sqrt),
    "Gelu": _gelu,
    "Add": _same(OpType.Add),
    "Sub": _same(OpType.Sub),
    "Mul": _same(OpType.Mul),
    "Div": _same(OpType.Div),
    "Pow": _same(OpType.Pow),
    "MatMul": _same(OpType.MatMul),
    "Gemm": _gemm,
    "Softmax": _softmax,
    "LayerNormalization": _layernorm,
    "BatchNormalization": _batchnorm,
    "ReduceMean": _reduce_mean,
    "Transpose": _transpose,
    "Reshape": _reshape,
    "Flatten": _flatten,
    "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze,
    "Concat": _concat,
    "Split": _split,
    "Slice": _slice,
    "Gather": _gather,
    "Conv": _conv,
    "MaxPool": _max_pool,
    "AveragePool": _average_pool,
    "GlobalAveragePool": _global_average_pool,
    "Constant": _constant,
}


def convert_node(cx: ImportContext, n: onnx.NodeProto, base: str) -> None:
    CONVERTERS[n.op_type](cx, n, attrs_of(n), base)
