"""Fuzzing machine configs: random TOML over the real field names (values of every TOML type, NaN and inf
included) and damaged bytes of a valid file. Only ConfigError may escape; an accepted config is finite: its
JSON (what `--json` prints) has no NaN and its hash and timing conversions work."""

from __future__ import annotations

import json
import math
from dataclasses import fields
from pathlib import Path

import numpy as np
from fuzz_helpers import fuzz, mutate_bytes, pick

from simulator.config import PRESETS, MachineConfig, load_config
from simulator.energy import EnergyTable
from simulator.errors import ConfigError

FIELDS = [f.name for f in fields(MachineConfig) if f.name not in ("name", "energy")]
ENERGY = [f.name for f in fields(EnergyTable)]
VALUES = [
    "0", "1", "-1", "3", "4", "16", "256", "1024", "65536", "4294967296", "9223372036854775807", "2.5", "1e300",
    "nan", "inf", "-inf", '"base"', '"x"', "true", "[1, 2]", '["base"]', "{ a = 1 }", "0x10", "1_000",
]  # fmt: skip
PRESET_VALUES = ['"tiny"', '"base"', '"large"', '"huge"', '["base"]', "3"]
VALID = sorted((Path(__file__).resolve().parents[2] / "examples").rglob("*.toml"))


def _toml(rng: np.random.Generator) -> str:
    lines = []
    if rng.random() < 0.8:
        lines.append(f"preset = {pick(rng, PRESET_VALUES)}")
    for _ in range(int(rng.integers(0, 6))):
        key = pick(rng, FIELDS) if rng.random() < 0.9 else "bogus"
        lines.append(f"{key} = {pick(rng, VALUES)}")
    if rng.random() < 0.4:
        lines.append("[energy]")
        for _ in range(int(rng.integers(1, 4))):
            lines.append(f"{pick(rng, ENERGY)} = {pick(rng, VALUES)}")
    return "\n".join(dict.fromkeys(lines)) + "\n"


def _check(cfg: MachineConfig) -> str:
    text = json.dumps(cfg.as_dict(), allow_nan=False)  # raises on NaN/inf
    assert json.loads(text)["name"] == cfg.name and len(cfg.config_hash()) == 16
    assert math.isfinite(cfg.cycles_to_us(1000))
    return "accepted"


def test_fuzz_machine_toml(tmp_path: Path) -> None:
    path = tmp_path / "m.toml"
    seeds = [p.read_bytes() for p in VALID] or [b'preset = "base"\narray_size = 8\n[energy]\ndram_byte = 100.0\n']

    def case(rng: np.random.Generator) -> str:
        if rng.random() < 0.7:
            path.write_text(_toml(rng))
        else:
            path.write_bytes(mutate_bytes(pick(rng, seeds), rng))
        return _check(load_config(path))

    counts = fuzz("machine TOML", case, (ConfigError,))
    assert counts["accepted"] and counts["rejected"]
    assert _check(PRESETS["base"])
