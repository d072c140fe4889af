"""The analytic cost model: per-unit busy time from the simulator's timing rules, composed as a pipeline.

Every formula is a call into `simulator.timing` (never a copy): DMA transfers, preloads, matmuls, drains and
vector passes are charged at their average size, each unit's total is its busy time (the matrix unit's preloads
and matmuls overlap as the pipelined array runs them, `timing.matrix_segment_cycles`, one segment per drain or
step). A kernel's steps run as a
software pipeline of stages load -> matrix -> vector -> store (a step's store waits for its compute, which waits
for its loads): the busiest stage (or the DRAM channel the DMAs share, or instruction issue) sets the pace, and
the other stages' share of one step does not overlap it; every fenced phase drains the pipeline and fills it
again, so that share is paid once per phase (a one-step kernel runs its stages in series). In a kernel whose
steps hand work back and forth between the matrix and vector units (`SERIAL_COMPUTE`: attention's scores, softmax
and product with V on one dependency chain per head) the two units form one stage: within a step each waits for
the other, and the next step's work, emitted after this one's, cannot hide under it. A zero-skip kernel's
matrix work shrinks by the fraction of all-zero tiles it will skip. Energy counts the same events with the
machine's per-event table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fusion.cost.interface import CostEstimate, KernelFeatures
from fusion.engine.strategies import REGISTRY
from simulator import timing
from simulator.config import MachineConfig

# The relative error (measured - predicted) / predicted the model makes per kernel strategy (`Strategy.spread`, from
# bench/bench_cost.py), stated with each prediction (`CostEstimate.spread`) for the planner's expected-regret
# measurement; a strategy that states none (measured on fewer than 20 kernels) gets the largest spread.
SPREAD = {name: s.spread for name, s in REGISTRY.items() if s.spread is not None}
# strategies whose steps alternate matrix and vector work on one dependency chain (bench/bench_cost_error.py: priced
# as overlapping stages, attention kernels measured 18% above their prediction, in series 5%)
SERIAL_COMPUTE = frozenset({"attention"})
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
    fill: float  # one DRAM access per fenced phase (a feature for learned models; `cycles` counts `phases`)
    steps: int
    transfer: float  # cycles the shared DRAM channel moves bursts (loads and stores together)
    phases: int = 1  # fenced phases: the pipeline drains and fills again at each
    serial_compute: bool = False  # the matrix and vector units work in series within a step (one stage)

    @property
    def cycles(self) -> float:
        """The pace of the busiest stage (or channel, or issue), plus the other stages' share of one step once per
        phase."""
        compute = (self.matrix + self.vector,) if self.serial_compute else (self.matrix, self.vector)
        stages = (self.load, *compute, self.store)
        top, steps = max(stages), max(self.steps, 1)
        restarts = min(max(self.phases, 1), steps)
        # the channel's time beyond the busiest stage is other stages' DMA traffic, already paid on the channel
        rest = sum(stages) - top - max(0.0, self.transfer - top)
        return max(top, self.transfer, self.issue) + rest * restarts / steps


def _matmul_time(f: KernelFeatures, cfg: MachineConfig) -> int:
    """Preloads and matmuls on the pipelined array: an instruction waiting for the results (a drain, a streamed
    matmul, a step's hand-over to the other units) ends a segment (`KernelFeatures.matrix_segments`, counted from
    the program; a row without the count: one per drain or step); within one the tiles overlap as
    `timing.matrix_segment_cycles` says, at the kernel's average sizes."""
    if not f.matmuls:
        return f.preloads * timing.preload_cycles(cfg)
    tiles = max(f.preloads, 1)
    segments = min(max(f.matrix_segments or max(f.drains, f.steps), 1), tiles)
    rows = _avg(f.matmul_rows, f.matmuls)
    return segments * timing.matrix_segment_cycles(cfg, _avg(tiles, segments), _avg(f.matmuls, tiles), rows)


def unit_times(f: KernelFeatures, cfg: MachineConfig) -> UnitTimes:
    latency = timing.dma_cycles(cfg, 1, 0, 0)  # an empty transfer: the access latency alone
    ld_bytes, st_bytes = f.load_bursts * cfg.burst_bytes, f.store_bursts * cfg.burst_bytes
    load = f.dma_loads * latency + timing.dma_transfer_cycles(cfg, 1, ld_bytes, ld_bytes)
    store = f.dma_stores * latency + timing.dma_transfer_cycles(cfg, 1, st_bytes, st_bytes)
    skips = f.strategy in REGISTRY and REGISTRY[f.strategy].skips_zero_tiles
    kept = 1.0 - f.zero_tile_fraction if skips else 1.0
    matrix = kept * _matmul_time(f, cfg) + f.drains * timing.drain_cycles(
        cfg, _avg(f.drain_rows, f.drains), DRAIN_LATENCY
    )
    vector = f.vector_instrs * timing.vector_cycles(
        cfg, _avg(f.vector_pass_elems, f.vector_instrs), VECTOR_LATENCY
    ) + f.chain_ops * timing.chain_op_cycles(cfg, VECTOR_LATENCY)
    issue = f.instructions * timing.scalar_cycles(cfg)
    burst = cfg.burst_bytes
    per_phase = timing.dma_cycles(cfg, 1, burst, burst)
    transfer = timing.dma_transfer_cycles(cfg, 1, ld_bytes + st_bytes, ld_bytes + st_bytes)
    serial = f.strategy in SERIAL_COMPUTE
    return UnitTimes(load, store, matrix, vector, issue, f.phases * per_phase, f.steps, transfer, f.phases, serial)


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
        spread = SPREAD.get(features.strategy, max(SPREAD.values()))
        return CostEstimate(unit_times(features, config).cycles, energy_pj(features, config), spread)

    def predict_group(self, features: Sequence[KernelFeatures], config: MachineConfig) -> list[CostEstimate]:
        return [self.predict(f, config) for f in features]


def roofline_cycles(macs: int, dram_bytes: int, cfg: MachineConfig) -> float:
    """Lower bound on any kernel: max(MACs / N^2, DRAM bytes / bytes per cycle) (Williams et al. 2009)."""
    return max(macs / cfg.peak_macs_per_cycle, dram_bytes / cfg.dram_bytes_per_cycle)
