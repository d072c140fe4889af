"""Vector-unit numerics: i8 saturates to [-128, 127], i32 wraps, f32 is IEEE single precision.

Each function does one instruction's data work in a few numpy calls. Operands arrive already shaped for
broadcasting (the caller reshapes rows for the .vr/.vc modes); scalars arrive as Python numbers.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy.special import erf as _erf

from isa.enums import DType
from simulator.errors import Fault

I8_MIN, I8_MAX = -128, 127
_I32 = np.int32
_F32 = np.float32
_WIDE = np.int64


def sat8(x: np.ndarray) -> np.ndarray:
    """Saturate an integer array to int8 (two ufuncs: np.clip's Python wrapper costs more than the work)."""
    wide = np.maximum(x, I8_MIN)
    np.minimum(wide, I8_MAX, out=wide)
    return wide.astype(np.int8)


def _shift_amount(b: np.ndarray | int, dtype: DType) -> np.ndarray | int:
    return np.bitwise_and(b, 7 if dtype is DType.i8 else 31)


def _srl(a: np.ndarray, b: np.ndarray | int, dtype: DType) -> np.ndarray:
    unsigned = np.uint8 if dtype is DType.i8 else np.uint32
    return np.right_shift(a.view(unsigned), np.asarray(_shift_amount(b, dtype), dtype=unsigned)).view(a.dtype)


_BINARY_WIDE: dict[str, Callable[[np.ndarray, np.ndarray | int], np.ndarray]] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "max": np.maximum,
    "min": np.minimum,
    "div": np.divide,
}

BINARY_OPS = frozenset(_BINARY_WIDE) | {"sll", "srl", "sra"}


def check_binary(op_name: str, dtype: DType) -> None:
    """The faults of `binary` that do not depend on the operands (its result is always of `dtype`)."""
    if op_name in ("sll", "srl", "sra"):
        if dtype is DType.f32:
            raise Fault(f"{op_name} needs an integer dtype, got f32")
    elif op_name not in _BINARY_WIDE:
        raise Fault(f"unknown vector operation {op_name!r}")
    elif op_name == "div" and dtype is not DType.f32:
        raise Fault(f"div needs dtype f32, got {dtype.name}")


def binary(op_name: str, a: np.ndarray, b: np.ndarray | int | float, dtype: DType) -> np.ndarray:
    """`a OP b` elementwise in `dtype` (b broadcasts)."""
    check_binary(op_name, dtype)
    if op_name in ("sll", "srl", "sra"):
        if op_name == "srl":
            return _srl(a, b, dtype)
        if op_name == "sra":
            return np.right_shift(a, np.asarray(_shift_amount(b, dtype), dtype=a.dtype))
        if dtype is DType.i8:
            return sat8(np.left_shift(a.astype(_I32), _shift_amount(b, dtype)))
        return np.left_shift(a, np.asarray(_shift_amount(b, dtype), dtype=_I32))
    fn = _BINARY_WIDE[op_name]
    if dtype is DType.f32:
        with np.errstate(all="ignore"):
            return fn(a, np.asarray(b, dtype=_F32)).astype(_F32, copy=False)
    if dtype is DType.i8:
        return sat8(fn(a.astype(_I32), np.asarray(b, dtype=_I32)))
    return fn(a, np.asarray(b, dtype=_I32)).astype(_I32, copy=False)


def _relu(a: np.ndarray) -> np.ndarray:
    return np.maximum(a, a.dtype.type(0))


def _sigmoid(a: np.ndarray) -> np.ndarray:
    return (_F32(1) / (_F32(1) + np.exp(-a))).astype(_F32, copy=False)


_UNARY_INT: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "relu": _relu,
    "neg": np.negative,
    "abs": np.abs,
    "copy": np.copy,
}
_UNARY_F32: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    **_UNARY_INT,
    "exp": np.exp,
    "recip": lambda a: _F32(1) / a,
    "rsqrt": lambda a: _F32(1) / np.sqrt(a),
    "sqrt": np.sqrt,
    "erf": _erf,
    "tanh": np.tanh,
    "sigmoid": _sigmoid,
}
UNARY_OPS = frozenset(_UNARY_F32)


def unary_function(op_name: str, dtype: DType) -> Callable[[np.ndarray], np.ndarray]:
    """The function of `unary` (its result is always of `dtype`); a fault for an op `dtype` does not have."""
    fn = (_UNARY_F32 if dtype is DType.f32 else _UNARY_INT).get(op_name)
    if fn is None:
        if dtype is DType.f32:
            raise Fault(f"unknown vector operation {op_name!r}")
        raise Fault(f"{op_name} needs dtype f32, got {dtype.name}")
    return fn


