"""Quality figures of a cost model: MAPE, Kendall's tau within candidate groups, and selection regret."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fusion.hpm.errors import HpmError


def mape(predicted: np.ndarray, measured: np.ndarray) -> float:
    """Mean absolute percentage error, as a fraction (0.05 = 5%)."""
    p, m = np.asarray(predicted, dtype=np.float64), np.asarray(measured, dtype=np.float64)
    if p.shape != m.shape or p.size == 0:
        raise HpmError(f"mape needs two non-empty arrays of one shape, got {p.shape} and {m.shape}")
    if np.any(m <= 0):
        raise HpmError("mape needs positive measured values")
    return float(np.mean(np.abs(p - m) / m))


def kendall_tau(a: np.ndarray, b: np.ndarray) -> float:
    """Kendall's tau-b between two rankings (ties in either count against neither); 1.0 for fewer than two pairs
    that are untied in both, since a planner choosing among such candidates cannot misorder them."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    i, j = np.triu_indices(a.size, k=1)
    sa, sb = np.sign(a[i] - a[j]), np.sign(b[i] - b[j])
    n1, n2 = np.count_nonzero(sa), np.count_nonzero(sb)
    if n1 == 0 or n2 == 0:
        return 1.0
    return float(np.sum(sa * sb) / np.sqrt(n1 * n2))


def selection_regret(predicted: np.ndarray, measured: np.ndarray) -> float:
    """How much slower the candidate the model ranks first is than the best one (0.02 = 2% more cycles)."""
    p, m = np.asarray(predicted, dtype=np.float64), np.asarray(measured, dtype=np.float64)
    return float(m[int(np.argmin(p))] / np.min(m) - 1.0)


def grouped(groups: Sequence[object], predicted: np.ndarray, measured: np.ndarray) -> tuple[float, float, int]:
    """(mean Kendall tau, mean selection regret, number of groups) over groups with at least two candidates."""
    keys = np.asarray([str(g) for g in groups])
    taus, regrets = [], []
    for key in np.unique(keys):
        idx = np.flatnonzero(keys == key)
        if idx.size < 2:
            continue
        taus.append(kendall_tau(predicted[idx], measured[idx]))
        regrets.append(selection_regret(predicted[idx], measured[idx]))
    if not taus:
        return float("nan"), float("nan"), 0
    return float(np.mean(taus)), float(np.mean(regrets)), len(taus)
