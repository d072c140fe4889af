"""Training and prediction on a small seeded sweep; the numpy predictors equal scikit-learn's."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from fusion.cost.analytic import UnitTimes, unit_times
from fusion.hpm.errors import HpmError
from fusion.hpm.metrics import mape
from fusion.hpm.model import TARGETS, make_estimator, make_pair_estimator, train
from fusion.hpm.modelfile import load_model, save_model
from fusion.hpm.pairs import group_pairs, pair_matrix
from fusion.hpm.predictors import from_sklearn
from fusion.hpm.schema import (
    FEATURE_NAMES,
    UNITS,
    baselines,
    fill,
    matrix_of,
    serial_dma_cycles,
    vectorize,
)


@pytest.fixture(scope="module")
def model(small_dataset):
    ds = small_dataset
    return train(ds.features(), ds.configs(), {t: ds.measured(t) for t in TARGETS}, "gbt", seed=0)


def test_fits_its_training_data_better_than_the_analytic_estimate(small_dataset, model) -> None:
    ds = small_dataset
    cycles, energy = model.predict_many(ds.features(), ds.configs())
    base_cycles, base_energy = baselines(ds.features(), ds.configs())
    measured = ds.measured("cycle")
    assert mape(cycles, measured) < 0.5 * mape(base_cycles, measured)
    assert mape(cycles, measured) < 0.05
    assert mape(energy, ds.measured("energy_total_pj")) < 0.02


def test_feature_vector_matches_schema(small_dataset) -> None:
    x = vectorize(small_dataset.features()[0], small_dataset.configs()[0])
    assert x.shape == (len(FEATURE_NAMES),) and np.all(np.isfinite(x))
    assert len(set(FEATURE_NAMES)) == len(FEATURE_NAMES)


def test_machine_relative_features_locate_the_bottleneck(small_dataset) -> None:
    for f, cfg in list(zip(small_dataset.features(), small_dataset.configs(), strict=True))[:60]:
        x = dict(zip(FEATURE_NAMES, vectorize(f, cfg), strict=True))
        assert x["tile_n_per_array"] * cfg.array_size == pytest.approx(f.tile_n)
        assert x["tile_k_per_array"] * cfg.array_size == pytest.approx(f.tile_k)
        units = unit_times(f, cfg)
        busy = {u: getattr(units, u) for u in UNITS}
        gaps = {u: x[f"{u}_gap"] for u in UNITS}
        # the estimate is never below its busiest unit, and that unit is the one nearest to it
        assert min(gaps.values()) >= -math.log1p(1 / max(units.cycles, 1.0)) - 1e-12
        assert busy[min(gaps, key=gaps.__getitem__)] == max(busy.values())


def test_fill_by_hand() -> None:
    assert fill(16, 24) == pytest.approx(2 / 3)  # one beat of 24 lanes, 16 used
    assert fill(48, 24) == 1.0 and fill(24, 24) == 1.0
    assert fill(50, 24) == pytest.approx(50 / 72)  # three beats, the last with 2 of 24 lanes
    assert fill(0, 24) == 1.0


def test_serial_dma_cycles_by_hand() -> None:
    # one step: load, compute and store in series; two steps: the loads and stores (1200) bound it, and the
    # other unit's half of its work (vector 200 / 2 steps) does not overlap
    one = UnitTimes(load=500, store=400, matrix=0, vector=200, issue=30, fill=80, steps=1, transfer=600)
    assert serial_dma_cycles(one) == 1100
    two = UnitTimes(load=700, store=500, matrix=0, vector=200, issue=30, fill=80, steps=2, transfer=600)
    assert serial_dma_cycles(two) == 1200 + 200 / 2
    compute_bound = UnitTimes(load=50, store=50, matrix=900, vector=0, issue=30, fill=80, steps=4, transfer=60)
    assert serial_dma_cycles(compute_bound) == 900 + 100 / 4


def test_padding_features_follow_the_machine(small_dataset) -> None:
    """A lane or array count that does not divide the output rows shows as a fill below 1 (independent oracle:
    the beats the rows occupy, counted with integer arithmetic)."""
    for f, cfg in list(zip(small_dataset.features(), small_dataset.configs(), strict=True))[:60]:
        x = dict(zip(FEATURE_NAMES, vectorize(f, cfg), strict=True))
        row = f.shapes[-1][-1]
        for name, width in (("lane_fill_row", cfg.vector_lanes), ("array_fill_n", cfg.array_size)):
            beats = (row + width - 1) // width
            assert x[name] == pytest.approx(row / (beats * width))
            assert (x[name] == 1.0) == (row % width == 0)


def test_save_load_round_trip(tmp_path: Path, small_dataset, model) -> None:
    path = save_model(model, tmp_path / "m.hpm")
    loaded = load_model(path)
    before = model.predict_many(small_dataset.features(), small_dataset.configs())
    after = loaded.predict_many(small_dataset.features(), small_dataset.configs())
    np.testing.assert_array_equal(before[0], after[0])
    np.testing.assert_array_equal(before[1], after[1])
    assert loaded.meta["algorithm"] == "gbt" and loaded.meta["samples"] == len(small_dataset)


@pytest.mark.parametrize("algo", ["gbt", "forest", "mlp"])
def test_numpy_predictors_equal_sklearn(small_dataset, algo: str) -> None:
    """The array form of every estimator the model fits predicts what scikit-learn's own `predict` does: on real
    rows, on one row, on rows far outside the training data, and (trees) with a missing value."""
    ds = small_dataset
    x = matrix_of(ds.features(), ds.configs())
    y = np.log(ds.measured("cycle") / baselines(ds.features(), ds.configs())[0])
    fitted = make_estimator(algo, 0).fit(x, y)
    far = x[:3] * np.array([[10.0], [-3.0], [0.5]])
    for rows in (x, x[:1], far):
        np.testing.assert_allclose(from_sklearn(fitted).predict(rows), fitted.predict(rows), rtol=1e-9, atol=1e-9)
    first, second = group_pairs(list(ds.columns["group"]))
    pairs = pair_matrix(x, first, second)
    pair_est = make_pair_estimator(0).set_params(max_iter=50).fit(pairs, y[first] - y[second])
    pairs[1, 7] = np.nan
    np.testing.assert_allclose(from_sklearn(pair_est).predict(pairs), pair_est.predict(pairs), rtol=1e-9, atol=1e-12)


def test_targets_must_be_positive_numbers(small_dataset) -> None:
    """A model is never trained to predict 0 (or from NaN): all-zero, some-zero and NaN cycles are refused."""
    ds = small_dataset
    energy = ds.measured("energy_total_pj")
    for bad in (np.zeros(len(ds)), np.where(np.arange(len(ds)) == 3, 0.0, ds.measured("cycle"))):
        with pytest.raises(HpmError, match="not a positive number"):
            train(ds.features(), ds.configs(), {"cycle": bad, "energy_total_pj": energy})
    nan = ds.measured("cycle").copy()
    nan[0] = np.nan
    with pytest.raises(HpmError, match="cycle is not a positive number in 1 of"):
        train(ds.features(), ds.configs(), {"cycle": nan, "energy_total_pj": energy})
