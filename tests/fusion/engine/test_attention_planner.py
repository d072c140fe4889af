"""The attention kernel as a planner strategy: dynamic takes it where it measures faster, the results stay the
reference's (int8 bit-exact, fp32 1e-5, the engine's shadow validation on every call), and the plan is never
slower than static or none."""

from __future__ import annotations

import numpy as np
import pytest
from attention_graphs import AttentionShape, attention_graph
from engine_helpers import context, run_group

from fusion.engine.attention_match import find_attention
from fusion.engine.engine import EngineOptions, FusionEngine
from fusion.engine.plan import Group
from fusion.engine.validation import ValidationPolicy

SHAPES = [
    AttentionShape(seq=16, heads=2, head_dim=32, causal=True),  # GPT-2-like
    AttentionShape(seq=17, heads=2, head_dim=32),  # ViT-like
    AttentionShape(seq=16, heads=4, kv_heads=2, head_dim=16, causal=True, scale="div"),  # LLaMA-like GQA
]


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
@pytest.mark.parametrize("shape", SHAPES)
def test_the_attention_group_builds_through_the_engine(shape, dtype):
    graph, inputs = attention_graph(shape)
    mc = context(graph, inputs, dtype)
    (match,) = find_attention(graph)
    _, run, env = run_group(mc, Group(match.nodes(graph), "attention"), inputs)
    for value, got in run.outputs.items():
        if dtype == "int8":
            assert np.array_equal(got, env[value])
        else:
            np.testing.assert_allclose(got, env[value], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
@pytest.mark.parametrize("shape", SHAPES)
def test_dynamic_takes_the_attention_kernel_and_never_loses(shape, dtype):
    graph, inputs = attention_graph(shape)
    cycles, outputs = {}, {}
    for policy in ("none", "static", "dynamic"):
        options = EngineOptions(policy=policy, validation=ValidationPolicy("always"), workers=1)
        engine = FusionEngine(graph, "base", dtype, options, samples=[inputs])
        result = engine.run(inputs)
        assert engine.events == []  # shadow validation against the unfused kernels found no difference
        cycles[policy], outputs[policy] = result.cycles, result.outputs
        if policy == "dynamic":
            strategies = {c.group.strategy for c in engine.plan.choices}
            assert strategies & {"attention", "attention_proj"}, engine.plan.choices  # with its projections or not
        engine.close()
    assert cycles["dynamic"] <= min(cycles["none"], cycles["static"]), cycles
    for value, got in outputs["dynamic"].items():
        if dtype == "int8":
            assert np.array_equal(got, outputs["none"][value])
        else:
            np.testing.assert_allclose(got, outputs["none"][value], rtol=1e-5, atol=1e-5)
