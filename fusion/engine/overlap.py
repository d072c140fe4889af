"""The overlap a kernel boundary gains when the plan runs as one program, predicted without simulating.

In one program (`fusion.engine.program`) a boundary is token-ordered instead of fenced where the dependences allow
(`pipelined.join_phases`): the next kernel's first loads that read nothing the previous kernel writes, into slots
its last steps do not use, are issued right after the previous kernel's last loads, so they run under its last
step's compute. The gain is at most the time those loads take (a DMA's latency plus their bytes at the channel's
rate) and at most that compute tail:

    overlap(A, B) = min(dram_latency + early load bytes of B / DRAM bytes per cycle,
                        predicted cycles of A / its pipeline steps)

The early loads are the ones `join_phases` itself picks: the two kernels are generated in one small DRAM image
(their nodes' values and constant forms), B in the slots that follow A's last step, and joined, as the link does;
no simulation. The cycles are the cost model's prediction. 0 where the link would keep a fence (a strategy that
is not pipelinable, a host view, a join the generator refuses) or B loads nothing independent first. The planner
subtracts it from the separate kernels' score when it weighs a fusion (`Evaluator(overlap=)`): fusing kernels
also removes the boundaries whose overlap a program would have had.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from fusion.cost.interface import KernelFeatures
from fusion.engine.context import ModelContext
from fusion.engine.errors import CodegenError
from fusion.engine.kernel import dram_forms, group_phases
from fusion.engine.pipelined import join_phases
from fusion.engine.plan import Group
from fusion.engine.program import value_extent
from fusion.engine.strategies import strategy_of
from fusion.engine.views import is_view
from fusion.graph.ir import Graph
from fusion.lower import plan_dram
from fusion.lower.context import LowerContext
from fusion.lower.emitter import Step
from fusion.lower.local_alloc import DEPTH


class Priced(Protocol):
    """A planned kernel as the planner prices it (`planner.Evaluated`)."""

    group: Group
    features: KernelFeatures
    cycles: float


class BoundaryOverlap:
    """`overlap(before, after)` for one model context, each pair's early loads generated once (thread-safe)."""

    def __init__(self, mc: ModelContext) -> None:
        self.mc = mc
        self._early: dict[tuple[Group, Group], tuple[int, int]] = {}
        self._lock = threading.Lock()

    def __call__(self, before: Priced, after: Priced) -> float:
        """Predicted cycles the boundary between `before` and the next kernel `after` gains (module docstring)."""
        if not (strategy_of(before.group).pipelinable and strategy_of(after.group).pipelinable):
            return 0.0
        key = (before.group, after.group)
        with self._lock:
            found = self._early.get(key)
        if found is None:
            found = early_loads(self.mc, before.group, after.group)
            with self._lock:
                self._early[key] = found
        early, steps = found
        if not early:
            return 0.0
        cfg = self.mc.config
        return min(cfg.dram_latency + early / cfg.dram_bytes_per_cycle, before.cycles / max(1, steps))

    def chain(self, kernels: Sequence[Priced]) -> float:
        """The predicted overlap of kernels run one after another in a program (host views skipped: no kernel)."""
        run = [k for k in kernels if not strategy_of(k.group).host_view]
        return sum(self(a, b) for a, b in zip(run, run[1:], strict=False))


def early_loads(mc: ModelContext, before: Group, after: Group) -> tuple[int, int]:
    """(bytes of `after`'s loads a program issues under `before`'s last step, `before`'s pipeline steps): the two
    generated in one DRAM image and joined as `program.link_plan` joins them; (0, steps) when the join is refused."""
    graph = mc.graph
    names = set(before.nodes) | set(after.nodes)
    sub = mc.subgraph(graph.in_order(names))
    forms: dict[str, np.ndarray] = {}
    scratch: dict[str, int] = {}
    for g in (before, after):
        more, extra = dram_forms(mc, mc.subgraph(g.nodes), g)
        forms.update(more)
        scratch.update(extra)
    _, addresses, _ = plan_dram(sub, mc.qplan, mc.config, forms, whole_program=True, scratch=scratch)

    def generate(g: Group, rotation: int) -> tuple[list[list[Step]], LowerContext]:
        part = mc.subgraph(g.nodes)
        cx = LowerContext(part, mc.config, mc.qplan, mc.params, addresses, rotation=rotation)
        return [list(p) for p in group_phases(cx, part.nodes, g, mc.allow_rounding_change)], cx

    first, _ = generate(before, 0)
    steps = sum(1 for phase in first for s in phase if s.segments())
    last = [s for s in first[-1] if s.segments()]
    second, _ = generate(after, len(last) % DEPTH)
    # what `before` writes, as `after` reads it: its outputs and the views of them between the two (a view is its
    # input's bytes in a program, `program._place_views`; here it is a value of its own)
    whole = LowerContext(sub, mc.config, mc.qplan, mc.params, addresses)
    written = [value_extent(whole, v) for v in viewed(graph, mc.subgraph(before.nodes).outputs) if v in sub.types]
    try:
        joined, _ = join_phases(mc.config, first[-1], second[0], written)
    except CodegenError:
        return 0, steps
    added = joined[len(last) :]  # the early loads, as one extra load step after the producer's last one
    return sum(math.prod(v.shape) * v.dtype.size for s in added for v, _ in s.loads), steps


def viewed(graph: Graph, values: Sequence[str]) -> set[str]:
    """The values and every value views (Reshape, Identity, a slab Gather) make of them, in chains."""
    found = set(values)
    for node in graph.nodes:  # (graph order: a chain's views come in order)
        if is_view(graph, node) and node.inputs and node.inputs[0] in found:
            found.update(node.outputs)
    return found
