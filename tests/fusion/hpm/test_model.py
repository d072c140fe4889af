"""Training and prediction on a small seeded sweep; the model file container and its refusals."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import numpy as np
import pytest

from fusion.cost.analytic import UnitTimes, unit_times
from fusion.hpm.errors import ModelFileError, SchemaMismatchError
from fusion.hpm.fastpath import DIRECT_ROWS, predict
from fusion.hpm.metrics import mape
from fusion.hpm.model import MAGIC, PAIRS, TARGETS, load_model, read_header, save_model, train, train_on
from fusion.hpm.schema import (
    FEATURE_NAMES,
    UNITS,
    baselines,
    fill,
    matrix_of,
    schema_hash,
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


def _rewrite_header(path: Path, change: dict) -> None:
    header, payload = read_header(path)
    raw = json.dumps({**header, **change}).encode()
    path.write_bytes(MAGIC + struct.pack("<Q", len(raw)) + raw + payload)


def test_schema_mismatch_is_a_clear_error(tmp_path: Path, model) -> None:
    path = save_model(model, tmp_path / "m.hpm")
    names = [*FEATURE_NAMES[:-1], "feature_from_the_future"]
    _rewrite_header(path, {"feature_names": names, "schema_hash": schema_hash(names)})
    with pytest.raises(SchemaMismatchError, match="feature_from_the_future") as err:
        load_model(path)
    assert "retrain" in str(err.value)


def test_corruption_and_foreign_files_are_refused(tmp_path: Path, model) -> None:
    path = save_model(model, tmp_path / "m.hpm")
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match="checksum"):
        load_model(path)
    (tmp_path / "x.hpm").write_bytes(b"not a model")
    with pytest.raises(ModelFileError, match="magic"):
        load_model(tmp_path / "x.hpm")


def test_fast_paths_equal_sklearn(small_dataset) -> None:
    """Few-row predictions straight from the trees equal each estimator's own `predict`: the forest's, and the
    flattened boosted trees' (cycles, energy and the pairwise estimator, on real and on far-off rows, with a
    missing value)."""
    ds = small_dataset
    for algo in ("forest", "gbt"):
        fitted = train_on(ds, algo, seed=0)
        assert PAIRS in fitted.estimators
        x = matrix_of(ds.features()[:DIRECT_ROWS], ds.configs()[:DIRECT_ROWS])
        far = x[:3] * np.array([[10.0], [-3.0], [0.5]])
        for est in fitted.estimators.values():
            for rows in (x, x[:1], far):
                rows = np.hstack([rows, rows]) if est is fitted.estimators[PAIRS] else rows
                np.testing.assert_allclose(predict(est, rows), est.predict(rows), rtol=1e-9, atol=1e-12)
        pairs = np.hstack([x[:4], x[:4]])
        pairs[1, 7] = np.nan
        np.testing.assert_allclose(predict(fitted.estimators[PAIRS], pairs), fitted.estimators[PAIRS].predict(pairs))
