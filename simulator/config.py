"""Machine configuration: one validated, frozen record from which every size, rate and energy derives.

Load a preset by name (`tiny`, `base`, `large`) or a TOML file. A TOML file may start from a preset with
`preset = "base"` and override any field (fields are independent: a smaller `array_size` does not shrink
`stream_fifo_depth`); per-event energies go in an `[energy]` table. Example:

    preset = "base"
    array_size = 8
    stream_fifo_depth = 8
    dram_bytes_per_cycle = 16
    [energy]
    dram_byte = 160.0
"""

from __future__ import annotations

import hashlib
import json
import math
import tomllib
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from simulator.energy import EnergyTable
from simulator.errors import ConfigError

KIB = 1024
MIB = 1024 * KIB
MAX_ARRAY_SIZE = 256  # int8 products summed over K <= 256 stay exact in float32 (the fast matmul path)
# A host-dispatched kernel launch: 5 us, the CUDA kernel launch overhead Volkov and Demmel measured ("Benchmarking
# GPUs to Tune Dense Linear Algebra", SC 2008: 3-7 us per launch; ~4-5 us as quoted on
# https://forums.developer.nvidia.com/t/cost-of-launching-a-kernel-function/18347). In cycles at the clock:
LAUNCH_US = 5.0
DEFAULT_LAUNCH_CYCLES = 5000  # LAUNCH_US at 1 GHz (`base`, `large`; `tiny` at 200 MHz: 1000)


@dataclass(frozen=True)
class MachineConfig:
    """Every hardware parameter of one machine. Sizes in bytes, rates per cycle, times in cycles."""

    name: str
    array_size: int  # N: the systolic array is N x N
    vector_lanes: int  # L: elements per vector-unit beat
    spad_bytes: int
    spad_banks: int
    acc_bytes: int
    acc_banks: int
    dram_bytes: int
    dram_bytes_per_cycle: int
    dram_latency: int
    burst_bytes: int
    queue_depth: int  # entries per unit instruction queue
    vreg_elems: int  # capacity of one vector register (fusion chains)
    stream_fifo_depth: int  # rows the matrix -> vector stream FIFO holds before mx.mms stalls (presets: N)
    branch_penalty: int  # extra cycles of a taken branch
    clock_mhz: float
    max_cycles: int  # watchdog
    energy: EnergyTable = field(default_factory=EnergyTable)
    # cycles the host pays to launch one kernel in host-dispatched execution (driver call, command queue, the
    # device fetching it); a whole-model program launched once pays it once (`fusion.engine.program`)
    launch_cycles: int = DEFAULT_LAUNCH_CYCLES

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError("name must be a non-empty string")
        positive = (
            "array_size",
            "vector_lanes",
            "spad_bytes",
            "spad_banks",
            "acc_bytes",
            "acc_banks",
            "dram_bytes",
            "dram_bytes_per_cycle",
            "burst_bytes",
            "queue_depth",
            "vreg_elems",
            "stream_fifo_depth",
            "max_cycles",
        )
        for name in positive:
            _check_int(name, getattr(self, name), 1)
        _check_int("dram_latency", self.dram_latency, 0)
        _check_int("branch_penalty", self.branch_penalty, 0)
        _check_int("launch_cycles", self.launch_cycles, 0)
        clock = self.clock_mhz
        if isinstance(clock, bool) or not isinstance(clock, int | float) or not 0 < clock < math.inf:
            raise ConfigError(f"clock_mhz must be a finite positive number, got {clock!r}")
        if self.array_size > MAX_ARRAY_SIZE:
            raise ConfigError(f"array_size must be at most {MAX_ARRAY_SIZE}, got {self.array_size}")
        for name in ("spad_banks", "acc_banks", "burst_bytes"):
            if getattr(self, name) & (getattr(self, name) - 1):
                raise ConfigError(f"{name} must be a power of two, got {getattr(self, name)}")
        if self.spad_bytes % self.spad_banks:
            raise ConfigError(f"spad_bytes ({self.spad_bytes}) must divide evenly into spad_banks ({self.spad_banks})")
        if self.acc_bytes % (4 * self.acc_banks):
            raise ConfigError(
                f"acc_bytes ({self.acc_bytes}) must divide into acc_banks ({self.acc_banks}) "
                "banks of whole 4-byte entries"
            )
        if self.spad_bytes > 1 << 24 or self.acc_bytes > 1 << 24:
            raise ConfigError("spad_bytes and acc_bytes must each fit the 16 MiB local address window")
        if self.dram_bytes > 1 << 32:
            raise ConfigError(f"dram_bytes must fit 32-bit addresses, got {self.dram_bytes}")
        if not isinstance(self.energy, EnergyTable):
            raise ConfigError(f"energy must be an EnergyTable, got {type(self.energy).__name__}")

    @property
    def spad_bank_bytes(self) -> int:
        return self.spad_bytes // self.spad_banks

    @property
    def acc_bank_bytes(self) -> int:
        return self.acc_bytes // self.acc_banks

    @property
    def peak_macs_per_cycle(self) -> int:
        return self.array_size * self.array_size

    def cycles_to_us(self, cycles: int) -> float:
        return cycles / self.clock_mhz

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def config_hash(self) -> str:
        """Stable 16-hex-digit digest of every field (the kernel cache keys on it)."""
        text = json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value}")


