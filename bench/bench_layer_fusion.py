"""Layer fusion (`conv_chain`, depth-first consecutive Convs) on the zoo CNNs: the dynamic plan's cycles and DRAM
bytes with and without the strategy, on `base` and on a low-bandwidth machine (base with fewer DRAM bytes per
cycle), and which chains the planner took.

    python bench/bench_layer_fusion.py --models resnet18,mobilenet_v2 --dtype int8 --bandwidth 4

On a loaded machine the eight plans can run as separate processes: `--only MODEL:MACHINE:VARIANT --json runs.jsonl`
appends one run's figures (MACHINE base or low, VARIANT with or without); `--from-json runs.jsonl` writes the table.

"Without" plans the same model with the `conv_chain` candidates removed from the planner's candidate list (the
planner has no switch to disable one strategy; this script filters `enumerate_candidates` in its own process).
Each run: seeded zoo input, validation off, host execution, one compile worker. Writes
bench/results/layer_fusion.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from unittest import mock

from bench.zoo import zoo_model

CHAIN = "conv_chain"


def plan_and_run(graph, inputs: dict, config, dtype: str, chains: bool) -> dict:
    """The dynamic plan's figures; `chains` False: planned without the conv_chain candidates."""
    from fusion.engine import planner
    from fusion.engine.engine import EngineOptions, FusionEngine
    from fusion.engine.validation import ValidationPolicy

    every = planner.enumerate_candidates

    def without(g):
        return [c for c in every(g) if c.family != CHAIN]

    options = EngineOptions(policy="dynamic", validation=ValidationPolicy("off"), workers=1, execution="host")
    with mock.patch.object(planner, "enumerate_candidates", every if chains else without):
        engine = FusionEngine(graph, config, dtype, options)
        start = time.perf_counter()
        result = engine.run(inputs)
        seconds = time.perf_counter() - start
        taken = [g for g in engine.plan.groups if g.strategy == CHAIN]
        engine.close()
    return {
        "cycles": result.cycles,
        "dram": result.dram_bytes,
        "chains": [f"{g.nodes[0]}..{g.nodes[-1]} ({g.schedule})" for g in taken],
        "seconds": seconds,
    }


def main(argv: list[str] | None = None) -> int:
    from fusion.lower.compiler import load_graph
    from simulator.config import load_config

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="resnet18,mobilenet_v2")
    ap.add_argument("--dtype", default="int8", choices=("fp32", "int8"))
    ap.add_argument("--bandwidth", type=int, default=4, help="DRAM bytes per cycle of the low-bandwidth machine")
    ap.add_argument("--out", default="bench/results/layer_fusion.md")
    ap.add_argument("--only", help="one run, MODEL:MACHINE:VARIANT (machine base|low, variant with|without)")
    ap.add_argument("--json", help="append the runs' figures to this JSON-lines file")
    ap.add_argument("--from-json", help="write the table from these runs instead of planning")
    args = ap.parse_args(argv)
    base = load_config("base")
    configs = (base, replace(base, name=f"base_bw{args.bandwidth}", dram_bytes_per_cycle=args.bandwidth))
    runs = _read(args.from_json) if args.from_json else {}
    if args.only:
        name, machine, variant = args.only.split(":")
        config = configs[("base", "low").index(machine)]
        graph, inputs, _ = _model(name, load_graph)
        run = plan_and_run(graph, inputs, config, args.dtype, variant == "with")
        print(json.dumps(_append(args.json, {"model": name, "machine": config.name, "variant": variant, **run})))
        return 0
    lines = [
        f"# Layer fusion (`conv_chain`), {args.dtype}, dynamic plans: `python bench/bench_layer_fusion.py --models "
        f"{args.models} --dtype {args.dtype} --bandwidth {args.bandwidth}`",
        "",
        f"`base` has {base.dram_bytes_per_cycle} DRAM bytes per cycle; `base_bw{args.bandwidth}` is base with "
        f"{args.bandwidth}. Without: the same planner with no `conv_chain` candidate. Cycles and DRAM bytes of the "
        "whole model (host execution, kernel by kernel).",
        "",
        "| model | machine | cycles without | cycles with | speedup | DRAM MB without | DRAM MB with | chains taken |",
        "|---|---|---|---|---|---|---|---|",
    ]
    details = []
    for name in args.models.split(","):
        graph, inputs, size = _model(name, load_graph)
        for config in configs:
            off, on = (
                runs.get((name, config.name, variant))
                or plan_and_run(graph, inputs, config, args.dtype, variant == "with")
                for variant in ("without", "with")
            )
            line = (
                f"| {name} {size} | {config.name} | {off['cycles']:,} | "
                f"{on['cycles']:,} | {off['cycles'] / on['cycles']:.3f}x | {off['dram'] / 1e6:.2f} | "
                f"{on['dram'] / 1e6:.2f} | {len(on['chains'])} |"
            )
            print(line, f"({off['seconds']:.0f} s / {on['seconds']:.0f} s)", flush=True)
            lines.append(line)
            details += [f"- {name}, {config.name}: {c}" for c in on["chains"]]
    lines += ["", "Chains taken:", "", *(details or ["- none"])]
    Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


def _model(name: str, load_graph) -> tuple:
    entry = zoo_model(name, "small")
    graph = load_graph(entry.onnx_path)
    return graph, {graph.inputs[0]: entry.input}, "x".join(map(str, entry.input.shape[2:]))


def _append(path: str | None, run: dict) -> dict:
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(run) + "\n")
    return run


def _read(path: str) -> dict:
    """(model, machine, variant) -> the run's figures, from a JSON-lines file of `--only` runs."""
    runs = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return {(r["model"], r["machine"], r["variant"]): r for r in runs}


if __name__ == "__main__":
    sys.exit(main())
