"""Lower bounds on a GEMM group's matrix-unit time, from shapes alone, to skip generating dominated schedules.

Planning generates, links and counts a kernel for every schedule it compares; most of that time goes to GEMM
schedules that cannot win. Every GEMM schedule issues at least one `mx.mm` per (GEMM, weight panel, k-slice)
of its orientation and streams a known number of rows in total, and the analytic model charges each instruction
`timing.matmul_cycles` (rows + 2N - 1) plus a preload: that sum bounds its predicted cycles from below, so a
schedule whose bound is above the best prediction so far is never built (branch and bound). Other strategies get
bound 0 (always built).
"""

from __future__ import annotations

import math

import numpy as np

from fusion.engine.codegen.matrix_group import EPILOGUE_HEADS
from fusion.engine.codegen.swapped import matrix_head
from fusion.engine.context import ModelContext
from fusion.engine.plan import Group
from simulator import timing


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def matrix_bound(mc: ModelContext, group: Group) -> float:
    """Cycles the matrix unit needs at least for this group's schedule (0 when not a dense GEMM schedule)."""
    if group.strategy not in ("epilogue", "swapped"):
        return 0.0
    graph, cfg = mc.graph, mc.config
    head = matrix_head([graph.node(n) for n in group.nodes])
    if head.op not in EPILOGUE_HEADS:
        return 0.0
    a, b = (graph.types[v].shape for v in head.inputs[:2])
    if len(a) < 2 or len(b) < 2:
        return 0.0
    n_arr = cfg.array_size
    m, k, n = a[-2], a[-1], b[-1]
    batch = math.prod(np.broadcast_shapes(a[:-2], b[:-2]))
    k_slices = _ceil(k, n_arr)
    if group.strategy == "swapped":  # n_out rows streamed per k-slice, one A^T preload per k-slice
        instrs, rows = k_slices, n * k_slices
    else:  # one preload + mm per (GEMM, panel, k-slice); each GEMM streams its rows once per panel and k-slice
        gemms = 1 if group.flatten else batch
        per_gemm = m * batch if group.flatten else m
        instrs = gemms * _ceil(n, n_arr) * k_slices
        rows = gemms * per_gemm * _ceil(n, n_arr) * k_slices
    return rows + instrs * (2 * n_arr - 1 + timing.preload_cycles(cfg))
