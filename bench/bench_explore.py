"""Design-space exploration: a small fixed sweep run once on Ray and once on local processes, side by side.

The space: the `base` preset's array size x vector lanes x DRAM bandwidth (8 machines) over the bundled MLP and
post-norm encoder, unfused (`none`) and fused (`dynamic`), fp32: 32 points, each compiled, fused and simulated
for real (`fusion.explore.run.run_explore`, what `dynfuse explore` runs). Each backend sweeps into a fresh
directory; the two tables must agree point for point (results do not depend on scheduling). Prints the table,
the Pareto set (cycles, energy, area) per model and the wall time per backend; writes bench/results/explore.md.
Usage: python bench/bench_explore.py [--workers 2] [--backends ray,local]
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from fusion.engine.workers import available_cores
from fusion.explore.pareto import designs, front
from fusion.explore.run import SweepOutcome, run_explore
from fusion.explore.space import Space, space_from_dict
from fusion.tasks import make_runner

ROOT = Path(__file__).resolve().parents[1]
MODELS = [ROOT / "tests" / "fusion" / "models" / f"{name}.onnx" for name in ("mlp", "encoder_post_d64")]
RESULTS = Path(__file__).parent / "results" / "explore.md"
SPACE = {
    "preset": "base",
    "policies": ["none", "dynamic"],
    "dtypes": ["fp32"],
    "fields": {"array_size": [8, 16], "vector_lanes": [8, 16], "dram_bytes_per_cycle": [16, 32]},
}
FIELDS = tuple(SPACE["fields"])
FIGURES = ("cycles", "dram_traffic_bytes", "energy_pj")


def sweep(space: Space, backend: str, workers: int) -> tuple[SweepOutcome, float]:
    """One full sweep into a fresh directory; wall seconds include starting and stopping the backend."""
    runner = make_runner(backend, workers)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"explore_{backend}_") as out:
        outcome = run_explore(MODELS, space, Path(out), runner, progress=False)
    return outcome, time.perf_counter() - start


def figures(outcome: SweepOutcome) -> dict[str, tuple[Any, ...]]:
    return {r["key"]: (r["status"], *(r.get(f) for f in FIGURES)) for r in outcome.rows}


def point_rows(outcome: SweepOutcome) -> list[list[str]]:
    rows = []
    for r in sorted(outcome.rows, key=lambda r: (r["model"], *(r[f] for f in FIELDS), r["policy"])):
        if r["status"] != "ok":
            rows.append([r["model"], *(str(r[f]) for f in FIELDS), r["policy"], r["status"], "", "", "", ""])
            continue
        rows.append(
            [
                r["model"],
                *(str(r[f]) for f in FIELDS),
                r["policy"],
                str(r["cycles"]),
                f"{r['dram_traffic_bytes'] / 1e3:.1f}",
                f"{r['energy_pj'] / 1e6:.3f}",
                f"{r['area_mm2']:.3f}",
                f"{r['roofline_fraction']:.3f}",
            ]
        )
    return rows


def pareto_rows(outcome: SweepOutcome) -> list[list[str]]:
    """The Pareto set per model, and for both models summed: no other design beats it in cycles, energy and
    area at once."""
    rows = []
    models = sorted({r["model"] for r in outcome.rows})
    for model in [*models, "both"]:
        found = designs([r for r in outcome.rows if model in ("both", r["model"])])
        for design, best in zip(found, front(found), strict=True):
            if best:
                knobs = dict(design.machine)
                rows.append(
                    [
                        model,
                        *(str(knobs[f]) for f in FIELDS),
                        design.policy,
                        str(design.cycles),
                        f"{design.energy_pj / 1e6:.3f}",
                        f"{design.area_mm2:.3f}",
                    ]
                )
    return rows


POINT_HEAD = ["model", "array", "lanes", "DRAM B/cyc", "policy", "cycles", "DRAM kB", "energy uJ", "mm^2", "roofline"]
PARETO_HEAD = ["model", "array", "lanes", "DRAM B/cyc", "policy", "cycles", "energy uJ", "mm^2"]


def markdown(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(r) + " |" for r in rows)]


def show(console: Console, title: str, head: list[str], rows: list[list[str]]) -> None:
    table = Table(title=title)
    for name in head:
        table.add_column(name, justify="left" if name in ("model", "policy") else "right")
    for row in rows:
        table.add_row(*row)
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--backends", default="ray,local", help="comma-separated: ray, local")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a throw-away local instance: no token file
    space = space_from_dict(SPACE, "bench_explore")
    console = Console(width=130)
    outcomes: dict[str, SweepOutcome] = {}
    walls: dict[str, float] = {}
    for backend in args.backends.split(","):
        outcomes[backend], walls[backend] = sweep(space, backend, args.workers)
        console.print(f"{backend}: {outcomes[backend].points} points in {walls[backend]:.1f} s")
    first, *others = outcomes.values()
    for backend, outcome in outcomes.items():
        if figures(outcome) != figures(first) or outcome.failures:
            raise SystemExit(f"error: the {backend} sweep differs from the {next(iter(outcomes))} one")
    points, pareto = point_rows(first), pareto_rows(first)
    show(console, "points", POINT_HEAD, points)
    show(console, "Pareto set per model and both summed (cycles, energy, area)", PARETO_HEAD, pareto)
    wall_head = ["runner", "workers", "points", "wall s", "s / point"]
    walls_rows = [
        [b, str(args.workers), str(o.points), f"{walls[b]:.1f}", f"{walls[b] / o.points:.2f}"]
        for b, o in outcomes.items()
    ]
    show(console, "runner wall time (one run, same points)", wall_head, walls_rows)
    fields = ", ".join(f"{k} {v}" for k, v in SPACE["fields"].items())
    lines = [
        "# Design-space exploration (`bench/bench_explore.py`)",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores ({available_cores()} usable), "
        f"Python {platform.python_version()}; measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} "
        "while other jobs shared the cores (wall times are indicative).",
        f"Command: `python bench/bench_explore.py --workers {args.workers} --backends {args.backends}`.",
        "",
        f"Space: preset `{SPACE['preset']}`, {fields}; models {', '.join(m.stem for m in MODELS)}; policies "
        f"none, dynamic; fp32: {first.points} points, every one compiled, fused and simulated. The sweeps agree "
        "point for point (status, cycles, DRAM bytes, energy) on every runner.",
        "",
        "## Runner wall time",
        "",
        "Each runner sweeps every point into a fresh directory; wall time includes starting and stopping it "
        "(a local Ray instance takes a few seconds to start).",
        "",
        *markdown(wall_head, walls_rows),
        "",
        "## Pareto set per model and for both models (figures summed)",
        "",
        "The area model (`simulator/area.py`) counts on-chip SRAM, PEs and lanes, not the DRAM channel, so the "
        "wider channel costs no area here and designs on the front tend to have it: weigh it by its own cost. "
        f"Policies on the front: {', '.join(sorted({r[4] for r in pareto}))}.",
        "",
        *markdown(PARETO_HEAD, pareto),
        "",
        "## Points",
        "",
        "DRAM kB: DRAM traffic; roofline: the model's roofline bound / measured cycles.",
        "",
        *markdown(POINT_HEAD, points),
        "",
    ]
    RESULTS.write_text("\n".join(lines))
    console.print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
