"""The co-simulation corpus: every program in examples/ plus seeded random programs.

Programs run on the simulator with transaction recording; kernel inputs they
declare get seeded random values (`simulator.inputs.random_inputs`) unless the
caller supplies them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from assembler.objfile import ObjectFile
from assembler.source import assemble
from rtl.cosim import Recorded
from rtl.programs import random_program
from simulator.config import MachineConfig
from simulator.inputs import random_inputs
from simulator.run import load_program, simulate

EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "examples"


def example_programs(config: str = "base") -> list[Path]:
    """Every example, as the variant generated for machine `config` where there is one (examples/variants.py)."""
    variants = EXAMPLES_DIR / config
    return [variants / p.name if (variants / p.name).is_file() else p for p in sorted(EXAMPLES_DIR.glob("*.s"))]


def record(
    name: str, obj: ObjectFile, cfg: MachineConfig, inputs: dict[str, np.ndarray] | None = None, seed: int = 0
) -> Recorded:
    """Simulate with transaction recording; inputs not given are seeded random (`simulator.inputs`)."""
    result = simulate(obj, cfg, random_inputs(obj, seed, inputs), record_transactions=True)
    return Recorded(name, obj, result.transactions)


def record_file(path: Path, cfg: MachineConfig, inputs: dict[str, np.ndarray] | None = None, seed: int = 0) -> Recorded:
    return record(path.name, load_program(path), cfg, inputs, seed)


def record_random(seed: int, cfg: MachineConfig) -> Recorded:
    return record(f"random-{seed}", assemble(random_program(seed, cfg), f"<random {seed}>"), cfg, seed=seed)
