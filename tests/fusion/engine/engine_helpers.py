"""Helpers for the fusion-engine tests: small hand-built graphs, model loading, running one group's kernel."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from fusion.engine.context import ModelContext
from fusion.engine.execute import run_kernel
from fusion.engine.kernel import build_kernel
from fusion.engine.plan import Group
from fusion.graph.builder import GraphBuilder
from fusion.graph.ir import Graph
from fusion.graph.ops import OpType
from fusion.lower.compiler import load_graph
from fusion.quant.calibrate import calibrate
from fusion.reference.interpreter import evaluate
from fusion.reference.quantized import evaluate_quantized
from simulator.config import load_config

MODELS = Path(__file__).resolve().parents[1] / "models"


def model(name: str) -> tuple[Graph, dict[str, np.ndarray]]:
    graph = load_graph(MODELS / f"{name}.onnx")
    data = np.load(MODELS / f"{name}.npz")
    return graph, {graph.inputs[0]: data["input"]}


def gemm_graph(m: int = 32, k: int = 48, n: int = 40, residual: bool = True, seed: int = 0) -> Graph:
    """x @ W + b (+ r) -> relu, with a separate bias Add (as ONNX exporters write a Linear layer)."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("gemm_epilogue")
    x = b.input("x", (m, k))
    h = b.op(OpType.MatMul, x, b.constant(rng.standard_normal((k, n)).astype(np.float32), "w"), name="mm")
    h = b.op(OpType.Add, h, b.constant(rng.standard_normal(n).astype(np.float32), "bias"), name="add_bias")
    if residual:
        h = b.op(OpType.Add, h, b.input("r", (m, n)), name="add_res")
    b.output(b.op(OpType.Relu, h, name="relu"))
    return b.build()


def linear_relu_graph(m: int = 64, k: int = 128, n: int = 64, seed: int = 0) -> Graph:
    """Gemm (bias inside) -> Relu: the int8-exact epilogue fusion."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("linear_relu")
    x = b.input("x", (m, k))
    w = b.constant((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), "w")
    bias = b.constant((rng.standard_normal(n) * 0.1).astype(np.float32), "bias")
    b.output(b.op(OpType.Relu, b.op(OpType.Gemm, x, w, bias, name="fc"), name="relu"))
    return b.build()


def sparse_activations(shape: tuple[int, int], tile: int, zero_tiles: float, seed: int = 0) -> np.ndarray:
    """ReLU-like activations whose column blocks (dead channel groups) are zero: about `zero_tiles` of the
    tile x tile blocks are all zero, and 70-90% of the elements are zero for zero_tiles ~ 0.6-0.8."""
    rng = np.random.default_rng(seed)
    x = np.maximum(rng.standard_normal(shape), 0).astype(np.float32)
    groups = shape[1] // tile
    dead = rng.permutation(groups)[: int(round(zero_tiles * groups))]
    for g in dead:
        x[:, g * tile : (g + 1) * tile] = 0
    return x


def context(graph: Graph, inputs: dict[str, np.ndarray], dtype: str, config: str = "base") -> ModelContext:
    params = calibrate(graph, [inputs]) if dtype == "int8" else None
    return ModelContext(graph, load_config(config), dtype, params)


def reference_env(mc: ModelContext, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every value as the kernels store it (int8 where the quantization plan says so)."""
    if mc.params is None:
        return evaluate(mc.graph, inputs)
    return {k: v.data for k, v in evaluate_quantized(mc.graph, inputs, mc.params).items()}


def run_group(mc: ModelContext, group: Group, inputs: dict[str, np.ndarray], sparsity: str = "any"):
    """Build the group's kernel and simulate it in checked (race-detecting) mode on reference inputs."""
    env = reference_env(mc, inputs)
    kernel = build_kernel(mc, group, sparsity)
    return kernel, run_kernel(mc, kernel, env, checked=True), env


def assert_reference(outputs: dict[str, np.ndarray], env: dict[str, np.ndarray], value: str, dtype: str, tol: float):
    """A kernel's output equals the (quantized) reference: int8 bit-exact, fp32 within `tol`."""
    if dtype == "int8":
        np.testing.assert_array_equal(outputs[value], env[value])
    else:
        np.testing.assert_allclose(outputs[value], env[value], rtol=tol, atol=tol)


