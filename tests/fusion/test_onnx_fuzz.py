"""Seeded, bounded fuzzing of the ONNX import: mutated models (attributes of other types and values, rewired or
missing inputs, truncated or re-typed initializers, other operator types, odd input dims) either import or raise
a dynfuse error; no other exception escapes. A few seconds; `FUZZ_CASES` scales it up for a longer run."""

from __future__ import annotations

import os
import random

import onnx
import pytest
from fusion_helpers import MODELS_DIR
from onnx import AttributeProto, helper

from fusion.onnx_import.importer import import_model
from isa.errors import DynfuseError

CASES = int(os.environ.get("FUZZ_CASES", "150"))
VALUES = (0, -1, 1, 3, 2**62, -(2**63), 1.5, float("inf"), float("nan"), "x", [0, 0], [1.0], [2**40, 1], ["a"])
NAMES = ("axis", "perm", "strides", "pads", "kernel_shape", "group", "alpha", "epsilon", "to", "axes", "mode")
OPS = (
    *("Relu", "Cast", "Expand", "Pad", "Range", "Where", "Slice", "Gather", "Conv", "Reshape", "Trilu", "Shape"),
    *("ConstantOfShape", "GatherElements", "ReduceSum", "Split", "Concat", "Clip", "Pow", "MaxPool", "Flatten"),
    *("Unsqueeze", "Squeeze", "Softmax", "LayerNormalization", "Gemm", "Transpose", "Unknown"),
)


def _attribute(name: str, value) -> AttributeProto:
    return helper.make_attribute(name, value)


def _mutate(model: onnx.ModelProto, rng: random.Random) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    for _ in range(rng.randint(1, 3)):
        node = rng.choice(g.node)
        kind = rng.randrange(7)
        if kind == 0 and node.attribute:
            attr = rng.choice(node.attribute)
            attr.CopyFrom(_attribute(attr.name, rng.choice(VALUES)))
        elif kind == 1:
            node.attribute.append(_attribute(rng.choice(NAMES), rng.choice(VALUES)))
        elif kind == 2 and node.input:
            i = rng.randrange(len(node.input))
            node.input[i] = rng.choice(["", "ghost", rng.choice(g.node).output[0], *node.input])
        elif kind == 3 and g.initializer:
            tensor = rng.choice(g.initializer)
            if tensor.raw_data:
                tensor.raw_data = tensor.raw_data[: rng.randrange(len(tensor.raw_data) + 1)]
            else:
                tensor.dims.append(rng.choice([0, 2, 7]))
        elif kind == 4:
            node.op_type = rng.choice(OPS)
        elif kind == 5 and g.input[0].type.tensor_type.shape.dim:
            rng.choice(g.input[0].type.tensor_type.shape.dim).dim_value = rng.choice([0, 1, 3, 2**31])
        elif kind == 6 and g.initializer:
            rng.choice(g.initializer).data_type = rng.choice([1, 3, 7, 9, 10, 11, 16])
    return out


@pytest.mark.parametrize("name", ["mlp", "resnet_block", "encoder_pre_d64"])
def test_mutated_models_import_or_raise_a_dynfuse_error(name) -> None:
    model = onnx.load(str(MODELS_DIR / f"{name}.onnx"))
    rng = random.Random(f"fuzz-{name}")
    outcomes = {"imported": 0, "refused": 0}
    for _ in range(CASES):
        mutant = _mutate(model, rng)
        try:
            import_model(mutant)
            outcomes["imported"] += 1
        except DynfuseError:
            outcomes["refused"] += 1
    assert outcomes["refused"] > CASES // 4, outcomes  # the mutations do reach the checks
