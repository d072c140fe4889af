"""The fusion engine's generated kernels on the RTL: every kernel a call of the engine dispatches for a bundled
model on `tiny` (int8, `dynamic` plan: fused groups, unfused ones, pipelined pairs) runs on the simulator with
the model's own values, and its matrix/vector transactions replay on the Verilog units, values and cycles exact.
Until this test, only hand-written examples and random programs were co-simulated."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np
import pytest

from fusion.engine.emit_asm import RecordingCache, dispatched
from fusion.engine.engine import EngineOptions, FusionEngine
from fusion.lower.compiler import load_graph
from rtl.cosim import Recorded, cosimulate
from simulator.config import PRESETS
from simulator.run import simulate

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fusion" / "engine"))
from engine_helpers import reference_env  # noqa: E402 - a test helper beside the engine's tests

pytestmark = pytest.mark.rtl
TINY = PRESETS["tiny"]
ROOT = Path(__file__).resolve().parents[2]


def _bundled() -> list[Path]:
    """examples/models and tests/fusion/models, each distinct model once."""
    seen, out = set(), []
    for path in sorted(
        [*(ROOT / "examples" / "models").glob("*.onnx"), *(ROOT / "tests/fusion/models").glob("*.onnx")]
    ):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest not in seen and path.with_suffix(".npz").exists():
            seen.add(digest)
            out.append(path)
    return out


def engine_kernel_runs(path: Path, x: np.ndarray | None = None) -> list[Recorded]:
    """Each kernel one call dispatched (on `x`, else the model's bundled input), simulated on the values it
    computes in the model."""
    graph = load_graph(path)
    inputs = {graph.inputs[0]: np.load(path.with_suffix(".npz"))["input"] if x is None else x}
    cache = RecordingCache()
    engine = FusionEngine(graph, TINY, "int8", EngineOptions(workers=1), cache=cache)
    result = engine.run(inputs)
    env = reference_env(engine.mc, inputs)  # int8 kernels are bit-exact with the quantized reference
    runs = []
    for record, kernel in dispatched(result.records, cache.used):
        names = kernel.symbols or {}
        sim = simulate(kernel.program, TINY, {names[v]: env[v] for v in kernel.inputs}, record_transactions=True)
        runs.append(Recorded(f"{path.stem}:{record.schedule}:{record.nodes[0]}", kernel.program, sim.transactions))
    return runs


def _check(runs: list[Recorded]) -> None:
    assert any(r.name.split(":")[1] != "unfused" for r in runs)  # fused kernels are among them
    reports = cosimulate(TINY, runs)
    for report in reports:
        assert report.ok, "\n".join(report.lines())
    units = {b.unit for r in reports for b in r.batches}
    assert {"matrix_unit", "vector_unit"} <= units
    assert sum(r.compared for r in reports) > 100


@pytest.mark.parametrize("path", _bundled(), ids=lambda p: p.stem)
def test_engine_kernels_of_bundled_models_match_the_rtl(path: Path) -> None:
    _check(engine_kernel_runs(path))


def test_engine_kernels_of_a_zoo_model_match_the_rtl() -> None:
    """A real export: the zoo's Whisper-style encoder (Conv1d front end as 1-D implicit GEMMs, attention, GELU
    and LayerNorm chains), ~8k transactions, ~30 s. The other zoo transformers use the same kernel kinds with
    more transactions (co-simulation time grows with them) and are not co-simulated in the suite (its budget);
    the CNNs do not fit `tiny`'s 4 MiB of DRAM."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # `bench` is a directory of the project, not an installed package
    from bench.zoo import zoo_model

    entry = zoo_model("whisper_encoder")
    _check(engine_kernel_runs(entry.onnx_path, entry.input))
