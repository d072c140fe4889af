"""The fusion engine's generated kernels on the RTL: every kernel a call of the engine dispatches (int8, `dynamic`
plan: fused groups, unfused ones, pipelined pairs) runs on the simulator with the model's own values, and its
matrix/vector transactions replay on the Verilog units, values and cycles exact.

Bundled models (`examples/models`, `tests/fusion/models`): every transaction of each distinct kernel program, on
`tiny`.

Zoo models (`bench/zoo`, every model at its small input): each distinct kernel program once (kernels repeat across
layers: keyed by their instruction words), thinned to the first `ZOO_KEEP` executions of each transaction form
over the model's programs (`rtl.sampling`: every instruction form the model's kernels execute, with its real
values). The machine is the smallest preset whose DRAM holds the model (`check_fits_dram`): `tiny` for the
transformers and the Whisper encoder, `base` for the CNNs. The RTL units do not model DRAM (their parameters are
the array size, the lanes and the stream FIFO depth; the timing rules the checker applies read only the array size
and lanes), so `tiny` with more DRAM would be as honest, but on a 4 x 4 array the engine's straight-line kernels
for 3.5-25M-weight CNNs are hundreds of thousands of weight tiles: planning resnet18 alone ran past 15 minutes
(under load); on `base` each CNN plans in about a minute.
"""

from __future__ import annotations

import dataclasses
import hashlib
import sys
from collections import Counter
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from fusion.engine.emit_asm import RecordingCache, dispatched
from fusion.engine.engine import EngineOptions, FusionEngine
from fusion.engine.errors import EngineError
from fusion.engine.footprint import check_fits_dram
from fusion.graph.ir import Graph
from fusion.lower.compiler import load_graph
from rtl.cosim import Recorded, cosimulate
from rtl.sampling import form, thin
from simulator.config import PRESETS, MachineConfig
from simulator.run import simulate

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fusion" / "engine"))
from engine_helpers import reference_env  # noqa: E402 - a test helper beside the engine's tests

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # `bench` is a directory of the project, not an installed package
from bench.zoo import NAMES, zoo_model  # noqa: E402

pytestmark = pytest.mark.rtl
TINY = PRESETS["tiny"]
ZOO_PRESETS = ("tiny", "base")  # smallest first
ZOO_KEEP = 3  # executions of each transaction form replayed per zoo model


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


def engine_kernel_runs(
    graph: Graph, x: np.ndarray, cfg: MachineConfig = TINY, keep: int | None = None, label: str = ""
) -> list[Recorded]:
    """Each distinct kernel program one call dispatched on `x`, simulated on the values it computes in the model
    (`keep`: thinned right after its simulation to that many executions of each transaction form over all of the
    programs)."""
    inputs = {graph.inputs[0]: x}
    recording = RecordingCache()
    engine = FusionEngine(graph, cfg, "int8", EngineOptions(workers=1), cache=recording)
    result = engine.run(inputs)
    engine.close()
    env = reference_env(engine.mc, inputs)  # int8 kernels are bit-exact with the quantized reference
    runs, seen, forms = [], set(), Counter()
    for record, kernel in dispatched(result.records, recording.used):
        if kernel.program.text in seen:
            continue
        seen.add(kernel.program.text)
        names = kernel.symbols or {}
        sim = simulate(kernel.program, cfg, {names[v]: env[v] for v in kernel.inputs}, record_transactions=True)
        run = Recorded(f"{label or graph.name}:{record.schedule}:{record.nodes[0]}", kernel.program, sim.transactions)
        runs.append(run if keep is None else thin(run, keep, forms).run)
    return runs


def _check(cfg: MachineConfig, runs: list[Recorded], least: int = 100) -> None:
    """Every replayed transaction matches; fused kernels, the matrix and vector units and at least `least`
    transactions are among them."""
    assert any(r.name.split(":")[1] != "unfused" for r in runs)  # fused kernels are among them
    reports = cosimulate(cfg, runs)
    for report in reports:
        assert report.ok, "\n".join(report.lines())
    units = {b.unit for r in reports for b in r.batches}
    assert {"matrix_unit", "vector_unit"} <= units
    assert sum(r.compared for r in reports) >= least


@pytest.mark.slow  # encoder_post_d128: ~50k transactions, minutes
@pytest.mark.parametrize("path", _bundled(), ids=lambda p: p.stem)
def test_engine_kernels_of_bundled_models_match_the_rtl(path: Path) -> None:
    _check(TINY, engine_kernel_runs(load_graph(path), np.load(path.with_suffix(".npz"))["input"], label=path.stem))


