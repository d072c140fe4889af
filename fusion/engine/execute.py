"""Run kernels on the simulator, moving tensors between them in their storage dtype."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from fusion.engine.context import ModelContext
from fusion.engine.kernel import Kernel
from fusion.engine.views import apply_view
from simulator.run import simulate


@dataclass(frozen=True)
class KernelRun:
    outputs: dict[str, np.ndarray]
    cycles: int
    dram_read_bytes: int
    dram_write_bytes: int
    energy_pj: float
    counters: Any  # simulator counters (None for host-side alias kernels)


def run_kernel(
    mc: ModelContext,
    kernel: Kernel,
    env: Mapping[str, np.ndarray],
    checked: bool = False,
    max_cycles: int | None = None,
    timing_only: bool = False,
) -> KernelRun:
    """Simulate a kernel on `env`; `max_cycles`: a tighter watchdog than the machine's (a SimulatorTrap past it);
    `timing_only`: the counters without the values (`simulator.run.simulate`; no outputs)."""
    if kernel.program is None:  # a view: applied on the host, no kernel
        (src,), (dst,) = kernel.inputs, kernel.outputs
        node = mc.graph.node(kernel.group.nodes[0])
        return KernelRun({dst: apply_view(mc.graph, node, env[src])}, 0, 0, 0, 0.0, None)
    names = kernel.symbols or {}
    config = mc.config if max_cycles is None else replace(mc.config, max_cycles=max_cycles)
    inputs = {names[v]: env[v] for v in kernel.inputs}
    result = simulate(kernel.program, config, inputs, checked=checked, timing_only=timing_only)
    c = result.counters
    outputs = {} if timing_only else {v: result.outputs[names[v]] for v in kernel.outputs}
    return KernelRun(
        outputs, int(c.cycle), int(c.dram_read_bytes), int(c.dram_write_bytes), float(c.energy_total_pj), c
    )


def timing_cycles(mc: ModelContext, kernel: Kernel, checked: bool = False, max_cycles: int | None = None) -> int:
    """A kernel's cycles on zero inputs of its guard's shapes and storage dtypes: its timing, for any kernel
    whose control flow does not test data (every kernel but the zero-skip ones). Simulated timing only (the
    simulator then computes values only for a kernel whose control flow tests them). `max_cycles`: as
    `run_kernel`."""
    shapes, dtypes = dict(kernel.guard.shapes), dict(kernel.guard.dtypes)
    env = {v: np.zeros(shapes[v], dtype=dtypes[v]) for v in kernel.inputs}
    return run_kernel(mc, kernel, env, checked=checked, max_cycles=max_cycles, timing_only=True).cycles


def to_real(mc: ModelContext, value: str, data: np.ndarray) -> np.ndarray:
    scale = mc.scale(value)
    return data if scale is None else data.astype(np.float32) * np.float32(scale)
