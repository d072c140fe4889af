"""int8 accuracy of every zoo model: the quantized reference (which every int8 run equals bit for bit) against
onnxruntime's fp32 output, max and RMS error relative to max |y|.

    python bench/bench_int8_accuracy.py --out bench/results/int8_accuracy.md

Three measurements per model (small inputs), because one sample's max error is a noisy figure (docs/zoo.md "int8
accuracy"): the zoo input calibrated on itself (what `tests/fusion/zoo` requires <= 3%); `--seeds` other seeded
standard-normal inputs, each calibrated on itself (mean / worst max error); the zoo input's calibration applied
to those inputs (mean RMS error: does the calibration generalise beyond its one sample?).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from bench.zoo import NAMES, zoo_model
from fusion.lower.compiler import load_graph
from fusion.quant.calibrate import calibrate
from fusion.reference.quantized import run_quantized

SEED_BASE = 100  # other inputs: default_rng(SEED_BASE + i), away from the zoo's own seed


@dataclass(frozen=True)
class Accuracy:
    zoo_max: float
    zoo_rms: float
    seeds_mean: float
    seeds_worst: float
    cross_rms: float


def errors(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    """(max, RMS) of |got - want| relative to max |want|."""
    diff = np.abs(got.astype(np.float64) - want)
    top = float(np.max(np.abs(want)))
    return float(diff.max()) / top, float(np.sqrt(np.mean(diff**2))) / top


def measure(name: str, seeds: int) -> Accuracy:
    entry = zoo_model(name)
    graph = load_graph(entry.onnx_path)
    session = ort.InferenceSession(str(entry.onnx_path), providers=["CPUExecutionProvider"])
    x_name, y_name = graph.inputs[0], graph.outputs[0]
    others = [
        np.random.default_rng(SEED_BASE + i).standard_normal(entry.input.shape).astype(np.float32) for i in range(seeds)
    ]
    wants = [session.run(None, {session.get_inputs()[0].name: x})[0] for x in others]

    def own(x: np.ndarray, want: np.ndarray) -> tuple[float, float]:
        inputs = {x_name: x}
        return errors(run_quantized(graph, inputs, calibrate(graph, [inputs]))[y_name], want)

    zoo_max, zoo_rms = own(entry.input, entry.reference_output)
    maxes = [own(x, w)[0] for x, w in zip(others, wants, strict=True)]
    params = calibrate(graph, [{x_name: entry.input}])
    cross = [
        errors(run_quantized(graph, {x_name: x}, params)[y_name], w)[1] for x, w in zip(others, wants, strict=True)
    ]
    return Accuracy(
        zoo_max,
        zoo_rms,
        float(np.mean(maxes)) if maxes else float("nan"),
        max(maxes, default=float("nan")),
        float(np.mean(cross)) if cross else float("nan"),
    )


def table(rows: list[tuple[str, Accuracy]], seeds: int) -> str:
    lines = [
        f"| model | zoo input: max / RMS | {seeds} other seeds: mean / worst max | zoo calibration on them: RMS |",
        "|---|---|---|---|",
    ]
    for name, a in rows:
        cells = (
            f"{a.zoo_max:.2%} / {a.zoo_rms:.2%}",
            f"{a.seeds_mean:.2%} / {a.seeds_worst:.2%}",
            f"{a.cross_rms:.2%}",
        )
        lines.append(f"| {name} | {' | '.join(cells)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(NAMES), choices=NAMES, metavar="NAME")
    parser.add_argument("--seeds", type=int, default=6, help="other inputs per model (default 6)")
    parser.add_argument("--out", type=Path, help="write the table as markdown here")
    args = parser.parse_args(argv)
    if not 0 <= args.seeds <= 64:
        parser.error("--seeds must be in [0, 64]")
    start = time.perf_counter()
    rows = []
    for name in args.models:
        rows.append((name, measure(name, args.seeds)))
        print(f"{name}: done ({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)
    text = table(rows, args.seeds)
    print(text)
    if args.out is not None:
        header = (
            "# int8 accuracy against onnxruntime (fp32), relative to max |y|\n\n"
            f"`python bench/bench_int8_accuracy.py --seeds {args.seeds}`: the quantized reference, calibrated as "
            '`dynfuse run/fuse --dtype int8` calibrates (on its input). docs/zoo.md "int8 accuracy".\n\n'
        )
        args.out.write_text(header + text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
