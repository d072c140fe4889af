"""The three execution models of one plan, measured: one program, host-dispatched kernels, the kernels' sum.

- sum of kernels: each planned group simulated as its own program (`execute.run_kernel`), values moved on the
  host, cycles added (what `CallResult.cycles` reports);
- host-dispatched: that sum plus `MachineConfig.launch_cycles` per launched kernel (alias groups launch nothing);
- program: the plan linked into one binary as the engine links it (`program_run.faster_link`), one simulation.

The overlap gained at each token-ordered boundary is its marginal effect: the same program with a fence at that
boundary only, minus the program's cycles (one more simulation per joined boundary).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fusion.engine.context import ModelContext
from fusion.engine.execute import run_kernel
from fusion.engine.kernel import build_kernel
from fusion.engine.plan import GroupChoice
from fusion.engine.program import Prefer, link_plan, run_program
from fusion.engine.program_run import faster_link


@dataclass(frozen=True)
class ProgramFigures:
    program_cycles: int
    kernel_cycles: int  # sum of the plan's kernels, each its own program
    launches: int  # kernels the host launches
    host_cycles: int  # kernel_cycles + launches x launch_cycles
    dispatch_cycles: int  # the on-chip dispatch measurements' cycles (inside program_cycles)
    boundaries: tuple[tuple[int, int, int], ...]  # (plan position before, after, cycles gained) per joined one
    fences: int  # boundaries that kept a fence
    joined: int  # token-ordered boundaries

    @property
    def overlap_cycles(self) -> int:
        """What one program saves over the kernels' sum (fences, overlapped loads), launches aside."""
        return self.kernel_cycles - self.program_cycles


def measure(
    mc: ModelContext,
    choices: Sequence[GroupChoice],
    inputs: Mapping[str, np.ndarray],
    prefer: Prefer | None = None,
    per_boundary: bool = True,
) -> ProgramFigures:
    """The three figures for a plan on these inputs (module docstring); `per_boundary=False` skips the marginal
    gain of each token-ordered boundary (one simulation of the whole program each: `boundaries` is then empty)."""
    env, kernels, launches = dict(inputs), 0, 0
    for choice in choices:
        kernel = build_kernel(mc, choice.group)
        run = run_kernel(mc, kernel, env)
        env.update(run.outputs)
        kernels += run.cycles
        launches += kernel.program is not None
    linked = faster_link(mc, choices, prefer)
    run = run_program(mc, linked, inputs)
    fences = frozenset(b.before for b in linked.boundaries if not b.joined)
    gained = []
    for b in linked.boundaries if per_boundary else ():
        if b.joined:
            fenced = run_program(mc, link_plan(mc, choices, prefer, fenced=fences | {b.before}), inputs)
            gained.append((b.before, b.after, fenced.cycles - run.cycles))
    return ProgramFigures(
        run.cycles,
        kernels,
        launches,
        kernels + launches * mc.config.launch_cycles,
        run.dispatch_cycles,
        tuple(gained),
        sum(not b.joined for b in linked.boundaries),
        sum(b.joined for b in linked.boundaries),
    )
