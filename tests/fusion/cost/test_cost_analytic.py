"""The analytic cost model against the simulator: per-unit work, overall accuracy, roofline, energy."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from fusion.cost import AnalyticCostModel, CostModel, roofline_cycles
from fusion.cost.analytic import unit_times
from fusion.engine.execute import run_kernel
from fusion.engine.features import kernel_features
from fusion.engine.kernel import build_kernel
from fusion.engine.plan import Group
from fusion.lower.compiler import ALIAS_OPS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))  # the engine tests' helpers
from engine_helpers import context, model, reference_env  # noqa: E402


@pytest.fixture(scope="module")
def measured():
    graph, inputs = model("encoder_post_d64")
    mc = context(graph, inputs, "int8")
    env = reference_env(mc, inputs)
    rows = []
    for node in graph.nodes:
        if node.op in ALIAS_OPS:
            continue
        kernel = build_kernel(mc, Group((node.name,), "unfused"))
        rows.append((kernel_features(mc, kernel), run_kernel(mc, kernel, env)))
    return mc, rows


def test_it_is_a_cost_model(measured) -> None:
    mc, rows = measured
    cost_model: CostModel = AnalyticCostModel()
    estimate = cost_model.predict(rows[0][0], mc.config)
    assert cost_model.name == "analytic" and estimate.cycles > 0 and estimate.energy_pj > 0


def test_unit_busy_times_match_the_simulator(measured) -> None:
    mc, rows = measured
    for feats, run in rows:
        u = unit_times(feats, mc.config)
        assert u.load == pytest.approx(run.counters.load_busy, rel=0.05, abs=8)
        assert u.store == pytest.approx(run.counters.store_busy, rel=0.05, abs=8)
        assert u.matrix == pytest.approx(run.counters.matrix_busy, rel=0.05, abs=16)


def test_cycle_predictions_are_close_and_energy_is_accurate(measured) -> None:
    mc, rows = measured
    model_ = AnalyticCostModel()
    errors = [abs(model_.predict(f, mc.config).cycles - r.cycles) / r.cycles for f, r in rows]
    assert float(np.mean(errors)) < 0.25
    for f, r in rows:
        assert model_.predict(f, mc.config).energy_pj == pytest.approx(r.energy_pj, rel=0.1)


def test_no_kernel_beats_the_roofline(measured) -> None:
    mc, rows = measured
    for feats, run in rows:
        bound = roofline_cycles(feats.macs, run.dram_read_bytes + run.dram_write_bytes, mc.config)
        assert run.cycles >= bound


def test_zero_skip_prediction_shrinks_with_the_zero_fraction(measured) -> None:
    mc, rows = measured
    feats = next(f for f, _ in rows if f.matmuls)
    skip = replace(feats, strategy="zero_skip")
    m = AnalyticCostModel()
    dense = unit_times(skip, mc.config).matrix
    assert unit_times(replace(skip, zero_tile_fraction=0.75), mc.config).matrix < 0.5 * dense
    assert m.predict(replace(skip, zero_tile_fraction=0.75), mc.config).cycles <= m.predict(skip, mc.config).cycles
