"""The engine's execution models: host-dispatched (launches priced) and one program per plan (guards, shadow
validation and fallback per kernel inside the program), and `dynfuse fuse --execution`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from engine_helpers import MODELS, linear_relu_graph, model

import fusion.engine.program as program_module
from dynfuse.cli import main
from fusion.engine.engine import EngineOptions, FusionEngine
from fusion.engine.errors import EngineError
from fusion.engine.validation import ValidationPolicy
from fusion.engine.views import is_view
from fusion.lower.emitter import Step
from isa.enums import Unit

PROGRAM = EngineOptions(execution="program")
HOST = EngineOptions(execution="host")


def test_program_execution_matches_host_execution_and_prices_one_launch() -> None:
    graph, inputs = model("encoder_post_d64")
    host = FusionEngine(graph, "base", "int8", HOST).run(inputs)
    engine = FusionEngine(graph, "base", "int8", PROGRAM)
    first, second = engine.run(inputs), engine.run(inputs)
    for v in graph.outputs:
        np.testing.assert_array_equal(first.outputs[v], host.outputs[v])
        np.testing.assert_array_equal(second.outputs[v], host.outputs[v])
    launch = engine.config.launch_cycles
    kernels = sum(not is_view(graph, graph.node(r.nodes[0])) or len(r.nodes) > 1 for r in host.records)
    assert host.model_cycles == host.cycles + kernels * launch
    assert first.model_cycles == first.cycles + launch == first.program.cycles + launch
    assert first.cycles < host.cycles  # the plan has token-ordered boundaries here
    assert sum(r.validated for r in first.records) > 0 and not any(r.validated for r in second.records)
    assert len(engine.programs[engine._state]) == 1  # linked once, run twice
    assert any(b.joined for b in first.program.boundaries)


def test_a_kernel_failing_validation_in_the_program_is_replaced_by_its_unfused_kernels(monkeypatch) -> None:
    graph, inputs = model("mlp")
    host = FusionEngine(graph, "base", "int8", HOST).run(inputs)
    real = program_module.group_phases
    victim: list[str] = []

    def storeless(cx, nodes, group, rounding_change):  # fault injection: a fused kernel that never stores
        phases = real(cx, nodes, group, rounding_change)
        if group.fused and (not victim or victim[0] == group.nodes):
            victim[:] = [group.nodes]
            return [[Step(s.loads, s.compute, []) for s in phase] for phase in phases]
        return phases

    monkeypatch.setattr(program_module, "group_phases", storeless)
    options = EngineOptions(validation=ValidationPolicy.parse("always"), execution="program")
    engine = FusionEngine(graph, "base", "int8", options)
    result = engine.run(inputs)
    assert victim and result.program.replaced == (victim[0],)
    for v in graph.outputs:
        np.testing.assert_array_equal(result.outputs[v], host.outputs[v])
    assert [e.nodes for e in engine.events] == [victim[0]]
    assert any(r.fallback and set(r.nodes) <= set(victim[0]) for r in result.records)
    again = engine.run(inputs)  # blocked: linked with the unfused kernels from the start, no new event
    assert len(engine.events) == 1 and again.program.replaced == ()
    for v in graph.outputs:
        np.testing.assert_array_equal(again.outputs[v], host.outputs[v])


def test_execution_option_is_checked() -> None:
    with pytest.raises(EngineError, match="execution"):
        EngineOptions(execution="gpu")


def test_fuse_execution_program_reports_boundaries_overlap_and_dispatch(tmp_path: Path, capsys) -> None:
    x = np.load(MODELS / "encoder_post_d64.npz")["input"]
    np.save(tmp_path / "x.npy", x)
    args = ["fuse", str(MODELS / "encoder_post_d64.onnx"), "--input", f"src={tmp_path / 'x.npy'}", "--dtype", "int8"]
    assert EngineOptions().execution == "program"
    assert main([*args, "--report"]) == 0  # program: the default
    out = capsys.readouterr().out
    assert "execution program:" in out and "overlap gained" in out and "per boundary" in out
    assert main([*args, "--execution", "program", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["execution"] == "program" and body["model_cycles"] == body["cycles"] + 5000
    joined = [b for b in body["program"]["boundaries"] if b["joined"]]
    assert joined and all("gained_cycles" in b for b in joined)
    assert body["program"]["kernel_cycles"] >= body["program"]["cycles"]
    assert main([*args, "--execution", "host", "--json"]) == 0
    host = json.loads(capsys.readouterr().out)
    assert host["execution"] == "host" and host["program"] is None and host["model_cycles"] > host["cycles"]
    with pytest.raises(SystemExit) as stop:  # argparse: a usage error, no traceback
        main([*args, "--execution", "gpu"])
    assert stop.value.code != 0


@pytest.mark.parametrize("name", ["mlp", "resnet_block", "encoder_post_d128"])
def test_the_engine_keeps_the_fastest_of_its_candidate_and_the_fenced_program(name: str) -> None:
    """`keep_fastest`: the candidate (predicted joins, dispatches), else the same without dispatch, else fenced."""
    from fusion.engine.program import link_plan, model_prefers, run_program
    from fusion.engine.program_run import planned_fences

    graph, inputs = model(name)
    engine = FusionEngine(graph, "base", "int8")
    result = engine.run(inputs)
    mc, choices = engine.mc, engine.plan.choices
    (kept,) = engine.programs[engine._state].values()

    def cycles(linked) -> int:
        return run_program(mc, linked, inputs, checked=True).cycles

    # the candidate: the joins of largest predicted gain and the dispatches the cost model allows; the same without
    # dispatch; the reference: fenced everywhere, no dispatch (each kernel as it runs alone); each linked on its own
    # here (no shared phases)
    reference = link_plan(mc, choices, join=False)
    fences = planned_fences(mc, choices, reference.kernels)
    candidate = cycles(link_plan(mc, choices, model_prefers(mc, engine.cost_model), fenced=fences))
    plain, fenced = cycles(link_plan(mc, choices, fenced=fences)), cycles(reference)
    expected = candidate if candidate <= fenced else plain if plain <= fenced else fenced
    assert cycles(kept) == result.program.cycles == expected == result.cycles <= fenced
    assert kept.fenced_cycles == fenced and result.program.fenced_cycles == fenced
    assert result.program.gains == kept.gains
    if not kept.dispatches:  # (a dispatch's variant and count are not a boundary's)
        assert sum(g for *_, g in kept.gains) == kept.fenced_cycles - result.cycles
    single = {k.index for k in kept.kernels if k.phases == 1}
    joined = [b for b in kept.boundaries if b.joined]
    assert not any(a.after == b.before and a.after in single for a, b in zip(joined, joined[1:], strict=False))


def _fault(kind: str):
    """A scalar step that traps (a load below address 0) or never halts (a jump to itself)."""

    def emit(em) -> None:
        if kind == "trap":
            em.b.instr("lw", 1, -4, 0)
        else:
            spin = em.local_label("spin")
            em.b.label(spin)
            em.b.instr("jal", 0, spin)

    return Step([], [(Unit.scalar, emit)], [])


@pytest.mark.parametrize("kind", ["trap", "never_halts"])
def test_a_fused_kernel_that_traps_or_never_halts_in_the_program_is_replaced(monkeypatch, kind: str) -> None:
    graph, inputs = model("mlp")
    host = FusionEngine(graph, "base", "int8", EngineOptions(execution="host")).run(inputs)
    real = program_module.group_phases
    victim: list[tuple[str, ...]] = []

    def faulty(cx, nodes, group, rounding_change):  # fault injection: the first fused kernel starts with the fault
        phases = real(cx, nodes, group, rounding_change)
        if group.fused and (not victim or victim[0] == group.nodes):
            victim[:] = [group.nodes]
            return [[_fault(kind)], *phases]
        return phases

    monkeypatch.setattr(program_module, "group_phases", faulty)
    engine = FusionEngine(graph, "base", "int8", PROGRAM)
    result = engine.run(inputs)
    assert victim and result.program.replaced == (victim[0],)
    for v in graph.outputs:
        np.testing.assert_array_equal(result.outputs[v], host.outputs[v])
    (event,) = engine.events
    assert event.nodes == victim[0]
    assert ("trapped" if kind == "trap" else "over the program's cycle budget") in event.action
    again = engine.run(inputs)  # blocked: linked unfused from the start
    assert len(engine.events) == 1 and again.program.replaced == ()


def test_a_kernel_builder_needs_host_execution() -> None:
    """`builder=` replaces the kernels the host dispatches; a program is linked from the generators, so it would
    be silently ignored there: refused instead."""
    with pytest.raises(EngineError, match="builder"):
        FusionEngine(linear_relu_graph(), "base", "int8", builder=lambda mc, group, sparsity: None)
