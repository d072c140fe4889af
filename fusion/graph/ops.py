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
    OPAQUE = 8  # cannot be fused with anything (shape/constant generators, folded before lowering)


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
    Neg = "Neg"
    Abs = "Abs"
    Reciprocal = "Reciprocal"
    Sin = "Sin"
    Cos = "Cos"
    Clip = "Clip"  # attrs min, max (float32; -inf/inf when absent)
    HardSigmoid = "HardSigmoid"  # attrs alpha, beta: max(0, min(1, alpha * x + beta))
    HardSwish = "HardSwish"  # x * max(0, min(1, x / 6 + 1 / 2))
    Not = "Not"  # bool -> bool
    Cast = "Cast"  # attr to: a DataType value ("float32", "int64", "bool", ...)
    ConstantOfShape = "ConstantOfShape"  # no inputs; attrs shape, value, dtype
    Range = "Range"  # no inputs; attrs start, limit, delta, dtype
    # broadcasting binary and per-channel affine
    Add = "Add"
    Sub = "Sub"
    Mul = "Mul"
    Div = "Div"
    Pow = "Pow"
    Equal = "Equal"  # comparisons: any dtype in (both the same), bool out
    Less = "Less"
    LessOrEqual = "LessOrEqual"
    Greater = "Greater"
    GreaterOrEqual = "GreaterOrEqual"
    And = "And"  # bool, bool -> bool
    Or = "Or"
    Where = "Where"  # (condition bool, x, y) broadcast together
    Expand = "Expand"  # attr shape: the concrete output shape x broadcasts to
    BatchNorm = "BatchNorm"
    # layout / data movement
    Transpose = "Transpose"
    Reshape = "Reshape"
    Concat = "Concat"
    Split = "Split"
    Slice = "Slice"
    Gather = "Gather"
    GatherElements = "GatherElements"  # attr axis; inputs data, indices (same rank)
    Pad = "Pad"  # attrs pads (all begins then all ends, >= 0), mode ("constant"/"reflect"/"edge"), value
    Trilu = "Trilu"  # attrs upper (0/1), k: keep the lower/upper triangle of the last two axes, zero the rest
    Shape = "Shape"  # attrs start, end: int64 [end - start] dims of the input (depends on its type only)
    # reductions and normalizations
    ReduceMean = "ReduceMean"
    ReduceSum = "ReduceSum"  # attrs axes, keepdims (as ReduceMean)
    ReduceMax = "ReduceMax"
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


COMPARISONS_AND_LOGIC: tuple[OpType, ...] = (
    OpType.Equal,
    OpType.Less,
    OpType.LessOrEqual,
    OpType.Greater,
    OpType.GreaterOrEqual,
    OpType.And,
    OpType.Or,
)

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
        OpType.Neg,
        OpType.Abs,
        OpType.Reciprocal,
        OpType.Sin,
        OpType.Cos,
        OpType.Clip,
        OpType.HardSigmoid,
        OpType.HardSwish,
        OpType.Not,
        OpType.Cast,
    ),
    OpKind.BROADCAST: (
        OpType.Add,
        OpType.Sub,
        OpType.Mul,
        OpType.Div,
        OpType.Pow,
        *COMPARISONS_AND_LOGIC,
        OpType.BatchNorm,
        OpType.Where,
        OpType.Expand,
    ),
    OpKind.INJECTIVE: (
        OpType.Transpose,
        OpType.Reshape,
        OpType.Concat,
        OpType.Split,
        OpType.Slice,
        OpType.Gather,
        OpType.GatherElements,
        OpType.Pad,
        OpType.Trilu,
    ),
    OpKind.REDUCTION: (OpType.ReduceMean, OpType.ReduceSum, OpType.ReduceMax, OpType.Softmax, OpType.LayerNorm),
    OpKind.OUT_ELEMWISE_FUSABLE: (OpType.MatMul, OpType.Gemm, OpType.Conv, OpType.MaxPool, OpType.AveragePool),
    # computed from attributes or input types alone: the constant folder turns them into constants at import
    OpKind.OPAQUE: (OpType.ConstantOfShape, OpType.Range, OpType.Shape),
}

OP_KIND: dict[OpType, OpKind] = {op: kind for kind, ops in _KIND_MEMBERS.items() for op in ops}

UNARY_ELEMWISE: frozenset[OpType] = frozenset(_KIND_MEMBERS[OpKind.ELEMWISE])
BINARY_BROADCAST: frozenset[OpType] = frozenset(_KIND_MEMBERS[OpKind.BROADCAST]) - {
    OpType.BatchNorm,
    OpType.Where,
    OpType.Expand,
}
BOOL_RESULT: frozenset[OpType] = frozenset({*COMPARISONS_AND_LOGIC, OpType.Not})
# ops whose value follows from attributes and input *types*: foldable whenever their inputs' types are known
TYPE_ONLY: frozenset[OpType] = frozenset(_KIND_MEMBERS[OpKind.OPAQUE])
MATRIX_OPS: frozenset[OpType] = frozenset({OpType.MatMul, OpType.Gemm, OpType.Conv})


def _check_complete() -> None:
    missing = [op.name for op in OpType if op not in OP_KIND]
    if missing:
        raise AssertionError(f"operators without a kind: {missing}")


_check_complete()
