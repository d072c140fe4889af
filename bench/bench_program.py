"""One program per plan vs host-dispatched kernels vs the kernels' sum, per model (int8, base config, dynamic).

    python bench/bench_program.py [--models mlp,bert,...]   ->  bench/results/program.md

Columns: the plan's kernels each simulated alone and summed; host-dispatched = that sum plus
`MachineConfig.launch_cycles` per launch; the plan linked into one program as the engine keeps it
(`fusion.engine.program_run.link_for_call`); the overlap it gains over the sum, and at each token-ordered
boundary (as the link measured it: the kernels' shares against the plan fenced everywhere); the on-chip dispatch
code's cycles. One process, models one after another.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "fusion" / "engine"))

from bench.zoo import NAMES, zoo_model  # noqa: E402
from fusion.cost.analytic import AnalyticCostModel  # noqa: E402
from fusion.engine.engine import EngineOptions, FusionEngine  # noqa: E402
from fusion.engine.overlap import BoundaryOverlap  # noqa: E402
from fusion.engine.planner import Evaluator  # noqa: E402
from fusion.engine.program import model_prefers  # noqa: E402
from fusion.engine.program_figures import measure  # noqa: E402
from fusion.engine.strategies import strategy_of  # noqa: E402
from fusion.lower.compiler import load_graph  # noqa: E402

BUNDLED = ("mlp", "resnet_block", "encoder_post_d64", "encoder_pre_d64", "encoder_post_d128")


def _model(name: str):
    if name in BUNDLED:
        from engine_helpers import model

        return model(name)
    entry = zoo_model(name)
    graph = load_graph(entry.onnx_path)
    return graph, {graph.inputs[0]: entry.input}


def row(name: str) -> str:
    graph, inputs = _model(name)
    engine = FusionEngine(graph, "base", "int8", EngineOptions(execution="host"))
    engine.run(inputs)
    start = time.perf_counter()
    f = measure(engine.mc, engine.plan.choices, inputs)
    d = measure(engine.mc, engine.plan.choices, inputs, model_prefers(engine.mc, AnalyticCostModel()), False)
    seconds = time.perf_counter() - start
    ev = Evaluator(engine.mc, AnalyticCostModel(), engine.profiles)
    run = [ev.evaluate(c.group) for c in engine.plan.choices if not strategy_of(c.group).host_view]
    predicted = BoundaryOverlap(engine.mc).chain(run)
    best = sorted((g for *_, g in f.boundaries), reverse=True)[:3]
    return (
        f"| {name} | {f.kernel_cycles} | {f.launches} | {f.host_cycles} | {f.program_cycles} | "
        f"{f.kernel_cycles / f.program_cycles:.3f}x | {f.host_cycles / f.program_cycles:.2f}x | "
        f"{f.overlap_cycles} | {predicted:.0f} | {f.joined} / {f.fences} | {', '.join(map(str, best))} | "
        f"{d.program_cycles} | {d.dispatch_cycles} ({100 * d.dispatch_cycles / d.program_cycles:.2f}%) | "
        f"{seconds:.1f} |"
    )


def write_table(models: list[str], row: Callable[[str], str], lines: list[str], out: Path) -> None:
    """Append one row per model to the header `lines`, writing `out` after each (a long run keeps what it
    measured); a model the engine cannot run is a row with its error, not fatal to the table."""
    empty = "|" * (lines[-1].count("|") - 2)  # the error cell fills the row after the model's name
    for name in models:
        try:
            lines.append(row(name))
        except Exception as err:  # noqa: BLE001 - reported in the table
            lines.append(f"| {name} | {type(err).__name__}: {str(err)[:80]} {empty}")
        print(lines[-1], flush=True)
        out.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join((*BUNDLED, *NAMES)))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "program.md")
    args = parser.parse_args()
    lines = [
        "# One program per plan (int8, base config, dynamic policy)",
        "",
        "`python bench/bench_program.py`. Kernels: the plan's kernels each simulated alone, summed. Host: that sum "
        "+ 5000 launch cycles (`launch_cycles`, 5 us at 1 GHz) per launch. Program: the plan linked into one "
        "binary as the engine keeps it on the model's input (`program_run.link_for_call`: the fastest of the "
        "candidate, the same without on-chip dispatch and the plan fenced everywhere). Overlap: kernels - program; "
        "predicted overlap: the planner's estimate for the "
        "plan's kernel boundaries (`fusion.engine.overlap.BoundaryOverlap`, analytic cost model). "
        "Boundaries: token-ordered / fenced; top gains: the "
        "largest gains of single boundaries as the link measured them (cycles). Program with on-chip dispatch: the "
        "groups with dense and zero-skip variants whose count fits the budget (1% of the dense kernel) dispatched "
        "on chip, kept only if that paid on the model's input (its dispatch code's cycles, share of that program); "
        "the other columns run the planned variants.",
        "",
        "| model | kernels | launches | host | program | kernels/program | host/program | overlap | "
        "predicted overlap | joined / fenced | top boundary gains | program with on-chip dispatch | "
        "its dispatch cycles | bench s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    write_table(args.models.split(","), row, lines, args.out)


if __name__ == "__main__":
    main()
