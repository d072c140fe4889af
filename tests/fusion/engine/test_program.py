"""A whole plan linked into one program: outputs bit-exact against the per-kernel path and the int8 reference,
race-free, never slower than the plan's kernels run one by one (with the on-chip dispatches the engine keeps);
on-chip dispatch switching per call."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import linear_relu_graph, model, reference_env, sparse_activations

from fusion.cost.analytic import AnalyticCostModel
from fusion.engine.engine import FusionEngine
from fusion.engine.execute import run_kernel
from fusion.engine.kernel import build_kernel
from fusion.engine.plan import Group, GroupChoice
from fusion.engine.profile import data_class
from fusion.engine.program import link_plan, measure_cycles, model_prefers, run_program, threshold
from fusion.engine.program_run import link_for_call
from simulator.config import PRESETS, MachineConfig, config_from_dict
from simulator.errors import ConfigError


def _kernels_one_by_one(mc, choices, inputs) -> tuple[dict[str, np.ndarray], int]:
    """The per-kernel path: every planned group as its own program, values moved on the host."""
    env, cycles = dict(inputs), 0
    for choice in choices:
        run = run_kernel(mc, build_kernel(mc, choice.group), env)
        env.update(run.outputs)
        cycles += run.cycles
    return env, cycles


def _check_program(graph, inputs) -> None:
    engine = FusionEngine(graph, "base", "int8")  # program execution: the engine links, keeps and runs a program
    result = engine.run(inputs)
    mc, choices = engine.mc, engine.plan.choices
    linked = link_plan(mc, choices)
    run = run_program(mc, linked, inputs, checked=True)  # the race checker traps on any unordered access
    # with on-chip dispatch wherever the engine's cost model says it can pay
    dispatched = run_program(mc, link_plan(mc, choices, model_prefers(mc, engine.cost_model)), inputs, checked=True)
    env, kernels = _kernels_one_by_one(mc, choices, inputs)
    reference = reference_env(mc, inputs)
    for value in env:
        if value in run.outputs and not graph.is_constant(value):
            np.testing.assert_array_equal(run.outputs[value], env[value], err_msg=value)
            np.testing.assert_array_equal(run.outputs[value], reference[value], err_msg=value)
            np.testing.assert_array_equal(dispatched.outputs[value], reference[value], err_msg=value)
    # every join the link's rules allow is race-free and exact, but not always faster (a join can lose a cycle
    # or hundreds, and a dispatch's count and fences cost cycles on dense data: docs/program.md); the program the
    # engine keeps is never slower than the kernels one by one, nor than them fenced in one program
    (kept,) = engine.programs[engine._state].values()
    assert result.program.cycles <= kernels
    assert result.program.cycles <= kept.fenced_cycles == link_cycles(mc, choices, inputs)
    if not kept.dispatches:  # the boundaries' gains add up to what the program saves over its fenced kernels
        assert sum(g for *_, g in kept.gains) == kept.fenced_cycles - result.program.cycles
    assert [(b, a) for b, a, _ in kept.gains] == [(b.before, b.after) for b in kept.boundaries if b.joined]


def link_cycles(mc, choices, inputs) -> int:
    """The same plan with a fence at every boundary and no on-chip dispatch."""
    return run_program(mc, link_plan(mc, choices, join=False), inputs).cycles


@pytest.mark.parametrize("name", ["mlp", "resnet_block", "encoder_post_d64", "encoder_pre_d64", "encoder_post_d128"])
def test_bundled_model_as_one_program_is_exact_race_free_and_no_slower(name: str) -> None:
    _check_program(*model(name))


# ~1-2 minutes each on 2 cores; the CNNs (mobilenet_v2, resnet18, resnet50: ~10 minutes each with the race
# checker) are left to `python bench/bench_program.py`, outside the suite's time budget
SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    "name",
    [
        "whisper_encoder",
        "bert",
        *(pytest.param(n, marks=SLOW) for n in ("vit", "gpt2", "llama")),
    ],
)
def test_zoo_model_as_one_program_is_exact_race_free_and_no_slower(name: str) -> None:
    from bench.zoo import zoo_model
    from fusion.lower.compiler import load_graph

    entry = zoo_model(name)
    graph = load_graph(entry.onnx_path)
    _check_program(graph, {graph.inputs[0]: entry.input})


def _sparse_choice():
    graph = linear_relu_graph(m=64, k=256, n=64)
    dense_x = np.abs(np.random.default_rng(1).standard_normal((64, 256))).astype(np.float32) + 0.1
    engine = FusionEngine(graph, "base", "int8", samples=[{"x": dense_x}])
    mc = engine.mc
    dense = Group(("fc", "relu"), "epilogue", tile_m=64)
    zero_skip = Group(("fc", "relu"), "zero_skip", tile_m=64)
    choice = GroupChoice(dense, 0.0, "test", zero_skip=zero_skip)
    return graph, mc, choice, dense_x


def test_on_chip_dispatch_switches_per_call_without_a_replan() -> None:
    graph, mc, choice, dense_x = _sparse_choice()
    prefer = model_prefers(mc, AnalyticCostModel())
    assert link_plan(mc, [choice], prefer).dispatches == ()  # the measurement exceeds 1% of this small kernel
    linked = link_plan(mc, [choice], prefer, dispatch_budget=1.0)  # linked once: every call runs this binary
    (d,) = linked.dispatches
    assert 0 < d.threshold <= d.tiles
    sparse_x = sparse_activations((64, 256), mc.config.array_size, 0.75, seed=2)
    for x, expected in [(dense_x, "epilogue"), (sparse_x, "zero_skip")] * 2:
        run = run_program(mc, linked, {"x": x}, checked=True)
        assert [(i, g.strategy) for i, g in run.decisions] == [(0, expected)]
        host = data_class(x, mc.config.array_size)  # the host's class agrees with the chip's count
        assert (host[0] == "sparse") == (expected == "zero_skip")
        np.testing.assert_array_equal(
            run.outputs["y"] if "y" in run.outputs else run.outputs[graph.outputs[0]],
            reference_env(mc, {"x": x})[graph.outputs[0]],
        )
        assert run.dispatch_cycles > 0
        if expected == "epilogue":  # the budget's estimate is the measurement on dense data (fp32 input: 4 B each)
            assert abs(measure_cycles(mc.config, 64, 256, 4) - run.dispatch_cycles) <= 0.01 * run.dispatch_cycles


def test_threshold_is_the_break_even_and_needs_the_sparse_class() -> None:
    graph, mc, choice, _ = _sparse_choice()
    assert threshold(choice, 16, lambda c, f: (1.0, 1.5 - f)) == 9  # (dense, zero-skip) predictions
    assert threshold(choice, 16, lambda c, f: (1.0, 0.0)) == 4  # never below the sparse class (25% of the tiles)
    assert threshold(choice, 16, lambda c, f: (1.0, 1.0)) is None
    assert threshold(choice, 16, lambda c, f: (1.0, 0.0 if f in (0.5, 1.0) else 2.0)) == 16  # pays from there up


def test_launch_cycles_is_a_validated_config_field(tmp_path) -> None:
    assert PRESETS["base"].launch_cycles == 5000 and PRESETS["tiny"].launch_cycles == 1000
    with pytest.raises(ConfigError, match="launch_cycles"):
        MachineConfig(**{**PRESETS["base"].as_dict(), "energy": PRESETS["base"].energy, "launch_cycles": -1})
    assert config_from_dict({"preset": "base", "launch_cycles": 7}).launch_cycles == 7


def test_figures_price_launches_and_the_overlap_per_boundary() -> None:
    from fusion.engine.program_figures import measure

    graph, inputs = model("encoder_post_d64")
    engine = FusionEngine(graph, "base", "int8")
    engine.run(inputs)
    mc, choices = engine.mc, engine.plan.choices
    f = measure(mc, choices, inputs)
    launched = sum(c.group.strategy != "alias" for c in choices)
    assert f.launches == launched
    assert f.host_cycles == f.kernel_cycles + launched * mc.config.launch_cycles
    assert f.program_cycles <= f.kernel_cycles
    linked, run = link_for_call(mc, choices, None, inputs)  # the program the engine keeps, on these inputs
    assert f.program_cycles == run.cycles
    assert [(b, a) for b, a, _ in f.boundaries] == [(b.before, b.after) for b in linked.boundaries if b.joined]
    assert sum(g for *_, g in f.boundaries) == linked.fenced_cycles - run.cycles > 0


def test_one_image_refuses_two_groups_with_different_forms_of_one_constant() -> None:
    from fusion.engine.errors import CodegenError
    from fusion.engine.program import _check_one_image

    forms = {"const:bias:b": np.array([1, 2], np.int32)}
    _check_one_image(forms, {"const:bias:b": np.array([1, 2], np.int32)}, Group(("c2",), "unfused"))  # same: fine
    with pytest.raises(CodegenError, match="const:bias:b"):  # e.g. one bias initializer, two corrected biases
        _check_one_image(forms, {"const:bias:b": np.array([1, 3], np.int32)}, Group(("c2",), "unfused"))