def unary(op_name: str, a: np.ndarray, dtype: DType) -> np.ndarray:
    """`OP(a)` elementwise; transcendental ops exist only for f32."""
    fn = unary_function(op_name, dtype)
    if dtype is DType.f32:
        with np.errstate(all="ignore"):
            return fn(a).astype(_F32, copy=False)
    if dtype is DType.i8 and op_name in ("neg", "abs"):
        return sat8(fn(a.astype(_I32)))
    return fn(a)


REDUCE_OPS = frozenset({"rsum", "rmax", "rmin"})


def reduce_output_dtype(op_name: str, dtype: DType) -> DType:
    """i8 sums widen to i32 (so they cannot saturate); max and min keep the input dtype."""
    return DType.i32 if (op_name == "rsum" and dtype is DType.i8) else dtype


def reduce_rows(size: int, period: int) -> int:
    """The rows (output elements) of a reduction of `size` elements by `period`; a fault if they do not split."""
    if period <= 0 or size % period:
        raise Fault(f"{size} elements do not split into rows of period {period}")
    return size // period


def reduce(op_name: str, a: np.ndarray, period: int, dtype: DType) -> np.ndarray:
    """Reduce each row of `period` elements of the flat `a` to one element."""
    reduce_rows(a.size, period)
    rows = a.reshape(-1, period)
    if op_name == "rsum":
        out = reduce_output_dtype(op_name, dtype).numpy
        return rows.sum(axis=1, dtype=out)
    if op_name == "rmax":
        return rows.max(axis=1)
    if op_name == "rmin":
        return rows.min(axis=1)
    raise Fault(f"unknown reduction {op_name!r}")


def clip(a: np.ndarray, lo: int | float, hi: int | float, dtype: DType) -> np.ndarray:
    """min(max(a, lo), hi); integer bounds are first saturated to the dtype's range."""
    if dtype is DType.i8:
        lo, hi = min(max(lo, I8_MIN), I8_MAX), min(max(hi, I8_MIN), I8_MAX)
    return np.minimum(np.maximum(a, dtype.numpy.type(lo)), dtype.numpy.type(hi))


_INT_RANGE = {DType.i8: (I8_MIN, I8_MAX), DType.i32: (-(2**31), 2**31 - 1)}


def convert(a: np.ndarray, src: DType, dst: DType) -> np.ndarray:
    """dtype conversion: float -> int rounds half to even and saturates (NaN -> 0); int -> int saturates."""
    if src is dst:
        return a.copy()
    if dst is DType.f32:
        return a.astype(_F32)
    lo, hi = _INT_RANGE[dst]
    if src is DType.f32:
        wide = np.rint(a.astype(np.float64))
        wide[np.isnan(wide)] = 0
        return np.clip(wide, lo, hi).astype(dst.numpy)
    return np.clip(a, lo, hi).astype(dst.numpy)


def requantize(x_i32: np.ndarray, mult: int, shift: int) -> np.ndarray:
    """int8 = sat8((x * mult + 2^(shift-1)) >> shift) in int64 with an arithmetic shift (no rounding if shift=0)."""
    if x_i32.dtype != np.int32:
        raise Fault(f"requantize needs i32 input, got {x_i32.dtype}")
    wide = x_i32.astype(_WIDE) * _WIDE(mult)
    if shift:
        wide += _WIDE(1) << _WIDE(shift - 1)
        wide >>= _WIDE(shift)
    return sat8(wide)


MAX_SHIFT = 63


def requantize_channels(x_i32: np.ndarray, table: np.ndarray, channel: np.ndarray) -> np.ndarray:
    """Per-channel requantize: element i uses the (mult, shift) pair table[channel[i]], by the `requantize` rule.
    A shift outside [0, 63] is a fault (the scalar form's shift field cannot hold one)."""
    if x_i32.dtype != np.int32:
        raise Fault(f"requantize needs i32 input, got {x_i32.dtype}")
    pairs = np.asarray(table, np.int32).reshape(-1, 2)
    mult, shift = pairs[channel, 0].astype(_WIDE), pairs[channel, 1].astype(_WIDE)
    if shift.size and (shift.min() < 0 or shift.max() > MAX_SHIFT):
        raise Fault(
            f"per-channel requantize: shift {int(shift.max() if shift.max() > MAX_SHIFT else shift.min())} "
            f"outside [0, {MAX_SHIFT}]"
        )
    rounding = np.where(shift > 0, _WIDE(1) << np.maximum(shift - 1, 0), 0)
    return sat8((x_i32.astype(_WIDE) * mult + rounding) >> shift)


def quantize(x_f32: np.ndarray, scale: float) -> np.ndarray:
    """int8 = sat8(round_half_even(x * f32(scale))), NaN -> 0."""
    if x_f32.dtype != np.float32:
        raise Fault(f"quantize needs f32 input, got {x_f32.dtype}")
    with np.errstate(all="ignore"):
        scaled = np.rint(x_f32 * _F32(scale))
    scaled[np.isnan(scaled)] = 0
    return np.clip(scaled, I8_MIN, I8_MAX).astype(np.int8)
