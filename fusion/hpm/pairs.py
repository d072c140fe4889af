"""The schedules of one group priced together: a pairwise model of how two candidates of the same nodes differ.

The planner chooses among the schedules of one set of nodes, and those often lie within a few percent of each
other: per-kernel residuals of ~3% each flip such pairs (Kendall tau ~0.88 on the held-out machine). A second
estimator is trained on ordered pairs (i, j) of one group, on the difference of their feature vectors plus the
first's, to predict the difference of their log residuals: what separates two schedules, which a pointwise fit
averages away. A group's predictions are then its mean pointwise prediction plus each candidate's mean
predicted difference to the others (antisymmetrised), exact when the differences are; a group of one keeps its
pointwise prediction.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def group_pairs(groups: Sequence[object]) -> tuple[np.ndarray, np.ndarray]:
    """Row indices (i, j) of every ordered pair of distinct rows in the same group."""
    _, codes = np.unique(np.asarray([str(g) for g in groups]), return_inverse=True)
    order = np.argsort(codes, kind="stable")
    sizes = np.bincount(codes)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    firsts, seconds = [], []
    for size in np.unique(sizes[sizes > 1]):
        a, b = np.nonzero(~np.eye(size, dtype=bool))
        base = starts[sizes == size][:, None]
        firsts.append(order[(base + a).ravel()])
        seconds.append(order[(base + b).ravel()])
    if not firsts:
        return np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.intp)
    return np.concatenate(firsts), np.concatenate(seconds)


def pair_matrix(x: np.ndarray, first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """A pair's features: how the first row differs from the second, then the first row itself."""
    return np.hstack([x[first] - x[second], x[first]])


def jointly(
    residuals: np.ndarray, groups: Sequence[object], first: np.ndarray, second: np.ndarray, differences: np.ndarray
) -> np.ndarray:
    """Per-row log residuals of groups priced together: the group's mean pointwise residual plus the row's mean
    antisymmetrised predicted difference (`differences[p]` for pair (first[p], second[p])) to its group."""
    _, codes = np.unique(np.asarray([str(g) for g in groups]), return_inverse=True)
    sizes = np.bincount(codes)
    mean = np.bincount(codes, weights=residuals) / sizes
    n = len(residuals)
    ahead = np.bincount(first, weights=differences, minlength=n)
    spread = ahead - np.bincount(second, weights=differences, minlength=n)
    return mean[codes] + spread / (2 * sizes[codes])
