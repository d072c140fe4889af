"""Per-event energy in picojoules, the default figures and where they come from.

Defaults are the 45 nm per-operation energies of M. Horowitz, "Computing's energy problem (and what we
can do about it)", ISSCC 2014, Fig. 1.1.9:
- DRAM: 1.3-2.6 nJ per 64-bit access -> 2.6 nJ / 8 B = 325 pJ per byte (upper end: random rows).
- SRAM: 8 KB 64-bit read 10 pJ, 32 KB 20 pJ, 1 MB 100 pJ -> a 256 KB banked scratchpad ~ 32 KB banks:
  20 pJ / 8 B = 2.5 pJ per byte; the accumulator (smaller banks, 32-bit words) 10 pJ / 8 B = 1.25 pJ per byte.
- int8 MAC: 8-bit multiply 0.2 pJ + 32-bit add 0.1 pJ = 0.3 pJ.
- fp32 MAC: fp32 multiply 3.7 pJ + fp32 add 0.9 pJ = 4.6 pJ.
- vector element op: 32-bit int add 0.1 pJ; fp32 add 0.9 pJ (transcendentals are charged the same).
- instruction: fetch of one 64-bit word from an 8 KB instruction SRAM, 10 pJ (decode and register file
  are small beside it).
Override any of them in a TOML config (`[energy]` table) or with `dataclasses.replace`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from simulator.errors import ConfigError


@dataclass(frozen=True)
class EnergyTable:
    """Energy per event (pJ). Field names are the TOML keys of the `[energy]` table."""

    dram_byte: float = 325.0
    spad_byte: float = 2.5
    acc_byte: float = 1.25
    mac_int8: float = 0.3
    mac_fp32: float = 4.6
    vector_int_op: float = 0.1
    vector_fp32_op: float = 0.9
    instruction: float = 10.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
                raise ConfigError(f"energy.{f.name} must be a finite non-negative number, got {value!r}")
