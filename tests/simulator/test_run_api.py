"""The Python entry point, transactions for RTL replay, traces and the `dynfuse sim` command."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sim_helpers import GEMM, run_asm

from dynfuse.cli import main
from isa import DynfuseError
from isa.enums import Unit
from simulator import PRESETS, simulate
from simulator.counters import COUNTER_DOCS, counters_markdown
from simulator.timing import matmul_cycles, preload_cycles, vector_cycles

RNG = np.random.default_rng(5)
A, W = RNG.integers(-128, 128, (8, 4), dtype=np.int8), RNG.integers(-128, 128, (4, 4), dtype=np.int8)


def test_transactions_carry_operands_results_and_charged_cycles() -> None:
    result = run_asm(GEMM, inputs={"a": A, "w": W}, record_transactions=True)
    cfg = PRESETS["tiny"]
    assert [t.mnemonic for t in result.transactions] == ["mx.preload", "mx.mm", "v.relu"]
    preload, mm, relu = result.transactions
    assert np.array_equal(preload.operands["w"], W) and preload.cycles == preload_cycles(cfg)
    assert np.array_equal(mm.operands["a"], A) and np.array_equal(mm.result, A.astype(np.int32) @ W)
    assert mm.cycles == matmul_cycles(cfg, 8) and mm.pc == 11
    assert relu.cycles == vector_cycles(cfg, 32, 1) and np.array_equal(relu.result, np.maximum(mm.result, 0).ravel())
    assert preload.start + preload.cycles == mm.start  # tokens aside, the unit runs them back to back
    assert relu.start >= mm.start + mm.cycles  # ordered by the mx -> vx token
    assert np.array_equal(result.outputs["c"], np.maximum(A.astype(np.int32) @ W, 0))
    assert run_asm(GEMM, inputs={"a": A, "w": W}).transactions == ()


def test_trace_has_one_track_per_unit_and_one_slice_per_instruction(tmp_path) -> None:
    result = run_asm(GEMM, inputs={"a": A, "w": W}, trace=True)
    path = tmp_path / "t.json"
    result.write_trace(path)
    events = json.loads(path.read_text())["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
    assert names == {u.value: u.name for u in Unit}
    slices = [e for e in events if e["ph"] == "X"]
    assert sum(e["tid"] == Unit.scalar for e in slices) == result.counters.instret
    assert sum(e["tid"] != Unit.scalar for e in slices) == result.counters.instret - result.counters.instructions_scalar
    mm = next(e for e in slices if e["tid"] == Unit.matrix and e["name"].startswith("mx.mm"))
    assert mm["dur"] == pytest.approx(PRESETS["tiny"].cycles_to_us(matmul_cycles(PRESETS["tiny"], 8)))


def test_bad_inputs_are_clear_errors() -> None:
    with pytest.raises(DynfuseError, match="input 'b' is not a .input"):
        run_asm(GEMM, inputs={"b": A})
    with pytest.raises(DynfuseError, match=r"shape \(4, 8\) but the kernel declares \(8, 4\)"):
        run_asm(GEMM, inputs={"a": A.T.copy()})
    with pytest.raises(DynfuseError, match="dtype int32"):
        run_asm(GEMM, inputs={"a": A.astype(np.int32)})
    with pytest.raises(DynfuseError, match="no trace was recorded"):
        run_asm(GEMM).write_trace("/tmp/never.json")


def test_counter_docs_cover_the_dataclass_and_rdcnt_ids() -> None:
    counters = run_asm(GEMM, inputs={"a": A, "w": W}).counters.as_dict()
    assert list(counters) == [name for name, _, _ in COUNTER_DOCS]
    text = counters_markdown()
    assert all(f"`{name}`" in text for name in counters)
    from isa.enums import Counter

    assert {c.name for c in Counter} <= set(counters)


def test_cli_sim_report_json_outputs_and_trace(tmp_path, capsys) -> None:
    src = tmp_path / "gemm.s"
    src.write_text(GEMM)
    np.save(tmp_path / "a.npy", A)
    np.save(tmp_path / "w.npy", W)
    out, trace = tmp_path / "out", tmp_path / "trace.json"
    argv = [
        "sim",
        str(src),
        "--config",
        "tiny",
        "--input",
        f"a={tmp_path / 'a.npy'}",
        "--input",
        f"w={tmp_path / 'w.npy'}",
        "--output-dir",
        str(out),
        "--trace",
        str(trace),
        "--checked",
    ]
    assert main(argv) == 0
    assert "cycle" in capsys.readouterr().out
    assert np.array_equal(np.load(out / "c.npy"), np.maximum(A.astype(np.int32) @ W, 0))
    assert json.loads(trace.read_text())["traceEvents"]
    assert main([*argv[:6], "--input", f"w={tmp_path / 'w.npy'}", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["counters"]["macs"] == 8 * 4 * 4 and report["kernels"]["k"]["macs"] == 128


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--input", "a"], "--input expects NAME=FILE.npy"),
        (["--config", "huge"], "unknown machine config 'huge'"),
        (["--input", "a=/nonexistent.npy"], "No such file"),
    ],
)
def test_cli_errors_are_one_line(tmp_path, capsys, extra: list[str], message: str) -> None:
    src = tmp_path / "gemm.s"
    src.write_text(GEMM)
    assert main(["sim", str(src), *extra]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_cli_reports_traps(tmp_path, capsys) -> None:
    src = tmp_path / "bad.s"
    src.write_text("li x1, 1\ndiv x2, x1, x0\nhalt\n")
    assert main(["sim", str(src), "--config", "tiny"]) == 1
    assert "trap at pc 1 (div x2, x1, x0), cycle 1: division by zero" in capsys.readouterr().err


def test_binary_object_files_run(tmp_path) -> None:
    from assembler.binary import save
    from assembler.source import assemble

    path = tmp_path / "g.bin"
    save(assemble(GEMM), path)
    result = simulate(path, "tiny", {"a": A, "w": W})
    assert np.array_equal(result.outputs["c"], np.maximum(A.astype(np.int32) @ W, 0))


def test_traffic_and_energy_counters() -> None:
    c = run_asm(GEMM, inputs={"a": A, "w": W}).counters
    # A (32 B) and W (16 B) in; preload reads W, mm reads A and writes the 8x4 i32 tile, relu reads it and
    # writes 128 B to the scratchpad, the store reads those.
    assert (c.dram_read_bytes, c.dram_write_bytes) == (48, 128)
    assert (c.spad_write_bytes, c.spad_read_bytes) == (32 + 16 + 128, 16 + 32 + 128)
    assert (c.acc_write_bytes, c.acc_read_bytes) == (128, 128)
    assert (c.macs, c.macs_int8, c.vector_elem_ops) == (128, 128, 32)
    e = PRESETS["tiny"].energy
    assert c.energy_dram_pj == 176 * e.dram_byte and c.energy_mac_pj == 128 * e.mac_int8
    assert c.energy_vector_pj == 32 * e.vector_int_op and c.energy_instruction_pj == c.instret * e.instruction
    assert c.roofline_bound_cycles == max(128 / 16, 176 / 8)


def test_failed_runs_leave_garbage_collection_on() -> None:
    import gc

    from assembler.objfile import ObjectFile

    with pytest.raises(DynfuseError, match="does not fit"):
        simulate(ObjectFile((), data=b"x", data_base=PRESETS["tiny"].dram_bytes), "tiny")
    with pytest.raises(DynfuseError, match="division by zero"):
        run_asm("li x1, 1\ndiv x2, x1, x0\nhalt\n")
    assert gc.isenabled()
