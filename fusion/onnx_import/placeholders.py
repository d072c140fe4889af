"""Types for the outputs of nodes the importer cannot convert, from ONNX's own shape inference.

They let the import go on past an unsupported node (its outputs become typed placeholders), so one error lists
every unsupported node of the model instead of the first layer of them.
"""

from __future__ import annotations

from collections.abc import Mapping

import onnx
from onnx import helper, shape_inference

from fusion.errors import GraphError
from fusion.graph.ir import DataType, TensorType


def _concrete(info: onnx.ValueInfoProto) -> TensorType | None:
    tensor = info.type.tensor_type
    if not info.type.HasField("tensor_type") or not tensor.HasField("shape"):
        return None
    dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
    if None in dims:
        return None
    try:
        return TensorType(tuple(dims), DataType.of(helper.tensor_dtype_to_np_dtype(tensor.elem_type)))
    except (GraphError, KeyError, TypeError, ValueError):
        return None


def inferred_types(model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, TensorType]:
    """Value name -> concrete type wherever ONNX shape inference finds one (empty if inference fails)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for info in copy.graph.input:
        if info.name in shapes and info.type.HasField("tensor_type"):
            dims = info.type.tensor_type.shape
            dims.ClearField("dim")
            for d in shapes[info.name]:
                dims.dim.add().dim_value = int(d)
    known = {o.domain for o in copy.opset_import}
    for domain in sorted({n.domain for n in copy.graph.node} - known - {"ai.onnx"}):
        copy.opset_import.add(domain=domain, version=1)  # else inference refuses the whole model
    try:
        inferred = shape_inference.infer_shapes(copy, strict_mode=False)
    except (shape_inference.InferenceError, onnx.checker.ValidationError, ValueError, RuntimeError, MemoryError):
        return {}
    values = (*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input)
    return {info.name: t for info in values if (t := _concrete(info)) is not None}
