"""fp32 numpy kernels, one per IR operator, written from the ONNX operator definitions.

Arithmetic is float32 throughout (as on the accelerator's f32 vector path); erf comes from scipy.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy.special import erf

from fusion.graph.ir import Node
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


UNARY: dict[OpType, Callable[[Node, np.ndarray], np.ndarray]] = {
    OpType.Identity: lambda n, x: x,
    OpType.Relu: lambda n, x: np.maximum(x, F32(0.0)),
    OpType.Sigmoid: lambda n, x: sigmoid(x),
    OpType.Tanh: lambda n, x: np.tanh(x),
    OpType.Erf: lambda n, x: _f32(erf(x)),
    OpType.Gelu: lambda n, x: gelu(x, n.attr("approximate")),
    OpType.Exp: lambda n, x: np.exp(x),
    OpType.Sqrt: lambda n, x: np.sqrt(x),
}

BINARY: dict[OpType, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    OpType.Add: np.add,
    OpType.Sub: np.subtract,
    OpType.Mul: np.multiply,
    OpType.Div: np.divide,
    OpType.Pow: np.power,
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
    OpType.ReduceMean: lambda n, a, sp: _reduce_mean(n, a[0]),
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
