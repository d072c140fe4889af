"""`dynfuse explore` on local processes: every point recorded, figures those of the fusion engine itself, resumes
without redoing points, bad input is a clear error, directories merge."""

from __future__ import annotations

import functools
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from explore_helpers import MLP, die_once_on, rows_without_timing, write_space

from dynfuse.cli import main
from fusion.engine.engine import EngineOptions, FusionEngine
from fusion.explore.point import INVALID, OK
from fusion.explore.run import load_models, run_explore
from fusion.explore.space import load_space, machine
from fusion.explore.store import JOURNAL_NAME, read_table
from fusion.tasks import Runner
from simulator.area import area


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    tmp = tmp_path_factory.mktemp("sweep")
    outcome = run_explore([MLP], load_space(write_space(tmp)), tmp / "out", Runner("local", 2), progress=False)
    return tmp / "out", outcome


def test_every_point_is_recorded_with_the_engines_own_figures(swept) -> None:
    out, outcome = swept
    rows = read_table(out).to_pylist()
    assert len(rows) == outcome.points == 8 and outcome.measured_now == 8
    invalid = [r for r in rows if r["status"] == INVALID]
    assert len(invalid) == 4 and all(r["spad_banks"] == 3 and "power of two" in r["reason"] for r in invalid)
    assert all(r["cycles"] is None and r["area_mm2"] is None for r in invalid)
    ok = [r for r in rows if r["status"] == OK]
    assert len(ok) == 4
    inputs = load_models([MLP], {})["mlp"].inputs
    for r in ok:
        config = machine("tiny", {"array_size": r["array_size"], "spad_banks": r["spad_banks"]})
        engine = FusionEngine(MLP, config, "fp32", EngineOptions(policy=r["policy"], workers=1))
        result = engine.run(inputs)
        assert (r["cycles"], r["dram_traffic_bytes"]) == (result.cycles, result.dram_bytes)
        assert r["energy_pj"] == pytest.approx(result.energy_pj, rel=1e-6)
        assert r["area_mm2"] == pytest.approx(area(config).total_mm2)
        assert 0 < r["roofline_fraction"] <= 1 and r["plan_seconds"] > 0
    by = {(r["array_size"], r["policy"]): r for r in ok}
    for size in (4, 8):
        assert by[(size, "dynamic")]["cycles"] < by[(size, "none")]["cycles"], "fusion saves cycles on the MLP"
        assert by[(size, "dynamic")]["fused_kernels"] > 0 == by[(size, "none")]["fused_kernels"]
    assert (
        by[(8, "dynamic")]["cycles"] < by[(4, "dynamic")]["cycles"]
        and by[(8, "none")]["area_mm2"] > by[(4, "none")]["area_mm2"]
    )
    assert (out / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_resume_redoes_only_lost_points(swept, tmp_path: Path) -> None:
    out, _ = swept
    lines = (out / JOURNAL_NAME).read_text().splitlines(keepends=True)
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    (resumed / JOURNAL_NAME).write_text("".join(lines[:3]) + lines[3][:25])  # killed while writing the 4th
    outcome = run_explore([MLP], load_space(write_space(tmp_path)), resumed, Runner("inline", 1), progress=False)
    assert outcome.measured_now == 5
    keys = [json.loads(line)["key"] for line in (resumed / JOURNAL_NAME).read_text().splitlines()]
    assert len(keys) == len(set(keys)) == 8, "every point once"
    assert rows_without_timing(resumed) == rows_without_timing(out), "resumed equals one run"
    again = run_explore([MLP], load_space(write_space(tmp_path)), resumed, Runner("inline", 1), progress=False)
    assert again.measured_now == 0


def test_a_local_worker_killed_mid_sweep_loses_and_duplicates_nothing(swept, tmp_path: Path) -> None:
    out, _ = swept
    killer = functools.partial(die_once_on, str(tmp_path))
    space = load_space(write_space(tmp_path))
    outcome = run_explore([MLP], space, tmp_path / "out", Runner("local", 2), progress=False, evaluate=killer)
    assert (tmp_path / "killed").exists() and outcome.failures == []
    keys = [json.loads(line)["key"] for line in (tmp_path / "out" / JOURNAL_NAME).read_text().splitlines()]
    assert len(keys) == len(set(keys)) == 8
    assert rows_without_timing(tmp_path / "out") == rows_without_timing(out)


def test_an_interrupted_command_leaves_its_table_and_resumes(swept, tmp_path: Path) -> None:
    out = tmp_path / "out"
    # 24 points: many more than finish between the journal's second line and the signal
    space = write_space(
        tmp_path,
        'preset = "tiny"\npolicies = ["none", "dynamic"]\n[fields]\n'
        "array_size = [4, 8, 16]\nvector_lanes = [4, 8, 16, 32]\n",
    )
    cmd = [sys.executable, "-m", "dynfuse", "explore", str(MLP), "--space", str(space), "-o", str(out),
           "--backend", "local", "--workers", "1", "--no-progress"]  # fmt: skip
    # as from a shell, SIGINT at its default: a test process may run with it ignored (inherited by children)
    default_sigint = functools.partial(signal.signal, signal.SIGINT, signal.SIG_DFL)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=default_sigint)
    journal = out / JOURNAL_NAME
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not journal.exists() or journal.read_text().count("\n") < 2):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) == 130 and b"interrupted" in proc.stderr.read()
    done = len(read_table(out))
    assert 2 <= done < 24, "interrupted mid-way, the table holds what finished"
    outcome = run_explore([MLP], load_space(space), out, Runner("inline", 1), progress=False)
    assert outcome.measured_now == 24 - done and len(read_table(out)) == 24