def zoo_config(graph: Graph) -> MachineConfig:
    """The smallest preset whose DRAM holds every node's operands."""
    for name in ZOO_PRESETS:
        try:
            check_fits_dram(graph, PRESETS[name])
            return PRESETS[name]
        except EngineError:
            continue
    raise AssertionError(f"{graph.name} fits none of {ZOO_PRESETS}")


@cache
def zoo_runs(name: str) -> tuple[MachineConfig, tuple[Recorded, ...]]:
    """A zoo model's distinct kernel programs, recorded and thinned (once per test process)."""
    entry = zoo_model(name)
    graph = load_graph(entry.onnx_path)
    cfg = zoo_config(graph)
    return cfg, tuple(engine_kernel_runs(graph, entry.input, cfg, keep=ZOO_KEEP, label=name))


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_engine_kernels_of_zoo_models_match_the_rtl(name: str) -> None:
    cfg, runs = zoo_runs(name)
    _check(cfg, list(runs), least=40)  # thinned: bert on tiny replays 78 of its 149k transactions


def test_thinning_keeps_every_form_and_whole_matrix_segments() -> None:
    """What the zoo replay leaves out is only repetition: each form survives, matrix segments stay whole (a kept
    matmul follows the preload it followed in the program), and every stream is kept."""
    path = ROOT / "tests" / "fusion" / "models" / "encoder_post_d64.onnx"
    runs = engine_kernel_runs(load_graph(path), np.load(path.with_suffix(".npz"))["input"])
    total = dropped = 0
    for run in runs:
        thinned = thin(run, 2)
        index = {id(t): i for i, t in enumerate(run.transactions)}
        kept = [index[id(t)] for t in thinned.run.transactions]
        assert kept == sorted(kept)
        forms = {form(run.obj.instructions()[t.pc], t) for t in run.transactions}
        assert forms == {form(run.obj.instructions()[t.pc], t) for t in thinned.run.transactions}
        for position, i in enumerate(kept):
            if run.transactions[i].mnemonic in ("mx.mm", "mx.mma", "mx.mms"):
                before = [j for j in range(i) if run.transactions[j].mnemonic == "mx.preload"]
                assert not before or before[-1] in kept[:position]
        streams = [t for t in run.transactions if t.mnemonic in ("mx.mms", "vc.lds")]
        assert streams == [t for t in thinned.run.transactions if t.mnemonic in ("mx.mms", "vc.lds")]
        total += len(run.transactions)
        dropped += sum(thinned.dropped.values())
        assert sum(thinned.dropped.values()) == len(run.transactions) - len(thinned.run.transactions)
        assert len(thin(_at_one_address(run), 2).run.transactions) == len(thinned.run.transactions)
    assert dropped > total // 2  # there was repetition to leave out


def _at_one_address(run: Recorded) -> Recorded:
    """`run` with every address the simulator recorded for the RTL's address generators set to 0: thinning must
    not tell them apart (an address is a register's value, not a form)."""

    def moved(t):
        return dataclasses.replace(t, operands={k: 0 if k.endswith("_addr") else v for k, v in t.operands.items()})

    return dataclasses.replace(run, transactions=tuple(moved(t) for t in run.transactions))


def test_a_changed_value_or_cycle_count_in_a_zoo_kernel_is_caught(tmp_path) -> None:
    """The thinned zoo replay can fail: a matmul result off by one in a kept matrix segment, a drain charged one
    cycle more (each replayed alone, so the failure costs seconds)."""
    cfg, runs = zoo_runs("whisper_encoder")
    run = next(r for r in runs if {"mx.mm", "mx.drain"} <= {t.mnemonic for t in r.transactions})
    txns = run.transactions
    first = next(i for i, t in enumerate(txns) if t.mnemonic == "mx.mm")
    start = max(i for i in range(first) if txns[i].mnemonic == "mx.preload")  # the segment's weights
    mm = dataclasses.replace(txns[first], result=txns[first].result + np.int32(1))
    drain = next(t for t in txns if t.mnemonic == "mx.drain")
    wrong_value = dataclasses.replace(run, name="mm + 1", transactions=(*txns[start:first], mm))
    wrong_cycles = dataclasses.replace(
        run, name="drain + 1 cycle", transactions=(dataclasses.replace(drain, cycles=drain.cycles + 1),)
    )
    value_report, cycle_report = cosimulate(cfg, [wrong_value, wrong_cycles], vcd_dir=tmp_path)
    assert (value_report.value_mismatches, value_report.cycle_mismatches) == (1, 0)
    assert (cycle_report.value_mismatches, cycle_report.cycle_mismatches) == (0, 1)
    assert cycle_report.compared == 1
