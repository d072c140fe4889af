"""Designs (a machine under one policy and dtype, its figures summed over the models) and their Pareto front in
cycles, energy and area; the front plotted as a PNG."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fusion.explore.point import OK
from fusion.explore.space import SWEEPABLE, Value

OBJECTIVES = ("cycles", "energy_pj", "area_mm2")  # all minimised
FIGURE_NAMES = (
    "cycles",
    "dram_traffic_bytes",
    "energy_pj",
    "energy_uj",
    "area_mm2",
    "roofline_fraction",
    "plan_seconds",
)
METRIC_NAMES = frozenset([*FIGURE_NAMES, *SWEEPABLE])  # what an objective may name (`Design.metrics`)


@dataclass(frozen=True)
class Design:
    policy: str
    dtype: str
    machine: tuple[tuple[str, Value], ...]
    models: int
    cycles: int
    dram_traffic_bytes: int  # bytes moved to and from DRAM (not the `dram_bytes` capacity field)
    energy_pj: float
    area_mm2: float
    roofline_cycles: float
    plan_seconds: float

    @property
    def roofline_fraction(self) -> float:
        return self.roofline_cycles / self.cycles if self.cycles else 0.0

    def metrics(self) -> dict[str, float]:
        """Every figure an objective may name: the design's totals and its machine's fields."""
        return {
            **{k: float(v) for k, v in self.machine},
            "cycles": float(self.cycles),
            "dram_traffic_bytes": float(self.dram_traffic_bytes),
            "energy_pj": self.energy_pj,
            "energy_uj": self.energy_pj / 1e6,
            "area_mm2": self.area_mm2,
            "roofline_fraction": self.roofline_fraction,
            "plan_seconds": self.plan_seconds,
        }

    def label(self, base: dict[str, Any]) -> str:
        changed = [f"{k}={v}" for k, v in self.machine if base.get(k) != v]
        return ", ".join(changed) or "preset"


def designs(rows: Iterable[dict[str, Any]], models: int | None = None) -> list[Design]:
    """One design per (policy, dtype, machine) whose every model ran (`models`: how many it must have; default
    the most any design has), figures summed over its models; in a fixed order."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        if row.get("status") == OK:
            machine = tuple((name, row[name]) for name in SWEEPABLE)
            groups.setdefault((row["policy"], row["dtype"], machine), []).append(row)
    need = models if models is not None else max((len(g) for g in groups.values()), default=0)
    out = []
    for (policy, dtype, machine), members in sorted(groups.items(), key=lambda kv: repr(kv[0])):
        if len(members) < need:
            continue
        out.append(
            Design(
                policy,
                dtype,
                machine,
                len(members),
                sum(int(r["cycles"]) for r in members),
                sum(int(r["dram_traffic_bytes"]) for r in members),
                sum(float(r["energy_pj"]) for r in members),
                float(members[0]["area_mm2"]),
                sum(float(r["roofline_cycles"]) for r in members),
                sum(float(r["plan_seconds"]) for r in members),
            )
        )
    return out


def pareto_mask(values: np.ndarray) -> np.ndarray:
    """Rows of `values` (n x k, minimised) that no other row dominates (<= in all, < in one).

    Rows are visited in lexicographic order, so every row's dominators come before it; dominance is transitive,
    so comparing with the front found so far is enough: O(n x front) instead of O(n^2)."""
    n, k = values.shape
    keep = np.zeros(n, dtype=bool)
    found = np.empty((0, k), dtype=values.dtype)
    for i in np.lexsort(values.T[::-1]):
        row = values[i]
        if not np.any(np.all(found <= row, axis=1) & np.any(found < row, axis=1)):
            keep[i] = True
            found = np.vstack([found, row])
    return keep


def front(items: Sequence[Design]) -> list[bool]:
    if not items:
        return []
    values = np.array([[getattr(d, name) for name in OBJECTIVES] for d in items], dtype=np.float64)
    return pareto_mask(values).tolist()


def plot_front(items: Sequence[Design], path: Path, title: str) -> Path:
    """Cycles against energy (colour: area) and against area (colour: energy); the Pareto designs ringed.
    One marker shape per policy/dtype."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    on_front = np.array(front(items), dtype=bool)
    cycles = np.array([d.cycles for d in items], dtype=np.float64)
    energy = np.array([d.energy_pj / 1e6 for d in items])
    size = np.array([d.area_mm2 for d in items])
    kinds = sorted({(d.policy, d.dtype) for d in items})
    markers = "osD^vP*X"
    fig, axes = plt.subplots(1, 2, figsize=(12, 5), constrained_layout=True)
    panels = (
        (axes[0], energy, size, "energy (uJ)", "area (mm^2)"),
        (axes[1], size, energy, "area (mm^2)", "energy (uJ)"),
    )
    for ax, y, colour, ylabel, clabel in panels:
        scatter = None
        for index, kind in enumerate(kinds):
            sel = np.array([(d.policy, d.dtype) == kind for d in items], dtype=bool)
            scatter = ax.scatter(
                cycles[sel], y[sel], c=colour[sel], cmap="viridis", vmin=colour.min(), vmax=colour.max(),
                marker=markers[index % len(markers)], s=36, label=f"{kind[0]} {kind[1]}",
            )  # fmt: skip
        ax.scatter(
            cycles[on_front], y[on_front], s=140, facecolors="none", edgecolors="red", linewidths=1.5,
            label="Pareto front",
        )  # fmt: skip
        ax.set_xlabel("cycles (sum over models)")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        if scatter is not None:
            fig.colorbar(scatter, ax=ax, label=clabel)
        ax.legend(fontsize=8)
    fig.suptitle(f"{title}: {int(on_front.sum())} Pareto designs of {len(items)}")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
