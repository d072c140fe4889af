"""`dynfuse hpm calibrate` takes the runner options `dynfuse explore` takes, with the same checks."""

from __future__ import annotations

from pathlib import Path

from dynfuse.cli import main
from fusion.hpm.dataset import load_dataset


def test_calibrate_on_local_processes_and_runner_mistakes(tmp_path: Path, capsys) -> None:
    out = tmp_path / "data"
    base = ["hpm", "calibrate", "--configs", "tiny", "--samples", "2", "--no-progress", "-o", str(out)]
    assert main([*base, "--backend", "local", "--workers", "2"]) == 0
    assert len(load_dataset(out)) > 0
    assert main([*base, "--backend", "local", "--address", "auto"]) == 1
    assert "--address joins a Ray cluster" in capsys.readouterr().err
    assert main([*base, "--workers", "0"]) == 1
    assert "--workers must be >= 1" in capsys.readouterr().err