def test_given_inputs_are_used_and_change_the_key(swept, tmp_path: Path) -> None:
    out, _ = swept
    x = tmp_path / "x.npy"
    np.save(x, np.ones((4, 32), np.float32))
    space = write_space(tmp_path, 'preset = "tiny"\n[fields]\narray_size = [4]\n')
    code = main(["explore", str(MLP), "--space", str(space), "-o", str(out), "--input", f"input={x}",
                 "--backend", "local", "--workers", "1", "--no-progress"])  # fmt: skip
    assert code == 0
    assert len(read_table(out)) == 9, "a new point: same machine and policy, other inputs"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--space", "{space_bad}"], "fields.array_sise: not a MachineConfig field"),
        (["--space", "{space}", "--input", "nope={npy}"], "--input nope: no model has an input"),
        (["--space", "{space}", "--search", "3", "--objective", "cycles * colour"], "unknown name 'colour'"),
        (["--space", "{space}", "--validate", "sometimes"], "validation mode must be one of"),
        (["--space", "{space}", "--workers", "0"], "--workers must be >= 1"),
        (["--space", "{space}", "--backend", "local", "--address", "auto"], "--address joins a Ray cluster"),
    ],
)
def test_user_mistakes_are_one_line_errors(tmp_path: Path, capsys, args: list[str], message: str) -> None:
    paths = {
        "space": write_space(tmp_path),
        "space_bad": write_space(tmp_path, 'preset = "tiny"\n[fields]\narray_sise = [4]\n', "bad.toml"),
        "npy": tmp_path / "x.npy",
    }
    np.save(paths["npy"], np.zeros((4, 32), np.float32))
    argv = ["explore", str(MLP), *(a.format(**paths) for a in args), "-o", str(tmp_path / "out"), "--no-progress"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    if "space_bad" in args[1]:
        assert "bad.toml" in err


def test_missing_model_is_an_error(tmp_path: Path, capsys) -> None:
    argv = ["explore", str(tmp_path / "none.onnx"), "--space", str(write_space(tmp_path)), "-o", str(tmp_path / "o")]
    assert main(argv) == 1 and "no such model file" in capsys.readouterr().err


def test_directories_of_several_machines_merge_by_key(swept, tmp_path: Path, capsys) -> None:
    out, _ = swept
    other = tmp_path / "other"
    space = write_space(tmp_path, 'preset = "tiny"\npolicies = ["dynamic"]\n[fields]\narray_size = [8, 16]\n')
    assert main(["explore", str(MLP), "--space", str(space), "-o", str(other), "--backend", "local",
                 "--workers", "1", "--no-progress"]) == 0  # fmt: skip
    merged = tmp_path / "merged"
    assert main(["explore-merge", str(out), str(other), "-o", str(merged)]) == 0
    keys = [r["key"] for r in read_table(merged).to_pylist()]
    assert len(keys) == len(set(keys)) == len(read_table(out)) + 1, "array_size 8 dynamic is in both"
    assert main(["explore-merge", str(tmp_path / "nothing"), "-o", str(merged)]) == 1
    assert "not a sweep directory" in capsys.readouterr().err
