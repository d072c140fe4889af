"""fp32 numpy kernels, one per IR operator, written from the ONNX operator definitions.

Float arithmetic is float32 throughout (as on the accelerator's f32 vector path); erf comes from scipy. Integer and
bool tensors (shape computations, masks) keep their dtype; integer Div truncates toward zero as ONNX does.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy.special import erf

from fusion.graph.ir import DataType, Node
from fusion.graph.ops import OpType
from fusion.reference.windows import windows

Arrays = tuple[np.ndarray, ...]
F32 = np.float32


def _f32(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=F32)


def gelu(x: np.ndarray, approximate: str) -> np.ndarray:
    x = _f32(x)
    if approximate == "tanh":
        inner = F32(np.sqrt(2.0 / np.pi)) * (x + F32(0.044715) * x * x * x)
        return _f32(F32(0.5) * x * (F32(1.0) + np.tanh(inner)))
    return _f32(F32(0.5) * x * (F32(1.0) + _f32(erf(x / F32(np.sqrt(2.0))))))


def sigmoid(x: np.ndarray) -> np.ndarray:
    return _f32(F32(1.0) / (F32(1.0) + np.exp(-_f32(x))))


def hard_sigmoid(x: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    return _f32(np.clip(F32(alpha) * _f32(x) + F32(beta), F32(0.0), F32(1.0)))


def clip(x: np.ndarray, low: float, high: float) -> np.ndarray:
    """Clip with float bounds (-inf/inf when absent); an integer x stays integer."""
    if x.dtype.kind in "iu":
        info = np.iinfo(x.dtype)
        low, high = max(low, info.min), min(high, info.max)
        return np.clip(x, np.ceil(low).astype(x.dtype), np.floor(high).astype(x.dtype))
    return np.clip(x, x.dtype.type(low), x.dtype.type(high))


MAX_PRODUCT_POW = 8  # float32 x^k for an integer |k| up to this is defined as a product (the accelerator's arithmetic)


def power(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """np.power, with two definitions of our own.

    Integers to negative powers truncate toward zero (numpy refuses them). A float32 base to one integer exponent
    k with 2 <= |k| <= MAX_PRODUCT_POW is x * x * ... * x, rounded after each product, left to right (and 1 / that
    for k < 0): what a vector unit without a log computes, and what int8 bit-exactness needs to be defined as.
    """
    if a.dtype.kind in "iu" and b.dtype.kind in "iu" and np.any(b < 0):
        return np.trunc(np.power(a.astype(np.float64), b.astype(np.float64))).astype(a.dtype)
    if a.dtype == np.float32 and b.size == 1:
        k = float(b.reshape(-1)[0])
        if k == int(k) and 2 <= abs(k) <= MAX_PRODUCT_POW:
            out = a * a
            for _ in range(int(abs(k)) - 2):
                out = out * a
            return np.reciprocal(out) if k < 0 else out
    return np.power(a, b)


def divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Float division, or integer division truncating toward zero (ONNX Div on integers)."""
    if a.dtype.kind in "iu" and b.dtype.kind in "iu":
        q = np.abs(a) // np.abs(b)
        return np.where((a < 0) != (b < 0), -q, q).astype(a.dtype)
    return np.divide(a, b)


UNARY: dict[OpType, Callable[[Node, np.ndarray], np.ndarray]] = {
    OpType.Identity: lambda n, x: x,
    OpType.Relu: lambda n, x: np.maximum(x, F32(0.0)),
    OpType.Sigmoid: lambda n, x: sigmoid(x),
    OpType.Tanh: lambda n, x: np.tanh(x),
    OpType.Erf: lambda n, x: _f32(erf(x)),
    OpType.Gelu: lambda n, x: gelu(x, n.attr("approximate")),
    OpType.Exp: lambda n, x: np.exp(x),
    OpType.Sqrt: lambda n, x: np.sqrt(x),
    OpType.Neg: lambda n, x: np.negative(x),
    OpType.Abs: lambda n, x: np.abs(x),
    OpType.Reciprocal: lambda n, x: _f32(F32(1.0) / _f32(x)),
    OpType.Sin: lambda n, x: np.sin(x),
    OpType.Cos: lambda n, x: np.cos(x),
    OpType.Clip: lambda n, x: clip(x, n.attr("min"), n.attr("max")),
    OpType.HardSigmoid: lambda n, x: hard_sigmoid(x, n.attr("alpha"), n.attr("beta")),
    OpType.HardSwish: lambda n, x: _f32(x * hard_sigmoid(x, 1.0 / 6.0, 0.5)),
    OpType.Not: lambda n, x: np.logical_not(x),
    OpType.Cast: lambda n, x: np.asarray(x).astype(DataType(n.attr("to")).numpy),
}

BINARY: dict[OpType, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    OpType.Add: np.add,
    OpType.Sub: np.subtract,
    OpType.Mul: np.multiply,
    OpType.Div: divide,
    OpType.Pow: power,
    OpType.Equal: np.equal,
    OpType.Less: np.less,
    OpType.LessOrEqual: np.less_equal,
    OpType.Greater: np.greater,
    OpType.GreaterOrEqual: np.greater_equal,
    OpType.And: np.logical_and,
    OpType.Or: np.logical_or,
}


