"""The issue order of an interleaved attention step (`codegen.attention_order`): any merge keeps each unit's
instructions in order and every pop after its push (random token streams), the recorded instructions replay as
the emitter would have written them, and the kernels whose head blocks share one step (two or three blocks, each
in its own buffer slot) run exact and race-free in the simulator's checked mode."""

from __future__ import annotations

import pytest
from attention_graphs import AttentionShape
from hypothesis import given, settings
from hypothesis import strategies as st
from test_attention_kernel import assert_matches, run
from test_attention_projections import run as run_projected

from assembler.builder import ProgramBuilder
from fusion.engine.codegen.attention import _hand_on
from fusion.engine.codegen.attention_order import (
    Call,
    Held,
    estimate,
    hoist_preloads,
    merge,
    record,
    replay,
    token,
    touches,
    written,
)
from fusion.engine.errors import CodegenError
from fusion.lower.emitter import Emitter
from isa.enums import Activation, Unit
from simulator.config import load_config

UNITS = (Unit.load, Unit.matrix, Unit.vector, Unit.store)


def _work(unit: Unit, size: int) -> Call:
    return {
        Unit.load: Call(unit, "dma_ld", (Held(64), Held(4096), Held(64), size, 16, "i8")),
        Unit.matrix: Call(unit, "mx_mm", (Held(1 << 24), Held(128), size)),
        Unit.vector: Call(unit, "v_copy", (Held(256), Held(512), size, "i8")),
        Unit.store: Call(unit, "dma_st", (Held(8192), Held(64), Held(64), size, 16, "i8")),
    }[unit]


@st.composite
def stage_chains(draw):
    """Heads x stages, each stage on a unit (consecutive stages on different units), a few instructions each;
    the per-unit streams in stage-major or head-major order, with the tokens between consecutive stages."""
    stages = draw(st.lists(st.sampled_from(UNITS), min_size=2, max_size=6))
    stages = [u for i, u in enumerate(stages) if i == 0 or u != stages[i - 1]]
    heads = draw(st.integers(1, 3))
    parts = []
    for _ in range(heads):
        head = []
        for r, unit in enumerate(stages):
            calls = [token(stages[r - 1], unit, False)] if r else []
            calls += [_work(unit, draw(st.integers(1, 40))) for _ in range(draw(st.integers(1, 4)))]
            calls += [token(unit, stages[r + 1], True)] if r + 1 < len(stages) else []
            head.append((unit, calls))
        parts.append(head)
    major = draw(st.booleans())
    order = [(g, r) for r in range(len(stages)) for g in range(heads)] if major else None
    order = order or [(g, r) for g in range(heads) for r in range(len(stages))]
    streams: dict[Unit, list[Call]] = {}
    for g, r in order:
        unit, calls = parts[g][r]
        streams.setdefault(unit, []).extend(calls)
    return streams


@settings(max_examples=60, deadline=None)
@given(stage_chains())
def test_a_merge_keeps_each_units_order_and_every_pop_after_its_push(streams):
    cfg = load_config("base")
    order, cycles = merge(cfg, streams)
    assert sorted(map(id, order)) == sorted(id(c) for s in streams.values() for c in s)
    for unit, stream in streams.items():
        assert [c for c in order if c.unit is unit] == stream
    pushed: dict[tuple, int] = {}
    for c in order:
        if c.name == "sync_push":
            pushed[c.args] = pushed.get(c.args, 0) + 1
        elif c.name == "sync_pop":
            pushed[c.args] -= 1
            assert pushed[c.args] >= 0, c
    assert cycles > 0 and estimate(cfg, order) > 0


def test_recorded_instructions_replay_as_emitted():
    """A recorded emit function, replayed, gives the same text as emitting it directly (values in registers
    through the emitter's cache)."""

    def emit(em: Emitter) -> None:
        em.b.mx_preload(em.reg(4096), 16, 16, "i8")
        em.b.mx_mm(*em.regs(1 << 24, 128), 17)
        em.b.ep_cfg(*em.regs(0, 0, 0x3F800000), 3, Activation.none, "none", "i8")
        em.b.mx_drain(*em.regs(512, 1 << 24), 17, 16)
        em.push(Unit.matrix, Unit.vector)

    direct, replayed = ProgramBuilder(), ProgramBuilder()
    emit(Emitter(direct))
    calls = record([emit])
    assert [c.unit for c in calls] == [Unit.matrix] * 5
    replay(Emitter(replayed), calls)
    assert direct.build().text == replayed.build().text


def test_an_instruction_of_no_unit_is_refused():
    with pytest.raises(CodegenError, match="not a unit instruction"):
        record([lambda em: em.b.fence()])


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
@pytest.mark.parametrize(
    "shape",
    [
        AttentionShape(seq=17, heads=3, head_dim=16, causal=True),
        AttentionShape(seq=10, keys=20, heads=2, kv_heads=1, head_dim=24, key_len=15),
    ],
)
def test_head_blocks_sharing_a_step_run_exact(shape, dtype):
    _, got, want = run(shape, dtype)
    assert_matches(got, want, dtype)


