"""The three execution models of one plan, measured: one program, host-dispatched kernels, the kernels' sum.

- sum of kernels: each planned group simulated as its own program (`execute.run_kernel`), values moved on the
  host, cycles added (what `CallResult.cycles` reports);
- host-dispatched: that sum plus `MachineConfig.launch_cycles` per launched kernel (alias groups launch nothing);
- program: the plan linked into one binary as the engine links it and run on the inputs
  (`program_run.link_for_call`: the candidate's run and the fenced reference's).

The overlap gained at each token-ordered boundary is what the link measured when it kept the program (the
kernels' shares of the timeline against the fenced reference's, `program_run._gains`), so no simulation more. An
engine's call already holds all of it (`CallResult.program`): `of_call` reads the figures from there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fusion.engine.context import ModelContext
from fusion.engine.execute import run_kernel
from fusion.engine.kernel import build_kernel
from fusion.engine.plan import GroupChoice
from fusion.engine.program import Prefer
from fusion.engine.program_run import ProgramCall, link_for_call


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
    """The three figures for a plan on these inputs (module docstring); `per_boundary=False`: `boundaries` empty."""
    env, kernels, launches = dict(inputs), 0, 0
    for choice in choices:
        kernel = build_kernel(mc, choice.group)
        run = run_kernel(mc, kernel, env)
        env.update(run.outputs)
        kernels += run.cycles
        launches += kernel.program is not None
    linked, run = link_for_call(mc, choices, prefer, inputs)
    gained = linked.gains if per_boundary else ()
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


def of_call(call: ProgramCall, launches: int, launch_cycles: int) -> ProgramFigures:
    """The figures of an engine's program-mode call, from what it already measured (no simulation): the kernels'
    sum is the plan fenced at every boundary without on-chip dispatch, as the link ran it on the call that linked
    the program (each kernel as it runs alone); `launches`: the kernels a host would launch for the call."""
    return ProgramFigures(
        call.cycles,
        call.fenced_cycles,
        launches,
        call.fenced_cycles + launches * launch_cycles,
        call.dispatch_cycles,
        call.gains,
        sum(not b.joined for b in call.boundaries),
        sum(b.joined for b in call.boundaries),
    )
