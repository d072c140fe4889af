"""Typed access to ONNX node attributes: the one place an attribute's type and range are checked.

A converter asks for `a.int("group", 1)` or `a.ints("strides")`; an attribute of the wrong ONNX type, an integer
outside the range a shape or window can have, or a non-finite float where a number is needed is a Malformed
problem naming the attribute, never a TypeError or OverflowError from deep inside a converter.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, numpy_helper

from fusion.onnx_import.context import Malformed

_MISSING = object()
# attributes that size or index tensors stay far below this (a dim of 2^40 elements is no model dynfuse runs)
INT_LIMIT = 1 << 40
_TYPE_NAMES = {v: k for k, v in AttributeProto.AttributeType.items()}


def _type_name(attr: AttributeProto) -> str:
    return _TYPE_NAMES.get(attr.type, str(attr.type))


class Attrs:
    """The attributes of one ONNX node, read with their expected types."""

    def __init__(self, node: onnx.NodeProto) -> None:
        self._by_name = {a.name: a for a in node.attribute}

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def _get(self, name: str, default: Any, want: tuple[int, ...], what: str) -> AttributeProto | Any:
        attr = self._by_name.get(name)
        if attr is None:
            if default is _MISSING:
                raise Malformed(f"required attribute {name!r} is missing")
            return default
        if attr.type not in want:
            raise Malformed(f"attribute {name!r} must be {what}, got {_type_name(attr)}")
        return attr

    @staticmethod
    def _check_int(name: str, value: int, low: int, high: int) -> int:
        if not low <= value <= high:
            raise Malformed(f"attribute {name!r} = {value} is outside [{low}, {high}]")
        return int(value)

    def int(self, name: str, default: Any = _MISSING, low: int = -INT_LIMIT, high: int = INT_LIMIT) -> int:
        attr = self._get(name, default, (AttributeProto.INT,), "an int")
        if not isinstance(attr, AttributeProto):
            return attr
        return self._check_int(name, attr.i, low, high)

    def ints(self, name: str, default: Any = _MISSING, low: int = -INT_LIMIT, high: int = INT_LIMIT) -> tuple[int, ...]:
        attr = self._get(name, default, (AttributeProto.INTS,), "a list of ints")
        if not isinstance(attr, AttributeProto):
            return attr
        return tuple(self._check_int(name, v, low, high) for v in attr.ints)

    def float(self, name: str, default: Any = _MISSING, finite: bool = True) -> float:
        attr = self._get(name, default, (AttributeProto.FLOAT, AttributeProto.INT), "a float")
        if not isinstance(attr, AttributeProto):
            return attr
        value = float(attr.f if attr.type == AttributeProto.FLOAT else attr.i)
        if finite and not math.isfinite(value):
            raise Malformed(f"attribute {name!r} = {value} is not finite")
        return value

    def floats(self, name: str, default: Any = _MISSING) -> tuple[float, ...]:
        attr = self._get(name, default, (AttributeProto.FLOATS,), "a list of floats")
        return tuple(float(v) for v in attr.floats) if isinstance(attr, AttributeProto) else attr

    def string(self, name: str, default: Any = _MISSING) -> str:
        attr = self._get(name, default, (AttributeProto.STRING,), "a string")
        if not isinstance(attr, AttributeProto):
            return attr
        try:
            return attr.s.decode()
        except UnicodeDecodeError:
            raise Malformed(f"attribute {name!r} is not UTF-8 text") from None

    def tensor(self, name: str, default: Any = _MISSING) -> np.ndarray:
        attr = self._get(name, default, (AttributeProto.TENSOR,), "a tensor")
        if not isinstance(attr, AttributeProto):
            return attr
        return tensor_array(attr.t, f"attribute {name!r}")


def tensor_array(tensor: onnx.TensorProto, what: str) -> np.ndarray:
    """A TensorProto's data, or Malformed when its bytes do not hold its declared shape (a truncated file) or
    it points at external data that is absent."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        info = {e.key: e.value for e in tensor.external_data}
        raise Malformed(
            f"{what}: data is in external file {info.get('location', '?')!r}, which was not loaded "
            "(keep it next to the model file, or save the model with its weights inside)"
        )
    try:
        return numpy_helper.to_array(tensor)
    except (ValueError, TypeError) as err:
        dims = list(tensor.dims)
        raise Malformed(f"{what}: data does not fill its shape {dims} (truncated or corrupt: {err})") from None
