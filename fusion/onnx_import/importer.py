"""Import an ONNX model into a fusion Graph, specialised to concrete input shapes.

All problems (unknown operators, unsupported attributes or dtypes) are collected over the whole model and
raised together as one UnsupportedModelError, so a user sees every node that needs work at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import helper, numpy_helper

from fusion.errors import FusionError, GraphError, Problem, UnsupportedModelError
from fusion.graph.assemble import assemble
from fusion.graph.ir import DataType, Graph, TensorType
from fusion.onnx_import.context import ImportContext, Unsupported
from fusion.onnx_import.converters import CONVERTERS, convert_node

MIN_OPSET = 13
DEFAULT_DOMAINS = ("", "ai.onnx")


def load(model: onnx.ModelProto | str | Path) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    try:
        return onnx.load(str(model))
    except (OSError, DecodeError) as err:
        raise FusionError(f"cannot read ONNX model {model}: {err}") from None


def opset_version(model: onnx.ModelProto) -> int:
    versions = [o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS]
    if not versions:
        raise UnsupportedModelError((Problem("<model>", "opset", "feature", "model imports no default-domain opset"),))
    return versions[0]


def _value_type(info: onnx.ValueInfoProto, shapes: Mapping[str, tuple[int, ...]]) -> TensorType:
    tensor = info.type.tensor_type
    try:
        dtype = DataType.of(helper.tensor_dtype_to_np_dtype(tensor.elem_type))
    except (GraphError, KeyError, TypeError) as err:
        raise Unsupported(f"input dtype: {err}") from None
    if info.name in shapes:
        return TensorType(tuple(int(d) for d in shapes[info.name]), dtype)
    if not tensor.HasField("shape"):
        raise Unsupported(f"input has no shape; pass input_shapes={{{info.name!r}: (...)}}")
    dims = tuple(d.dim_value if d.HasField("dim_value") else d.dim_param or "?" for d in tensor.shape.dim)
    if any(isinstance(d, str) for d in dims):
        raise Unsupported(f"input shape {dims} is symbolic; pass input_shapes={{{info.name!r}: (...)}}")
    return TensorType(dims, dtype)


def _constant(tensor: onnx.TensorProto) -> np.ndarray:
    array = numpy_helper.to_array(tensor)
    try:
        DataType.of(array.dtype)
    except GraphError as err:
        raise Unsupported(f"initializer {tensor.name!r}: {err}") from None
    return array


def import_model(
    model: onnx.ModelProto | str | Path,
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    bind: Mapping[str, np.ndarray] | None = None,
) -> Graph:
    """A typed Graph for `model`. `input_shapes` fixes symbolic dims; `bind` turns inputs into constants."""
    proto = load(model)
    opset = opset_version(proto)
    if opset < MIN_OPSET:
        raise UnsupportedModelError((Problem("<model>", "opset", "feature", f"opset {opset} < {MIN_OPSET}"),))
    shapes, bind = dict(input_shapes or {}), dict(bind or {})
    graph = proto.graph
    cx = ImportContext()
    problems: list[Problem] = []
    broken: set[str] = set()
    initializers = {t.name for t in graph.initializer}
    inputs: dict[str, TensorType] = {}
    for info in graph.input:
        if info.name in initializers:
            continue
        try:
            if info.name in bind:
                cx.add_constant(info.name, np.asarray(bind[info.name]))
            else:
                inputs[info.name] = cx.types[info.name] = _value_type(info, shapes)
        except (Unsupported, GraphError) as err:
            problems.append(Problem(f"<input {info.name}>", "input", "feature", str(err)))
            broken.add(info.name)
    for tensor in graph.initializer:
        try:
            cx.add_constant(tensor.name, _constant(tensor))
        except Unsupported as err:
            problems.append(Problem(f"<initializer {tensor.name}>", "initializer", "feature", str(err)))
            broken.add(tensor.name)
    problems.extend(_convert_nodes(cx, graph, broken))
    if problems:
        raise UnsupportedModelError(tuple(problems), header=f"cannot import ONNX model {graph.name!r}")
    result = assemble(graph.name or "model", inputs, cx.constants, cx.nodes, [o.name for o in graph.output])
    _check_declared_outputs(result, graph)
    return result


def _convert_nodes(cx: ImportContext, graph: onnx.GraphProto, broken: set[str]) -> list[Problem]:
    """Convert every node; a node downstream of a failed one (or of a `broken` value) is skipped silently."""
    problems: list[Problem] = []
    for index, n in enumerate(graph.node):
        base = n.name or f"{n.op_type}_{index}"
        if n.domain not in DEFAULT_DOMAINS or n.op_type not in CONVERTERS:
            domain = f"{n.domain}::" if n.domain not in DEFAULT_DOMAINS else ""
            problems.append(Problem(base, n.op_type, "op", f"operator {domain}{n.op_type} is not supported"))
            broken.update(n.output)
            continue
        if any(v in broken for v in n.input):
            broken.update(n.output)
            continue
        try:
            convert_node(cx, n, base)
        except (Unsupported, GraphError) as err:
            problems.append(Problem(base, n.op_type, "feature", str(err)))
            broken.update(n.output)
        except (IndexError, KeyError) as err:  # a required input or attribute is absent
            problems.append(Problem(base, n.op_type, "malformed", f"missing input or attribute ({err})"))
            broken.update(n.output)
    return problems


def _check_declared_outputs(result: Graph, graph: onnx.GraphProto) -> None:
    for info in graph.output:
        dims = info.type.tensor_type.shape.dim
        declared = tuple(d.dim_value if d.HasField("dim_value") else None for d in dims)
        got = result.types[info.name].shape
        if dims and None not in declared and declared != got:
            raise GraphError(f"output {info.name!r}: model declares shape {declared}, import infers {got}")