def _batchnorm(node: Node, x: np.ndarray, scale: np.ndarray, bias: np.ndarray, mean, var) -> np.ndarray:
    shape = (1, -1) + (1,) * (x.ndim - 2)
    inv = scale / np.sqrt(var + F32(node.attr("epsilon")))
    return (x - mean.reshape(shape)) * inv.reshape(shape) + bias.reshape(shape)


def softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def _layernorm(node: Node, x: np.ndarray, scale: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    axes = tuple(range(node.attr("axis"), x.ndim))
    mean = np.mean(x, axis=axes, keepdims=True)
    centred = x - mean
    var = np.mean(centred * centred, axis=axes, keepdims=True)
    y = centred / np.sqrt(var + F32(node.attr("epsilon"))) * scale
    return y if bias is None else y + bias


def _slice(node: Node, x: np.ndarray) -> np.ndarray:
    for axis, start, end, step in zip(
        node.attr("axes"), node.attr("starts"), node.attr("ends"), node.attr("steps"), strict=True
    ):
        x = np.take(x, np.arange(start, end, step), axis=axis)
    return x


def _gather(node: Node, data: np.ndarray, idx: np.ndarray) -> np.ndarray:
    axis = node.attr("axis")
    idx = np.where(idx < 0, idx + data.shape[axis], idx)
    return np.take(data, idx, axis=axis)


def _gather_elements(node: Node, data: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """ONNX GatherElements: the output has the indices' shape (no broadcasting, unlike take_along_axis)."""
    axis = node.attr("axis")
    idx = np.where(idx < 0, idx + data.shape[axis], idx)
    data = data[tuple(slice(None) if d == axis else slice(0, n) for d, n in enumerate(idx.shape))]
    return np.take_along_axis(data, idx.astype(np.int64), axis=axis)


def _pad(node: Node, x: np.ndarray) -> np.ndarray:
    pads, mode = node.attr("pads"), node.attr("mode")
    widths = list(zip(pads[: x.ndim], pads[x.ndim :], strict=True))
    if mode == "constant":
        return np.pad(x, widths, mode="constant", constant_values=np.asarray(node.attr("value")).astype(x.dtype))
    return np.pad(x, widths, mode=mode)


def _trilu(node: Node, x: np.ndarray) -> np.ndarray:
    return (np.triu if node.attr("upper") else np.tril)(x, node.attr("k"))


def _range(node: Node) -> np.ndarray:
    dtype = DataType(node.attr("dtype")).numpy
    start, limit, delta = (np.asarray(node.attr(k)).astype(dtype) for k in ("start", "limit", "delta"))
    count = max(int(np.ceil((float(limit) - float(start)) / float(delta))), 0)
    return (start + np.arange(count, dtype=dtype) * delta).astype(dtype)


def _split(node: Node, x: np.ndarray) -> Arrays:
    return tuple(np.split(x, np.cumsum(node.attr("sizes"))[:-1], axis=node.attr("axis")))


def _gemm(node: Node, a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None) -> np.ndarray:
    y = a @ b
    return y if c is None else y + c


def _windows(
    node: Node,
    x: np.ndarray,
    kernel: tuple[int, ...],
    out: tuple[int, ...],
    fill: float,
    pads: tuple[int, ...] | None = None,
) -> np.ndarray:
    pads = node.attr("pads") if pads is None else pads
    return windows(x, kernel, node.attr("strides"), node.attr("dilations"), pads, out, fill)


def im2col_gemm(node: Node, x: np.ndarray, w: np.ndarray, out: tuple[int, ...]) -> np.ndarray:
    """Convolution without bias as im2col + one batched GEMM per group, in the inputs' dtype."""
    g = node.attr("group")
    kernel = w.shape[2:]
    n, c = x.shape[:2]
    s = len(out)
    cols = _windows(node, x, kernel, out, 0.0).reshape(n, g, c // g, *out, *kernel)
    # -> [g, N * prod(out), C/g * prod(kernel)]
    order = (1, 0, *range(3, 3 + s), 2, *range(3 + s, 3 + 2 * s))
    cols = cols.transpose(order).reshape(g, n * int(np.prod(out)), -1)
    wg = w.reshape(g, w.shape[0] // g, -1)
    y = np.matmul(cols, wg.transpose(0, 2, 1))  # [g, N*P, M/g]
    return y.reshape(g, n, *out, -1).transpose(1, 0, s + 2, *range(2, s + 2)).reshape(n, w.shape[0], *out)


def conv(node: Node, x: np.ndarray, w: np.ndarray, b: np.ndarray | None, out: tuple[int, ...]) -> np.ndarray:
    y = im2col_gemm(node, x, w, out)
    if b is not None:
        y = y + b.reshape((1, -1) + (1,) * len(out))
    return _f32(y)


def max_pool(node: Node, x: np.ndarray, out: tuple[int, ...]) -> np.ndarray:
    s = len(out)
    return np.max(_windows(node, x, node.attr("kernel"), out, -np.inf), axis=tuple(range(-s, 0)))


def average_pool(node: Node, x: np.ndarray, out: tuple[int, ...]) -> np.ndarray:
    """Mean of each window; the divisor counts explicit pads only with count_include_pad (never ceil overhang)."""
    s = len(out)
    axes = tuple(range(-s, 0))
    kernel = node.attr("kernel")
    total = np.sum(_windows(node, x, kernel, out, 0.0), axis=axes)
    ones = np.ones((1, 1, *x.shape[2:]), F32)
    if node.attr("count_include_pad"):
        pads = node.attr("pads")
        ones = np.pad(ones, [(0, 0), (0, 0), *zip(pads[:s], pads[s:], strict=True)], constant_values=1)
        count = np.sum(_windows(node, ones, kernel, out, 0.0, pads=(0,) * (2 * s)), axis=axes)
    else:
        count = np.sum(_windows(node, ones, kernel, out, 0.0), axis=axes)
    return _f32(total / count)


def _reduce_mean(node: Node, x: np.ndarray) -> np.ndarray:
    return np.mean(x, axis=node.attr("axes"), keepdims=bool(node.attr("keepdims")), dtype=F32)


def _reduce(node: Node, x: np.ndarray, f: Callable) -> np.ndarray:
    return f(x, axis=tuple(node.attr("axes")), keepdims=bool(node.attr("keepdims")))


Kernel = Callable[[Node, Arrays, tuple[int, ...]], "np.ndarray | Arrays"]


def _unary_kernel(f: Callable[[Node, np.ndarray], np.ndarray]) -> Kernel:
    return lambda n, a, sp: f(n, a[0])


def _binary_kernel(f: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Kernel:
    return lambda n, a, sp: f(a[0], a[1])


KERNELS: dict[OpType, Kernel] = {
    **{op: _unary_kernel(f) for op, f in UNARY.items()},
    **{op: _binary_kernel(f) for op, f in BINARY.items()},
    OpType.BatchNorm: lambda n, a, sp: _batchnorm(n, *a),
    OpType.Transpose: lambda n, a, sp: np.transpose(a[0], n.attr("perm")),
    OpType.Reshape: lambda n, a, sp: np.reshape(a[0], n.attr("shape")),
    OpType.Concat: lambda n, a, sp: np.concatenate(a, axis=n.attr("axis")),
    OpType.Split: lambda n, a, sp: _split(n, a[0]),
    OpType.Slice: lambda n, a, sp: _slice(n, a[0]),
    OpType.Gather: lambda n, a, sp: _gather(n, *a),
    OpType.GatherElements: lambda n, a, sp: _gather_elements(n, *a),
    OpType.Where: lambda n, a, sp: np.where(*a),
    OpType.Expand: lambda n, a, sp: np.broadcast_to(a[0], n.attr("shape")).copy(),
    OpType.ConstantOfShape: lambda n, a, sp: np.full(
        n.attr("shape"), n.attr("value"), dtype=DataType(n.attr("dtype")).numpy
    ),
    OpType.Range: lambda n, a, sp: _range(n),
    OpType.Shape: lambda n, a, sp: np.asarray(np.shape(a[0])[n.attr("start") : n.attr("end")], dtype=np.int64),
    OpType.Pad: lambda n, a, sp: _pad(n, a[0]),
    OpType.Trilu: lambda n, a, sp: _trilu(n, a[0]),
    OpType.ReduceMean: lambda n, a, sp: _reduce_mean(n, a[0]),
    OpType.ReduceSum: lambda n, a, sp: _reduce(n, a[0], np.sum),
    OpType.ReduceMax: lambda n, a, sp: _reduce(n, a[0], np.max),
    OpType.Softmax: lambda n, a, sp: softmax(a[0], n.attr("axis")),
    OpType.LayerNorm: lambda n, a, sp: _layernorm(n, *a),
    OpType.MatMul: lambda n, a, sp: np.matmul(a[0], a[1]),
    OpType.Gemm: lambda n, a, sp: _gemm(n, *a),
    OpType.Conv: lambda n, a, sp: conv(n, a[0], a[1], a[2] if len(a) > 2 else None, sp),
    OpType.MaxPool: lambda n, a, sp: max_pool(n, a[0], sp),
    OpType.AveragePool: lambda n, a, sp: average_pool(n, a[0], sp),
}

if set(KERNELS) != set(OpType):
    raise AssertionError(f"reference kernels missing for {set(OpType) - set(KERNELS)}")


def evaluate_node(node: Node, args: Arrays, out_shapes: tuple[tuple[int, ...], ...]) -> Arrays:
    """Run one node on numpy inputs; `out_shapes` are the graph's recorded output shapes (for window sizes)."""
    result = KERNELS[node.op](node, args, out_shapes[0][2:])
    return result if isinstance(result, tuple) else (result,)
