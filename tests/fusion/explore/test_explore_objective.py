"""The objective language: arithmetic as written, constraints as Optuna reads them, and no way to run code."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fusion.explore.errors import ExploreError
from fusion.explore.objective import parse_constraint, parse_objective
from fusion.explore.pareto import METRIC_NAMES

NAMES = frozenset({"cycles", "area_mm2", "energy_uj"})
positive = st.floats(min_value=1e-3, max_value=1e6, allow_nan=False)


@given(cycles=positive, area=positive, energy=positive)
def test_expressions_compute_what_they_say(cycles: float, area: float, energy: float) -> None:
    m = {"cycles": cycles, "area_mm2": area, "energy_uj": energy}
    cases = {
        "cycles * area_mm2": cycles * area,
        "cycles - energy_uj / 2 + 3": cycles - energy / 2 + 3,
        "-(cycles + 1e3) * -2": (cycles + 1000) * 2,
        "log(cycles) + sqrt(area_mm2)": math.log(cycles) + math.sqrt(area),
        "max(cycles, energy_uj, 5) - min(area_mm2, 2)": max(cycles, energy, 5) - min(area, 2),
        "cycles / area_mm2 / energy_uj": cycles / area / energy,
    }
    for text, want in cases.items():
        assert parse_objective(text, NAMES)(m) == pytest.approx(want, rel=1e-12), text


def test_constraints_give_optunas_violation() -> None:
    m = {"cycles": 100.0, "area_mm2": 2.0, "energy_uj": 1.0}
    assert parse_constraint("cycles <= 150", NAMES).violation(m) == -50
    assert parse_constraint("cycles <= 50", NAMES).violation(m) == 50
    assert parse_constraint("area_mm2 >= 3", NAMES).violation(m) == 1
    assert parse_constraint("cycles * area_mm2 > 100", NAMES).violation(m) == -100
    assert parse_constraint("cycles < 100", NAMES).violation(m) > 0, "on the bound of a strict comparison"
    assert parse_constraint("log(0 - cycles) < 1", NAMES).violation(m) == math.inf, "no value: infeasible"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("cycles *", "column"),
        ("cycles area_mm2", "column"),
        ("colour * 2", "unknown name 'colour'"),
        ("exp(cycles)", "unknown function 'exp'"),
        ("log(cycles, 2)", "log takes 1"),
        ('__import__("os").system("true")', "cannot parse"),
        ("cycles.__class__", "cannot parse"),
        ("[x for x in ()]", "cannot parse"),
        ("lambda: 1", "cannot parse"),
    ],
)
def test_bad_or_hostile_text_is_an_error(text: str, message: str) -> None:
    with pytest.raises(ExploreError, match=message):
        parse_objective(text, NAMES)


def test_a_constraint_needs_a_comparison() -> None:
    with pytest.raises(ExploreError, match="cannot parse"):
        parse_constraint("cycles", NAMES)


def test_objectives_may_name_figures_and_machine_fields() -> None:
    assert {"cycles", "energy_pj", "area_mm2", "dram_traffic_bytes", "array_size", "spad_bytes"} <= METRIC_NAMES
