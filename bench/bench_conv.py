"""Every distinct Conv layer of the zoo CNNs, alone: cycles of the baseline kernel (`unfused`: DRAM im2col + GEMM)
and of the implicit GEMM (`implicit_gemm`, the fused path's generator, bias + Relu in its drain when the model has
them), each beside the layer's roofline bound, and DRAM bytes moved vs compulsory (input + weights + bias +
output, once each).

    python bench/bench_conv.py --models resnet18,mobilenet_v2 --dtype int8 --out bench/results/conv.md

Reads the exported zoo models from the zoo cache (`$DYNFUSE_ZOO_CACHE`, default ~/.cache/dynfuse/zoo; run the zoo
tests or bench_zoo.py once to export them). Each layer runs on seeded standard-normal input, race-checked off.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

from fusion.engine.context import ModelContext
from fusion.engine.errors import CodegenError
from fusion.engine.execute import run_kernel
from fusion.engine.kernel import build_kernel
from fusion.engine.plan import Group
from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType
from fusion.lower.compiler import load_graph
from fusion.quant.calibrate import calibrate
from fusion.reference.interpreter import evaluate
from fusion.reference.quantized import evaluate_quantized
from simulator.config import load_config


def _cache() -> Path:
    return Path(os.environ.get("DYNFUSE_ZOO_CACHE", Path.home() / ".cache" / "dynfuse" / "zoo"))


def conv_layers(model: str, size: str = "small") -> list[tuple[str, object, dict]]:
    """(name, graph of the Conv (+ its Relu), attrs) for each distinct Conv shape of the model's export."""
    dirs = sorted(_cache().glob(f"{model}-{size}-*"))
    if not dirs:
        raise SystemExit(
            f"error: no {size} export of {model!r} in {_cache()} "
            f"(run bench/bench_zoo.py --models {model} --sizes {size})"
        )
    graph = load_graph(str(dirs[0] / "model.onnx"))
    seen, out = set(), []
    for node in graph.nodes:
        if node.op != OpType.Conv:
            continue
        x, w = graph.types[node.inputs[0]].shape, graph.types[node.inputs[1]].shape
        users = [n for n in graph.nodes if node.outputs[0] in n.inputs]
        relu = len(users) == 1 and users[0].op == OpType.Relu
        key = (x, w, tuple(node.attr("strides")), tuple(node.attr("pads")), node.attr("group"), relu)
        if key in seen:
            continue
        seen.add(key)
        b = GraphBuilder(node.name)
        args = [b.input("x", x), b.constant(np.asarray(graph.constants[node.inputs[1]]), "w")]
        if len(node.inputs) > 2:
            args.append(b.constant(np.asarray(graph.constants[node.inputs[2]]), "b"))
        attrs = {k: node.attr(k) for k in ("dilations", "group", "pads", "strides")}
        h = b.op(OpType.Conv, *args, name="conv", **attrs)
        if relu:
            h = b.op(OpType.Relu, h, name="relu")
        b.output(h)
        out.append((f"{model}/{node.name}", b.build(), {"x": x, "w": w, **attrs, "relu": relu}))
    return out


def measure(graph, config: str, dtype: str) -> dict[str, object]:
    rng = np.random.default_rng(0)
    inputs = {"x": rng.standard_normal(graph.types["x"].shape).astype(np.float32)}
    params = calibrate(graph, [inputs]) if dtype == "int8" else None
    mc = ModelContext(graph, load_config(config), dtype, params)
    env = (
        evaluate(graph, inputs)
        if params is None
        else {k: v.data for k, v in evaluate_quantized(graph, inputs, params).items()}
    )
    names = tuple(n.name for n in graph.nodes)
    row: dict[str, object] = {}
    groups = (
        ("unfused", Group(("conv",), "unfused")),
        ("implicit", Group(names, "implicit_gemm")),
        ("packed", Group(names, "implicit_packed")),
        ("stationary", Group(names, "implicit_stationary")),
    )
    for label, group in groups:
        try:
            run = run_kernel(mc, build_kernel(mc, group), env)
        except CodegenError as err:
            row[label] = str(err).split(": ", 1)[-1][:60]
            continue
        if len(names) == 2 and label == "unfused":  # the Relu's own kernel
            relu = run_kernel(mc, build_kernel(mc, Group(("relu",), "unfused")), env)
            run = run.__class__(
                run.outputs,
                run.cycles + relu.cycles,
                run.dram_read_bytes + relu.dram_read_bytes,
                run.dram_write_bytes + relu.dram_write_bytes,
                run.energy_pj + relu.energy_pj,
                run.counters,
            )
        row[label] = (run.cycles, run.dram_read_bytes + run.dram_write_bytes)
    es = 1 if dtype == "int8" else 4
    compulsory = sum(graph.types[v].size for v in ("x", graph.outputs[0])) * es + graph.types["w"].size * es
    row["compulsory"] = compulsory + (graph.types["b"].size * 4 if "b" in graph.types else 0)
    cfg = mc.config
    macs = graph.types[graph.outputs[0]].size * int(np.prod(graph.types["w"].shape[1:]))
    row["bound"] = max(macs / cfg.array_size**2, row["compulsory"] / cfg.dram_bytes_per_cycle)
    return row


def _cell(value, compulsory: int, bound: float) -> str:
    if isinstance(value, str):
        return f"refused: {value}"
    cycles, nbytes = value
    return f"{cycles:,} ({bound / cycles:.0%}) / {nbytes / compulsory:.1f}x"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="resnet18,mobilenet_v2")
    ap.add_argument("--size", default="small", choices=("small", "full"), help="the zoo export (64x64 or 224x224)")
    ap.add_argument("--config", default="base")
    ap.add_argument("--dtype", default="int8", choices=("fp32", "int8"))
    ap.add_argument("--out", default="bench/results/conv.md")
    args = ap.parse_args(argv)
    lines = [
        f"# Conv layers alone ({args.config}, {args.dtype}, {args.size}): `python bench/bench_conv.py --models "
        f"{args.models} --dtype {args.dtype} --size {args.size}`",
        "",
        "Cell: cycles (roofline bound / cycles; bound = max(MACs / N^2, compulsory bytes / DRAM bytes per cycle)) "
        "/ DRAM bytes moved as a multiple of compulsory "
        "(input + weights + bias + output once). `unfused` includes the Relu kernel where the model has one; "
        "`implicit` (band schedule), `packed` (channels-last, taps packed into K) and `stationary` (the patch "
        "preloaded, weights streamed) absorb it.",
        "",
        "| layer | x | w | stride | pads | group | unfused | implicit | packed | stationary | best vs unfused |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for model in args.models.split(","):
        for name, graph, a in conv_layers(model, args.size):
            row = measure(graph, args.config, args.dtype)
            c = row["compulsory"]
            un = row["unfused"]
            fused = [row[k][0] for k in ("implicit", "packed", "stationary") if not isinstance(row[k], str)]
            speed = f"{un[0] / min(fused):.2f}x" if not isinstance(un, str) and fused else "-"
            cells = " | ".join(_cell(row[k], c, row["bound"]) for k in ("unfused", "implicit", "packed", "stationary"))
            line = f"| {name} | {a['x']} | {a['w']} | {a['strides']} | {a['pads']} | {a['group']} | {cells} | {speed} |"
            print(line, flush=True)
            lines.append(line)
    Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