PRESETS: dict[str, MachineConfig] = {
    "tiny": MachineConfig(
        name="tiny",
        array_size=4,
        vector_lanes=4,
        spad_bytes=16 * KIB,
        spad_banks=2,
        acc_bytes=4 * KIB,
        acc_banks=2,
        dram_bytes=4 * MIB,
        dram_bytes_per_cycle=8,
        dram_latency=20,
        burst_bytes=16,
        queue_depth=4,
        vreg_elems=256,
        stream_fifo_depth=4,
        branch_penalty=2,
        clock_mhz=200.0,
        max_cycles=10_000_000,
        launch_cycles=round(LAUNCH_US * 200.0),
    ),
    "base": MachineConfig(
        name="base",
        array_size=16,
        vector_lanes=16,
        spad_bytes=256 * KIB,
        spad_banks=4,
        acc_bytes=64 * KIB,
        acc_banks=4,
        dram_bytes=512 * MIB,
        dram_bytes_per_cycle=32,
        dram_latency=100,
        burst_bytes=64,
        queue_depth=8,
        vreg_elems=4096,
        stream_fifo_depth=16,
        branch_penalty=2,
        clock_mhz=1000.0,
        max_cycles=1_000_000_000,
        launch_cycles=round(LAUNCH_US * 1000.0),
    ),
    "large": MachineConfig(
        name="large",
        array_size=32,
        vector_lanes=32,
        spad_bytes=512 * KIB,
        spad_banks=8,
        acc_bytes=128 * KIB,
        acc_banks=8,
        dram_bytes=1024 * MIB,
        dram_bytes_per_cycle=64,
        dram_latency=100,
        burst_bytes=64,
        queue_depth=16,
        vreg_elems=8192,
        stream_fifo_depth=32,
        branch_penalty=2,
        clock_mhz=1000.0,
        max_cycles=1_000_000_000,
        launch_cycles=round(LAUNCH_US * 1000.0),
    ),
}

_FIELD_NAMES = {f.name for f in fields(MachineConfig)}
_ENERGY_NAMES = {f.name for f in fields(EnergyTable)}


def load_config(name_or_path: str | Path | MachineConfig) -> MachineConfig:
    """A preset by name, or a TOML file (optionally `preset = "..."` plus overrides)."""
    if isinstance(name_or_path, MachineConfig):
        return name_or_path
    text = str(name_or_path)
    if text in PRESETS:
        return PRESETS[text]
    path = Path(text)
    if path.suffix != ".toml":
        raise ConfigError(f"unknown machine config {text!r}: use a preset ({', '.join(PRESETS)}) or a .toml file")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: TOML must be UTF-8 text (byte {err.start} is not)") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: invalid TOML: {err}") from None
    return config_from_dict(data, default_name=path.stem)


def config_from_dict(data: dict[str, Any], default_name: str = "custom") -> MachineConfig:
    data = dict(data)
    preset = data.pop("preset", None)
    if preset is not None and (not isinstance(preset, str) or preset not in PRESETS):
        raise ConfigError(f"preset must be one of {', '.join(PRESETS)}, got {preset!r}")
    energy = data.pop("energy", {})
    if not isinstance(energy, dict):
        raise ConfigError("energy must be a table of per-event pJ values")
    for key in data:
        if key not in _FIELD_NAMES:
            raise ConfigError(f"unknown config field {key!r}")
    for key in energy:
        if key not in _ENERGY_NAMES:
            raise ConfigError(f"unknown energy field {key!r}")
    if preset is None:
        missing = sorted(_FIELD_NAMES - set(data) - {"name", "energy", "launch_cycles"})
        if missing:
            raise ConfigError(f"missing config fields (or give preset = ...): {', '.join(missing)}")
        return MachineConfig(**{"name": default_name, **data}, energy=EnergyTable(**energy))
    start = PRESETS[preset]
    return replace(start, **{"name": default_name, **data}, energy=replace(start.energy, **energy))
