"""The analytic cost model: per-unit busy time from the simulator's timing rules, overlapped across units.

Every formula is a call into `simulator.timing` (never a copy): DMA transfers, preloads, matmuls, drains and
vector passes are charged at their average size, each unit's total is its busy time, the units overlap within a
pipeline phase (the kernel takes as long as its busiest unit, the DRAM channel being shared by loads and stores),
the other units' share of one step does not overlap (pipeline fill and drain), and every fenced phase pays
one DRAM latency. A zero-skip kernel's matrix work
shrinks by the fraction of all-zero tiles it will skip. Energy counts the same events with the machine's
per-event table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fusion.cost.interface import CostEstimate, KernelFeatures
from simulator import timing
from simulator.config import MachineConfig

VECTOR_LATENCY = 2  # typical pipeline depth of a vector row in the ISA table (add 1, mul 2, exp 4)
DRAIN_LATENCY = 3


def _avg(total: int, count: int) -> int:
    return -(-total // count) if count else 0


@dataclass(frozen=True)
class UnitTimes:
    load: float
    store: float
    matrix: float
    vector: float
    issue: float
    fill: float
    steps: int
    transfer: float  # cycles the shared DRAM channel moves bursts (loads and stores together)

    @property
    def cycles(self) -> float:
        """The busiest unit, plus the others' share of one step that cannot overlap it (pipeline fill/drain)."""
        memory = max(self.load, self.store, self.transfer)  # access latencies overlap, the channel does not
        busy = (memory, self.matrix, self.vector)
        top = max(*busy, self.issue)
        return top + (sum(busy) - max(busy)) / max(self.steps, 1) + self.fill


def unit_times(f: KernelFeatures, cfg: MachineConfig) -> UnitTimes:
    latency = timing.dma_cycles(cfg, 1, 0, 0)  # an empty transfer: the access latency alone
    ld_bytes, st_bytes = f.load_bursts * cfg.burst_bytes, f.store_bursts * cfg.burst_bytes
    load = f.dma_loads * latency + timing.dma_transfer_cycles(cfg, 1, ld_bytes, ld_bytes)
    store = f.dma_stores * latency + timing.dma_transfer_cycles(cfg, 1, st_bytes, st_bytes)
    kept = 1.0 - f.zero_tile_fraction if f.strategy == "zero_skip" else 1.0
    matrix = kept * (
        f.preloads * timing.preload_cycles(cfg) + f.matmuls * timing.matmul_cycles(cfg, _avg(f.matmul_rows, f.matmuls))
    ) + f.drains * timing.drain_cycles(cfg, _avg(f.drain_rows, f.drains), DRAIN_LATENCY)
    vector = f.vector_instrs * timing.vector_cycles(
        cfg, _avg(f.vector_pass_elems, f.vector_instrs), VECTOR_LATENCY
    ) + f.chain_ops * timing.chain_op_cycles(cfg, VECTOR_LATENCY)
    issue = f.instructions * timing.scalar_cycles(cfg)
    burst = cfg.burst_bytes
    per_phase = timing.dma_cycles(cfg, 1, burst, burst)
    transfer = timing.dma_transfer_cycles(cfg, 1, ld_bytes + st_bytes, ld_bytes + st_bytes)
    return UnitTimes(load, store, matrix, vector, issue, f.phases * per_phase, f.steps, transfer)


def energy_pj(f: KernelFeatures, cfg: MachineConfig) -> float:
    e = cfg.energy
    mac = e.mac_int8 if f.dtype == "int8" else e.mac_fp32
    op = e.vector_fp32_op
    local_bytes = 2 * (f.dram_read_bytes + f.dram_write_bytes)  # every DMA byte is also written/read locally
    return (
        (f.dram_read_bytes + f.dram_write_bytes) * e.dram_byte
        + local_bytes * e.spad_byte
        + f.macs * mac
        + f.vector_elems * op
        + f.instructions * e.instruction
    )


class AnalyticCostModel:
    """`CostModel` from the timing rules; `name` shows in reports."""

    name = "analytic"

    def predict(self, features: KernelFeatures, config: MachineConfig) -> CostEstimate:
        return CostEstimate(unit_times(features, config).cycles, energy_pj(features, config))

    def predict_group(self, features: Sequence[KernelFeatures], config: MachineConfig) -> list[CostEstimate]:
        return [self.predict(f, config) for f in features]


def roofline_cycles(macs: int, dram_bytes: int, cfg: MachineConfig) -> float:
    """Lower bound on any kernel: max(MACs / N^2, DRAM bytes / bytes per cycle) (Williams et al. 2009)."""
    return max(macs / cfg.peak_macs_per_cycle, dram_bytes / cfg.dram_bytes_per_cycle)
