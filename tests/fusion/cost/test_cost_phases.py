"""What does not pipeline: the loads no step can start before (the head) and the fenced phases that hand no step to
the main unit, counted from the program (`features.program_counts`) and paid alone or in series by the analytic
model, against a word-by-word count through the ISA decoder and against the simulator."""

from __future__ import annotations

import statistics
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from fusion.cost import AnalyticCostModel
from fusion.cost.analytic import UnitTimes, unit_times
from fusion.engine.candidates import enumerate_candidates, schedules
from fusion.engine.execute import timing_cycles
from fusion.engine.features import kernel_features
from fusion.engine.kernel import try_build
from fusion.engine.strategies import strategy_of
from isa.encoding import decode
from isa.enums import DType, Unit
from simulator.timing import dma_bursts

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))  # the engine tests' helpers
from engine_helpers import context, model  # noqa: E402

PASSES = ("vector", "vector_reduce", "chain_load", "chain_reduce", "chain_stream")
UNPIPELINED = {f"serial_{k}": 0 for k in ("loads", "load_bursts", "stores", "store_bursts", "phases")}
UNPIPELINED |= {"serial_vector_instrs": 0, "serial_vector_elems": 0, "serial_chain_ops": 0}
HEAD = {"head_loads": 0, "head_load_bursts": 0, "head_vector_instrs": 0, "head_vector_elems": 0}


def test_unit_times_pay_the_head_alone_and_unpipelined_phases_in_series() -> None:
    piped = UnitTimes(load=900, store=400, matrix=1000, vector=200, issue=30, fill=102, steps=4, transfer=300)
    assert piped.cycles == 1000 + (900 + 400 + 200) / 4
    # 400 of the loads come before any step: paid alone, and they are the load stage's share of the fill
    head = replace(piped, head=400)
    assert head.cycles == 400 + 1000 + (400 + 200) / 4
    # vector work preparing the first step's operands (an int8 quantization of A) holds back the matrix unit...
    prologue = replace(piped, head_vector=100)
    assert prologue.cycles == 100 + 1000 + (900 + 400 + 100) / 4
    # ...but not the loads streaming behind it: in a load-bound kernel it hides under them
    assert replace(prologue, load=2000).cycles == 2000 + (1000 + 400 + 100) / 4
    # a phase without steps after the pipeline: its load, vector pass and store one after another
    tail = replace(head, load=1200, store=500, vector=260, serial_load=300, serial_store=100, serial_vector=60)
    assert tail.cycles == head.cycles + 300 + 60 + 100
    # loads and stores share the DRAM channel, the load unit winning ties: a store stage waits behind the loads'
    # transfers in the measure (squared) the load stage keeps the channel busy (here it paces the pipeline)
    shared = UnitTimes(load=1000, store=600, matrix=300, vector=0, issue=30, fill=102, steps=4, transfer=900)
    assert shared.cycles == 1000 + (600 + 300) / 4
    contended = replace(shared, load_transfer=800)
    assert contended.cycles == pytest.approx(600 + 800 * (1000 / (1000 + 225)) ** 2 + 225)
    assert replace(contended, steps=1).cycles == shared.cycles + (600 + 300) * 3 / 4  # one step: all in series


def _vector_prologue(program, serial: list[bool], pushes, main) -> bool:
    """Whether the vector unit passes before its first token into the main unit, which comes before it first waits
    for the main unit (the features' `head_vector`)."""
    into = [pc for pc, src, dst in pushes if src == Unit.vector and dst == main and main != Unit.vector]
    waits = [
        pc
        for pc, ins in enumerate(program)
        if ins.mnemonic == "sync.pop" and not serial[pc] and (ins.field("src"), ins.field("dst")) == (main, Unit.vector)
    ]
    if not into or (waits and waits[0] < into[0]):
        return False
    return any(ins.spec.timing in PASSES and not serial[pc] for pc, ins in enumerate(program[: into[0]]))


def _load_tokens(program, serial: list[bool], main) -> tuple[int, int]:
    """The load unit's first pipelined token and its first that feeds a step: one not into the vector unit, or into
    the vector unit when the vector unit's next token after popping it (first in, first out) does not hand it back
    to the load unit (an A-stationary GEMM's resident A is a prologue handed back: the first step's loads come
    after it)."""
    pushes = [
        (pc, ins.field("src"), ins.field("dst"))
        for pc, ins in enumerate(program)
        if ins.mnemonic == "sync.push" and not serial[pc]
    ]
    pops = [
        pc
        for pc, ins in enumerate(program)
        if ins.mnemonic == "sync.pop"
        and not serial[pc]
        and (ins.field("src"), ins.field("dst")) == (Unit.load, Unit.vector)
    ]
    ours = [(pc, dst) for pc, src, dst in pushes if src == Unit.load]
    if not ours:
        return len(program), 0
    if _vector_prologue(program, serial, pushes, main):
        # beside the vector unit's prologue: the next token's loads when it goes to the main unit, no wait between
        waits = (
            any(
                ins.mnemonic == "sync.pop" and ins.field("dst") == Unit.load for ins in program[ours[0][0] : ours[1][0]]
            )
            if len(ours) > 1
            else True
        )
        takes = [
            pc
            for pc, ins in enumerate(program)
            if ins.mnemonic == "sync.pop" and (ins.field("src"), ins.field("dst")) == (Unit.load, Unit.matrix)
        ]
        work = [pc for pc, ins in enumerate(program) if ins.spec.timing in ("preload", "matmul", "matmul_stream")]
        taken = bool(takes and work and takes[0] < work[0])
        beside = not waits and taken and ours[0][1] == Unit.vector and ours[1][1] == Unit.matrix
        return ours[0][0], ours[1][0] if beside else ours[0][0]
    for handed, (pc, dst) in enumerate(ours):
        onward = [d for p, s, d in pushes if s == Unit.vector and handed < len(pops) and p > pops[handed]]
        if dst != Unit.vector or main == Unit.vector or not onward or onward[0] != Unit.load:
            return ours[0][0], pc
    return ours[0][0], ours[0][0]


