"""The fused attention kernel (`fusion.engine.codegen.attention`) against what runs the same nodes without it.

    python bench/bench_attention.py [--dtypes int8,fp32] [--out bench/results/attention.md]

Per attention (the zoo models' own, and hand-built ones of growing sequence length): the matched nodes' cycles
as unfused kernels (`none`), as the best plan of the other strategies for those nodes (`dynamic` on the nodes
with the attention strategy left out), and as the one attention kernel; the kernel's analytic prediction and its
error; the kernel's mode (whole heads in a step, keys streamed in blocks, online softmax). base config, each
kernel simulated on reference inputs and checked against them (int8 bit-exact, fp32 1e-5).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "fusion" / "engine"))

from attention_graphs import AttentionShape, attention_graph  # noqa: E402
from engine_helpers import context, reference_env  # noqa: E402

from bench.zoo import zoo_model  # noqa: E402
from fusion.cost.analytic import AnalyticCostModel  # noqa: E402
from fusion.engine import candidates  # noqa: E402
from fusion.engine.attention_match import find_attention  # noqa: E402
from fusion.engine.execute import run_kernel  # noqa: E402
from fusion.engine.features import kernel_features  # noqa: E402
from fusion.engine.kernel import build_kernel  # noqa: E402
from fusion.engine.plan import Group  # noqa: E402
from fusion.engine.planner import Evaluator, plan_dynamic  # noqa: E402
from fusion.lower.compiler import load_graph  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "attention.md"
ZOO = ("bert", "gpt2", "llama", "vit")
SHAPES = {
    "S=64 H=4 D=32 causal": AttentionShape(seq=64, heads=4, head_dim=32, causal=True),
    "S=128 H=2 D=64 causal": AttentionShape(seq=128, heads=2, head_dim=64, causal=True),
    "S=256 H=1 D=64 padded": AttentionShape(seq=256, heads=1, head_dim=64, key_len=200),
    "S=8 x 5000 keys (online, fp32)": AttentionShape(seq=8, keys=5000, heads=1, head_dim=16),
}


def _cases(dtype: str):
    for name in ZOO:
        entry = zoo_model(name, "small")
        graph = load_graph(entry.onnx_path)
        yield f"{name} (zoo, layer 0)", graph, {graph.inputs[0]: entry.input}
    for label, shape in SHAPES.items():
        if dtype == "int8" and "online" in label:
            continue  # int8 refuses the online softmax (not the reference's sums)
        graph, inputs = attention_graph(shape)
        yield label, graph, inputs


def _cycles(mc, groups, env) -> int:
    return sum(run_kernel(mc, build_kernel(mc, g), env).cycles for g in groups)


def measure(label: str, graph, inputs, dtype: str) -> dict:
    mc = context(graph, inputs, dtype)
    env = reference_env(mc, inputs)
    match = find_attention(graph)[0]
    nodes = match.nodes(graph)
    group = Group(nodes, "attention")
    kernel = build_kernel(mc, group)
    run = run_kernel(mc, kernel, env, checked=True)
    for value, got in run.outputs.items():
        ok = np.array_equal(got, env[value]) if dtype == "int8" else np.allclose(got, env[value], 1e-5, 1e-5)
        if not ok:
            raise AssertionError(f"{label} {dtype}: the attention kernel differs from the reference")
    predicted = AnalyticCostModel().predict(kernel_features(mc, kernel), mc.config).cycles
    unfused = _cycles(mc, [Group((n,), "unfused") for n in nodes], env)
    without = _without_attention(mc, nodes)
    others = _cycles(mc, without, env)
    return {
        "label": label,
        "dtype": dtype,
        "unfused": unfused,
        "others": others,
        "kernel": run.cycles,
        "predicted": predicted,
    }


def _without_attention(mc, nodes) -> list[Group]:
    """The dynamic plan of the nodes with the attention candidates removed (what ran before the strategy)."""
    original = candidates.enumerate_candidates

    def others(graph):
        return [c for c in original(graph) if c.family != "attention"]

    candidates.enumerate_candidates = others
    try:
        import fusion.engine.planner as planner

        planner.enumerate_candidates = others
        plan = plan_dynamic(Evaluator(mc, AnalyticCostModel(), {}), nodes=nodes, guard=False)
    finally:
        candidates.enumerate_candidates = original
        planner.enumerate_candidates = original
    return [c.group for c in plan.choices]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", default="int8,fp32")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    start = time.perf_counter()
    rows = []
    for dtype in args.dtypes.split(","):
        for label, graph, inputs in _cases(dtype):
            row = measure(label, graph, inputs, dtype)
            rows.append(row)
            print(row, flush=True)
    lines = [
        "# Attention as one kernel",
        "",
        f"`python bench/bench_attention.py` on `base`, {time.perf_counter() - start:.0f} s. Cycles of the matched "
        "attention nodes (the first attention of each zoo model; hand-built attentions with Q/K/V projections "
        "outside): every node unfused, the dynamic plan of those nodes without the attention strategy, the "
        "attention kernel (checked against the reference: int8 bit-exact, fp32 1e-5); the analytic model's "
        "prediction for the kernel and its error (measured - predicted) / predicted.",
        "",
        "| attention | dtype | unfused | other strategies | attention kernel | vs unfused | vs others "
        "| predicted | error |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        err = (r["kernel"] - r["predicted"]) / r["predicted"]
        lines.append(
            f"| {r['label']} | {r['dtype']} | {r['unfused']:,} | {r['others']:,} | {r['kernel']:,} "
            f"| {r['unfused'] / r['kernel']:.2f}x | {r['others'] / r['kernel']:.2f}x | {r['predicted']:,.0f} "
            f"| {100 * err:+.1f}% |"
        )
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
