"""Node costs: MACs and bytes from first principles, and a roofline that is the max of compute and memory time."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from fusion.graph.builder import GraphBuilder
from fusion.graph.cost import graph_costs, group_cost, node_cost
from fusion.graph.metadata import graph_info
from fusion.graph.ops import OpKind, OpType
from fusion.lower import compile
from simulator.config import load_config

BASE = load_config("base")


def _one(op, shapes, consts=(), **attrs):
    b = GraphBuilder()
    ins = [b.input(f"x{i}", s) for i, s in enumerate(shapes)] + [b.constant(c) for c in consts]
    b.output(b.op(op, *ins, name="n", **attrs))
    g = b.build()
    return g, node_cost(g, g.node("n"), BASE)


def test_matmul_cost_is_roofline_of_macs_and_bytes() -> None:
    g, c = _one(OpType.MatMul, [(3, 64, 32), (32, 48)])
    assert c.macs == 3 * 64 * 32 * 48
    assert c.bytes_read == 4 * (3 * 64 * 32 + 32 * 48) and c.bytes_written == 4 * 3 * 64 * 48
    compute = c.macs / BASE.array_size**2
    memory = c.bytes / BASE.dram_bytes_per_cycle
    assert c.cycles == math.ceil(max(compute, memory))
    assert c.intensity == pytest.approx(c.macs / c.bytes)
    assert c.bound == ("compute" if compute >= memory else "memory")


def test_conv_macs_equal_im2col_gemm_size() -> None:
    w = np.zeros((8, 2, 3, 3), np.float32)
    g, c = _one(OpType.Conv, [(1, 4, 10, 10)], [w], strides=(2, 2), pads=(1, 1, 1, 1), dilations=(1, 1), group=2)
    out = g.types[g.outputs[0]].shape
    assert out == (1, 8, 5, 5)
    # im2col: rows = N*OH*OW, cols = C/g*KH*KW per group, M/g outputs per group
    assert c.macs == (1 * 5 * 5) * (2 * 3 * 3) * 8


def test_elementwise_is_memory_bound_and_views_are_free() -> None:
    _, c = _one(OpType.Relu, [(64, 64)])
    assert c.macs == 0 and c.vector_ops == 64 * 64 and c.bound == "memory"
    assert c.cycles == math.ceil(2 * 64 * 64 * 4 / BASE.dram_bytes_per_cycle)
    _, view = _one(OpType.Reshape, [(64, 64)], shape=(4096,))
    assert view.cycles == 0 and view.bytes == 0


def test_cost_scales_with_the_machine_and_element_size() -> None:
    g, _ = _one(OpType.MatMul, [(256, 256), (256, 256)])
    wide = dataclasses.replace(BASE, name="wide", array_size=32)
    slow, fast = (node_cost(g, g.node("n"), cfg).compute_cycles for cfg in (BASE, wide))
    assert slow == 4 * fast
    int8 = graph_costs(g, BASE, elem_bytes=1)["n"]
    assert int8.bytes * 4 == node_cost(g, g.node("n"), BASE).bytes


def test_node_info_bundles_types_kind_and_cost() -> None:
    g, c = _one(OpType.Gemm, [(8, 16), (16, 4)])
    (info,) = graph_info(g, BASE)
    assert info.op == OpType.Gemm and info.kind == OpKind.OUT_ELEMWISE_FUSABLE
    assert [t.shape for t in info.inputs] == [(8, 16), (16, 4)] and info.outputs[0].shape == (8, 4)
    assert info.cost == c and info.cost.macs == 8 * 16 * 4


def test_fused_group_moves_only_boundary_bytes() -> None:
    b = GraphBuilder()
    x = b.input("x", (64, 64))
    mm = b.op(OpType.MatMul, x, b.constant(np.ones((64, 64), np.float32)), name="mm")
    act = b.op(OpType.Relu, mm, name="act")
    b.output(b.op(OpType.Tanh, act, name="tail"))
    g = b.build()
    group = group_cost(g, ["mm", "act"], BASE)
    alone = [node_cost(g, g.node(n), BASE) for n in ("mm", "act")]
    assert group.macs == alone[0].macs and group.vector_ops == alone[1].vector_ops
    assert group.bytes_read == 2 * 64 * 64 * 4 and group.bytes_written == 64 * 64 * 4  # x + weight in, act out
    assert group.bytes == sum(c.bytes for c in alone) - 2 * 64 * 64 * 4  # mm's output never reaches DRAM
    assert group.cycles <= sum(c.cycles for c in alone)


@pytest.mark.parametrize(
    ("op", "shape", "consts", "attrs"),
    [
        (OpType.Relu, (6, 40), [], {}),
        (OpType.Gelu, (6, 40), [], {"approximate": "none"}),
        (OpType.Gelu, (6, 40), [], {"approximate": "tanh"}),
        (OpType.HardSwish, (6, 40), [], {}),
        (OpType.Clip, (6, 40), [], {"min": -1.0, "max": 6.0}),
        (OpType.Pow, (6, 40), [np.array(3.0, np.float32)], {}),
        (OpType.Mul, (6, 40), [np.array(0.5, np.float32)], {}),
        (OpType.Where, (6, 40), ["cond", np.zeros((6, 40), np.float32)], {}),
        (OpType.Trilu, (6, 40), [], {"upper": 1, "k": 0}),
        (OpType.BatchNorm, (1, 4, 6, 5), [np.ones(4, np.float32)] * 4, {"epsilon": 1e-5}),
        (OpType.Softmax, (6, 40), [], {"axis": 1}),
        (OpType.LayerNorm, (6, 40), [np.ones(40, np.float32), np.zeros(40, np.float32)], {"axis": 1, "epsilon": 1e-5}),
    ],
)
def test_vector_ops_are_the_element_operations_the_unfused_kernel_issues(op, shape, consts, attrs) -> None:
    """Counted from the op's vector recipe, so equal to the elements the baseline kernel's `v.*` instructions
    process (each instruction's element count, read off the compiled program): the count cannot drift from
    what the recipe emits."""
    b = GraphBuilder()
    x = b.input("x", shape)
    ins = [x]
    for c in consts:
        cond = np.arange(math.prod(shape)).reshape(shape) % 3 == 0
        ins.append(b.constant(cond) if isinstance(c, str) else b.constant(c))
    if op == OpType.Where:
        ins = [ins[1], x, ins[2]]
    b.output(b.op(op, *ins, name="n", **attrs))
    g = b.build()
    program = compile(g, "tiny", "fp32", cleanup=False).program
    issued = sum(i.field("n") for i in program.instructions() if i.mnemonic.startswith("v."))
    assert node_cost(g, g.node("n"), BASE).vector_ops == issued > 0
