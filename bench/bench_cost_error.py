"""The cost models' per-kernel error on whole plans, cheaply: each model's `none` and `dynamic` plans run once by
the engine (host execution, validation off), and every kernel it dispatched is predicted by each cost model from
the features the engine recorded, against the cycles the engine simulated for it (`KernelRecord.measured_cycles`,
on the model's input). Nothing is simulated twice: a model costs its two engine runs.

Error = (predicted - measured) / measured per dispatched kernel (a repeated layer's kernels count each time they
run; pipelined pairs and fallbacks carry no features and are left out). Per model, dtype and plan: the median and
90th percentile of |error| per cost model and the analytic model's signed median; per kernel kind (the strategy,
and for unfused kernels the op) over everything measured; the kinds behind each row's errors.

    python bench/bench_cost_error.py                          # every zoo model (small), both dtypes
    python bench/bench_cost_error.py --models bert,gpt2 --dtypes fp32 --out /tmp/ce.md
    python bench/bench_cost_error.py --models mlp,encoder_post_d64   # the bundled models (tests/fusion/models)
    python bench/bench_cost_error.py --kernels /tmp/k.jsonl   # also every kernel's row, for diagnosis

The engine plans with the analytic model (its default); the learned model is the shipped one (or
$DYNFUSE_HPM_MODEL), measured even when its generator stamp is stale (`bench_zoo.load_hpm`; the table says so).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # `bench.zoo` from a script run as `python bench/bench_cost_error.py`

from bench.zoo import NAMES, zoo_model  # noqa: E402

BUNDLED = ROOT / "tests" / "fusion" / "models"
RESULTS = Path(__file__).parent / "results" / "cost_error.md"
PLANS = ("none", "dynamic")
DTYPES = ("fp32", "int8")
COST_MODELS = ("analytic", "hpm")
BAD = 0.10  # a kernel whose |error| exceeds this counts toward its kind in the "where" column


@dataclass(frozen=True)
class KernelError:
    """One dispatched kernel: its kind, measured cycles and each cost model's prediction."""

    kind: str
    schedule: str
    nodes: tuple[str, ...]
    measured: int
    predicted: Mapping[str, float]

    def error(self, model: str) -> float:
        return (self.predicted[model] - self.measured) / self.measured


def kind_of(strategy: str, ops: Sequence[str]) -> str:
    """The kernel kind errors are grouped by: the strategy, and an unfused kernel's op (its generator)."""
    return f"unfused {ops[0]}" if strategy == "unfused" and ops else strategy


def kernel_errors(records: Iterable, config, models: Mapping[str, object]) -> list[KernelError]:
    """Each record (`engine.KernelRecord`) that ran its own kernel, predicted by every model from its features."""
    rows = []
    for r in records:
        if r.features is None or r.measured_cycles <= 0:
            continue
        predicted = {name: float(m.predict(r.features, config).cycles) for name, m in models.items()}
        rows.append(
            KernelError(kind_of(r.features.strategy, r.features.ops), r.schedule, r.nodes, r.measured_cycles, predicted)
        )
    return rows


def summary(rows: Sequence[KernelError], model: str) -> dict:
    """n, median and 90th percentile of |error|, the signed median (fractions)."""
    if not rows:
        return {"n": 0}
    err = np.array([r.error(model) for r in rows])
    return {
        "n": len(rows),
        "median": float(np.median(np.abs(err))),
        "p90": float(np.percentile(np.abs(err), 90)),
        "signed": float(np.median(err)),
    }


def where(rows: Sequence[KernelError], model: str, top: int = 3) -> list[tuple[str, int, int, float]]:
    """The kinds holding the most kernels off by more than BAD: (kind, off, of, their median signed error)."""
    kinds: dict[str, list[float]] = {}
    for r in rows:
        kinds.setdefault(r.kind, []).append(r.error(model))
    off = [(k, sum(abs(e) > BAD for e in errs), len(errs), float(np.median(errs))) for k, errs in kinds.items()]
    return sorted((o for o in off if o[1]), key=lambda o: -o[1])[:top]


