"""dynfuse `static` against TVM's own FuseOps: kernels per model (TVM's `call_tir` calls in `main` after
from_onnx, LegalizeOps, AnnotateTIROpPattern, FoldConstant, FuseOps, FuseTIR) vs dynfuse's TVM rules on its IR
(`fusion.engine.fuse_ops`), its `static` and `dynamic` plans (kernels = non-view groups) in the `--dtype`.

Needs `pip install apache-tvm` (0.27; a bench-only dependency). Models: the bundled ones plus every `*.onnx` under
the `--zoo` directories (those dynfuse cannot import are listed with the reason); the zoo's exports are cached in
~/.cache/dynfuse/zoo. Results: bench/results/tvm.md (fp32), tvm_int8.md (int8).
Usage: python bench/bench_tvm.py [--zoo DIR ...] [--models NAME ...] [--dtype fp32|int8]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx

from fusion.engine.engine import EngineOptions, FusionEngine
from fusion.engine.fuse_ops import fuse_ops
from fusion.engine.validation import ValidationPolicy
from fusion.graph.ir import Graph
from fusion.lower.compiler import ALIAS_OPS, load_graph

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = sorted((ROOT / "tests" / "fusion" / "models").glob("*.onnx"))
RESULTS = {"fp32": "tvm.md", "int8": "tvm_int8.md"}  # under bench/results/, per dtype


def tvm_kernels(path: Path) -> list[str]:
    """TVM's fused kernels of an ONNX model: the PrimFuncs `main` calls, in call order."""
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    mod = from_onnx(onnx.load(path), keep_params_in_input=False)
    passes = [
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
    ]
    with tvm.transform.PassContext(opt_level=3):
        mod = tvm.transform.Sequential(passes)(mod)
    names: list[str] = []

    def visit(expr) -> None:
        if isinstance(expr, relax.Call) and getattr(expr.op, "name", "") == "relax.call_tir":
            names.append(expr.args[0].name_hint)

    relax.analysis.post_order_visit(mod["main"].body, visit)
    return names


def dynfuse_counts(path: Path, dtype: str) -> dict[str, object]:
    graph = load_graph(path)
    inputs = {
        v: np.random.default_rng(0).standard_normal(graph.types[v].shape).astype(np.float32) for v in graph.inputs
    }
    tvm_groups = fuse_ops(graph)
    row: dict[str, object] = {"rules": len(tvm_groups)}
    row["rules_kernels"] = sum(1 for g in tvm_groups if any(graph.node(n).op not in ALIAS_OPS for n in g))
    for policy in ("static", "dynamic"):
        options = EngineOptions(policy=policy, validation=ValidationPolicy("off"), workers=1)
        engine = FusionEngine(graph, "base", dtype, options, samples=[inputs])
        result = engine.run(inputs)
        assert engine.plan is not None
        row[policy] = sum(1 for g in engine.plan.groups if g.strategy != "alias") - len(engine.plan.pipelined)
        row[f"{policy}_cycles"] = result.cycles
        row[f"{policy}_groups"] = [
            "+".join(graph.node(n).op.value for n in g.nodes) for g in engine.plan.groups if g.strategy != "alias"
        ]
        if policy == "static":
            row["splits"] = splits(graph, tvm_groups, [g.nodes for g in engine.plan.groups if g.strategy != "alias"])
    return row


def splits(graph: Graph, tvm_groups: list[tuple[str, ...]], kernels: list[tuple[str, ...]]) -> list[str]:
    """The TVM groups static runs as more than one kernel: `TVM ops -> kernel | kernel ...`."""
    where = {n: i for i, g in enumerate(tvm_groups) for n in g}
    parts: dict[int, list[tuple[str, ...]]] = {}
    for nodes in kernels:
        parts.setdefault(where[nodes[0]], []).append(nodes)

    def ops(nodes: tuple[str, ...]) -> str:
        return "+".join(graph.node(n).op.value for n in nodes)

    return [f"{ops(tvm_groups[i])} -> {' | '.join(map(ops, k))}" for i, k in parts.items() if len(k) > 1]


