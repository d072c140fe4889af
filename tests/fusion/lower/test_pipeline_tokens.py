"""The token pipeline (`fusion.lower.emitter.run_pipeline`) orders every access of a step after the accesses of
the step that last used its buffers: checked on the simulator's race checker (the independent oracle) over random
unit sequences, each segment reading and writing its step's slot."""

from __future__ import annotations

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from assembler.builder import ProgramBuilder
from fusion.lower.emitter import Emitter, Step, run_pipeline
from isa.enums import Unit
from isa.memory_map import LOCAL_ACC_BASE
from simulator.run import simulate

N = 16  # f32 elements per row; the array's width on base
SLOT = N * N * 4  # one slot: a whole weight tile for mx.preload
COMPUTE = (Unit.matrix, Unit.vector)


def _segment(unit: Unit, step: int, slot: int):
    """One segment on `unit` that reads and writes (or reads) the step's slot, so an unordered neighbour races."""
    buf, acc = slot * SLOT, LOCAL_ACC_BASE + slot * N * 4

    def emit(em: Emitter) -> None:
        if unit is Unit.load:
            em.b.dma_ld(*em.regs(buf, 0, N * 4), 1, N, "f32")
        elif unit is Unit.vector:
            em.b.v_add(*em.regs(buf, buf, buf), N, "f32")
        elif unit is Unit.matrix:
            em.b.mx_preload(em.reg(buf), N, N, "f32")
            em.b.mx_mm(*em.regs(acc, buf), 1)
        else:
            em.b.dma_st(*em.regs(SLOT * 4 + step * N * 4, buf, N * 4), 1, N, "f32")

    return unit, emit


def _program(shapes: list[tuple[bool, tuple[Unit, ...], bool]], depth: int):
    """Steps of (loads?, compute units, stores?) emitted through `run_pipeline`; DRAM: 16 floats in, one row out
    per step."""
    b = ProgramBuilder(data_base=0)
    steps = []
    for s, (load, compute, store) in enumerate(shapes):
        segs = [_segment(u, s, s % depth) for u in ((Unit.load,) if load else ()) + compute]
        segs += [_segment(Unit.store, s, s % depth)] if store else []
        steps.append(Step(compute=segs))
    with b.kernel("pipeline", inputs=[("x", "f32", (N,), "X")], outputs=[("y", "f32", (len(steps), N), "Y")]):
        run_pipeline(Emitter(b), steps, depth)
        b.halt()
    b.data()
    b.label("X")
    b.zero(N * 4)
    b.zero(SLOT * 4 - N * 4)
    b.label("Y")
    b.zero(len(steps) * N * 4)
    return b.build()


_step = st.tuples(st.booleans(), st.lists(st.sampled_from(COMPUTE), max_size=4).map(tuple), st.booleans()).filter(
    lambda shape: shape[0] or shape[1] or shape[2]
)


@settings(max_examples=60, deadline=None)
@given(shapes=st.lists(_step, min_size=1, max_size=8), depth=st.sampled_from((2, 3)))
# a step ending on the matrix unit whose credit to a vector-led step three later crosses a matrix -> vector
# hand-over in between: that hand-over's pop took the credit and ran unordered (the queue is FIFO)
@example(
    shapes=[
        (False, (Unit.vector, Unit.matrix), False),
        (True, (Unit.matrix, Unit.vector), True),
        (True, (Unit.matrix,), True),
        (False, (Unit.vector, Unit.matrix), True),
    ],
    depth=3,
)
def test_every_step_is_ordered_after_its_slots_last_user(shapes, depth) -> None:
    result = simulate(_program(shapes, depth), "base", {"x": np.ones(N, np.float32)}, checked=True)
    assert result.counters.cycle > 0
