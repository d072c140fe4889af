"""The overlap a kernel boundary gains when the plan runs as one program, predicted without simulating.

In one program (`fusion.engine.program`) a boundary is token-ordered instead of fenced where the dependences allow
(`pipelined.join_phases`): the next kernel's first loads that read nothing the previous kernel writes (its weights,
values from before that kernel) are issued while the previous kernel still computes its last step. So the boundary
gains, at most, the time those loads take (a DMA's latency plus their bytes at the channel's rate), and at most the
previous kernel's compute tail (one of its pipeline steps) they can hide under. Both come from the kernels'
features and the cost model's predicted cycles, as the planner prices everything else:

    overlap(A, B) = min(dram_latency + independent first-step bytes of B / DRAM bytes per cycle,
                        predicted cycles of A / its pipeline steps)

and 0 where the link keeps a fence (a strategy that is not pipelinable, a host view) or B's first step loads
nothing independent. B's first-step bytes are its DRAM reads per step, the independent share by the bytes of its
inputs that A does not produce. The planner subtracts it from the separate kernels' score when it weighs a fusion
(`Evaluator(overlap=...)`): fusing two kernels also removes the boundary whose overlap a program would have had.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from fusion.cost.interface import KernelFeatures
from fusion.engine.context import ModelContext
from fusion.engine.plan import Group
from fusion.engine.strategies import strategy_of
from fusion.lower.context import storage_dtype


class Priced(Protocol):
    """A planned kernel as the planner prices it (`planner.Evaluated`)."""

    group: Group
    features: KernelFeatures
    cycles: float


def boundary_overlap(mc: ModelContext, before: Priced, after: Priced) -> float:
    """Predicted cycles the boundary between `before` and the next kernel `after` gains in one program (module
    docstring)."""
    first, second = strategy_of(before.group), strategy_of(after.group)
    if not (first.pipelinable and second.pipelinable):
        return 0.0
    feats, cfg = after.features, mc.config
    independent = independent_fraction(mc, before.group, after.group)
    first_step = feats.dram_read_bytes / max(1, feats.steps) * independent
    if first_step <= 0:
        return 0.0
    loads = cfg.dram_latency + first_step / cfg.dram_bytes_per_cycle
    tail = before.cycles / max(1, before.features.steps)
    return min(loads, tail)


def independent_fraction(mc: ModelContext, before: Group, after: Group) -> float:
    """The share of `after`'s input bytes that `before` does not write (what its loads need not wait for)."""
    graph, written = mc.graph, set(mc.subgraph(before.nodes).outputs)
    nodes = [graph.node(n) for n in after.nodes]
    inside = {v for n in nodes for v in n.outputs}
    sizes = {v: _bytes(mc, v) for n in nodes for v in n.inputs if v and v not in inside}  # weights included
    total = sum(sizes.values())
    return sum(b for v, b in sizes.items() if v not in written) / total if total else 0.0


def chain_overlap(mc: ModelContext, kernels: Sequence[Priced]) -> float:
    """The predicted overlap of consecutive kernels run one after another in a program (the boundaries between
    them; host views launch nothing and are skipped)."""
    run = [k for k in kernels if not strategy_of(k.group).host_view]
    return sum(boundary_overlap(mc, a, b) for a, b in zip(run, run[1:], strict=False))


def _bytes(mc: ModelContext, value: str) -> int:
    """The value's DRAM bytes as the kernels read it (0 for a non-float constant, e.g. a shape: no DMA reads it)."""
    t = mc.graph.types[value]
    if t.dtype.numpy != np.float32:
        return 0
    return math.prod(t.shape) * storage_dtype(mc.graph, mc.qplan, value).size
