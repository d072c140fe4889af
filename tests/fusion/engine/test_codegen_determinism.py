"""Generator output is a function of the generator's arguments: no module-level counter or context variable
changes what a kernel's program holds (`Emitter.local_label`, `LowerContext.rotation`)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from engine_helpers import context, linear_relu_graph, model

from assembler.builder import ProgramBuilder
from fusion.engine.candidates import enumerate_candidates, schedules, zero_skip_twin
from fusion.engine.context import ModelContext
from fusion.engine.errors import CodegenError
from fusion.engine.kernel import dram_forms, group_phases
from fusion.engine.pipelined import ALL_SLOTS, step_slots
from fusion.engine.plan import Group
from fusion.lower import emit_phases, plan_dram
from fusion.lower.context import LowerContext
from fusion.lower.emitter import Emitter, Step
from fusion.lower.errors import LoweringError
from fusion.lower.local_alloc import DEPTH


class _Recording(ProgramBuilder):
    """A builder that also keeps the label names it is given (labels local to a program never reach the binary,
    so the object file alone cannot show a label that depends on what was built before)."""

    def __init__(self) -> None:
        super().__init__(data_base=0)
        self.labels: list[str] = []

    def label(self, name: str) -> str:
        self.labels.append(name)
        return super().label(name)


def _phases(mc: ModelContext, group: Group, rotation: int = 0) -> list[list[Step]]:
    sub = mc.subgraph(group.nodes)
    forms, scratch = dram_forms(mc, sub, group)
    _, addresses, _ = plan_dram(sub, mc.qplan, mc.config, forms, whole_program=True, scratch=scratch)
    cx = LowerContext(sub, mc.config, mc.qplan, mc.params, addresses, rotation=rotation)
    return group_phases(cx, sub.nodes, group, mc.allow_rounding_change)


def _emit(mc: ModelContext, group: Group) -> tuple[list[str], tuple[int, ...]]:
    """The group's labels and instruction words."""
    b = _Recording()
    emit_phases(b, Emitter(b), _phases(mc, group))
    b.halt()
    return b.labels, b.build().text


@pytest.fixture(scope="module")
def gemm() -> ModelContext:
    graph = linear_relu_graph()
    x = {"x": np.random.default_rng(0).standard_normal((64, 128)).astype(np.float32)}
    return context(graph, x, "int8")


def test_zero_skip_labels_do_not_depend_on_programs_built_before(gemm: ModelContext) -> None:
    a, b = Group(("fc", "relu"), "zero_skip"), Group(("fc", "relu"), "zero_skip", panels=2)
    first = _emit(gemm, a)
    assert first[0], "the zero-skip kernel branches over skipped k-slices"
    _emit(gemm, b)
    assert _emit(gemm, a) == first


def test_same_output_from_threads_in_any_order(gemm: ModelContext) -> None:
    groups = [Group(("fc", "relu"), "zero_skip", panels=p) for p in (1, 2, 0)] * 4
    serial = {g: _emit(gemm, g) for g in groups}
    with ThreadPoolExecutor(4) as pool:
        for order in (groups, groups[::-1]):
            for g, out in zip(order, pool.map(lambda g: _emit(gemm, g), order), strict=True):
                assert out == serial[g]


def _rotated(slots: frozenset[int], rotation: int) -> frozenset[int]:
    if slots == ALL_SLOTS:
        return slots
    return frozenset((s + rotation) % DEPTH if s < DEPTH else s for s in slots)


@pytest.mark.parametrize("name", ["mlp", "encoder_post_d64", "resnet_block"])
def test_rotation_moves_every_generators_tiles(name: str) -> None:
    """Generated with rotation r, step j's tiles lie in the slots step j's tiles did without it, each moved by r:
    every generator (every strategy, the unfused baseline's too) honours the argument at every allocation."""
    graph, x = model(name)
    mc = context(graph, x, "int8")
    moved, strategies = 0, set()
    for cand in enumerate_candidates(graph):
        for group in (g for s in schedules(mc, cand) for g in (s, zero_skip_twin(s)) if g is not None):
            if group.strategy == "alias":
                continue
            try:
                plain = _phases(mc, group)
            except (CodegenError, LoweringError):
                continue
            strategies.add(group.strategy)
            for rotation in range(1, DEPTH):
                turned = _phases(mc, group, rotation)
                for phase, phase_r in zip(plain, turned, strict=True):
                    for step, step_r in zip(phase, phase_r, strict=True):
                        slots = step_slots(mc.config, step)
                        assert step_slots(mc.config, step_r) == _rotated(slots, rotation), (group, rotation)
                        moved += slots != ALL_SLOTS and _rotated(slots, rotation) != slots
    assert moved > 0 and len(strategies) >= 3
