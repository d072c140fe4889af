"""Pipelined pairs: a producer group and its consumer as one program (no fence between), the consumer's
independent loads issued while the producer computes, ordered against its DRAM writes by sync tokens."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from engine_helpers import model, reference_env

from fusion.engine.cache import KernelCache
from fusion.engine.context import ModelContext
from fusion.engine.engine import EngineOptions, FusionEngine
from fusion.engine.errors import CodegenError
from fusion.engine.execute import run_kernel, timing_cycles
from fusion.engine.kernel import build_kernel
from fusion.engine.pairing import worth_pairing
from fusion.engine.pipelined import build_pipelined
from fusion.engine.plan import Group
from fusion.engine.planner import Evaluator
from fusion.engine.report import build_report, format_report
from fusion.graph.builder import GraphBuilder
from fusion.graph.ir import Graph
from fusion.graph.ops import OpType
from fusion.quant.calibrate import calibrate
from simulator.config import load_config
from simulator.errors import SimulatorTrap

LN = Group(("ln",), "chain")
GEMM = Group(("fc", "relu"), "epilogue")


def ln_gemm_graph(m: int = 16, d: int = 64, n: int = 256, seed: int = 0) -> Graph:
    """A vector-bound LayerNorm feeding a weight-heavy Linear (as a transformer's FFN input)."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("ln_gemm")
    x = b.input("x", (m, d))
    scale = b.constant((rng.standard_normal(d) * 0.2 + 1).astype(np.float32), "gamma")
    shift = b.constant((rng.standard_normal(d) * 0.1).astype(np.float32), "beta")
    h = b.op(OpType.LayerNorm, x, scale, shift, name="ln", axis=1, epsilon=1e-5)
    w = b.constant((rng.standard_normal((d, n)) / np.sqrt(d)).astype(np.float32), "w")
    bias = b.constant((rng.standard_normal(n) * 0.1).astype(np.float32), "bias")
    b.output(b.op(OpType.Relu, b.op(OpType.Gemm, h, w, bias, name="fc"), name="relu"))
    return b.build()


def norm_projections_graph(m: int = 16, d: int = 64, n: int = 64, seed: int = 0) -> Graph:
    """A one-step LayerNorm feeding Q, K, V projections side by side (`siblings`): the planner pairs them (a serial
    producer, `pairing.serial`), so the planner-level tests below run a planned pair."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("norm_projections")
    x = b.input("x", (1, m, d))
    gamma = b.constant((rng.standard_normal(d) * 0.2 + 1).astype(np.float32), "gamma")
    beta = b.constant((rng.standard_normal(d) * 0.1).astype(np.float32), "beta")
    h = b.op(OpType.LayerNorm, x, gamma, beta, name="ln", axis=2, epsilon=1e-5)
    for name in ("q", "k", "v"):
        w = b.constant((rng.standard_normal((d, n)) / np.sqrt(d)).astype(np.float32), f"w_{name}")
        b.output(b.op(OpType.MatMul, h, w, name=name))
    return b.build()


def planned_pair_model() -> tuple[Graph, dict[str, np.ndarray]]:
    return norm_projections_graph(), {"x": np.random.default_rng(1).standard_normal((1, 16, 64)).astype(np.float32)}


def _context(dtype: str) -> tuple[ModelContext, dict[str, np.ndarray]]:
    graph = ln_gemm_graph()
    x = {"x": np.random.default_rng(1).standard_normal((16, 64)).astype(np.float32)}
    params = calibrate(graph, [x]) if dtype == "int8" else None
    return ModelContext(graph, load_config("base"), dtype, params), x


@pytest.mark.parametrize("dtype", ["int8", "fp32"])
def test_pair_beats_two_kernels_with_equal_outputs(dtype: str) -> None:
    mc, x = _context(dtype)
    env = reference_env(mc, x)
    ln, gemm = run_kernel(mc, build_kernel(mc, LN), env), run_kernel(mc, build_kernel(mc, GEMM), env)
    pair = build_pipelined(mc, LN, GEMM)
    run = run_kernel(mc, pair, env, checked=True)  # checked: no unsynchronised access anywhere
    assert run.cycles < ln.cycles + gemm.cycles - 100  # at least one DMA latency hidden
    assert (pair.group, pair.pipelined_with) == (LN, GEMM) and set(pair.outputs) == {"relu"}
    out = run.outputs["relu"]
    if dtype == "int8":  # bit-exact vs fusion.reference.quantized
        np.testing.assert_array_equal(out, env["relu"])
    else:
        np.testing.assert_allclose(out, env["relu"], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out, gemm.outputs["relu"])  # and the same as the separate kernels


def test_removing_the_dram_ordering_token_is_a_race() -> None:
    mc, x = _context("int8")
    unordered = build_pipelined(mc, LN, GEMM, order_dram=False)
    with pytest.raises(SimulatorTrap, match="race"):
        run_kernel(mc, unordered, reference_env(mc, x), checked=True)


def test_pairs_without_a_flow_or_with_a_view_are_refused() -> None:
    mc, _ = _context("int8")
    with pytest.raises(CodegenError, match="flows"):
        build_pipelined(mc, GEMM, LN)
    with pytest.raises(CodegenError, match="not pipelined"):
        build_pipelined(mc, LN, Group(("fc", "relu"), "zero_skip"))


@pytest.mark.parametrize(
    ("name", "dtype", "least"),
    [("encoder_post_d64", "int8", 3), ("encoder_pre_d64", "fp32", 4), ("encoder_pre_d64", "int8", 1)],
)
def test_bundled_model_pairs_are_race_free_and_exact(name: str, dtype: str, least: int) -> None:
    """Every adjacent producer -> consumer pair of a bundled model's dynamic plan that can be pipelined runs
    race-free, with the reference's values (int8 bit-exact), and never slower than its two kernels. `least`: a
    floor on the pairs (encoder_post int8's plan is four kernels since its MLP is one, [Add, LN, FFN1 + bias, ReLU,
    FFN2 + bias, Add, LN]: QKV GEMM, attention, output projection, MLP; all three of its pairs pipeline)."""
    graph, x = model(name)
    engine = FusionEngine(graph, "base", dtype)
    engine.run(x)
    mc = engine.mc
    env = reference_env(mc, x)
    groups = [g for g in engine.plan.groups if g.strategy != "alias"]
    pairs = 0
    for a, b in zip(groups, groups[1:], strict=False):
        try:
            pair = build_pipelined(mc, a, b)
        except CodegenError:
            continue
        run = run_kernel(mc, pair, env, checked=True)
        apart = run_kernel(mc, build_kernel(mc, a), env).cycles + run_kernel(mc, build_kernel(mc, b), env).cycles
        assert run.cycles <= apart
        for v, data in run.outputs.items():
            if dtype == "int8":
                np.testing.assert_array_equal(data, env[v])
            else:
                np.testing.assert_allclose(data, env[v], rtol=1e-4, atol=1e-4)
        pairs += 1
    assert pairs >= least


def test_planner_pairs_complementary_groups_and_the_engine_runs_them() -> None:
    graph, x = planned_pair_model()
    # host: a program joins its kernel boundaries itself and runs no pair (docs/program.md)
    apart = FusionEngine(graph, "base", "int8", EngineOptions(pipeline=False, execution="host")).run(x)
    engine = FusionEngine(graph, "base", "int8", EngineOptions(checked=True, execution="host"))
    first, second = engine.run(x), engine.run(x)
    pairs = engine.plan.pipelined
    assert pairs and all(set(p.bounds) == {"memory", "compute"} or p.producer.nodes == ("ln",) for p in pairs)
    assert all(p.pipelined_cycles < p.separate_cycles for p in pairs)
    # timing does not depend on the values: the plan-time measurement on zeros is what the live run takes
    assert first.cycles == apart.cycles - sum(p.separate_cycles - p.pipelined_cycles for p in pairs)
    for v, data in first.outputs.items():
        np.testing.assert_array_equal(data, apart.outputs[v])
    runs = [r for r in first.records if r.pipelined_with]
    assert len(runs) == len(pairs) and all(r.validated and not r.fallback for r in runs)
    assert all(r.cache_hit for r in second.records if r.pipelined_with)  # the pair is a cached kernel
    rep = build_report(engine, first)
    assert "pipelined with" in format_report(rep) and len(rep.as_dict()["pipelined"]) == len(pairs)


def test_pair_kernel_round_trips_through_the_disk_cache(tmp_path) -> None:
    mc, x = _context("int8")
    pair = build_pipelined(mc, LN, GEMM)
    KernelCache(disk_dir=tmp_path).get_or_build("k" * 64, lambda: pair)
    cache = KernelCache(disk_dir=tmp_path)
    again, _ = cache.get_or_build("k" * 64, lambda: pytest.fail("rebuilt"))
    assert cache.stats.disk_hits == 1 and (again.group, again.pipelined_with) == (LN, GEMM)
    assert again.program.text == pair.program.text
    env = reference_env(mc, x)
    np.testing.assert_array_equal(run_kernel(mc, again, env).outputs["relu"], env["relu"])


def test_shadow_validation_catches_a_wrong_pair_and_runs_the_groups_apart(monkeypatch) -> None:
    import fusion.engine.engine as engine_module

    def faulty(mc, kernel, env, checked=False, max_cycles=None):  # a pair whose first output is off by one step
        run = run_kernel(mc, kernel, env, checked, max_cycles)
        if kernel.pipelined_with is None:
            return run
        (v, data), *_ = run.outputs.items()
        return replace(run, outputs={**run.outputs, v: data + np.ones_like(data)})

    graph, x = planned_pair_model()
    monkeypatch.setattr(engine_module, "run_kernel", faulty)
    engine = FusionEngine(graph, "base", "int8", EngineOptions(execution="host"))  # (pairs run in host mode)
    result = engine.run(x)
    assert engine.plan.pipelined and len(engine.events) == len(engine.plan.pipelined)
    assert not any(r.pipelined_with for r in result.records)  # every pair ran apart after its failed validation
    want = FusionEngine(graph, "base", "int8", EngineOptions(pipeline=False, execution="host")).run(x).outputs
    for v, data in result.outputs.items():
        np.testing.assert_array_equal(data, want[v])
    assert not any(r.pipelined_with for r in engine.run(x).records)  # blocked from then on


def test_planner_race_checks_only_pairs_worth_taking_and_refuses_a_racing_one(monkeypatch) -> None:
    """The checked (race-finding) simulation runs only for pairs saving at least the regret floor, each taken pair
    passed it, and a pair whose DRAM ordering is missing is found racing and not taken."""
    import fusion.engine.pairing as pairing

    runs: list[tuple[bool, int]] = []

    def counted(mc, kernel, checked=False):
        cycles = timing_cycles(mc, kernel, checked=checked)
        runs.append((checked, cycles))
        return cycles

    within = Evaluator.simulated_within

    def budgeted(ev, kernel, budget, checked=False):  # the plain, budgeted simulation of a candidate pair
        cycles = within(ev, kernel, budget, checked)
        if kernel.pipelined_with is not None:
            runs.append((checked, cycles))
        return cycles

    graph, x = planned_pair_model()
    monkeypatch.setattr(pairing, "timing_cycles", counted)
    monkeypatch.setattr(Evaluator, "simulated_within", budgeted)
    engine = FusionEngine(graph, "base", "int8", EngineOptions(execution="host"))
    engine.run(x)
    pairs = engine.plan.pipelined
    assert pairs and all(worth_pairing(p.separate_cycles, p.pipelined_cycles) for p in pairs)
    checked = [c for flag, c in runs if flag]
    assert sorted(checked) == sorted(p.pipelined_cycles for p in pairs)  # no race check for a pair not taken
    assert len(runs) > len(checked)  # each pair simulated plainly first

    monkeypatch.setattr(pairing, "build_pipelined", lambda mc, a, b: build_pipelined(mc, a, b, order_dram=False))
    racing = FusionEngine(graph, "base", "int8", EngineOptions(execution="host"))
    racing.run(x)
    assert not racing.plan.pipelined


def test_a_saving_below_the_regret_floor_is_not_worth_a_pair() -> None:
    assert worth_pairing(10_000, 9_950) and not worth_pairing(10_000, 9_951)  # REGRET_FLOOR = 0.5%
    assert worth_pairing(100, 99) and not worth_pairing(100, 100)  # at least one cycle
