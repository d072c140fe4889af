"""The analytic model composes unit times as a pipeline of stages per fenced phase, and states its spread."""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from fusion.cost import AnalyticCostModel
from fusion.cost.analytic import SPREAD, UnitTimes
from fusion.engine.context import ModelContext
from fusion.engine.execute import run_kernel
from fusion.engine.features import kernel_features
from fusion.engine.kernel import build_kernel
from fusion.engine.plan import Group
from fusion.lower.compiler import ALIAS_OPS, load_graph
from simulator.config import load_config

MODELS = Path(__file__).resolve().parents[1] / "models"


def test_stages_run_in_series_in_one_step_and_overlap_over_many() -> None:
    one = UnitTimes(load=500, store=400, matrix=0, vector=200, issue=30, fill=102, steps=1, transfer=300, phases=1)
    assert one.cycles == 500 + 400 + 200  # a step's store waits for its compute, which waits for its loads
    four = replace(one, steps=4)
    assert four.cycles == 500 + (400 + 200) / 4  # the busiest stage paces, the others' share of one step is paid
    two_phases = replace(four, phases=2)
    assert two_phases.cycles == 500 + 2 * (400 + 200) / 4  # each fence drains and refills the pipeline
    channel = replace(four, transfer=900)
    # the DRAM channel the DMAs share paces it; the flow shop's span (500 + 600 / 4) hides under its 900 cycles
    assert channel.cycles == 900
    issue = replace(four, issue=620)
    # an issue-bound kernel: the span beyond the issue's pace is the fill (a faster stage never adds to it)
    assert issue.cycles == 650 and replace(issue, vector=100).cycles == 625


def test_predictions_state_the_measured_spread_of_their_strategy() -> None:
    graph = load_graph(MODELS / "mlp.onnx")
    mc = ModelContext(graph, load_config("base"), "fp32")
    node = next(n for n in graph.nodes if n.op not in ALIAS_OPS)
    feats = kernel_features(mc, build_kernel(mc, Group((node.name,), "unfused")))
    model = AnalyticCostModel()
    assert model.predict(feats, mc.config).spread == SPREAD["unfused"]
    assert model.predict(replace(feats, strategy="zero_skip"), mc.config).spread == max(SPREAD.values())


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_unfused_kernels_of_the_encoder_are_predicted_within_ten_percent(dtype: str) -> None:
    """Median over the bundled encoder's baseline kernels (the simulator is the oracle)."""
    from fusion.quant.calibrate import calibrate

    graph = load_graph(MODELS / "encoder_post_d64.onnx")
    x = {graph.inputs[0]: np.load(MODELS / "encoder_post_d64.npz")["input"]}
    mc = ModelContext(graph, load_config("base"), dtype, calibrate(graph, [x]) if dtype == "int8" else None)
    errors = []
    for node in graph.nodes:
        if node.op in ALIAS_OPS:
            continue
        kernel = build_kernel(mc, Group((node.name,), "unfused"))
        shapes, dtypes = dict(kernel.guard.shapes), dict(kernel.guard.dtypes)
        env = {v: np.zeros(shapes[v], dtype=dtypes[v]) for v in kernel.inputs}
        measured = run_kernel(mc, kernel, env).cycles
        errors.append(abs(AnalyticCostModel().predict(kernel_features(mc, kernel), mc.config).cycles / measured - 1))
    assert statistics.median(errors) < 0.10