def model_name(path: Path) -> str:
    """A model's name: its file's stem, or a zoo cache entry's (`<name>-<size>-s<seed>-<key>/model.onnx`)."""
    return path.parent.name.rsplit("-", 1)[0] if path.stem == "model" else path.stem


def source_commit() -> str:
    """The commit the measured code is (read when the run starts), marked when the tree has uncommitted edits."""
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    return f"commit {head or 'unknown'}" + (" + uncommitted edits" if dirty.stdout.strip() else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--zoo", nargs="*", default=[], help="directories searched for *.onnx")
    ap.add_argument("--dtype", default="fp32", choices=("fp32", "int8"))
    ap.add_argument("--models", nargs="*", default=[], help="only these models (names as in the table)")
    args = ap.parse_args()
    models = BUNDLED + sorted(p for d in args.zoo for p in Path(d).expanduser().rglob("*.onnx"))
    if args.models:
        unknown = set(args.models) - {model_name(p) for p in models}
        if unknown:
            sys.exit(f"bench_tvm: no such model(s): {', '.join(sorted(unknown))}")
        models = [p for p in models if model_name(p) in args.models]
    start, commit = time.perf_counter(), source_commit()
    command = " ".join(["python", "bench/bench_tvm.py", *sys.argv[1:]])
    lines = [
        "| model | TVM kernels | TVM rules on dynfuse IR (kernels) | static kernels | TVM groups static splits | "
        "dynamic kernels | static cycles | dynamic cycles |",
        "|---|---|---|---|---|---|---|---|",
    ]
    details = []
    for path in models:
        try:
            tvm = tvm_kernels(path)
            count = str(len(tvm))
        except Exception as err:  # TVM's importer refusing a model is a result here, not a failure
            tvm, count = [f"(TVM failed: {type(err).__name__}: {str(err).splitlines()[0][:80]})"], "failed"
        try:
            row = dynfuse_counts(path, args.dtype)
        except Exception as err:  # likewise dynfuse's importer or planner
            why = f"{type(err).__name__}: {str(err).splitlines()[0][:100]}"
            lines.append(f"| {model_name(path)} | {count} | dynfuse failed: {why} | | | | | |")
            continue
        rules = f"{row['rules']} ({row['rules_kernels']})"
        cells = [model_name(path), count, rules, row["static"], len(row["splits"]), row["dynamic"]]
        cells += [row["static_cycles"], row["dynamic_cycles"]]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
        print(lines[-1], flush=True)
        details.append(f"- {model_name(path)}: TVM {', '.join(tvm)}\n  - static: {', '.join(row['static_groups'])}")
        details += [f"  - split: {split}" for split in row["splits"]]
    results = Path(__file__).parent / "results" / RESULTS[args.dtype]
    results.write_text(
        f"# dynfuse static vs TVM FuseOps ({args.dtype} plans)\n\n"
        f"At {commit}: `{command}` ({time.perf_counter() - start:.0f} s). "
        "TVM kernels: "
        "`call_tir` calls in `main` after from_onnx, LegalizeOps, AnnotateTIROpPattern, FoldConstant, FuseOps, "
        "FuseTIR (TVM 0.27, on TVM's own import of the ONNX file: its graph keeps ops dynfuse's import folds or "
        "fuses, e.g. Gather for the QKV split, Gelu as Div/Erf/Add/Mul/Mul, BatchNorm). TVM rules on dynfuse IR: "
        "`fusion.engine.fuse_ops` (TVM's partitioner and op patterns) on dynfuse's graph: its groups (those with a "
        "node that is not a view: kernels). static/dynamic kernels: the plans' groups that run a kernel (views "
        "excluded; a pipelined pair counts once). TVM groups static splits: those static runs as several kernels, "
        "listed below (`split:`) with static's kernels; each is a kernel-library gap (docs/fusion.md).\n\n"
        + "\n".join(lines)
        + "\n\nGroups:\n\n"
        + "\n".join(details)
        + "\n"
    )
    print(f"wrote {results}")


if __name__ == "__main__":
    main()
