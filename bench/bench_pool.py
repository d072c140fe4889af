"""Pooling and depthwise Conv layers alone on the vector unit: the frame kernels (`fusion.lower.kernels.frame_windows`
and `frame_pool`, what the baseline and the fused plans run now) beside the padded-band / window kernels they
replaced (`windows`: DRAM padding phase, band of shifted ops at every padded position, DRAM scratch and a copy
phase picking the strided pixels), each against the layer's bounds.

    python bench/bench_pool.py --dtype int8 --out bench/results/pool.md

Layers: the zoo CNNs' distinct depthwise Convs and MaxPools (from the exported small models in the zoo cache,
`$DYNFUSE_ZOO_CACHE`, default ~/.cache/dynfuse/zoo) and the pools of `SYNTHETIC` built with the graph builder,
each after a 1x1 identity Conv + Relu (so its input is int8 on the int8 path, as in the model; that prefix's own
cycles are subtracted). Seeded standard-normal inputs. Bounds: DRAM = compulsory bytes (input + weights + output
once) / bytes per cycle; vector = one lane-wide op per tap per output element (two for a multiply-accumulate) /
lanes (a per-tap bound: the separable MaxPool needs about k_h + s_h * k_w ops per output and can go below it).
"""

from __future__ import annotations

import argparse
import os
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType
from fusion.lower import compiler
from fusion.lower.compiler import compile as compile_model
from fusion.lower.compiler import load_graph
from fusion.lower.kernels import windows
from fusion.lower.kernels.conv_depthwise import is_depthwise


def _cache() -> Path:
    return Path(os.environ.get("DYNFUSE_ZOO_CACHE", Path.home() / ".cache" / "dynfuse" / "zoo"))


def _layer(node, graph) -> tuple[str, object]:
    x = graph.types[node.inputs[0]].shape
    b = GraphBuilder(node.name)
    h = _prefix(b, x)
    attrs = {k: node.attr(k) for k in ("dilations", "pads", "strides")}
    if node.op == OpType.Conv:
        args = [h, b.constant(np.asarray(graph.constants[node.inputs[1]]), "w")]
        if len(node.inputs) > 2:
            args.append(b.constant(np.asarray(graph.constants[node.inputs[2]]), "b"))
        out = b.op(OpType.Conv, *args, name="layer", group=node.attr("group"), **attrs)
    else:
        out = b.op(
            OpType.MaxPool, h, name="layer", kernel=node.attr("kernel"), ceil_mode=node.attr("ceil_mode"), **attrs
        )
    b.output(out)
    kernel = graph.types[node.inputs[1]].shape[2:] if node.op == OpType.Conv else node.attr("kernel")
    return f"{node.op.value} x{list(x)} k{list(kernel)} s{list(node.attr('strides'))}", b.build()


def layers(models: list[str]) -> list[tuple[str, object]]:
    out, seen = [], set()
    for model in models:
        dirs = sorted(_cache().glob(f"{model}-small-*"))
        if not dirs:
            raise SystemExit(f"error: no exported {model!r} in {_cache()} (run bench/bench_zoo.py --models {model})")
        graph = load_graph(str(dirs[0] / "model.onnx"))
        for node in graph.nodes:
            if node.op == OpType.MaxPool or (node.op == OpType.Conv and is_depthwise(graph, node)):
                name, g = _layer(node, graph)
                if name not in seen:
                    seen.add(name)
                    out.append((f"{model}: {name}", g))
    for name, op, shape, kernel, stride, pad in SYNTHETIC:
        b = GraphBuilder(name)
        pool = dict(kernel=kernel, strides=stride, pads=(pad,) * 4, dilations=(1, 1), ceil_mode=0)
        extra = {"count_include_pad": 0} if op == OpType.AveragePool else {}
        b.output(b.op(op, _prefix(b, shape), name="layer", **pool, **extra))
        out.append((f"{name}: {op.value} x{list(shape)} k{kernel} s{stride}", b.build()))
    return out


# Pools the small zoo models do not have at these sizes: resnet18's 224x224 stem MaxPool, an Inception-style
# 3x3 stride-1 AveragePool and a DenseNet-style 2x2 stride-2 transition AveragePool.
SYNTHETIC = (
    ("resnet18 224", OpType.MaxPool, (1, 64, 112, 112), (3, 3), (2, 2), 1),
    ("inception-like", OpType.AveragePool, (1, 64, 28, 28), (3, 3), (1, 1), 1),
    ("densenet-like", OpType.AveragePool, (1, 128, 28, 28), (2, 2), (2, 2), 0),
)


