"""On-chip dispatch overhead per model: the store-side zero-tile counter vs measuring the operand (int8, base).

    python bench/bench_dispatch.py [--models mlp,bert,...]   ->  bench/results/dispatch.md

Per model, the engine's plan (host execution, dynamic policy) is linked into one program with on-chip dispatch
(the analytic cost model's predictions, budget 1% of each dense kernel) twice: with the counter
(`link_plan(counter=True)`: a group whose operand a kernel of the program writes on the tile grid reads the count
its writer's `dma.stz` stores made) and without (`counter=False`: every dispatch DMAs its operand and tests each
tile, so only groups whose measurement fits the budget get one). Columns: dispatched groups (counted / measured),
the dispatch code's cycles (dispatchers and `zc.clr` blocks) and their share of the program's cycles, and the
program's cycles, on the model's bundled input. One process, models one after another.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "fusion" / "engine"))

from bench.bench_program import BUNDLED, write_table  # noqa: E402
from bench.bench_program import _model as model_inputs  # noqa: E402 - the same models and inputs as that table
from bench.zoo import NAMES  # noqa: E402
from fusion.cost.analytic import AnalyticCostModel  # noqa: E402
from fusion.engine.engine import EngineOptions, FusionEngine  # noqa: E402
from fusion.engine.program import link_plan, model_prefers, run_program, variants  # noqa: E402


def _cells(mc, choices, inputs, prefer, counter: bool) -> str:
    linked = link_plan(mc, choices, prefer, counter=counter)
    run = run_program(mc, linked, inputs)
    counted = sum(d.producer is not None for d in linked.dispatches)
    share = 100 * run.dispatch_cycles / run.cycles
    return f"{counted} / {len(linked.dispatches) - counted} | {run.dispatch_cycles} ({share:.3f}%) | {run.cycles}"


def row(name: str) -> str:
    graph, inputs = model_inputs(name)
    engine = FusionEngine(graph, "base", "int8", EngineOptions(execution="host"))
    engine.run(inputs)
    mc, choices = engine.mc, engine.plan.choices
    start = time.perf_counter()
    prefer = model_prefers(mc, AnalyticCostModel())
    candidates = sum(variants(c) is not None for c in choices)
    on, off = (_cells(mc, choices, inputs, prefer, counter) for counter in (True, False))
    return f"| {name} | {candidates} | {on} | {off} | {time.perf_counter() - start:.1f} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join((*BUNDLED, *NAMES)))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "dispatch.md")
    args = parser.parse_args()
    lines = [
        "# On-chip dispatch overhead (int8, base config, dynamic policy)",
        "",
        "`python bench/bench_dispatch.py`. Groups with dense and zero-skip variants; with the store-side counter "
        "and without it (every dispatch measures its operand: one DMA + a `bnz.tile` per tile): dispatched groups "
        "(counted / measured), the dispatch code's cycles (share of the program), the program's cycles.",
        "",
        "| model | groups with variants | counter: dispatched (counted / measured) | its dispatch cycles | program | "
        "no counter: dispatched | its dispatch cycles | program | bench s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    write_table(args.models.split(","), row, lines, args.out)


if __name__ == "__main__":
    main()
