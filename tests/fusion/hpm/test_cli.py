"""`dynfuse hpm calibrate | train | eval` through the console entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dynfuse.cli import main
from fusion.hpm.cost_model import MODEL_ENV, SHIPPED_MODEL
from fusion.hpm.errors import StaleModelError
from fusion.hpm.modelfile import load_model, read_model_file

ROOT = Path(__file__).resolve().parents[3]


def test_calibrate_train_eval(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data, model, plots = tmp_path / "data", tmp_path / "hpm.model", tmp_path / "plots"
    args = ["--configs", "base,tiny", "--samples", "16", "--jobs", "1", "--heldout-share", "0.4", "--no-progress"]
    assert main(["hpm", "calibrate", *args, "-o", str(data)]) == 0
    assert "kernels from" in capsys.readouterr().out
    assert main(["hpm", "train", str(data), "-o", str(model)]) == 0
    header, _ = read_model_file(model)
    assert header["meta"]["algorithm"] == "gbt" and header["meta"]["pairs"] > 0  # the default, with its pairs
    capsys.readouterr()
    assert main(["hpm", "eval", str(data), "--model", str(model), "--json", "--plots", str(plots)]) == 0
    out = capsys.readouterr().out
    figures = json.loads(out[out.index("{") :])
    for split in ("heldout_kernels", "heldout_config"):
        for name in ("hpm", "analytic"):
            assert {"cycle_mape", "energy_mape", "kendall_tau", "mean_regret"} <= set(figures[split][name])
    assert sorted(p.name for p in plots.glob("*.png")) == sorted(
        f"{kind}_{split}.png" for kind in ("pred_vs_measured", "error_by_op") for split in figures
    )


def test_user_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hpm", "train", str(tmp_path), "-o", str(tmp_path / "m")]) == 1
    assert "no dataset" in capsys.readouterr().err
    assert main(["hpm", "calibrate", "--configs", "nosuch", "--samples", "2", "-o", str(tmp_path / "d")]) == 1
    assert "nosuch" in capsys.readouterr().err
    (tmp_path / "bad.model").write_text("junk")
    assert main(["hpm", "eval", str(tmp_path), "--model", str(tmp_path / "bad.model")]) == 1
    assert "error:" in capsys.readouterr().err


def test_train_into_a_directory_is_refused_without_leftovers(small_sweep: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "models"
    out.mkdir()
    assert main(["hpm", "train", str(small_sweep), "-o", str(out)]) == 1
    assert "is a directory" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models"] and not any(out.iterdir())


def test_fuse_plans_with_the_shipped_model_on_a_fresh_install(tmp_path: Path) -> None:
    """No $DYNFUSE_HPM_MODEL, a working directory with nothing of dynfuse's, scikit-learn not importable:
    `dynfuse fuse --cost-model hpm` on the bundled encoder plans with the shipped model (numpy only) and prints
    the plan. A shipped model calibrated on other kernel generators than this code's plans analytically, saying
    so in one warning line that names the fix."""
    env = {k: v for k, v in os.environ.items() if k != MODEL_ENV}
    blocked = "import sys; sys.modules['sklearn'] = sys.modules['threadpoolctl'] = None; from dynfuse.cli import main"
    model = ROOT / "examples" / "models" / "encoder_post_d64.onnx"
    cmd = [sys.executable, "-c", f"{blocked}; sys.exit(main(sys.argv[1:]))", "fuse", str(model), "--cost-model", "hpm"]
    proc = subprocess.run([*cmd, "--workers", "1"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    assert "MatMul" in proc.stdout and "total:" in proc.stdout  # the plan
    try:
        load_model(SHIPPED_MODEL)
    except StaleModelError:
        assert "cost model analytic" in proc.stdout
        assert proc.stderr.count("warning:") == 1 and "make hpm" in proc.stderr
    else:
        assert "cost model hpm" in proc.stdout and "warning" not in proc.stderr