def _decoded(mc, kernel) -> dict[str, int]:
    """Head and unpipelined-phase counts from the ISA's own decoder, word by word (an oracle sharing no table or
    array arithmetic with `features.program_counts`)."""
    program = [decode(w) for w in kernel.program.text]
    timings = [ins.spec.timing for ins in program]
    main = next(
        (
            u
            for u, t in (
                (Unit.matrix, ("matmul", "matmul_stream")),
                (Unit.vector, PASSES),
                (Unit.store, ("dma_store",)),
            )
            if any(x in t for x in timings)
        ),
        None,
    )
    phase, phases, stepped = 0, [], set()
    for ins in program:
        phase += ins.mnemonic == "fence"
        phases.append(phase)
        if ins.mnemonic == "sync.pop" and main is not None and ins.field("dst") == main:
            stepped.add(phase)
    counts = dict(UNPIPELINED, head_loads=0, head_load_bursts=0, lead_loads=0, lead_load_bursts=0)
    first, close = _load_tokens(program, [bool(stepped) and at not in stepped for at in phases], main)
    regs: dict[int, int] = {}
    serial_phases = set()
    for pc, (ins, t, at) in enumerate(zip(program, timings, phases, strict=True)):
        serial = bool(stepped) and at not in stepped
        part = "head" if pc < first else "lead" if first < pc < close else None
        if ins.mnemonic == "li":
            regs[ins.field("rd")] = ins.field("imm32") & 0xFFFFFFFF
        elif t.startswith("dma_"):
            rows, row_bytes = ins.field("rows"), ins.field("cols") * (1 if ins.field("dtype") == DType.i8 else 4)
            bursts = dma_bursts(mc.config, rows, row_bytes, regs.get(ins.field("rs2"), row_bytes))
            side = "store" if t == "dma_store" else "load"
            if serial:
                counts[f"serial_{side}s"] += 1
                counts[f"serial_{side}_bursts"] += bursts
            elif side == "load" and part:
                counts[f"{part}_loads"] += 1
                counts[f"{part}_load_bursts"] += bursts
        if serial and (t in PASSES or t.startswith("dma_") or t in ("chain_op", "chain_store")):
            serial_phases.add(at)
            counts["serial_vector_instrs"] += t in PASSES
            counts["serial_chain_ops"] += t in ("chain_op", "chain_store")
    counts["serial_phases"] = len(serial_phases)
    return counts


@pytest.mark.parametrize(("name", "dtype"), [("encoder_post_d128", "int8"), ("resnet_block", "fp32")])
def test_the_head_and_unpipelined_phases_count_what_the_isa_decoder_reads(name: str, dtype: str) -> None:
    graph, x = model(name)
    mc = context(graph, x, dtype)
    heads = serials = 0
    for cand in enumerate_candidates(graph):
        for group in schedules(mc, cand):
            kernel = try_build(mc, group, "sparse" if strategy_of(group).skips_zero_tiles else "any")
            if isinstance(kernel, str) or kernel.program is None:
                continue
            f = kernel_features(mc, kernel)
            want = _decoded(mc, kernel)
            got = {k: getattr(f, k) for k in want}
            got["serial_vector_elems"] = want["serial_vector_elems"] = 0  # register lengths: checked by the model test
            assert got == want, group
            heads += f.head_loads > 0 and f.steps > 1
            serials += f.serial_phases > 0
    assert heads >= 3 and (serials >= 1 or name == "resnet_block")


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_kernels_much_of_which_does_not_pipeline_are_predicted_closer(dtype: str) -> None:
    """Every candidate kernel of the bundled encoders whose head or unpipelined phases are a third or more of its
    predicted time (swapped GEMMs with their LayerNorm pass, GEMMs with a resident or quantized activation,
    attention): the median |predicted / simulated - 1| is within 10%, and the mean is lower than with everything
    pipelined (measured on the generators of 5ec9791: fp32 1.6% against 2.3% over 246 kernels, int8 1.7% against
    5.2% over 178)."""
    model_, flat = AnalyticCostModel(), {**HEAD, **UNPIPELINED}
    errors, flat_errors = [], []
    for name in ("encoder_post_d64", "encoder_pre_d64", "encoder_post_d128"):
        graph, x = model(name)
        mc = context(graph, x, dtype)
        for cand in enumerate_candidates(graph):
            for group in schedules(mc, cand):
                kernel = try_build(mc, group, "any")
                if strategy_of(group).skips_zero_tiles or isinstance(kernel, str) or kernel.program is None:
                    continue
                f = kernel_features(mc, kernel)
                units = unit_times(f, mc.config)
                alone = units.head + units.head_vector + units.serial_load + units.serial_vector + units.serial_store
                if 3 * alone < units.cycles:
                    continue
                measured = timing_cycles(mc, kernel)
                errors.append(abs(model_.predict(f, mc.config).cycles / measured - 1))
                flat_errors.append(abs(model_.predict(replace(f, **flat), mc.config).cycles / measured - 1))
    assert len(errors) >= 8
    assert statistics.median(errors) < 0.10
    assert np.mean(errors) < np.mean(flat_errors), (np.mean(errors), np.mean(flat_errors))
