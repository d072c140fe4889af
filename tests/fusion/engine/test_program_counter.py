"""On-chip dispatch through the store-side zero-tile counter: the kernel writing a dispatched GEMM's operand counts
its all-zero tiles as it stores them (`dma.stz`), the dispatcher reads the count (`zc.rd`) and jumps."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import reference_env, sparse_activations
from test_program import _kernels_one_by_one

from fusion.cost.analytic import AnalyticCostModel
from fusion.engine.engine import EngineOptions, FusionEngine
from fusion.engine.profile import data_class, zero_tile_fraction
from fusion.engine.program import count_cycles, link_plan, measure_cycles, model_prefers, run_program
from fusion.graph.builder import GraphBuilder
from fusion.graph.ir import OpType
from simulator.timing import branch_cycles


def relu_linear_relu(m: int = 64, k: int = 256, n: int = 64, seed: int = 0):
    """Relu -> Gemm (bias) -> Relu: the first Relu is a kernel of its own, so the GEMM's operand is written by a
    kernel of the program (and sparse exactly when the input is)."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("relu_linear_relu")
    h = b.op(OpType.Relu, b.input("x", (m, k)), name="pre")
    w = b.constant((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), "w")
    bias = b.constant((rng.standard_normal(n) * 0.1).astype(np.float32), "bias")
    b.output(b.op(OpType.Relu, b.op(OpType.Gemm, h, w, bias, name="fc"), name="relu"))
    return b.build()


DENSE = np.abs(np.random.default_rng(1).standard_normal((64, 256))).astype(np.float32) + 0.1


@pytest.fixture(scope="module")
def planned():
    graph = relu_linear_relu()
    engine = FusionEngine(graph, "base", "int8", samples=[{"x": DENSE}])
    engine.run({"x": DENSE})
    return graph, engine


def test_the_count_switches_the_variant_per_call_without_a_relink(planned) -> None:
    graph, engine = planned
    mc, choices = engine.mc, engine.plan.choices
    linked = link_plan(mc, choices, model_prefers(mc, AnalyticCostModel()))  # once: every call runs this binary
    (d,) = linked.dispatches
    assert d.producer is not None and d.operand == "pre"  # counted by the Relu kernel's stores
    assert link_plan(mc, choices, model_prefers(mc, AnalyticCostModel()), counter=False).dispatches == ()
    n = mc.config.array_size
    cases = [(DENSE, "epilogue"), (sparse_activations((64, 256), n, 0.75, seed=2), "zero_skip")]
    at = sparse_activations((64, 256), n, 0.25, seed=3)  # at the threshold: 16 of the 64 tiles all zero
    below = at.copy()
    band, group = 3, int(np.flatnonzero(~at[:n].any(axis=0))[0]) // n  # one more element in one zero tile
    below[band * n + 5, group * n + 7] = 1.0
    cases += [(at, "zero_skip"), (below, "epilogue")]
    for x, expected in [*cases, *cases]:
        run = run_program(mc, linked, {"x": x}, checked=True)  # the race checker traps on an unordered access
        assert [(i, g.strategy) for i, g in run.decisions] == [(d.index, expected)]
        assert (round(zero_tile_fraction(x, n) * d.tiles) >= d.threshold) == (expected == "zero_skip")
        assert (data_class(x, n)[0] == "sparse") == (expected == "zero_skip")  # the host's class agrees
        env, _ = _kernels_one_by_one(mc, choices, {"x": x})
        out = graph.outputs[0]
        np.testing.assert_array_equal(run.outputs[out], reference_env(mc, {"x": x})[out])
        np.testing.assert_array_equal(run.outputs["pre"], env["pre"])
        # the overhead: zc.clr before the Relu, then zc.rd, slti and the dispatch (taken to the zero-skip variant)
        taken = expected == "zero_skip"
        assert run.dispatch_cycles == 3 + branch_cycles(mc.config, taken) <= count_cycles(mc.config)
    assert count_cycles(mc.config) < 0.01 * d.dense_cycles < measure_cycles(mc.config, 64, 256, 1)


def test_a_counter_read_is_not_moved_by_a_kernel_between_writer_and_dispatch(planned) -> None:
    """Only the writer's stores count: the other kernels' stores (the dispatched group's output) are plain."""
    graph, engine = planned
    mc = engine.mc
    linked = link_plan(mc, engine.plan.choices, model_prefers(mc, AnalyticCostModel()))
    text = [ins.mnemonic for ins in linked.program.instructions()]
    (block,) = [k for k in linked.program.kernels if k.name.startswith("chain")]
    assert {"dma.stz"} == {m for m in text[block.start : block.end] if m.startswith("dma.st")}
    others = [m for k in linked.program.kernels if k is not block for m in text[k.start : k.end]]
    assert "dma.stz" not in others and "dma.st" in others
    assert text.count("zc.clr") == 1 and text.count("zc.rd") == 1


