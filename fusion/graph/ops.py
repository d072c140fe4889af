"""The closed set of IR operators and their fusion kinds.

Kinds follow TVM's op pattern kinds; the fusion planner decides legality from them. The order matters:
a lower kind can be fused into a consumer or producer group of a higher kind under TVM-style rules.
"""

from __future__ import annotations

import enum


class OpKind(enum.IntEnum):
    """How an operator maps input elements to output elements."""

    ELEMWISE = 0  # one output element from the same-index input element
    BROADCAST = 1  # elementwise after broadcasting inputs (binary arithmetic, per-channel affine)
    INJECTIVE = 2  # each output element is one input element somewhere else (layout, slicing, gather)
    REDUCTION = 3  # output depends on a whole row/axis of the input (reduce, softmax, layernorm)
    OUT_ELEMWISE_FUSABLE = 4  # matrix-unit ops (GEMM, conv) and pooling that can take elementwise consumers
    OPAQUE = 8  # cannot be fused with anything (no operator of the current set)


class OpType(enum.Enum):
    """Every operator the IR has. The ONNX importer maps ONNX operators onto these (docs in onnx_import)."""

    # elementwise unary
    Identity = "Identity"
    Relu = "Relu"
    Sigmoid = "Sigmoid"
    Tanh = "Tanh"
    Erf = "Erf"
    Gelu = "Gelu"
    Exp = "Exp"
    Sqrt = "Sqrt"
    # broadcasting binary and per-channel affine
    Add = "Add"
    Sub = "Sub"
    Mul = "Mul"
    Div = "Div"
    Pow = "Pow"
    BatchNorm = "BatchNorm"
    # layout / data movement
    Transpose = "Transpose"
    Reshape = "Reshape"
    Concat = "Concat"
    Split = "Split"
    Slice = "Slice"
    Gather = "Gather"
    # reductions and normalizations
    ReduceMean = "ReduceMean"
    Softmax = "Softmax"
    LayerNorm = "LayerNorm"
    # matrix unit and windows
    MatMul = "MatMul"
    Gemm = "Gemm"
    Conv = "Conv"
    MaxPool = "MaxPool"
    AveragePool = "AveragePool"

    @property
    def kind(self) -> OpKind:
        return OP_KIND[self]


_KIND_MEMBERS: dict[OpKind, tuple[OpType, ...]] = {
    OpKind.ELEMWISE: (
        OpType.Identity,
        OpType.Relu,
        OpType.Sigmoid,
        OpType.Tanh,
        OpType.Erf,
        OpType.Gelu,
        OpType.Exp,
        OpType.Sqrt,
    ),
    OpKind.BROADCAST: (OpType.Add, OpType.Sub, OpType.Mul, OpType.Div, OpType.Pow, OpType.BatchNorm),
    OpKind.INJECTIVE: (OpType.Transpose, OpType.Reshape, OpType.Concat, OpType.Split, OpType.Slice, OpType.Gather),
    OpKind.REDUCTION: (OpType.ReduceMean, OpType.Softmax, OpType.LayerNorm),
    OpKind.OUT_ELEMWISE_FUSABLE: (OpType.MatMul, OpType.Gemm, OpType.Conv, OpType.MaxPool, OpType.AveragePool),
}

OP_KIND: dict[OpType, OpKind] = {op: kind for kind, ops in _KIND_MEMBERS.items() for op in ops}

UNARY_ELEMWISE: frozenset[OpType] = frozenset(_KIND_MEMBERS[OpKind.ELEMWISE])
BINARY_BROADCAST: frozenset[OpType] = frozenset(_KIND_MEMBERS[OpKind.BROADCAST]) - {OpType.BatchNorm}
MATRIX_OPS: frozenset[OpType] = frozenset({OpType.MatMul, OpType.Gemm, OpType.Conv})


def _check_complete() -> None:
    missing = [op.name for op in OpType if op not in OP_KIND]
    if missing:
        raise AssertionError(f"operators without a kind: {missing}")


_check_complete()
