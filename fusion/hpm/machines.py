"""Machine configurations the calibration sweep samples, and the one held out from training.

Variants change a preset's array size, vector lanes, DRAM bandwidth and scratchpad size (each stays a valid
`MachineConfig`: `dataclasses.replace` re-runs its checks). The held-out machine takes values on none of
those grids, so predicting it well means the model learned the machine parameters, not a lookup of known
machines. The grids hold values that are not powers of two (array 6 and 20, lanes 12, 20 and 28): with
power-of-two machines alone, the mostly power-of-two tensor dims always filled the array's rows and the vector
lanes exactly, so no training sample showed what a partly filled last tile or vector beat costs.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np

from simulator.config import KIB, MachineConfig, config_from_dict, load_config

ARRAY_SIZES = (4, 6, 8, 16, 20, 32)
LANES = (4, 8, 12, 16, 20, 28, 32)
BANDWIDTHS = (8, 12, 16, 32, 48, 64)
SPAD_SCALES = (0.5, 1.0, 2.0)
HELDOUT_NAME = "heldout"
MIN_SPAD = 32 * KIB  # below this a 256-deep GEMM row does not fit half the scratchpad


def _acc_bytes(cfg: MachineConfig, array_size: int) -> int:
    """Room for double-buffered accumulator tiles of the new array (at least the preset's)."""
    return max(cfg.acc_bytes, 8 * array_size * array_size * 4)


def variant(base: MachineConfig, rng: np.random.Generator) -> MachineConfig:
    n, lanes, bw = (int(rng.choice(grid)) for grid in (ARRAY_SIZES, LANES, BANDWIDTHS))
    spad = max(MIN_SPAD, int(base.spad_bytes * float(rng.choice(SPAD_SCALES))))
    name = f"{base.name}-n{n}-l{lanes}-bw{bw}-s{spad // KIB}k"
    return replace(
        base,
        name=name,
        array_size=n,
        vector_lanes=lanes,
        dram_bytes_per_cycle=bw,
        spad_bytes=spad,
        acc_bytes=_acc_bytes(base, n),
        vreg_elems=max(base.vreg_elems, 1024),
    )


def grids() -> dict[str, list[float]]:
    """The variant grids: part of what a sweep directory's seeds mean (a resumed sweep must draw from the same)."""
    return {
        "array_sizes": list(ARRAY_SIZES),
        "lanes": list(LANES),
        "bandwidths": list(BANDWIDTHS),
        "spad_scales": list(SPAD_SCALES),
    }


def heldout_config() -> MachineConfig:
    """Off every grid above: array 12, 24 lanes, 24 bytes/cycle, 192 KiB scratchpad, 80-cycle DRAM latency."""
    base = load_config("base")
    return replace(
        base,
        name=HELDOUT_NAME,
        array_size=12,
        vector_lanes=24,
        dram_bytes_per_cycle=24,
        dram_latency=80,
        spad_bytes=192 * KIB,
        acc_bytes=48 * KIB,
    )


def config_to_json(cfg: MachineConfig) -> str:
    return json.dumps(cfg.as_dict(), sort_keys=True)


def config_from_json(text: str) -> MachineConfig:
    data = json.loads(text)
    return config_from_dict(data, default_name=data.get("name", "custom"))
