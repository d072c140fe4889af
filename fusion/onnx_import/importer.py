"""Import an ONNX model into a fusion Graph, specialised to concrete input shapes.

All problems (unknown operators, unsupported attributes or dtypes, malformed nodes) are collected over the whole
model and raised together as one UnsupportedModelError, so a user sees every node that needs work at once. The
import does not stop at an unsupported node: its outputs get the types ONNX's own shape inference gives them
(placeholders, never run) and every node after it is still converted and checked; only a node that cannot be
checked without the missing values (it reads a placeholder's value, or one without an inferred type) is skipped
silently, as a consequence of a problem already listed.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import helper

from fusion.errors import FusionError, GraphError, Problem, UnsupportedModelError
from fusion.graph.assemble import assemble
from fusion.graph.ir import DataType, DimAssumption, Graph, TensorType
from fusion.onnx_import.attributes import tensor_array
from fusion.onnx_import.context import Consequence, ImportContext, Malformed, Unsupported
from fusion.onnx_import.converters import CONVERTERS, convert_node
from fusion.onnx_import.placeholders import inferred_types
from fusion.onnx_import.provenance import union

MIN_OPSET = 13
DEFAULT_DOMAINS = ("", "ai.onnx")


def load(model: onnx.ModelProto | str | Path) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    try:
        return onnx.load(str(model))
    except (OSError, DecodeError, ValueError, onnx.checker.ValidationError) as err:
        reason = " ".join(str(err).split())  # one line
        raise FusionError(f"cannot read ONNX model {model}: {reason}") from None


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


def _check_size(name: str, ttype: TensorType) -> None:
    """A value that flows at run time with a zero-size dim has no data for any kernel to work on."""
    if 0 in ttype.shape:
        raise Unsupported(f"value {name!r} has a zero-size dimension ({ttype}); dynfuse needs non-empty tensors")


def _constant(tensor: onnx.TensorProto) -> np.ndarray:
    array = tensor_array(tensor, f"initializer {tensor.name!r}")
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
    cx = ImportContext(keep=frozenset(o.name for o in graph.output))
    problems: list[Problem] = []
    broken = cx.placeholders
    initializers = {t.name for t in graph.initializer}
    inputs: dict[str, TensorType] = {}
    for info in graph.input:
        if info.name in initializers:
            continue
        try:
            if info.name in bind:
                cx.add_constant(info.name, np.asarray(bind[info.name]))
            else:
                ttype = _value_type(info, shapes)
                _check_size(info.name, ttype)
                inputs[info.name] = cx.types[info.name] = ttype
        except (Unsupported, GraphError) as err:
            problems.append(Problem(f"<input {info.name}>", "input", "feature", str(err)))
            broken.add(info.name)
    for tensor in graph.initializer:
        try:
            cx.add_constant(tensor.name, _constant(tensor))
        except (Unsupported, GraphError) as err:
            kind = "malformed" if isinstance(err, Malformed) else "feature"
            problems.append(Problem(f"<initializer {tensor.name}>", "initializer", kind, str(err)))
            broken.add(tensor.name)
    problems.extend(_convert_nodes(cx, proto, broken, shapes))
    problems.extend(_empty_values(cx))
    if problems:
        raise UnsupportedModelError(tuple(problems), header=f"cannot import ONNX model {graph.name!r}")
    outputs = [o.name for o in graph.output]
    assumptions = [*cx.assumptions, *_output_assumptions(cx, outputs)]
    result = assemble(graph.name or "model", inputs, cx.constants, cx.nodes, outputs, assumptions)
    _check_declared_outputs(result, graph)
    return result


def _convert_nodes(
    cx: ImportContext, proto: onnx.ModelProto, broken: set[str], shapes: Mapping[str, tuple[int, ...]]
) -> list[Problem]:
    """Convert every node, collecting problems. The outputs of a node that fails become placeholders typed by
    ONNX shape inference (in `broken`): later nodes reading them are still converted, so their own problems are
    listed too; a later node that fails only because it reads a placeholder is not listed again."""
    problems: list[Problem] = []
    fallback: dict[str, TensorType] | None = None
    for index, n in enumerate(proto.graph.node):
        base = n.name or f"{n.op_type}_{index}"
        tainted = any(v in broken for v in n.input)
        problem = None
        if n.domain not in DEFAULT_DOMAINS or n.op_type not in CONVERTERS:
            domain = f"{n.domain}::" if n.domain not in DEFAULT_DOMAINS else ""
            problem = Problem(base, n.op_type, "op", f"operator {domain}{n.op_type} is not supported{_hint(n)}")
        elif any(v and v not in cx.types for v in n.input):
            if not tainted:
                missing = [v for v in n.input if v and v not in cx.types]
                problem = Problem(base, n.op_type, "malformed", f"reads undefined value(s) {missing}")
        else:
            try:
                convert_node(cx, n, base)
            except Consequence:
                pass
            except Malformed as err:
                problem = Problem(base, n.op_type, "malformed", str(err))
            except (Unsupported, GraphError) as err:
                problem = Problem(base, n.op_type, "feature", str(err))
            except IndexError as err:  # a required input is absent
                problem = Problem(base, n.op_type, "malformed", f"missing input ({err})")
            else:
                if tainted:
                    broken.update(n.output)
                continue
        if problem is not None:
            problems.append(problem)
        broken.update(n.output)
        if fallback is None:
            fallback = inferred_types(proto, shapes)
        for out in n.output:
            if out and out not in cx.types and out in fallback:
                cx.types[out] = fallback[out]
    return problems


def _hint(n: onnx.NodeProto) -> str:
    if n.domain not in DEFAULT_DOMAINS:
        return f" (custom domain {n.domain!r}: export with standard ONNX operators)"
    return " (export it as supported operators, or add a converter in fusion/onnx_import/converters.py)"


def _empty_values(cx: ImportContext) -> list[Problem]:
    problems = []
    for node in cx.nodes:
        for out in node.outputs:
            if 0 in cx.types[out].shape:
                reason = f"output {out!r} is empty ({cx.types[out]}); dynfuse needs non-empty run-time tensors"
                problems.append(Problem(node.name, node.op.value, "feature", reason))
    return problems


def _output_assumptions(cx: ImportContext, outputs: list[str]) -> list[DimAssumption]:
    """A graph output the import folded to a constant holds for the dims it was computed from."""
    facts = []
    for name in outputs:
        for value, axis in sorted(union(cx.deps.get(name, frozenset()))):
            facts.append(DimAssumption(f"<output {name}>", value, axis, cx.types[value].shape[axis]))
    return facts


def _check_declared_outputs(result: Graph, graph: onnx.GraphProto) -> None:
    for info in graph.output:
        dims = info.type.tensor_type.shape.dim
        declared = tuple(d.dim_value if d.HasField("dim_value") else None for d in dims)
        got = result.types[info.name].shape
        if dims and None not in declared and declared != got:
            raise GraphError(f"output {info.name!r}: model declares shape {declared}, import infers {got}")
