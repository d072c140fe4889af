"""Helpers shared by the fusion tests (imported as a plain module: pytest puts this directory on sys.path)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fusion.graph.hashing import structural_hash
from fusion.graph.ir import Graph
from fusion.graph.shapes import verify
from fusion.reference.interpreter import run

MODELS_DIR = Path(__file__).resolve().parent / "models"
MODEL_NAMES = ("mlp", "encoder_post_d64", "encoder_pre_d64", "encoder_post_d128", "resnet_block")


def random_inputs(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {v: rng.standard_normal(graph.types[v].shape).astype(np.float32) for v in graph.inputs}


def check_pass(graph: Graph, run_pass, seed: int = 0, atol: float = 1e-5) -> Graph:
    """Apply a pass and check what every pass must keep: the input graph untouched, consistent types,
    the same inputs and output names, and the same results on random inputs."""
    before = structural_hash(graph)
    out = run_pass(graph)
    assert structural_hash(graph) == before, "pass modified its input graph"
    verify(out)
    assert out.inputs == graph.inputs and out.outputs == graph.outputs
    inputs = random_inputs(graph, seed)
    want, got = run(graph, inputs), run(out, inputs)
    for name in graph.outputs:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=atol)
    return out


def op_names(graph: Graph) -> list[str]:
    return [n.op.value for n in graph.nodes]