def run_checked_on_x(graph: Graph, names: tuple[str, ...], strategy: str, dtype: str, tol: float = 1e-4):
    """The group of `names` run with `strategy` (race-checked) on a seeded random input `x`, its output checked
    against the reference; returns (context, kernel, run)."""
    rng = np.random.default_rng(3)
    inputs = {"x": rng.standard_normal(graph.types["x"].shape).astype(np.float32)}
    mc = context(graph, inputs, dtype)
    kernel, run, env = run_group(mc, Group(names, strategy), inputs)
    assert_reference(run.outputs, env, graph.outputs[0], dtype, tol)
    return mc, kernel, run


def gated_mlp_graph(lead: tuple[int, ...], m: int, k: int, n: int, act: str, seed: int = 0) -> Graph:
    """gate = x @ Wg, up = x @ Wu, act(gate) * up (act: silu, gelu or none), in LLaMA's export order (the
    activation between the two GEMMs)."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("gated")
    x = b.input("x", (*lead, m, k))
    g = b.op(OpType.MatMul, x, b.constant((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)), name="gate")
    if act == "silu":
        g = b.op(OpType.Mul, g, b.op(OpType.Sigmoid, g, name="sig"), name="silu")
    elif act == "gelu":
        g = b.op(OpType.Gelu, g, approximate="tanh", name="gelu")
    u = b.op(OpType.MatMul, x, b.constant((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)), name="up")
    b.output(b.op(OpType.Mul, g, u, name="gated"))
    return b.build()


def conv_graph(n, c, cout, spatial, kernel, strides, dilations, pads, groups, relu, seed=7):
    """One Conv (+ bias, optional Relu) with seeded fan-in-scaled weights; returns the graph and its node names."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("conv")
    x = b.input("x", (n, c, *spatial))
    fan_in = c // groups * math.prod(kernel)
    w = b.constant((rng.standard_normal((cout, c // groups, *kernel)) / np.sqrt(fan_in)).astype(np.float32), "w")
    bias = b.constant((rng.standard_normal(cout) * 0.1).astype(np.float32), "b")
    h = b.op(OpType.Conv, x, w, bias, name="conv", dilations=dilations, group=groups, pads=pads, strides=strides)
    names = ("conv",)
    if relu:
        h = b.op(OpType.Relu, h, name="relu")
        names += ("relu",)
    b.output(h)
    return b.build(), names


def rotary_graph(lead: tuple[int, ...], s: int, d: int, split: int, swap: bool, seed: int = 0) -> Graph:
    """x = (a @ W) seen as (*lead, s, d); out = x * cos + Concat(-x[..., split:], x[..., :split]) * sin (swap:
    Concat(x[..., split:], -x[..., :split])), cos and sin (s, d) constants broadcast over the leading axes."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("rotary")
    a = b.input("a", (*lead, s, 8))
    x = b.op(OpType.MatMul, a, b.constant(rng.standard_normal((8, d)).astype(np.float32)), name="proj")
    angle = rng.uniform(0, 6.3, (s, d)).astype(np.float32)
    cos, sin = b.constant(np.cos(angle)), b.constant(np.sin(angle))
    rank = len(lead) + 2
    lo = b.op(OpType.Slice, x, axes=(rank - 1,), starts=(0,), ends=(split,), steps=(1,), name="lo")
    hi = b.op(OpType.Slice, x, axes=(rank - 1,), starts=(split,), ends=(d,), steps=(1,), name="hi")
    if swap:
        rot = b.op(OpType.Concat, hi, b.op(OpType.Neg, lo, name="neg"), axis=rank - 1, name="cat")
    else:
        rot = b.op(OpType.Concat, b.op(OpType.Neg, hi, name="neg"), lo, axis=rank - 1, name="cat")
    xc = b.op(OpType.Mul, x, cos, name="xcos")
    b.output(b.op(OpType.Add, xc, b.op(OpType.Mul, rot, sin, name="rsin"), name="out"))
    return b.build()
