"""`dynfuse hpm calibrate | train | eval` through the console entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dynfuse.cli import main
from fusion.hpm.model import read_header


def test_calibrate_train_eval(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data, model, plots = tmp_path / "data", tmp_path / "hpm.model", tmp_path / "plots"
    args = ["--configs", "base,tiny", "--samples", "16", "--jobs", "1", "--heldout-share", "0.4", "--no-progress"]
    assert main(["hpm", "calibrate", *args, "-o", str(data)]) == 0
    assert "kernels from" in capsys.readouterr().out
    assert main(["hpm", "train", str(data), "-o", str(model)]) == 0
    header, _ = read_header(model)
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
