"""Program-level co-simulation: the simulator's transactions replayed on the RTL, values and cycles exact."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dynfuse.cli import main
from isa import EpilogueFlags
from rtl.corpus import example_programs, record_file, record_random
from rtl.cosim import Recorded, cosimulate
from rtl.programs import random_program
from simulator.config import PRESETS
from simulator.timing import matmul_cycles

pytestmark = pytest.mark.rtl
TINY = PRESETS["tiny"]
RANDOM_SEEDS = range(8)


def _assert_clean(reports) -> None:
    for report in reports:
        assert report.ok, "\n".join(report.lines())


def test_random_programs_match_on_tiny() -> None:
    runs = [record_random(seed, TINY) for seed in RANDOM_SEEDS]
    reports = cosimulate(TINY, runs)
    _assert_clean(reports)
    units = {b.unit for r in reports for b in r.batches}
    assert units == {"matrix_unit", "vector_unit", "drain_write", "stream_path"}
    assert sum(r.compared for r in reports) > 100
    # preloads and matmuls overlapping on the pipelined matrix unit were replayed together, on the simulator's cycles
    assert any("(overlapping)" in v.label for r in reports for b in r.batches for v in b.verdicts)
    # some streams overflowed the FIFO: their mx.mms stalled, and the stream path replayed them all the same
    stalled = [
        (run.name, t.pc)
        for run in runs
        for t in run.transactions
        if t.mnemonic == "mx.mms" and t.cycles > matmul_cycles(TINY, t.result.shape[0])
    ]
    assert stalled
    skipped_streams = sum(n for r in reports for (m, _), n in r.skipped.items() if m == "vc.lds")
    assert skipped_streams == 0


def test_every_example_matches_on_tiny(capsys) -> None:
    """The whole corpus through `dynfuse cosim --examples`: each example as its examples/tiny/ variant if any."""
    paths = example_programs("tiny")
    assert any(p.parent.name == "tiny" for p in paths)
    assert main(["cosim", "--examples", "--config", "tiny"]) == 0
    lines = capsys.readouterr().out.splitlines()
    compared = {}
    for line in lines:
        head, sep, tail = line.partition(" on tiny: ")
        if sep:
            compared[head] = int(tail.split()[0])
            assert tail.endswith("0 value mismatches, 0 cycle mismatches"), line
    assert set(compared) == {p.name for p in paths}
    assert lines[-1].endswith("0 value mismatches, 0 cycle mismatches")
    for path in paths:
        text = path.read_text()
        if "mx.mm" in text or "mx.drain" in text:
            assert compared[path.name] > 0, path.name


def test_gemm_and_fused_epilogue_examples_match_on_base() -> None:
    """The 16 x 16 array: the GEMM and fused-epilogue examples, with their unfused twin and the stream."""
    base = PRESETS["base"]
    names = ("gemm_tiled", "gemm_bias_relu_fused", "gemm_bias_relu_unfused", "mm_stream_fused")
    paths = [p for p in example_programs("base") if p.stem in names]
    assert len(paths) == len(names)
    reports = cosimulate(base, [record_file(path, base) for path in paths])
    _assert_clean(reports)
    assert all(r.compared > 0 for r in reports)
    assert {b.unit for r in reports for b in r.batches} >= {"matrix_unit", "drain_write", "stream_path"}


def _first_case_changed(run: Recorded, mnemonic: str, change) -> Recorded:
    for i, txn in enumerate(run.transactions):
        if txn.mnemonic == mnemonic:
            doctored = list(run.transactions)
            doctored[i] = change(txn)
            return dataclasses.replace(run, transactions=tuple(doctored))
    raise AssertionError(f"no {mnemonic} transaction")


def _has(run: Recorded, mnemonic: str) -> bool:
    return any(t.mnemonic == mnemonic for t in run.transactions)


def test_a_wrong_value_or_cycle_count_is_reported(tmp_path) -> None:
    run = next(r for r in map(lambda s: record_random(s, TINY), range(20)) if _has(r, "mx.mm") and _has(r, "v.clip"))
    wrong_value = _first_case_changed(run, "mx.mm", lambda t: dataclasses.replace(t, result=t.result + np.int32(1)))
    wrong_cycles = _first_case_changed(run, "v.clip", lambda t: dataclasses.replace(t, cycles=t.cycles + 1))
    value_report, cycle_report = cosimulate(TINY, [wrong_value, wrong_cycles], vcd_dir=tmp_path)
    assert (value_report.value_mismatches, value_report.cycle_mismatches) == (1, 0)
    assert (cycle_report.value_mismatches, cycle_report.cycle_mismatches) == (0, 1)
    text = "\n".join(value_report.lines())
    assert "value mismatch at cycle" in text and "out_p[0]" in text
    assert "busy cycles: expected" in "\n".join(cycle_report.lines())
    assert list(tmp_path.glob("*.vcd"))


def test_cli_reports_totals(capsys) -> None:
    assert main(["cosim", "--random", "1", "--seed", "11", "--config", "tiny"]) == 0
    out = capsys.readouterr().out
    assert "0 value mismatches, 0 cycle mismatches" in out.splitlines()[-1]


def test_cli_needs_a_program(capsys) -> None:
    assert main(["cosim"]) == 1
    assert "needs at least one PROGRAM, --examples or --random" in capsys.readouterr().err


def test_random_programs_cover_every_epilogue_flag_and_match() -> None:
    """Every `ep.cfg` flag occurs among the random programs; the per-column (pc) ones, whose rs3 is a table
    address, replay on the RTL like the rest (a pc program once trapped on a random rs3)."""
    first_seed: dict[str, int] = {}
    for seed in range(400):
        for line in random_program(seed, TINY).splitlines():
            if line.strip().startswith("ep.cfg"):
                first_seed.setdefault(line.split(",")[-2].strip(), seed)
        if len(first_seed) == len(EpilogueFlags):
            break
    assert set(first_seed) == {f.name for f in EpilogueFlags}
    pc_seeds = sorted({seed for name, seed in first_seed.items() if EpilogueFlags[name] & EpilogueFlags.pc})
    _assert_clean(cosimulate(TINY, [record_random(seed, TINY) for seed in pc_seeds]))
