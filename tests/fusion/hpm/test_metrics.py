"""Metrics against values worked out by hand (and scipy's Kendall tau-b as a second oracle)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy.stats import kendalltau

from fusion.hpm.errors import HpmError
from fusion.hpm.metrics import grouped, kendall_tau, mape, selection_regret


def test_mape_by_hand() -> None:
    # |110-100|/100 = 0.1, |150-200|/200 = 0.25, |50-50|/50 = 0 -> mean 0.35/3
    assert mape(np.array([110.0, 150.0, 50.0]), np.array([100.0, 200.0, 50.0])) == pytest.approx(0.35 / 3)


def test_mape_rejects_bad_input() -> None:
    with pytest.raises(HpmError):
        mape(np.array([1.0]), np.array([0.0]))
    with pytest.raises(HpmError):
        mape(np.array([1.0, 2.0]), np.array([1.0]))


def test_kendall_tau_by_hand() -> None:
    # pairs (0,1) concordant, (0,2) concordant, (1,2) discordant: (2 - 1) / 3
    assert kendall_tau(np.array([1, 2, 3]), np.array([1, 3, 2])) == pytest.approx(1 / 3)
    assert kendall_tau(np.array([1, 2, 3]), np.array([3, 2, 1])) == pytest.approx(-1.0)
    # a tie in one ranking: tau-b = (2 - 0) / sqrt(3 * 2)
    assert kendall_tau(np.array([1, 2, 3]), np.array([1, 2, 2])) == pytest.approx(2 / math.sqrt(6))
    assert kendall_tau(np.array([5.0]), np.array([7.0])) == 1.0


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), min_size=3, max_size=12))
def test_kendall_tau_matches_scipy(pairs: list[tuple[int, int]]) -> None:
    a, b = (np.array(x, dtype=float) for x in zip(*pairs, strict=True))
    expected = kendalltau(a, b).statistic
    if not math.isnan(expected):
        assert kendall_tau(a, b) == pytest.approx(expected)


def test_selection_regret_by_hand() -> None:
    # the model ranks candidate 1 first (prediction 1.0); it takes 12 cycles, the best takes 10: 20% regret
    assert selection_regret(np.array([3.0, 1.0, 2.0]), np.array([10.0, 12.0, 11.0])) == pytest.approx(0.2)
    assert selection_regret(np.array([1.0, 2.0]), np.array([10.0, 12.0])) == 0.0


def test_grouped_skips_singletons() -> None:
    groups = ["a", "a", "b", "c", "c"]
    pred = np.array([1.0, 2.0, 5.0, 2.0, 1.0])
    meas = np.array([10.0, 20.0, 50.0, 10.0, 20.0])
    tau, regret, n = grouped(groups, pred, meas)
    assert n == 2  # "b" has one candidate
    assert tau == pytest.approx((1.0 + -1.0) / 2)
    assert regret == pytest.approx((0.0 + 1.0) / 2)  # group c picks 20 instead of 10
