"""The clean-up pipeline: every pass in a fixed order, repeated until the graph stops changing."""

from __future__ import annotations

from collections.abc import Callable

from fusion.graph.hashing import structural_hash
from fusion.graph.ir import Graph
from fusion.passes.batchnorm import fold_batchnorm
from fusion.passes.constant_fold import fold_constants
from fusion.passes.cse import eliminate_common_subexpressions
from fusion.passes.dce import eliminate_dead_nodes
from fusion.passes.gelu import fuse_gelu
from fusion.passes.layernorm import fuse_layernorm
from fusion.passes.noops import remove_noops
from fusion.passes.reshapes import merge_reshapes
from fusion.passes.transposes import cancel_transposes

Pass = Callable[[Graph], Graph]

CLEANUP_PASSES: tuple[Pass, ...] = (
    fold_batchnorm,
    fold_constants,
    remove_noops,
    fuse_layernorm,
    fuse_gelu,
    merge_reshapes,
    cancel_transposes,
    eliminate_common_subexpressions,
    eliminate_dead_nodes,
)


def cleanup(graph: Graph, passes: tuple[Pass, ...] = CLEANUP_PASSES, max_rounds: int = 8) -> Graph:
    """Apply `passes` in order until a round leaves the structural hash unchanged."""
    before = structural_hash(graph)
    for _ in range(max_rounds):
        for run in passes:
            graph = run(graph)
        after = structural_hash(graph)
        if after == before:
            break
        before = after
    return graph
