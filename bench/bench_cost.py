"""The analytic cost model's per-kernel error: every kernel the none / static / dynamic plans dispatch (each
distinct kernel once per model and dtype), predicted vs simulated cycles, on the bundled models, hand-built
transformer blocks and every importable zoo export (`--zoo DIR`: `*.onnx` below it).

Reports the median |error| per model and per strategy, and the spread per strategy (root mean square of the
relative error, measured - predicted over predicted), the number `AnalyticCostModel` states with each
prediction (`CostEstimate.spread`, `analytic.SPREAD`) for the planner's expected-regret measurement.
Usage: python bench/bench_cost.py [--zoo DIR ...] [--max-kernels-cycles N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from fusion.cost import AnalyticCostModel
from fusion.engine.context import ModelContext
from fusion.engine.execute import timing_cycles
from fusion.engine.planner import Evaluated, Evaluator, plan_dynamic, plan_none, plan_static
from fusion.graph.ir import Graph
from fusion.lower.compiler import load_graph
from fusion.quant.calibrate import calibrate
from simulator.config import load_config

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fusion" / "engine"))
from transformer_graphs import BlockShape, transformer  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "cost.md"
BLOCKS = (
    BlockShape(seq=32, dim=128, heads=4, ffn=4),
    BlockShape(seq=17, dim=48, heads=3, pre_norm=True, act="relu"),
    BlockShape(batch=2, seq=24, dim=64, heads=4, layers=2),
)


def models(zoo: list[str]) -> Iterator[tuple[str, Graph | Path, dict[str, np.ndarray] | None]]:
    for path in sorted((ROOT / "tests" / "fusion" / "models").glob("*.onnx")):
        yield path.stem, path, None
    for shape in BLOCKS:
        graph, inputs = transformer(shape)
        yield f"{graph.name}_l{shape.layers}", graph, inputs
    for path in sorted(p for d in zoo for p in Path(d).rglob("*.onnx")):
        yield path.parent.name.rsplit("-", 1)[0] if path.stem == "model" else path.stem, path, None


def kernels(graph: Graph, inputs: dict[str, np.ndarray], dtype: str) -> list[Evaluated]:
    """Every distinct kernel the three policies' plans dispatch (views excluded)."""
    params = calibrate(graph, [inputs]) if dtype == "int8" else None
    ev = Evaluator(ModelContext(graph, load_config("base"), dtype, params), AnalyticCostModel(), {})
    found: dict = {}
    for plan in (plan_none(ev), plan_static(ev), plan_dynamic(ev, guard=False)):
        for choice in plan.choices:
            e = ev.evaluate(choice.group)
            if isinstance(e, Evaluated) and e.kernel.program is not None:
                found[choice.group] = e
    return list(found.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--zoo", nargs="*", default=[], help="directories searched for *.onnx")
    args = ap.parse_args()
    start = time.perf_counter()
    per_model, by_strategy, failures = [], {}, []
    for name, source, inputs in models(args.zoo):
        try:
            graph = source if isinstance(source, Graph) else load_graph(source)
            rng = np.random.default_rng(0)
            inputs = inputs or {v: rng.standard_normal(graph.types[v].shape).astype(np.float32) for v in graph.inputs}
            for dtype in ("fp32", "int8"):
                errors = []
                for e in kernels(graph, inputs, dtype):
                    measured = timing_cycles(ModelContext(graph, load_config("base"), dtype), e.kernel)
                    errors.append((measured - e.cycles) / e.cycles)
                    by_strategy.setdefault(e.group.strategy, []).append(errors[-1])
                med = statistics.median(abs(x) for x in errors)
                per_model.append((name, dtype, len(errors), med, statistics.median(errors)))
                print(f"{name:32} {dtype} {len(errors):4d} kernels, median |error| {med:.1%}", flush=True)
        except Exception as err:  # a model dynfuse cannot import or plan is a row of the report
            failures.append(f"- {name}: {type(err).__name__}: {str(err).splitlines()[0][:160]}")
    everything = [x for v in by_strategy.values() for x in v]
    lines = ["| model | dtype | kernels | median abs error | median error |", "|---|---|---|---|---|"]
    lines += [f"| {m} | {d} | {n} | {a:.1%} | {s:+.1%} |" for m, d, n, a, s in per_model]
    spread = ["| strategy | kernels | median abs error | median error | spread (rms) |", "|---|---|---|---|---|"]
    for strategy, errs in sorted(by_strategy.items()):
        rms = float(np.sqrt(np.mean(np.square(errs))))
        spread.append(
            f"| {strategy} | {len(errs)} | {statistics.median(map(abs, errs)):.1%} | "
            f"{statistics.median(errs):+.1%} | {rms:.3f} |"
        )
    RESULTS.write_text(
        "# Analytic cost model: per-kernel error\n\n"
        f"`python bench/bench_cost.py {' '.join('--zoo ' + z for z in args.zoo)}` "
        f"({time.perf_counter() - start:.0f} s). Every distinct kernel of the none, static and dynamic plans "
        "(unguarded), simulated on zero inputs; error = (measured - predicted) / predicted. Over all "
        f"{len(everything)} kernels: median |error| {statistics.median(map(abs, everything)):.1%}.\n\n"
        + "\n".join(lines)
        + "\n\nBy strategy (the spread is what `AnalyticCostModel` states, `analytic.SPREAD`):\n\n"
        + "\n".join(spread)
        + ("\n\nNot measured:\n\n" + "\n".join(failures) if failures else "")
        + "\n"
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
