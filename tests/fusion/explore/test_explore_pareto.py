"""Pareto front against a brute-force definition; designs summed over models only when every model ran."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fusion.explore.pareto import FIGURE_NAMES, designs, pareto_mask
from fusion.explore.space import SWEEPABLE


def dominated(values: np.ndarray, i: int) -> bool:
    return any(
        all(values[j, k] <= values[i, k] for k in range(values.shape[1]))
        and any(values[j, k] < values[i, k] for k in range(values.shape[1]))
        for j in range(len(values))
    )


@settings(max_examples=60, deadline=None)
@given(arrays(np.float64, st.tuples(st.integers(1, 25), st.integers(1, 3)), elements=st.integers(0, 6).map(float)))
def test_front_is_exactly_the_non_dominated_rows(values: np.ndarray) -> None:
    mask = pareto_mask(values)
    assert mask.tolist() == [not dominated(values, i) for i in range(len(values))]
    assert mask.any(), "a non-empty set has a front"


def row(model: str, machine: int, cycles: int, status: str = "ok") -> dict:
    fields = {name: 1 for name in SWEEPABLE} | {"array_size": machine}
    figures = {"cycles": cycles, "dram_traffic_bytes": 10, "energy_pj": 2.0, "area_mm2": float(machine)}
    return {"model": model, "policy": "dynamic", "dtype": "fp32", "status": status, **fields, **figures,
            "roofline_cycles": cycles / 2, "plan_seconds": 0.1}  # fmt: skip


def test_designs_sum_over_models_and_skip_incomplete_machines() -> None:
    rows = [row("a", 4, 100), row("b", 4, 50), row("a", 8, 60), row("b", 8, 0, status="error")]
    (design,) = designs(rows)
    assert dict(design.machine)["array_size"] == 4
    assert (design.models, design.cycles, design.energy_pj, design.area_mm2) == (2, 150, 4.0, 4.0)
    assert design.roofline_fraction == 0.5
    assert set(design.metrics()) == set(FIGURE_NAMES) | set(SWEEPABLE)
