"""Vector chains (LayerNorm, Softmax, residual Adds as one `vc.*` chain): the analytic model's vector-unit time and
cycles against the simulator. A chain reduction (`vc.rsum`, `vc.rmax`) has no element count of its own: it passes
over its whole register (`features._chain_reduce_elems`), as the simulator times it."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from fusion.cost import AnalyticCostModel
from fusion.cost.analytic import unit_times
from fusion.engine.candidates import enumerate_candidates, schedules
from fusion.engine.execute import run_kernel
from fusion.engine.features import kernel_features
from fusion.engine.kernel import try_build

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))  # the engine tests' helpers
from engine_helpers import context, model  # noqa: E402

REDUCING = frozenset({"LayerNorm", "Softmax", "ReduceMean"})


@pytest.mark.parametrize(("name", "dtype"), [("encoder_post_d64", "int8"), ("encoder_pre_d64", "fp32")])
def test_reducing_chain_kernels_vector_time_and_cycles_match_the_simulator(name: str, dtype: str) -> None:
    """Every chain kernel of the model holding a row reduction (with the reductions' elements uncounted, the
    vector time was half the simulator's and the cycles 9-17% low)."""
    graph, x = model(name)
    mc = context(graph, x, dtype)
    errors = []
    for cand in enumerate_candidates(graph):
        for group in schedules(mc, cand):
            if group.strategy != "chain" or isinstance(kernel := try_build(mc, group, "any"), str):
                continue
            feats = kernel_features(mc, kernel)
            if not REDUCING & set(feats.ops):
                continue
            shapes, dtypes = dict(kernel.guard.shapes), dict(kernel.guard.dtypes)
            env = {v: np.zeros(shapes[v], dtype=dtypes[v]) for v in kernel.inputs}
            counters = run_kernel(mc, kernel, env).counters
            assert unit_times(feats, mc.config).vector == pytest.approx(counters.vector_busy, rel=0.05), group
            errors.append(abs(AnalyticCostModel().predict(feats, mc.config).cycles / counters.cycle - 1))
    assert len(errors) >= 3 and max(errors) < 0.05, [f"{e:.1%}" for e in errors]
