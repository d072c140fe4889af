"""Fuzzing the front door: mutated bundled ONNX models through `dynfuse fuse` (import, passes, planning under
each policy, fp32 and int8, kernels, simulation). Mutations change attribute values and types, shapes and
dimensions, op types, node wiring, initializer data and types, and add external-data references. Only the
project's errors may escape: `dynfuse.cli.main` turns those into exit code 1; anything else propagates and fails
the fuzzer."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import onnx
from fuzz_helpers import fuzz, pick
from onnx import AttributeProto, TensorProto

from dynfuse.cli import main

MODELS = Path(__file__).resolve().parents[1] / "fusion" / "models"
SEEDS = [onnx.load(MODELS / f"{name}.onnx") for name in ("mlp", "resnet_block")]
OPS = ["MatMul", "Gemm", "Relu", "Add", "Conv", "Transpose", "Reshape", "Softmax", "Unsqueeze", "Gelu", "Erf"]
INTS = [0, -1, 1, 2, 3, 2**31, 2**63 - 1, -(2**63)]
FLOATS = [0.0, -1.0, 1e-30, 1e30, float("nan"), float("inf")]


def _mutate_attribute(attr: AttributeProto, rng: np.random.Generator) -> None:
    choice = int(rng.integers(0, 5))
    if choice == 0:
        attr.type, attr.i = AttributeProto.INT, pick(rng, INTS)
    elif choice == 1:
        attr.type, attr.f = AttributeProto.FLOAT, pick(rng, FLOATS)
    elif choice == 2:
        del attr.ints[:]
        attr.type = AttributeProto.INTS
        attr.ints.extend(pick(rng, INTS) for _ in range(int(rng.integers(0, 5))))
    elif choice == 3:
        attr.type, attr.s = AttributeProto.STRING, b"x"
    else:
        attr.name = pick(rng, ["axis", "perm", "strides", "pads", "kernel_shape", "alpha", "transB", "group"])


def _mutate(model: onnx.ModelProto, rng: np.random.Generator) -> None:
    graph = model.graph
    for _ in range(int(rng.integers(1, 4))):
        choice = int(rng.integers(0, 7))
        node = pick(rng, list(graph.node))
        if choice == 0 and node.attribute:
            _mutate_attribute(pick(rng, list(node.attribute)), rng)
        elif choice == 1:
            node.op_type = pick(rng, OPS)
        elif choice == 2 and node.input:
            node.input[int(rng.integers(0, len(node.input)))] = pick(
                rng, [v.name for v in graph.value_info] + ["nope", ""]
            )
        elif choice == 3 and graph.initializer:
            init = pick(rng, list(graph.initializer))
            if init.raw_data and rng.random() < 0.5:
                init.raw_data = init.raw_data[: int(rng.integers(0, len(init.raw_data)))]
            elif rng.random() < 0.5:
                init.data_type = pick(rng, [TensorProto.INT64, TensorProto.DOUBLE, TensorProto.FLOAT16, 0])
            else:
                init.data_location = TensorProto.EXTERNAL
                entry = init.external_data.add()
                entry.key, entry.value = "location", "missing.bin"
        elif choice == 4:
            dims = pick(rng, list(graph.input)).type.tensor_type.shape.dim
            if dims:
                dims[int(rng.integers(0, len(dims)))].dim_value = pick(rng, [0, 1, 3, 4096])
        elif choice == 5 and node.attribute:
            del node.attribute[int(rng.integers(0, len(node.attribute)))]
        elif choice == 6:
            graph.node.remove(node)


def test_fuzz_onnx_models_through_fuse(tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"

    def case(rng: np.random.Generator) -> str:
        model = onnx.ModelProto()
        model.CopyFrom(pick(rng, SEEDS))
        _mutate(model, rng)
        path.write_bytes(model.SerializeToString())
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            policy, dtype = pick(rng, ["none", "static", "dynamic"]), pick(rng, ["fp32", "int8"])
            argv = ["fuse", str(path), "--config", "tiny", "--workers", "1", "--validate", "always"]
            code = main([*argv, "--policy", policy, "--dtype", dtype])
        return "fused" if code == 0 else "rejected"

    counts = fuzz("ONNX models through fuse", case, ())
    assert counts["rejected"]
