"""BatchNorm folding: y = (x - mean) / sqrt(var + eps) * scale + bias is a per-channel affine a*x + b.

Folded into the producing Conv (W*a, B*a + b), Gemm or 2-D MatMul with constant weights (B*a, C*a + b) when
the BN is that producer's only consumer; otherwise rewritten as Mul + Add with constant [C,1,..] factors,
so the lowering never meets a BatchNorm with constant parameters.
"""

from __future__ import annotations

import numpy as np

from fusion.graph.assemble import rebuild
from fusion.graph.ir import Graph, Node, make_node
from fusion.graph.ops import OpType
from fusion.passes.rewrite import fresh_name


def affine(graph: Graph, bn: Node) -> tuple[np.ndarray, np.ndarray] | None:
    """(a, b) per channel, or None if some BN parameter is not a constant."""
    params = [graph.constants.get(v) for v in bn.inputs[1:]]
    if any(p is None for p in params):
        return None
    scale, bias, mean, var = (p.astype(np.float64) for p in params)
    a = scale / np.sqrt(var + bn.attr("epsilon"))
    return a, bias - mean * a


def _foldable_producer(graph: Graph, bn: Node) -> Node | None:
    x = bn.inputs[0]
    prod = graph.producers.get(x)
    if prod is None or x in graph.outputs or len(graph.consumers.get(x, ())) != 1:
        return None
    if prod.op == OpType.Conv and graph.is_constant(prod.inputs[1]):
        return prod
    if prod.op in (OpType.Gemm, OpType.MatMul) and graph.is_constant(prod.inputs[1]):
        two_d = graph.types[prod.inputs[0]].rank == 2 and graph.types[prod.inputs[1]].rank == 2
        bias_ok = len(prod.inputs) < 3 or graph.is_constant(prod.inputs[2])
        return prod if two_d and bias_ok else None
    return None


def _f32(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32)


def fold_batchnorm(graph: Graph) -> Graph:
    constants = dict(graph.constants)
    replaced: dict[str, Node] = {}  # producer name -> folded node
    dropped: set[str] = set()
    extra: dict[str, list[Node]] = {}  # BN name -> its Mul/Add replacement
    taken: set[str] = set()

    def new_const(stem: str, value: np.ndarray) -> str:
        name = fresh_name(graph, stem, taken)
        taken.add(name)
        constants[name] = _f32(value)
        return name

    for bn in graph.nodes:
        if bn.op != OpType.BatchNorm:
            continue
        ab = affine(graph, bn)
        if ab is None:
            continue
        a, b = ab
        prod = _foldable_producer(graph, bn)
        if prod is not None:
            w = graph.constants[prod.inputs[1]].astype(np.float64)
            old_bias = graph.constants[prod.inputs[2]].astype(np.float64) if len(prod.inputs) > 2 else 0.0
            # Conv weights are [M, C, k...] (scale rows); Gemm/MatMul weights are [K, N] (scale columns)
            w = w * a.reshape((-1,) + (1,) * (w.ndim - 1)) if prod.op == OpType.Conv else w * a
            w_name = new_const(f"{prod.name}/bn_weight", w)
            b_name = new_const(f"{prod.name}/bn_bias", old_bias * a + b)
            op = OpType.Conv if prod.op == OpType.Conv else OpType.Gemm
            replaced[prod.name] = make_node(
                prod.name, op, (prod.inputs[0], w_name, b_name), bn.outputs, **prod.attr_dict
            )
            dropped.add(bn.name)
            continue
        shape = (-1,) + (1,) * (graph.types[bn.inputs[0]].rank - 2)
        a_name = new_const(f"{bn.name}/scale", a.reshape(shape))
        b_name = new_const(f"{bn.name}/shift", b.reshape(shape))
        mid = fresh_name(graph, f"{bn.name}/scaled", taken)
        taken.add(mid)
        extra[bn.name] = [
            make_node(mid, OpType.Mul, (bn.inputs[0], a_name), (mid,)),
            make_node(bn.name, OpType.Add, (mid, b_name), bn.outputs),
        ]
    # A folded producer now writes its BN's output where it stood; every reader of that output came after the BN.
    nodes: list[Node] = []
    for node in graph.nodes:
        if node.name in dropped:
            continue
        nodes.extend(extra.get(node.name, [replaced.get(node.name, node)]))
    return rebuild(graph, nodes, constants)