def source(name: str) -> tuple[Path, dict[str, np.ndarray]]:
    """A zoo model (small input) or a bundled example (tests/fusion/models), with its input."""
    if name in NAMES:
        entry = zoo_model(name)
        return entry.onnx_path, {"x": entry.input}
    path = BUNDLED / f"{name}.onnx"
    if not path.exists():
        bundled = ", ".join(sorted(p.stem for p in BUNDLED.glob("*.onnx")))
        raise KeyError(f"unknown model {name!r}; zoo: {', '.join(NAMES)}; bundled: {bundled}")
    with np.load(BUNDLED / f"{name}.npz") as data:
        return path, {"input": data["input"]}


@dataclass(frozen=True)
class Row:
    """One model, dtype and plan: its kernels' errors, or why it was not measured."""

    model: str
    dtype: str
    plan: str
    kernels: tuple[KernelError, ...]
    seconds: float  # the engine's run of this plan: planning, compiling and simulating
    failure: str = ""


def measure(name: str, dtype: str, plan: str, config: str, models: Mapping[str, object]) -> Row:
    """The kernels of one plan of the model, run once by the engine, with their errors (a failure is a row)."""
    from fusion.engine.engine import EngineOptions, FusionEngine
    from fusion.engine.validation import ValidationPolicy
    from fusion.lower.compiler import load_graph

    start = time.perf_counter()
    try:
        path, given = source(name)
        graph = load_graph(path)
        inputs = {graph.inputs[0]: next(iter(given.values()))}
        options = EngineOptions(policy=plan, validation=ValidationPolicy("off"), execution="host")
        engine = FusionEngine(graph, config, dtype, options)
        try:
            rows = tuple(kernel_errors(engine.run(inputs).records, engine.config, models))
        finally:
            engine.close()
    except Exception as err:  # a model the engine cannot run is a row saying why
        reason = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
        return Row(name, dtype, plan, (), time.perf_counter() - start, reason)
    return Row(name, dtype, plan, rows, time.perf_counter() - start)


def cost_models(labels: Sequence[str]) -> tuple[dict[str, object], str]:
    """The cost models by label, and the learned model's stamp status ("" without it)."""
    from fusion.cost.analytic import AnalyticCostModel

    models: dict[str, object] = {"analytic": AnalyticCostModel()}
    status = ""
    if "hpm" in labels:
        from bench.bench_zoo import load_hpm, stamp_text

        models["hpm"], stamp = load_hpm()
        status = f"HPM `{stamp['path']}` {stamp_text(stamp)}"
    return {k: v for k, v in models.items() if k in labels}, status


def _err(s: dict) -> str:
    return f"{s['median']:.1%} / {s['p90']:.1%}" if s.get("n") else "-"