def test_the_engine_dispatches_on_chip_per_call_in_program_mode(planned) -> None:
    """The program is linked on a sparse call, where the dispatch pays (`program_run.keep_fastest`); later calls
    switch variants on chip with the data."""
    graph, _ = planned
    engine = FusionEngine(graph, "base", "int8", EngineOptions(execution="program"), samples=[{"x": DENSE}])
    host = FusionEngine(graph, "base", "int8", samples=[{"x": DENSE}])
    sparse = sparse_activations((64, 256), engine.config.array_size, 0.75, seed=2)
    for x, expected in [(sparse, "zero_skip"), (DENSE, "epilogue")] * 2:
        result = engine.run({"x": x})
        (decision,) = result.program.decisions
        assert decision[:2] == (("fc", "relu"), expected)
        assert ("fc", "relu") not in result.replanned  # the dispatched group is never re-planned for its data
        assert result.program.dispatch_cycles <= count_cycles(engine.config)
        np.testing.assert_array_equal(result.outputs[graph.outputs[0]], host.run({"x": x}).outputs[graph.outputs[0]])
    assert len(engine.programs[engine._state]) == 1  # one link: the variant is picked on chip


def test_a_dispatch_that_does_not_pay_on_the_linking_call_is_left_out(planned) -> None:
    """Linked on dense data, the count and the fence it puts before the GEMM cost cycles the zero-skip variant
    never wins back on that call: the kept program has no dispatch and is no slower than its kernels fenced."""
    graph, _ = planned
    engine = FusionEngine(graph, "base", "int8", EngineOptions(execution="program"), samples=[{"x": DENSE}])
    result = engine.run({"x": DENSE})
    (kept,) = engine.programs[engine._state].values()
    assert kept.dispatches == () and result.program.decisions == () and result.program.dispatch_cycles == 0
    mc = engine.mc
    candidate = link_plan(mc, engine.plan.choices, model_prefers(mc, engine.cost_model))
    assert len(candidate.dispatches) == 1  # the cost model allows it; on this data it does not pay
    assert run_program(mc, candidate, {"x": DENSE}).cycles > result.cycles
    assert result.cycles <= result.program.fenced_cycles
    assert kept.dropped == ("pre",)  # weighed again once the operand turns sparse: linked again on that call
    sparse = sparse_activations((64, 256), engine.config.array_size, 0.75, seed=2)
    for x, expected in [(sparse, "zero_skip"), (DENSE, "epilogue"), (sparse, "zero_skip")]:
        (decision,) = engine.run({"x": x}).program.decisions
        assert decision[:2] == (("fc", "relu"), expected)


def test_one_counter_a_writer_between_another_writer_and_its_dispatch_makes_that_one_measure() -> None:
    """pre1, pre2, fc1(pre1), fc2(pre2): pre2's zc.clr would wipe pre1's count before fc1 reads it, so fc1 counts
    (its writer comes first) and fc2 measures its operand; each still follows its own operand's data."""
    rng = np.random.default_rng(4)
    b = GraphBuilder("two_branches")
    pre = [b.op(OpType.Relu, b.input(f"x{k}", (64, 256)), name=f"pre{k}") for k in (1, 2)]
    for k, h in zip((1, 2), pre, strict=True):
        w = b.constant((rng.standard_normal((256, 64)) / 16).astype(np.float32), f"w{k}")
        bias = b.constant((rng.standard_normal(64) * 0.1).astype(np.float32), f"bias{k}")
        b.output(b.op(OpType.Relu, b.op(OpType.Gemm, h, w, bias, name=f"fc{k}"), name=f"relu{k}"))
    graph = b.build()
    engine = FusionEngine(graph, "base", "int8", samples=[{"x1": DENSE, "x2": DENSE}])
    engine.run({"x1": DENSE, "x2": DENSE})
    mc, choices = engine.mc, engine.plan.choices
    assert [c.group.nodes[0] for c in choices][:2] == ["pre1", "pre2"]
    linked = link_plan(mc, choices, model_prefers(mc, AnalyticCostModel()), dispatch_budget=1.0)
    by_operand = {d.operand: d for d in linked.dispatches}
    assert by_operand["pre1"].producer is not None and by_operand["pre2"].producer is None
    sparse = sparse_activations((64, 256), mc.config.array_size, 0.75, seed=2)
    for x1, x2 in [(sparse, DENSE), (DENSE, sparse), (sparse, sparse), (DENSE, DENSE)]:
        run = run_program(mc, linked, {"x1": x1, "x2": x2}, checked=True)
        taken = {choices[i].group.nodes[0]: g.strategy for i, g in run.decisions}
        assert taken == {f"fc{k}": "zero_skip" if x is sparse else "epilogue" for k, x in ((1, x1), (2, x2))}
        reference = reference_env(mc, {"x1": x1, "x2": x2})
        for out in graph.outputs:
            np.testing.assert_array_equal(run.outputs[out], reference[out])
