"""Systolic-array numerics: int8 x int8 -> int32 (wrapping), fp32 x fp32 -> fp32, and the drain epilogue.

fp32 sums are defined in the array's order: the partial sum flows down a column, adding one rounded
product per PE (k = 0 .. K-1), with no fused multiply-add; `mx.mma` then adds that sum to the accumulator.
"""

from __future__ import annotations

import numpy as np
from scipy.special import erf as _erf

from isa.enums import Activation, DType
from simulator.errors import Fault
from simulator.semantics.scalar import f32_from_bits
from simulator.semantics.vector import requantize, requantize_channels

_F32 = np.float32
EXACT_F32_K = 1024  # |sum of K int8 products| < 2^24 for K < 1024: float32 BLAS is exact


def matmul(a: np.ndarray, w: np.ndarray, dtype: DType) -> np.ndarray:
    """a (rows x K) @ w (K x cols): i8 -> i32 (exact), f32 -> f32 in systolic summation order."""
    if a.shape[1] != w.shape[0]:
        raise Fault(f"matmul inner dimensions differ: {a.shape} @ {w.shape}")
    if dtype is DType.i8:
        if a.shape[1] < EXACT_F32_K:
            return np.matmul(a.astype(_F32), w.astype(_F32)).astype(np.int32)
        return np.matmul(a.astype(np.int64), w.astype(np.int64)).astype(np.int32)
    if dtype is DType.f32:
        total = np.zeros((a.shape[0], w.shape[1]), dtype=_F32)
        if not a.any() and np.isfinite(w).all():
            return total  # every product is +-0 and +0 + +-0 is +0: the column sums are +0 (the planner's zero inputs)
        with np.errstate(all="ignore"):  # IEEE overflow to inf is the hardware's behaviour, not an error
            for k in range(a.shape[1]):  # K <= N steps down the column, each a whole-tile numpy op
                total += a[:, k : k + 1] * w[k]
        return total
    raise Fault(f"matrix unit does not support dtype {dtype.name}")


def accumulate(acc: np.ndarray, product: np.ndarray) -> np.ndarray:
    """`mx.mma`: acc + product, wrapping for i32."""
    if acc.dtype.kind == "i":  # integer arrays wrap without a warning: no error state to set
        return acc + product
    with np.errstate(all="ignore"):  # f32 overflow to inf is the hardware's behaviour
        return acc + product


def _gelu(t: np.ndarray) -> np.ndarray:
    return (_F32(0.5) * t * (_F32(1) + _erf(t * _F32(0.7071067811865476)))).astype(_F32)


def _sigmoid(t: np.ndarray) -> np.ndarray:
    return (_F32(1) / (_F32(1) + np.exp(-t))).astype(_F32)


_FLOAT_ACTS = {
    Activation.none: lambda t: t,
    Activation.relu: lambda t: np.maximum(t, _F32(0)),
    Activation.gelu: _gelu,
    Activation.tanh: np.tanh,
    Activation.sigmoid: _sigmoid,
}


def check_epilogue(acc_dtype: np.dtype, act: Activation, out_dtype: DType, per_column: bool) -> None:
    """The drain configurations the epilogue cannot run (faults; a function of the configuration alone, so a run
    without values checks them too). The output is then of `out_dtype`."""
    if per_column and (acc_dtype != np.int32 or out_dtype is not DType.i8):
        raise Fault("a per-column requantizer (epflags pc) needs the int path and i8 out")
    if acc_dtype == np.int32:
        if act not in (Activation.none, Activation.relu):
            raise Fault(f"activation {act.name} needs the f32 path (integer epilogue supports relu only)")
    elif out_dtype is not DType.f32:
        raise Fault(f"a float accumulator drains only to f32, not {out_dtype.name}")


def epilogue(
    acc: np.ndarray,
    bias: np.ndarray | None,
    residual: np.ndarray | None,
    act: Activation,
    mult: int,
    shift: int,
    out_dtype: DType,
    table: np.ndarray | None = None,
) -> np.ndarray:
    """`mx.drain`: t = acc + bias[col] + residual; t = act(t); convert to out_dtype.

    Int path (acc i32): act is none or relu; i8 out = requantize(t, mult, shift), i32 out = t,
    f32 out = f32(t) * f32_from_bits(mult). Float path (acc f32): any activation; only f32 out,
    = t * f32_from_bits(mult). `mult` is the raw 32-bit register value. `table` (epflags pc: cols x 2 int32
    (mult, shift) pairs) requantizes each column with its own pair instead; int path, i8 out only.
    """
    check_epilogue(acc.dtype, act, out_dtype, table is not None)
    t = acc
    with np.errstate(all="ignore"):
        if bias is not None:
            t = t + bias.reshape(1, -1)
        if residual is not None:
            t = t + residual
    if acc.dtype == np.int32:
        if act is Activation.relu:
            t = np.maximum(t, np.int32(0))
        if table is not None:
            columns = np.broadcast_to(np.arange(t.shape[1]), t.shape)
            return requantize_channels(t.astype(np.int32, copy=False), table, columns)
        if out_dtype is DType.i8:
            return requantize(t.astype(np.int32, copy=False), mult, shift)
        if out_dtype is DType.i32:
            return t.astype(np.int32, copy=False)
        return t.astype(_F32) * _F32(f32_from_bits(mult))
    with np.errstate(all="ignore"):
        return (_FLOAT_ACTS[act](t.astype(_F32, copy=False)) * _F32(f32_from_bits(mult))).astype(_F32)
