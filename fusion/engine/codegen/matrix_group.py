"""A matrix node and the consumers its epilogue absorbs, as a `FusedGemm` per batch (or one flattened GEMM).

Absorbable consumers, in the order the drain applies them: Add of a per-column constant (bias, only when the
matrix node has none), Add of a same-shaped tensor (residual), Relu. On the int8 path only Relu keeps the
arithmetic of the unfused kernels (requantize(relu(t)) = relu(requantize(t))); a bias Add after an int8 MatMul
runs in float32 on the requantized value, so fusing it skips that requantization: only with
`rounding_change`, the bias is then quantized to accumulator units and the drain writes float32 (t * s_a * s_w).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import product

import numpy as np

from fusion.engine.codegen.gemm import FusedGemm, Schedule, fused_gemm_steps, is_dense, row_blocks
from fusion.engine.errors import CodegenError
from fusion.graph.ir import Graph, Node
from fusion.graph.ops import OpType
from fusion.lower.context import LowerContext, bias_form, const_key
from fusion.lower.emitter import Step
from fusion.lower.kernels.gemm import Operand
from fusion.lower.kernels.matrix import bias_view, matrix_operand, requant
from fusion.lower.views import View, dense
from isa.enums import DType

EPILOGUE_HEADS = frozenset({OpType.MatMul, OpType.Gemm})
PACKED = "panels"  # constant-form key of a weight packed panel-major (see gemm.pack_panels)


@dataclass(frozen=True)
class EpilogueOps:
    bias: str | None  # value of a per-column bias (the matrix node's own, or an absorbed Add's constant)
    residual: str | None
    relu: bool


def _other(node: Node, value: str) -> str:
    a, b = node.inputs
    return b if a == value else a


def is_column_vector(graph: Graph, value: str, n: int) -> bool:
    shape = graph.types[value].shape
    return graph.is_constant(value) and math.prod(shape) == n and (not shape or shape[-1] == n)


def epilogue_ops(graph: Graph, nodes: Sequence[Node], heads: frozenset[OpType] = EPILOGUE_HEADS) -> EpilogueOps:
    """Classify the absorbed consumers; raises CodegenError naming the first that the drain cannot apply."""
    head = nodes[0]
    if head.op not in heads:
        raise CodegenError(f"node {head.name!r} ({head.op.value}) cannot head a GEMM epilogue")
    out_shape = graph.types[head.outputs[0]].shape
    bias = head.inputs[2] if len(head.inputs) > 2 else None
    residual, relu, value, stage = None, False, head.outputs[0], 0
    for node in nodes[1:]:
        if node.inputs[0] != value and (len(node.inputs) < 2 or node.inputs[1] != value):
            raise CodegenError(f"node {node.name!r} does not consume {value!r}")
        if node.op == OpType.Relu and stage <= 2:
            relu, stage = True, 3
        elif (
            node.op == OpType.Add
            and stage == 0
            and bias is None
            and is_column_vector(graph, _other(node, value), out_shape[-1])
        ):
            bias, stage = _other(node, value), 1
        elif node.op == OpType.Add and stage <= 1 and graph.types[_other(node, value)].shape == out_shape:
            if graph.is_constant(_other(node, value)):
                raise CodegenError(f"node {node.name!r}: a constant residual is not supported")
            residual, stage = _other(node, value), 2
        else:
            raise CodegenError(f"node {node.name!r} ({node.op.value}) cannot be applied by the drain epilogue here")
        value = node.outputs[0]
    return EpilogueOps(bias, residual, relu)


def _lift(view: View, rank: int) -> View:
    if len(view.shape) < 2:
        raise CodegenError("a fused GEMM needs operands of rank 2 or more")
    pad = rank - len(view.shape)
    return replace(view, shape=(1,) * pad + view.shape, strides=(0,) * pad + view.strides)


def can_flatten(cx: LowerContext, nodes: Sequence[Node]) -> bool:
    """Batched A (dense) times a 2-D weight: all batches are one GEMM over their stacked rows."""
    head = nodes[0]
    a, b = (cx.graph.types[v].shape for v in head.inputs[:2])
    return len(a) > 2 and len(b) == 2


def matrix_group_steps(
    cx: LowerContext, nodes: Sequence[Node], schedule: Schedule, flatten: bool, rounding_change: bool = False
) -> list[Step]:
    graph, head = cx.graph, nodes[0]
    ops = epilogue_ops(graph, nodes)
    skips_requant = cx.int8 and ops.bias is not None and ops.bias != own_bias(head)
    if cx.int8 and ops.residual is not None:
        raise CodegenError("int8: a residual Add after the requantization cannot move into the drain")
    if skips_requant and not rounding_change:
        raise CodegenError("int8: a bias Add after the requantization moves into the drain only with rounding change")
    q = cx.matrix(head) if cx.int8 else None
    a = matrix_operand(cx, head, head.inputs[0], q.input_scale if q else None)
    b = matrix_operand(cx, head, head.inputs[1], q.weight_scale if q else None)
    out = cx.view(nodes[-1].outputs[0])
    rank = max(len(a.view.shape), len(b.view.shape))
    av, bv = _lift(a.view, rank), _lift(b.view, rank)
    m, n = av.shape[-2], bv.shape[-1]
    batch = tuple(int(d) for d in np.broadcast_shapes(av.shape[:-2], bv.shape[:-2]))
    out = out.reshape_dense((*batch, m, n))
    res = None if ops.residual is None else cx.view(ops.residual).broadcast_to((*batch, m, n))
    bias = None if ops.bias is None else bias_of(cx, head, ops.bias, n)
    requant_mult = None if skips_requant else requant(cx, head)
    packed = packed_weight(cx, head)
    out_scale = q.accumulator_scale if skips_requant and q is not None else 1.0
    if flatten:
        if not can_flatten(cx, nodes) or not is_dense(av) or (res is not None and not is_dense(res)):
            raise CodegenError(f"node {head.name!r}: only a dense batched A times a 2-D weight can be flattened")
        rows = math.prod(batch) * m
        g = FusedGemm(
            Operand(av.reshape_dense((rows, av.shape[-1])), a.quantize_scale),
            Operand(bv.index((0,) * len(batch)), b.quantize_scale),
            out.reshape_dense((rows, n)),
            bias,
            None if res is None else res.reshape_dense((rows, n)),
            ops.relu,
            requant_mult,
            out_scale,
            packed,
        )
        return fused_gemm_steps(cx.config, g, schedule, alone=True, rotation=cx.rotation)
    if schedule.resident_a and math.prod(batch) > 1:
        raise CodegenError("A-stationary order needs one GEMM (a batched MatMul runs one GEMM per batch)")
    a_full, b_full = av.broadcast_to((*batch, m, av.shape[-1])), bv.broadcast_to((*batch, bv.shape[-2], n))
    steps: list[Step] = []
    blocks = 0
    for index in product(*(range(d) for d in batch)):
        g = FusedGemm(
            Operand(a_full.index(index), a.quantize_scale),
            Operand(b_full.index(index), b.quantize_scale),
            out.index(index),
            bias,
            None if res is None else res.index(index),
            ops.relu,
            requant_mult,
            out_scale,
            packed,
        )
        alone = math.prod(batch) == 1
        steps.extend(fused_gemm_steps(cx.config, g, schedule, len(steps), blocks, alone, cx.rotation))
        blocks += row_blocks(cx.config, g, schedule)
    return steps


def packable_weight(graph: Graph, head: Node) -> str | None:
    """The head's weight when it is a 2-D constant (packed panel-major in the kernel's data)."""
    w = head.inputs[1]
    return w if graph.is_constant(w) and len(graph.types[w].shape) == 2 else None


def packed_weight(cx: LowerContext, head: Node) -> View | None:
    w = packable_weight(cx.graph, head)
    key = const_key(w, PACKED) if w else None
    if key is None or key not in cx.addresses:
        return None
    k, n = cx.graph.types[w].shape
    n_arr = cx.config.array_size
    return dense(cx.addresses[key], (-(-n // n_arr), k, n_arr), DType.i8 if cx.int8 else DType.f32)


def own_bias(head: Node) -> str | None:
    return head.inputs[2] if len(head.inputs) > 2 else None


def bias_of(cx: LowerContext, head: Node, value: str, n: int) -> View:
    if value == own_bias(head):
        view = bias_view(cx, head)
        assert view is not None
    elif cx.int8:  # an absorbed Add's bias, quantized to accumulator units by the engine's DRAM image
        view = cx.const_view(value, bias_form(head.name))
    else:
        view = cx.view(value)
    if view.size != n:
        raise CodegenError(f"bias {value!r} has {view.size} elements, the drain needs one per column ({n})")
    return dense(view.address, (n,), view.dtype)
