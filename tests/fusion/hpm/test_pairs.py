"""Pairs of schedules within candidate groups, and their joint pricing (`fusion.hpm.pairs`)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fusion.hpm.metrics import grouped
from fusion.hpm.model import PAIRS, TARGETS, train, train_on
from fusion.hpm.pairs import group_pairs, jointly, pair_matrix

labels = st.lists(st.sampled_from("abcdefg"), min_size=0, max_size=40)


@given(labels)
def test_group_pairs_are_every_ordered_pair_within_a_group(groups: list[str]) -> None:
    first, second = group_pairs(groups)
    brute = {(i, j) for i, a in enumerate(groups) for j, b in enumerate(groups) if a == b and i != j}
    assert sorted(zip(first.tolist(), second.tolist(), strict=True)) == sorted(brute)


@settings(deadline=None)
@given(labels, st.integers(0, 2**32 - 1))
def test_exact_differences_give_the_true_order_around_the_pointwise_mean(groups: list[str], seed: int) -> None:
    """With the true differences of residuals, a group's joint prices are the truth shifted by one constant per
    group (the pointwise mean's error): every within-group order is exact; groups of one keep their prediction."""
    rng = np.random.default_rng(seed)
    truth = rng.normal(size=len(groups))
    pointwise = truth + rng.normal(scale=0.5, size=len(groups))
    first, second = group_pairs(groups)
    joint = jointly(pointwise, groups, first, second, truth[first] - truth[second])
    for g in set(groups):
        idx = [i for i, x in enumerate(groups) if x == g]
        shift = joint[idx] - truth[idx]
        np.testing.assert_allclose(shift, shift[0], atol=1e-12)
        np.testing.assert_allclose(joint[idx].mean(), pointwise[idx].mean(), atol=1e-12)
        if len(idx) == 1:
            assert joint[idx[0]] == pointwise[idx[0]]


def test_pair_features_are_the_difference_then_the_first_row() -> None:
    x = np.arange(12.0).reshape(4, 3)
    out = pair_matrix(x, np.array([0, 3]), np.array([2, 1]))
    np.testing.assert_array_equal(out, [[-6, -6, -6, 0, 1, 2], [6, 6, 6, 9, 10, 11]])


def test_pairwise_estimator_ranks_the_training_groups(small_dataset) -> None:
    """Trained with its groups the model gains the pairwise estimator, and priced together the schedules of its
    training groups rank better than one at a time (a sign error in the pairs would rank them worse)."""
    ds = small_dataset
    grouped_model = train_on(ds, "forest", seed=0)
    pointwise_model = train(ds.features(), ds.configs(), {t: ds.measured(t) for t in TARGETS}, "forest", seed=0)
    assert PAIRS in grouped_model.predictors and grouped_model.meta["pairs"] > 0
    assert PAIRS not in pointwise_model.predictors
    groups = list(ds.columns["group"])
    measured = ds.measured("cycle")
    alone, _ = grouped_model.predict_many(ds.features(), ds.configs())
    together, _ = grouped_model.predict_many(ds.features(), ds.configs(), groups)
    tau_alone, _, n = grouped(groups, alone, measured)
    tau_together, _, _ = grouped(groups, together, measured)
    assert n > 10 and tau_together > tau_alone and tau_together > 0.95