def _line(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def model_table(rows: Sequence[Row], labels: Sequence[str]) -> list[str]:
    head = ["model", "dtype", "plan", "kernels"] + [f"{m} err med / p90" for m in labels]
    head += ["analytic signed median", f"analytic: kinds off by > {BAD:.0%} (off/of, signed median)", "s"]
    lines = [_line(head), "|" + "---|" * len(head)]
    for row in rows:
        if row.failure:
            lines.append(
                _line([row.model, row.dtype, row.plan, *["-"] * (len(head) - 4)]) + f" failed: {row.failure} |"
            )
            continue
        a = summary(row.kernels, "analytic")
        kinds = "; ".join(f"{k} {off}/{of} {s:+.0%}" for k, off, of, s in where(row.kernels, "analytic"))
        cells = [row.model, row.dtype, row.plan, str(len(row.kernels))]
        cells += [_err(summary(row.kernels, m)) for m in labels]
        cells += [f"{a['signed']:+.1%}" if a["n"] else "-", kinds or "-", f"{row.seconds:.0f}"]
        lines.append(_line(cells))
    return lines


def kind_table(rows: Sequence[Row], labels: Sequence[str]) -> list[str]:
    by_kind: dict[str, list[KernelError]] = {}
    for k in (k for row in rows for k in row.kernels):
        by_kind.setdefault(k.kind, []).append(k)
    head = ["kind", "kernels"] + [f"{m} err med / p90" for m in labels] + ["analytic signed median"]
    lines = [_line(head), "|" + "---|" * len(head)]
    for kind, kernels in sorted(by_kind.items(), key=lambda kv: -summary(kv[1], "analytic")["median"]):
        signed = f"{summary(kernels, 'analytic')['signed']:+.1%}"
        lines.append(_line([kind, str(len(kernels)), *[_err(summary(kernels, m)) for m in labels], signed]))
    return lines


def write(path: Path, rows: Sequence[Row], labels: Sequence[str], status: str, seconds: float, planned: int) -> None:
    command = "python bench/bench_cost_error.py " + " ".join(sys.argv[1:])
    partial = "" if len(rows) == planned else f" (partial: {len(rows)} of {planned} rows)"
    machine = f"{platform.machine()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end"
    path.write_text(
        "# Cost models: per-kernel error on the plans\n\n"
        f"`{command.strip()}` on `base`, {machine}; {seconds:.0f} s{partial}. {status + '. ' if status else ''}"
        "Every kernel the engine dispatched for the model's `none` and `dynamic` plans (planned with the analytic "
        "model, host execution, validation off, small zoo inputs), predicted by each cost model from the features "
        "the engine recorded, against the cycles the engine simulated for it (nothing re-simulated). Error = "
        "(predicted - measured) / measured; `err med / p90`: median and 90th percentile of |error|; signed < 0: "
        "under-predicted. `s`: wall time of the row's engine run (planning, compiling, simulating).\n\n"
        + "\n".join(model_table(rows, labels))
        + "\n\nBy kernel kind (strategy; unfused kernels by op), over every row above:\n\n"
        + "\n".join(kind_table(rows, labels))
        + "\n"
    )


def dump_rows(out, row: Row) -> None:
    """Every kernel of the row as a JSON line (for diagnosis)."""
    for k in row.kernels:
        head = {"model": row.model, "dtype": row.dtype, "plan": row.plan, "kind": k.kind, "schedule": k.schedule}
        out.write(json.dumps({**head, "nodes": k.nodes, "measured": k.measured, **k.predicted}) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", help=f"comma-separated zoo or bundled models (default: the zoo: {', '.join(NAMES)})")
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--plans", default=",".join(PLANS), help="comma-separated policies whose plans are measured")
    ap.add_argument("--cost-models", default=",".join(COST_MODELS), help="comma-separated: analytic[,hpm]")
    ap.add_argument("--config", default="base")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--kernels", type=Path, help="also write every kernel's row here (JSON lines)")
    args = ap.parse_args(argv)
    labels = tuple(args.cost_models.split(","))
    if "analytic" not in labels or (bad := [m for m in labels if m not in COST_MODELS]):
        ap.error(f"--cost-models {args.cost_models}: analytic and optionally hpm")
    dtypes, plans = args.dtypes.split(","), args.plans.split(",")
    if bad := [d for d in dtypes if d not in DTYPES] + [p for p in plans if p not in ("none", "static", "dynamic")]:
        ap.error(f"unknown dtype or plan: {', '.join(bad)}")
    names = args.models.split(",") if args.models else list(NAMES)
    try:
        for name in names:
            source(name)  # an unknown name is refused before any work (a zoo model is exported here if missing)
    except KeyError as err:
        ap.error(str(err.args[0]))
    models, status = cost_models(labels)
    jobs = [(n, d, p) for n in names for d in dtypes for p in plans]
    start, rows = time.perf_counter(), []
    with open(args.kernels or os.devnull, "w") as dump:
        for job in jobs:
            row = measure(*job, args.config, models)
            rows.append(row)
            dump_rows(dump, row)
            shown = row.failure or f"{len(row.kernels)} kernels, analytic {_err(summary(row.kernels, 'analytic'))}"
            print(f"{' '.join(job)}: {shown} ({row.seconds:.0f} s)", flush=True)
            write(args.out, rows, labels, status, time.perf_counter() - start, len(jobs))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
