"""Lower bounds on a GEMM group's matrix-unit time, from shapes alone, to skip generating dominated schedules.

Planning generates, links and counts a kernel for every schedule it compares; most of that time goes to GEMM
schedules that cannot win. Every GEMM schedule issues at least one `mx.mm` per (GEMM, weight panel, k-slice)
of its orientation and streams a known number of rows in total: the pipelined array needs at least a preload's
time per weight tile or a cycle per row, whichever is more, plus one 2N - 1 skew (`timing.matrix_lower_bound`),
which bounds the analytic model's prediction and the simulated cycles from below, so a schedule whose bound is
above the best prediction so far is never built (branch and bound). Other strategies get
bound 0 (always built). The strategy record names its bound (`strategies.matrix_bound`).

`cycle_bound` bounds a built kernel's simulated cycles from its counted program, so a measurement that only
matters under a budget (`planner.Evaluator.measured_within`: the plan guard's rivals, `settle`'s) is not simulated
when the bound is already past it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from fusion.engine.codegen.matrix_group import EPILOGUE_HEADS
from fusion.engine.codegen.swapped import matrix_head
from fusion.engine.context import ModelContext
from fusion.engine.plan import Group
from simulator import timing

if TYPE_CHECKING:  # fusion.cost imports the strategies, which import this module
    from fusion.cost.interface import KernelFeatures


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _gemm_shape(mc: ModelContext, group: Group) -> tuple[int, int, int, int] | None:
    """(m, k, n, batch) of the group's matrix node, None when it has no 2-D-or-more matrix operands."""
    graph = mc.graph
    head = matrix_head([graph.node(n) for n in group.nodes])
    if head.op not in EPILOGUE_HEADS:
        return None
    a, b = (graph.types[v].shape for v in head.inputs[:2])
    if len(a) < 2 or len(b) < 2:
        return None
    return a[-2], a[-1], b[-1], math.prod(np.broadcast_shapes(a[:-2], b[:-2]))


def _cycles(mc: ModelContext, instrs: int, rows: int) -> float:
    return timing.matrix_lower_bound(mc.config, instrs, rows)


def gemm_bound(mc: ModelContext, group: Group) -> float:
    """One preload + mm per (GEMM, panel, k-slice); each GEMM streams its rows once per panel and k-slice."""
    shape = _gemm_shape(mc, group)
    if shape is None:
        return 0.0
    m, k, n, batch = shape
    n_arr = mc.config.array_size
    gemms = 1 if group.flatten else batch
    per_gemm = m * batch if group.flatten else m
    instrs = gemms * _ceil(n, n_arr) * _ceil(k, n_arr)
    return _cycles(mc, instrs, gemms * per_gemm * _ceil(n, n_arr) * _ceil(k, n_arr))


def swapped_bound(mc: ModelContext, group: Group) -> float:
    """The swapped orientation: n_out rows streamed per k-slice, one A^T preload per k-slice."""
    shape = _gemm_shape(mc, group)
    if shape is None:
        return 0.0
    _, k, n, _ = shape
    k_slices = _ceil(k, mc.config.array_size)
    return _cycles(mc, k_slices, n * k_slices)


def cycle_bound(mc: ModelContext, feats: KernelFeatures) -> int:
    """A lower bound on the simulated cycles of a kernel whose program runs without zero tests (every generator
    but the zero-skip ones emits no branch; the conv generators' `loopi` bodies are counted as they issue,
    `features.program_counts`), so its counted instructions are the executed ones: the scalar unit issues each at
    least `scalar_cycles` apart, and the matrix unit takes its preloads and matmul rows
    (`timing.matrix_lower_bound`). 0 for a kernel that tests tiles."""
    if feats.zero_tests:
        return 0
    issue = feats.instructions * timing.scalar_cycles(mc.config)
    return max(issue, timing.matrix_lower_bound(mc.config, feats.preloads, feats.matmul_rows))
