"""User mistakes on zoo models, through the real `dynfuse` command: one `error:` line, a non-zero exit, never a
traceback (a damaged model file, a wrong input shape or name, a missing file)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]


def _dynfuse(*argv: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "dynfuse", *argv]
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=600)


def _mistakes(entry, tmp: Path) -> dict[str, list[str]]:
    model = str(entry.onnx_path)
    truncated = tmp / "truncated.onnx"
    truncated.write_bytes(entry.onnx_path.read_bytes()[: entry.onnx_path.stat().st_size // 3])
    wrong_shape = tmp / "wrong_shape.npy"
    np.save(wrong_shape, np.zeros(entry.input.shape[1:], np.float32))  # the batch axis dropped
    good = tmp / "x.npy"
    np.save(good, entry.input)
    return {
        "missing file": ["fuse", str(tmp / "absent.onnx")],
        "truncated model (fuse)": ["fuse", str(truncated)],
        "truncated model (run)": ["run", str(truncated)],
        "wrong input rank": ["fuse", model, "--input", f"x={wrong_shape}", "--dtype", "int8"],
        "unknown input name": ["fuse", model, "--input", f"nope={good}"],
        "input file missing": ["fuse", model, "--input", f"x={tmp / 'absent.npy'}"],
    }


def test_mistakes_on_a_zoo_model_are_one_error_line(zoo, tmp_path) -> None:
    for what, argv in _mistakes(zoo["bert"], tmp_path).items():
        done = _dynfuse(*argv)
        assert done.returncode != 0, f"{what}: exit 0"
        assert "Traceback" not in done.stderr, f"{what}: traceback\n{done.stderr}"
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert lines and lines[-1].startswith("error:"), f"{what}: no error line in {done.stderr!r}"
