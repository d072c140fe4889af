"""The `dynfuse` CLI run in this process on a zoo model, its outputs read back, memoised per session.

In-process, `dynfuse.cli.main` is exactly the command: it turns user mistakes into one `error:` line and an
exit code; any other exception escaping it would be a traceback for the user, so it is recorded as such.
"""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
import traceback
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import numpy as np

from bench.zoo import ZooEntry
from dynfuse.cli import main
from fusion.lower.compiler import load_graph
from fusion.quant.calibrate import calibrate
from fusion.reference.quantized import run_quantized

MODES = ("run", "none", "static", "dynamic", "oracle")  # `dynfuse run`, then `dynfuse fuse --policy MODE`
DTYPES = ("fp32", "int8")
# The oracle measures every legal plan. Measured under load (2026-11-23): it runs whisper_encoder in ~15 s and
# refuses the ViT (> 512 legal plans) in ~30 s, with its error; it refuses BERT, GPT-2 and LLaMA too but after
# 30-90 s of enumeration each, and takes 3-4 minutes per dtype on mobilenet_v2: too much for the suite.
ORACLE_MODELS = ("whisper_encoder", "vit")
FP32_TOLERANCE = 1e-4  # of max |y| (onnxruntime)
INT8_TOLERANCE = 0.03


@dataclass(frozen=True)
class CliRun:
    argv: tuple[str, ...]
    code: int
    stdout: str
    stderr: str
    traceback: str  # non-empty when an exception escaped the CLI
    output: np.ndarray | None = field(repr=False)

    @property
    def error_line(self) -> str:
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        return lines[-1] if lines else ""

    @property
    def report(self) -> dict:
        return json.loads(self.stdout)


def invoke(argv: list[str]) -> tuple[int, str, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code, trace = 0, ""
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit_:  # argparse
            code = exit_.code if isinstance(exit_.code, int) else 1
        except Exception:  # noqa: BLE001 - a traceback the user would see: recorded, reported by the test
            code, trace = -1, traceback.format_exc()
    return code, out.getvalue(), err.getvalue(), trace


_ENTRIES: dict[str, ZooEntry] = {}


def register(entries: dict[str, ZooEntry]) -> None:
    _ENTRIES.update(entries)


@cache
def cli_run(name: str, dtype: str, mode: str) -> CliRun:
    """`dynfuse run` (mode "run") or `dynfuse fuse --policy mode` on the zoo model's own input, with --json."""
    entry = _ENTRIES[name]
    with tempfile.TemporaryDirectory(prefix=f"zoo-{name}-") as tmp:
        x = Path(tmp) / "x.npy"
        np.save(x, entry.input)
        outdir = Path(tmp) / "out"
        common = [str(entry.onnx_path), "--input", f"x={x}", "--dtype", dtype, "--output-dir", str(outdir), "--json"]
        # dynamic runs as one program (the default execution: its outputs checked on every zoo model, #15); none
        # and static kernel by kernel, their outputs the same either way (test_program) and linking a CNN's
        # straight-line kernels twice more would double the suite's zoo time
        execution = [] if mode in ("run", "dynamic") else ["--execution", "host"]
        argv = ["run", *common] if mode == "run" else ["fuse", *common, "--policy", mode, "--validate", "off"]
        argv += execution
        code, stdout, stderr, trace = invoke(argv)
        y = outdir / "y.npy"
        output = np.load(y, allow_pickle=False) if code == 0 and y.exists() else None
    return CliRun(tuple(argv), code, stdout, stderr, trace, output)


@cache
def quantized_reference(name: str) -> np.ndarray:
    """fusion.reference.quantized on the model, calibrated on its input as the CLI's int8 path is."""
    entry = _ENTRIES[name]
    graph = load_graph(entry.onnx_path)
    inputs = {graph.inputs[0]: entry.input}
    return run_quantized(graph, inputs, calibrate(graph, [inputs]))[graph.outputs[0]]


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| / max |want|."""
    return float(np.max(np.abs(got.astype(np.float64) - want)) / np.max(np.abs(want)))
