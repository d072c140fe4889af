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
# mobilenet_v2 64x64's inverted residuals: features.2, 3, 4, 6, 9, 13
MOBILENET_BLOCKS = "ir:16x32x6x2x24,ir:24x16x6x1x24,ir:24x16x6x2x32,ir:32x8x6x1x32,ir:64x4x6x1x64,ir:96x4x6x1x96"


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


def basic_block(c: int, hw: int, seed: int = 0, mid: int = 0):
    """A ResNet basic block (Conv3x3 + ReLU, Conv3x3, + x, ReLU), or with `mid` a bottleneck (Conv1x1 to mid +
    ReLU, Conv3x3 + ReLU, Conv1x1 back to c, + x, ReLU), seeded fan-in-scaled weights and biases."""
    import numpy as np

    from fusion.graph.builder import GraphBuilder
    from fusion.graph.ops import OpType

    rng = np.random.default_rng(seed)
    b = GraphBuilder("basic_block")
    x = h = b.input("x", (1, c, hw, hw))
    layers = [(mid, c, 1), (mid, mid, 3), (c, mid, 1)] if mid else [(c, c, 3), (c, c, 3)]
    for i, (cout, cin, k) in enumerate(layers):
        attrs = {"strides": (1, 1), "pads": (k // 2,) * 4, "dilations": (1, 1), "group": 1}
        w = b.constant((rng.standard_normal((cout, cin, k, k)) / np.sqrt(k * k * cin)).astype(np.float32), f"w{i}")
        bias = b.constant((rng.standard_normal(cout) * 0.1).astype(np.float32), f"b{i}")
        h = b.op(OpType.Conv, h, w, bias, name=f"c{i}", **attrs)
        h = b.op(OpType.Relu, h, name=f"r{i}") if i < len(layers) - 1 else h
    b.output(b.op(OpType.Relu, b.op(OpType.Add, h, x, name="add"), name="relu"))
    return b.build(), {"x": rng.standard_normal((1, c, hw, hw)).astype(np.float32)}


def inverted_residual(c, hw, expand, cout, stride, seed=0, batch=1, relu6=True, dw_kernel=3, gain=1.5, stem=False):
    """MobileNetV2's inverted residual from x [batch, c, *hw]: 1x1 expand (x `expand`) -> Clip(0, 6) -> depthwise
    (pad k // 2, `stride`) -> Clip -> 1x1 project to cout (+ x when stride 1 and cout == c); Relu instead of the
    Clips when not `relu6`; weights `gain` x fan-in-scaled (1.5: the Clips bind; 0.5: mostly the int8
    requantization clamp), biases; `stem`: x first through a 1x1 Conv (the block input then an int8 Conv output in
    the quantized plan, as in MobileNetV2). Returns the graph and the block's node names."""
    import numpy as np

    from fusion.graph.builder import GraphBuilder
    from fusion.graph.ops import OpType

    rng = np.random.default_rng(seed)
    b = GraphBuilder("inverted_residual")
    x = b.input("x", (batch, c, *hw))
    e = c * expand

    def act(h, name):
        if relu6:
            return b.op(OpType.Clip, h, name=name, min=0.0, max=6.0)
        return b.op(OpType.Relu, h, name=name)

    def conv(h, i, shape, group, k, s):
        w = (rng.standard_normal(shape) * gain / np.sqrt(np.prod(shape[1:]))).astype(np.float32)
        bias = b.constant((rng.standard_normal(shape[0]) * 0.2).astype(np.float32), f"b{i}")
        attrs = {"dilations": (1, 1), "group": group, "pads": (k // 2,) * 4, "strides": (s, s)}
        return b.op(OpType.Conv, h, b.constant(w, f"w{i}"), bias, name=f"c{i}", **attrs)

    x = conv(x, 3, (c, c, 1, 1), 1, 1, 1) if stem else x
    h = act(conv(x, 0, (e, c, 1, 1), 1, 1, 1), "a0")
    h = act(conv(h, 1, (e, 1, dw_kernel, dw_kernel), e, dw_kernel, stride), "a1")
    h = conv(h, 2, (cout, e, 1, 1), 1, 1, 1)
    names = ["c0", "a0", "c1", "a1", "c2"]
    if stride == 1 and cout == c:
        h = b.op(OpType.Add, x, h, name="add")
        names.append("add")
    b.output(h)
    return b.build(), tuple(names)


def block(spec: str):
    """A block from its spec: `basic:CxHW` (a ResNet basic block), `bottleneck:CxHWxM` (a ResNet bottleneck,
    M mid channels) or `ir:CxHWxExSxCOUT` (an inverted residual: expansion E, depthwise stride S); its graph,
    seeded input and the chain's nodes."""
    import numpy as np

    kind, _, dims = spec.partition(":")
    sizes = tuple(map(int, dims.split("x")))
    if (kind, len(sizes)) in (("basic", 2), ("bottleneck", 3)):
        graph, inputs = basic_block(*sizes[:2], mid=sizes[2] if kind == "bottleneck" else 0)
        return graph, inputs, tuple(n.name for n in graph.nodes)
    if kind == "ir" and len(sizes) == 5:
        c, hw, expand, stride, cout = sizes
        graph, names = inverted_residual(c, (hw, hw), expand, cout, stride)
        x = np.random.default_rng(1).standard_normal(graph.types["x"].shape).astype(np.float32)
        return graph, {"x": x}, names
    raise SystemExit(f"--blocks: {spec!r} is none of basic:CxHW, bottleneck:CxHWxM, ir:CxHWxExSxCOUT")


def block_rows(spec: str, configs, dtypes=("fp32", "int8")) -> list[str]:
    """The block alone: the dynamic plan without `conv_chain` (measured, host execution), the chain's best schedule
    (measured), and the dynamic plan with it (what the planner takes); cycles and DRAM bytes."""
    from fusion.engine.candidates import Candidate, schedules
    from fusion.engine.context import ModelContext
    from fusion.engine.execute import run_kernel
    from fusion.engine.kernel import try_build
    from fusion.quant.calibrate import calibrate
    from fusion.reference.interpreter import evaluate
    from fusion.reference.quantized import evaluate_quantized

    graph, inputs, names = block(spec)
    rows = []
    for dtype in dtypes:
        params = calibrate(graph, [inputs]) if dtype == "int8" else None
        for config in configs:
            mc = ModelContext(graph, config, dtype, params)
            env = (
                evaluate(graph, inputs)
                if params is None
                else {k: v.data for k, v in evaluate_quantized(graph, inputs, params).items()}
            )
            groups = schedules(mc, Candidate(names, CHAIN))
            runs = [(g, run_kernel(mc, k, env)) for g in groups if not isinstance(k := try_build(mc, g), str)]
            off, on = (plan_and_run(graph, inputs, config, dtype, chains) for chains in (False, True))
            if not runs:
                rows.append(f"| {spec} | {dtype} | {config.name} | {off['cycles']:,} | refused | | | | |")
                continue
            group, run = min(runs, key=lambda gr: gr[1].cycles)
            dram = run.dram_read_bytes + run.dram_write_bytes
            rows.append(
                f"| {spec} | {dtype} | {config.name} | {off['cycles']:,} | {run.cycles:,} ({group.schedule}) | "
                f"{off['cycles'] / run.cycles:.2f}x | {on['cycles']:,} ({len(on['chains'])} chain) | "
                f"{off['dram'] / 1e3:.0f} | {dram / 1e3:.0f} |"
            )
            print(rows[-1], flush=True)
    return rows


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
    ap.add_argument(
        "--blocks",
        default=f"basic:64x16,basic:128x8,bottleneck:256x16x64,bottleneck:512x8x128,{MOBILENET_BLOCKS}",
        help="blocks alone: basic:CxHW, bottleneck:CxHWxM, ir:CxHWxExSxCOUT (default: resnet18 64x64's layer1, 2; "
        "resnet50 64x64's layer1, 2; mobilenet_v2 64x64's)",
    )
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
    if args.blocks:
        lines += [
            "",
            "## Blocks alone",
            "",
            "`basic:CxHW`: a ResNet basic block (Conv3x3 + ReLU, Conv3x3, + x, ReLU); `bottleneck:CxHWxM`: a ResNet "
            "bottleneck (Conv1x1 to M + ReLU, Conv3x3 + ReLU, Conv1x1 to C, + x, ReLU); `ir:CxHWxExSxCOUT`: a "
            "MobileNetV2 inverted residual (1x1 expand x E -> ReLU6 -> 3x3 depthwise stride S -> ReLU6 -> 1x1 "
            "project, + x when S = 1 and COUT = C). Without: the dynamic plan with no `conv_chain` candidate; "
            "chain: the conv_chain schedule measuring fewest cycles; planner: the dynamic plan with it (the chains "
            "it takes). Cycles (host execution), DRAM kB.",
            "",
            "| block | dtype | machine | without | chain | speedup | planner | DRAM kB without | DRAM kB chain |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for spec in args.blocks.split(","):
            lines += block_rows(spec, configs)
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
