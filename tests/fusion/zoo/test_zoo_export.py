"""The zoo's exports: byte-identical for one seed (a fresh export against the cached one, made by another
process), another seed gives other weights, and the registry names what it lacks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.zoo import spec, zoo_model
from bench.zoo.cache import INPUT, MODEL, OUTPUT, cache_key
from bench.zoo.export import STALE_AFTER_S, prune_stale

ROOT = Path(__file__).resolve().parents[3]


def _export(name: str, out: Path, seed: int = 0) -> Path:
    command = [sys.executable, "-W", "ignore", "-m", "bench.zoo.export", name, "--seed", str(seed), "--out", str(out)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return out


@pytest.mark.parametrize("name", ["whisper_encoder", "vit"])  # the legacy and the dynamo exporter
def test_same_seed_same_bytes(zoo, tmp_path, name: str) -> None:
    fresh = _export(name, tmp_path / name)
    cached = zoo[name].onnx_path.parent
    for part in (MODEL, INPUT, OUTPUT):
        assert (fresh / part).read_bytes() == (cached / part).read_bytes(), f"{name}/{part} differs between exports"


def test_another_seed_other_weights(zoo, tmp_path) -> None:
    other = _export("whisper_encoder", tmp_path / "seed1", seed=1)
    assert (other / MODEL).read_bytes() != zoo["whisper_encoder"].onnx_path.read_bytes()
    assert not np.array_equal(np.load(other / INPUT), zoo["whisper_encoder"].input)
    assert cache_key("whisper_encoder", "small", 1) != cache_key("whisper_encoder", "small", 0)


def test_entries_are_what_the_registry_says(zoo) -> None:
    for name, entry in zoo.items():
        assert entry.input.shape == spec(name).shape("small") and entry.input.dtype == np.float32
        assert np.all(np.isfinite(entry.reference_output)) and np.max(np.abs(entry.reference_output)) > 1e-3


def test_unknown_names_and_sizes_are_clear() -> None:
    with pytest.raises(KeyError, match="the zoo: resnet18"):
        zoo_model("alexnet")
    with pytest.raises(KeyError, match="sizes: small"):
        zoo_model("bert", "full")


def test_only_exports_unused_for_a_day_are_pruned(tmp_path) -> None:
    """Another environment's export (other package versions: another key) in use beside this one is kept; one
    nobody has used for `STALE_AFTER_S` is removed, and no other model's."""
    keep, recent, old = (tmp_path / f"vit-small-s0-{k}" for k in ("aaaa", "bbbb", "cccc"))
    other = tmp_path / "bert-small-s0-eeee"
    for d in (keep, recent, old, other):
        d.mkdir()
    now = 1_000_000_000.0
    os.utime(recent, (now - STALE_AFTER_S + 60,) * 2)
    os.utime(old, (now - STALE_AFTER_S - 60,) * 2)
    os.utime(other, (now - 10 * STALE_AFTER_S,) * 2)
    prune_stale("vit", "small", 0, keep, now=now)
    assert keep.is_dir() and recent.is_dir() and other.is_dir() and not old.exists()