@pytest.mark.parametrize("out", [False, True])
def test_projected_heads_sharing_a_step_run_exact(out):
    shape = AttentionShape(seq=17, heads=3, head_dim=16, scale="none", prescale=True, fused_qkv=True)
    for dtype in ("fp32", "int8"):
        _, got, want = run_projected(shape, dtype, out)
        assert_matches(got, want, dtype)


def test_a_footprint_over_estimates_never_under():
    load = Call(Unit.load, "dma_ld", (Held(1024), Held(4096), Held(64), 4, 16, "i8"))
    assert written(load) == (1024, 1088) and written(load, 1000) == (1000, 2000)
    copy = Call(Unit.vector, "v_copy", (Held(4096), Held(1000), 4, "i8"))  # reads 4 elements of up to 4 bytes
    assert touches(copy, 1000, 1001) and touches(copy, 1015, 1088) and not touches(copy, 1016, 1088)
    assert touches(Call(Unit.matrix, "mx_mm", (Held(1 << 24), Held(0), 16)), 1024, 1088)  # no count: all above


def test_loads_the_next_run_leaves_alone_are_handed_to_the_run_after_it():
    """X read by the vector unit, W in a bank of its own only by the matrix unit: W loads after the vector
    unit's token, with a token of its own to the matrix unit; W in X's bank stays (the load holds the bank)."""
    cfg = load_config("base")
    bank = cfg.spad_bank_bytes

    def head(w: int) -> list:
        x = Call(Unit.load, "dma_ld", (Held(0), Held(4096), Held(64), 4, 16, "i8"))
        wl = Call(Unit.load, "dma_ld", (Held(w), Held(8192), Held(64), 4, 16, "i8"))
        qnt = Call(Unit.vector, "v_qnt", (Held(256), 0, Held(1), 64))
        mm = Call(Unit.matrix, "mx_mm", (Held(1 << 24), Held(256), 4))
        to_v, to_m = token(Unit.load, Unit.vector, True), token(Unit.vector, Unit.matrix, True)
        pop_v, pop_m = token(Unit.load, Unit.vector, False), token(Unit.vector, Unit.matrix, False)
        return [(Unit.load, [x, wl, to_v]), (Unit.vector, [pop_v, qnt, to_m]), (Unit.matrix, [pop_m, mm])]

    apart = _hand_on(cfg, head(bank))
    x, w, push = head(bank)[0][1]
    assert apart[0][1] == [x, push, w, token(Unit.load, Unit.matrix, True)]
    assert apart[2][1][0] == token(Unit.load, Unit.matrix, False)
    assert _hand_on(cfg, head(bank // 2)) == head(bank // 2)


def _preload(addr: int) -> Call:
    return Call(Unit.matrix, "mx_preload", (Held(addr), 16, 16, "i8"))


def _drain(addr: int) -> Call:
    return Call(Unit.matrix, "mx_drain", (Held(addr), Held(1 << 24), 16, 16))


def _chain_store(addr: int) -> list[Call]:
    return [Call(Unit.vector, "vc_ld", (0, Held(1 << 16), 256, "i8")), Call(Unit.vector, "vc_st", (Held(addr), 0))]


@pytest.mark.parametrize(
    ("stored", "drained", "late", "order"),
    [
        # neither the drain nor what the crossed pop waits for writes its weights: the preload alone moves
        (1 << 15, 1 << 14, False, ["mx_mm", "mx_preload", "mx_drain", "sync_pop", "mx_mm"]),
        # the drain writes them: it stays
        (1 << 15, 4096, False, ["mx_mm", "mx_drain", "sync_pop", "mx_preload", "mx_mm"]),
        # the vector unit's store writes them, pushed before the drain: the pop moves with it
        (4096, 1 << 14, False, ["mx_mm", "sync_pop", "mx_preload", "mx_drain", "mx_mm"]),
        # pushed after the drain (the pop might wait on what follows it): it stays
        (4096, 1 << 14, True, ["mx_mm", "mx_drain", "sync_pop", "mx_preload", "mx_mm"]),
    ],
)
def test_a_preload_moves_before_drains_only_past_no_write_of_its_weights(stored, drained, late, order):
    """The weights at 4096: the preload after a drain and a pop of the vector unit's token goes in front of the
    drain (its weight-port cycles under the matmul's latency) unless the drain writes them first; a pop ordering
    a write of them goes with it when its push comes first."""
    mm = _work(Unit.matrix, 16)
    vector = [*_chain_store(stored), token(Unit.vector, Unit.matrix, True)]
    head, tail = ([], vector) if late else (vector, [])
    calls = [*head, mm, _drain(drained), *tail, token(Unit.vector, Unit.matrix, False), _preload(4096), mm]
    assert [c.name for c in hoist_preloads(calls) if c.unit is Unit.matrix] == order