@contextmanager
def padded_band():
    """The compiler's window lowerings as they were before the frame kernel (for the side-by-side column)."""
    saved = dict(compiler.LOWERINGS)
    compiler.LOWERINGS.update(windows.WINDOWS)
    try:
        yield
    finally:
        compiler.LOWERINGS.clear()
        compiler.LOWERINGS.update(saved)


def layer_cycles(graph, config: str, dtype: str) -> int:
    """Cycles of the layer's own kernel (the prefix before it excluded)."""
    x = {"x": np.random.default_rng(0).standard_normal(graph.types["x"].shape).astype(np.float32)}
    model = compile_model(graph, config, dtype, samples=[x] if dtype == "int8" else None, cleanup=False)
    relu = compile_model(_relu_only(graph), config, dtype, samples=[x] if dtype == "int8" else None, cleanup=False)
    return model.run(x)[1].cycle - relu.run(x)[1].cycle


def _frame_column(path: Path) -> dict[str, str]:
    """layer -> its frame cells in an earlier results file (a missing or malformed file is a clear error)."""
    try:
        rows = [line.split("|") for line in path.read_text().splitlines() if line.startswith("| ")]
    except OSError as e:
        raise SystemExit(f"error: --previous {path}: {e.strerror}") from None
    return {cells[1].strip(): cells[3].strip() for cells in rows if len(cells) > 4 and cells[1].strip() != "layer"}


def _prefix(b: GraphBuilder, shape: tuple[int, ...]):
    """x -> 1x1 identity Conv -> Relu: the layer's input is then int8 on the int8 path, as inside the model."""
    eye = np.eye(shape[1], dtype=np.float32).reshape(shape[1], shape[1], 1, 1)
    h = b.op(OpType.Conv, b.input("x", shape), b.constant(eye, "eye"), name="pre", **_ONE)
    return b.op(OpType.Relu, h, name="relu")


_ONE = {"strides": (1, 1), "pads": (0, 0, 0, 0), "dilations": (1, 1), "group": 1}


def _relu_only(graph):
    b = GraphBuilder("prefix")
    b.output(_prefix(b, graph.types["x"].shape))
    return b.build()


def bounds(graph, config, dtype: str) -> tuple[float, float]:
    from simulator.config import load_config

    cfg = load_config(config)
    node = graph.node("layer")
    es = 1 if dtype == "int8" else 4
    x, y = graph.types[node.inputs[0]], graph.types[node.outputs[0]]
    conv = node.op == OpType.Conv
    taps = int(np.prod(graph.types[node.inputs[1]].shape[2:])) if conv else int(np.prod(node.attr("kernel")))
    weights = graph.types[node.inputs[1]].size * es if conv else 0
    dram = (x.size + y.size) * es + weights
    vector = y.size * taps * (2 if conv else 1) / cfg.vector_lanes
    return dram / cfg.dram_bytes_per_cycle, vector


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="mobilenet_v2,resnet18")
    ap.add_argument("--config", default="base")
    ap.add_argument("--dtype", default="int8", choices=("fp32", "int8"))
    ap.add_argument("--out", default="bench/results/pool.md")
    ap.add_argument(
        "--previous",
        help="an earlier results file (e.g. `git show REV:bench/results/pool.md > pool@REV.md`): its frame column "
        "beside this run's, per layer",
    )
    args = ap.parse_args(argv)
    previous = _frame_column(Path(args.previous)) if args.previous else {}
    lines = [
        f"# Pooling and depthwise layers alone ({args.config}, {args.dtype}): `python bench/bench_pool.py "
        f"--models {args.models} --dtype {args.dtype}" + (f" --previous {args.previous}" if previous else "") + "`",
        "",
        "Cycles of the layer's kernel; `bound` = max(DRAM, vector) as in the module docstring; % = bound / cycles.",
        "",
        "| layer | padded band (before) | frame (now) | speedup | DRAM bound | vector bound |"
        + (f" frame in {args.previous} |" if previous else ""),
        "|---|---|---|---|---|---|" + ("---|" if previous else ""),
    ]
    for name, graph in layers(args.models.split(",")):
        with padded_band():
            before = layer_cycles(graph, args.config, args.dtype)
        now = layer_cycles(graph, args.config, args.dtype)
        dram, vector = bounds(graph, args.config, args.dtype)
        bound = max(dram, vector)
        line = (
            f"| {name} | {before:,} ({bound / before:.0%}) | {now:,} ({bound / now:.0%}) | {before / now:.2f}x "
            f"| {dram:,.0f} | {vector:,.0f} |"
        ) + (f" {previous.get(name, 'not measured')} |" if previous else "")
        print(line, flush=True)
        lines.append(line)
    Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
