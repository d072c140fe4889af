"""`static` is TVM's FuseOps: its groups, stated in domain terms, on hand-built graphs (TVM itself is checked
against in bench/bench_tvm.py, not here: it is a bench-only dependency)."""

from __future__ import annotations

import numpy as np
from engine_helpers import model
from transformer_graphs import BlockShape, transformer

from fusion.cost import AnalyticCostModel
from fusion.engine.context import ModelContext
from fusion.engine.fuse_ops import fuse_ops
from fusion.engine.planner import Evaluator, plan_static
from fusion.graph.builder import GraphBuilder
from fusion.graph.ir import Graph
from fusion.graph.ops import OpType
from simulator.config import load_config


def _ops(graph: Graph) -> list[str]:
    return ["+".join(graph.node(n).op.value for n in group) for group in fuse_ops(graph)]


def _linear(b: GraphBuilder, x: str, k: int, n: int, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    w = b.constant(rng.standard_normal((k, n)).astype(np.float32))
    return b.op(OpType.Add, b.op(OpType.MatMul, x, w), b.constant(rng.standard_normal(n).astype(np.float32)))


def test_matmul_add_gelu_is_one_group() -> None:
    b = GraphBuilder()
    b.output(b.op(OpType.Gelu, _linear(b, b.input("x", (16, 32)), 32, 48), approximate="none"))
    assert _ops(b.build()) == ["MatMul+Add+Gelu"]


def test_a_reduction_starts_its_own_group() -> None:
    """The residual Add before a LayerNorm does not join it (nothing joins a reduction from before), and the
    Softmax after a scaled score MatMul is a group of its own; the scaling Mul joins the MatMul."""
    b = GraphBuilder()
    x = b.input("x", (16, 32))
    h = b.op(OpType.Add, _linear(b, x, 32, 32), x)
    b.output(
        b.op(
            OpType.LayerNorm,
            h,
            b.constant(np.ones(32, np.float32)),
            b.constant(np.zeros(32, np.float32)),
            axis=1,
            epsilon=1e-5,
        )
    )
    assert _ops(b.build()) == ["MatMul+Add+Add", "LayerNorm"]
    b = GraphBuilder()
    q, k = b.input("q", (2, 16, 8)), b.input("k", (2, 8, 16))
    s = b.op(OpType.Mul, b.op(OpType.MatMul, q, k), b.constant(np.float32(0.5)))
    b.output(b.op(OpType.Softmax, s, axis=2))
    assert _ops(b.build()) == ["MatMul+Mul", "Softmax"]


def test_a_transpose_is_absorbed_by_its_injective_and_elementwise_consumers_not_by_a_matmul() -> None:
    """A head split (Reshape + Transpose) and the scaling Mul after it: one group; a Transpose feeding a MatMul
    stays alone (the MatMul is out-elementwise-fusable); a value that is a graph output is never fused on."""
    b = GraphBuilder()
    x = b.input("x", (1, 16, 32))
    h = b.op(OpType.Transpose, b.op(OpType.Reshape, x, shape=(1, 16, 2, 16)), perm=(0, 2, 1, 3))
    b.output(b.op(OpType.Mul, h, b.constant(np.float32(0.25))))
    assert _ops(b.build()) == ["Reshape+Transpose+Mul"]
    b = GraphBuilder()
    t = b.op(OpType.Transpose, b.input("x", (32, 16)), perm=(1, 0))
    b.output(b.op(OpType.MatMul, t, b.constant(np.ones((32, 8), np.float32))))
    assert _ops(b.build()) == ["Transpose", "MatMul"]
    b = GraphBuilder()
    r = b.op(OpType.Relu, b.input("x", (8, 8)))
    b.output(r, b.op(OpType.Exp, r))
    assert _ops(b.build()) == ["Relu", "Exp"]


def test_static_runs_each_tvm_group_with_the_kernel_library() -> None:
    """Every static group lies inside one TVM group and covers it with the library's kernels: the FFN's
    MatMul + bias + Gelu through the swapped GEMM's chain epilogue, the scores' MatMul + scaling as a stream,
    the bundled encoder's head split + scaling (Transpose + Reshape + Mul) as a layout chain."""
    for graph, fused_ops in (
        (transformer(BlockShape(seq=16, dim=32, heads=2))[0], {"MatMul+Add+Gelu", "MatMul+Mul", "MatMul+Add+Add"}),
        (model("encoder_post_d64")[0], {"Transpose+Reshape+Mul", "MatMul+Add+Add"}),
    ):
        mc = ModelContext(graph, load_config("base"), "fp32")
        plan = plan_static(Evaluator(mc, AnalyticCostModel(), {}))
        tvm = {n: set(g) for g in fuse_ops(graph) for n in g}
        assert all(set(c.group.nodes) <= tvm[c.group.nodes[0]] for c in plan.choices)
        fused = {"+".join(graph.node(n).op.value for n in c.group.nodes) for c in plan.choices}
        assert fused_ops <= fused
        assert sorted(n for c in plan.choices for n in c.group.nodes) == sorted(n.name for n in graph.nodes)


def _static_groups(graph: Graph, dtype: str) -> list[tuple[str, ...]]:
    """Static's groups, each in graph order, in the order of their first node (as `fuse_ops` lists TVM's)."""
    mc = ModelContext(graph, load_config("base"), dtype)
    order = {n.name: i for i, n in enumerate(graph.nodes)}
    groups = [
        tuple(sorted(c.group.nodes, key=order.__getitem__))
        for c in plan_static(Evaluator(mc, AnalyticCostModel(), {})).choices
    ]
    return sorted(groups, key=lambda g: order[g[0]])


def _conv(b: GraphBuilder, x: str, cin: int, cout: int, kernel: int, stride: int, rng: np.random.Generator) -> str:
    w = (rng.standard_normal((cout, cin, kernel, kernel)) / np.sqrt(cin * kernel * kernel)).astype(np.float32)
    bias = (0.1 * rng.standard_normal(cout)).astype(np.float32)
    pads = (kernel // 2,) * 4
    return b.op(
        OpType.Conv, x, b.constant(w), b.constant(bias), strides=(stride, stride), pads=pads, dilations=(1, 1), group=1
    )


def test_static_runs_a_downsampling_residual_block_as_tvm_groups() -> None:
    """A ResNet block that halves the resolution (BatchNorm folded at import): stride-2 Conv + Relu, Conv + the
    residual Add + Relu, the stride-2 1x1 shortcut Conv alone (the Add already belongs to the other Conv's group:
    one anchor per group). Static runs each TVM group as one conv kernel (epilogue: bias, residual, Relu)."""
    rng = np.random.default_rng(3)
    b = GraphBuilder()
    x = b.input("x", (1, 16, 8, 8))
    h = b.op(OpType.Relu, _conv(b, x, 16, 32, 3, 2, rng))
    h = _conv(b, h, 32, 32, 3, 1, rng)
    b.output(b.op(OpType.Relu, b.op(OpType.Add, h, _conv(b, x, 16, 32, 1, 2, rng))))
    graph = b.build()
    assert _ops(graph) == ["Conv+Relu", "Conv+Add+Relu", "Conv"]
    for dtype in ("fp32", "int8"):
        assert _static_groups(graph, dtype) == fuse_ops(graph)


def test_a_gemm_feeding_a_silu_gate_is_one_tvm_group_and_one_kernel() -> None:
    """LLaMA's MLP: the gate GEMM, the SiLU reading its output twice (Sigmoid, Mul) and the Mul by the up
    projection are one TVM group (the up GEMM and the down GEMM stand alone: one anchor per group); static runs
    it as one stream kernel (the GEMM's drained tiles feed the chain)."""
    rng = np.random.default_rng(5)
    b = GraphBuilder()
    x = b.input("x", (16, 32))
    gate = b.op(OpType.MatMul, x, b.constant(rng.standard_normal((32, 48)).astype(np.float32)))
    silu = b.op(OpType.Mul, gate, b.op(OpType.Sigmoid, gate))
    up = b.op(OpType.MatMul, x, b.constant(rng.standard_normal((32, 48)).astype(np.float32)))
    h = b.op(OpType.Mul, silu, up)
    b.output(b.op(OpType.MatMul, h, b.constant(rng.standard_normal((48, 32)).astype(np.float32))))
    graph = b.build()
    assert _ops(graph) == ["MatMul+Sigmoid+Mul+Mul", "MatMul", "MatMul"]
    assert _static_groups(graph, "fp32") == fuse_ops(graph)
