"""Silicon area of a machine configuration, so that "faster" can be weighed against "bigger".

The figures are 45 nm, the node of the energy table (`simulator/energy.py`), so area and energy come from one
technology:
- Logic: M. Horowitz, "Computing's energy problem (and what we can do about it)", ISSCC 2014, Fig. 1.1.9
  (area column, 45 nm): 8-bit multiply 282 um^2, 32-bit add 137 um^2, fp32 multiply 7700 um^2, fp32 add
  4184 um^2. A processing element of the N x N array holds an int8 MAC (8-bit multiply + 32-bit accumulate)
  and an fp32 MAC (fp32 multiply + fp32 add), as the array computes both (`mac_int8`, `mac_fp32` energies);
  a vector lane holds an fp32 multiplier, an fp32 adder and a 32-bit integer adder (fp32 and integer ops).
- SRAM: the 45 nm high-k metal-gate 6T cell of K. Mistry et al., "A 45nm Logic Technology with High-k+Metal
  Gate Transistors, Strained Silicon, 9 Cu Interconnect Layers, 193nm Dry Patterning, and 100% Pb-free
  Packaging", IEDM 2007: 0.346 um^2 per bit. Arrays also need decoders, sense amplifiers and drivers; the cell
  array is taken as 70% of a macro's area (`sram_array_efficiency`, an assumption: small banks are less
  efficient, override it for your memory compiler), so 0.494 um^2 per stored bit.
- What is stored on chip: scratchpad and accumulator (`spad_bytes`, `acc_bytes`), the 8 vector registers of
  `vreg_elems` fp32 elements, the matrix -> vector stream FIFO (`stream_fifo_depth` rows of N fp32), and the
  instruction queues (one per `isa.enums.Unit`, `queue_depth` 64-bit entries each), all counted as SRAM bits.
- Not modelled: DRAM (off chip), the DRAM interface and PHY (its area grows with `dram_bytes_per_cycle`, but
  no per-byte-per-cycle figure of the same source exists), control logic, wiring. Bandwidth therefore costs no
  area here; weigh it by energy (DRAM bytes) or add your PHY figure to the result.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from isa.enums import Unit
from isa.fields import NUM_VREGS
from simulator.config import MachineConfig
from simulator.errors import ConfigError

INSTRUCTION_BITS = 64
FP32_BITS = 32


@dataclass(frozen=True)
class AreaTable:
    """Area per component (um^2, 45 nm); field names are what an override names."""

    mult_int8: float = 282.0
    add_int32: float = 137.0
    mult_fp32: float = 7700.0
    add_fp32: float = 4184.0
    sram_cell: float = 0.346  # um^2 per bit (6T cell)
    sram_array_efficiency: float = 0.7  # share of an SRAM macro that is cells

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigError(f"area.{f.name} must be a positive number, got {value!r}")
        if self.sram_array_efficiency > 1:
            raise ConfigError(f"area.sram_array_efficiency must be at most 1, got {self.sram_array_efficiency}")

    @property
    def pe(self) -> float:
        return self.mult_int8 + self.add_int32 + self.mult_fp32 + self.add_fp32

    @property
    def lane(self) -> float:
        return self.mult_fp32 + self.add_fp32 + self.add_int32

    @property
    def sram_bit(self) -> float:
        return self.sram_cell / self.sram_array_efficiency


@dataclass(frozen=True)
class Area:
    """A configuration's area by component, in mm^2."""

    array_mm2: float
    vector_mm2: float
    sram_mm2: float
    sram_bits: int

    @property
    def total_mm2(self) -> float:
        return self.array_mm2 + self.vector_mm2 + self.sram_mm2


def sram_bits(config: MachineConfig) -> int:
    """Bits of on-chip storage (see the module docstring for what counts)."""
    local = 8 * (config.spad_bytes + config.acc_bytes)
    vregs = NUM_VREGS * config.vreg_elems * FP32_BITS
    fifo = config.stream_fifo_depth * config.array_size * FP32_BITS
    queues = len(Unit) * config.queue_depth * INSTRUCTION_BITS
    return local + vregs + fifo + queues


def area(config: MachineConfig, table: AreaTable | None = None) -> Area:
    t = table or AreaTable()
    um2_per_mm2 = 1e6
    bits = sram_bits(config)
    return Area(
        array_mm2=config.array_size**2 * t.pe / um2_per_mm2,
        vector_mm2=config.vector_lanes * t.lane / um2_per_mm2,
        sram_mm2=bits * t.sram_bit / um2_per_mm2,
        sram_bits=bits,
    )
