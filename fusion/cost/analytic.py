"""The analytic cost model: per-unit busy time from the simulator's timing rules, composed as a pipeline.

Every formula is a call into `simulator.timing` (never a copy): DMA transfers, preloads, matmuls, drains and
vector passes are charged at their average size, each unit's total is its busy time (the matrix unit's preloads
and matmuls overlap as the pipelined array runs them, `timing.matrix_segment_cycles`, one segment per drain or
step). A kernel's steps run as a software pipeline of stages load -> matrix -> vector -> store (a step's store
waits for its compute, which waits for its loads): the busiest stage (or the DRAM channel the DMAs share, or
instruction issue) sets the pace, and the other stages' share of one step does not overlap it; every fenced
phase drains the pipeline and fills it again, so that share is paid once per phase (a one-step kernel runs its
stages in series). The program says what does not pipeline (`KernelFeatures`, counted by
`fusion.engine.features`): the loads issued before the load unit's first token (a GEMM's resident activation, a
padded input image, the first weight panel: the head) are paid alone before any step, and stand for the load
stage's share of the fill; a fenced phase that hands no step to the main unit (a LayerNorm pass after a swapped
GEMM, a copy) runs its loads, vector work and stores in series after the pipeline. In a kernel whose steps hand
work back and forth between the matrix and vector units (`Strategy.serial_compute`: attention's scores, softmax and
product with V on one dependency chain per head; a conv_chain band's Convs and the Clips between them) the two
units form one stage: within a step each waits for the
other, and the next step's work, emitted after this one's, cannot hide under it. A zero-skip kernel's matrix work
shrinks by the fraction of all-zero tiles it will skip. Energy counts the same events with the machine's
per-event table.
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
VECTOR_LATENCY = 2  # typical pipeline depth of a vector row in the ISA table (add 1, mul 2, exp 4)
DRAIN_LATENCY = 3


def _avg(total: int, count: int) -> int:
    return -(-total // count) if count else 0


@dataclass(frozen=True)
class UnitTimes:
    load: float  # each unit's busy time over the whole kernel
    store: float
    matrix: float
    vector: float
    issue: float
    fill: float  # one DRAM access per fenced phase (a feature for learned models; `cycles` counts `phases`)
    steps: int
    transfer: float  # cycles the shared DRAM channel moves the pipelined steps' bursts (loads and stores together)
    phases: int = 1  # pipelined fenced phases: the pipeline drains and fills again at each
    serial_compute: bool = False  # the matrix and vector units work in series within a step (one stage)
    head: float = 0.0  # the loads no step can start before (part of `load`): the pipeline's fill, paid alone
    head_vector: float = 0.0  # the vector work preparing the first step's operands (part of `vector`), after them
    lead: float = 0.0  # the first step's own loads after a prologue's head (part of `load`), beside `head_vector`
    serial_load: float = 0.0  # the fenced phases without steps (part of `load`, `vector`, `store`): in series
    serial_vector: float = 0.0
    serial_store: float = 0.0
    load_transfer: float = 0.0  # the pipelined loads' share of `transfer`

    @property
    def cycles(self) -> float:
        """The head, then the pace of the busiest stage (or channel, or issue), plus the other stages' share of
        one step once per phase (the head is the load stage's share), then the unpipelined phases in series."""
        load, store = self.load - self.head - self.serial_load, self.store - self.serial_store
        vector = self.vector - self.serial_vector - self.head_vector
        compute = (self.matrix + vector,) if self.serial_compute else (self.matrix, vector)
        stages = (load, *compute, store)
        top, steps = max(stages), max(self.steps, 1)
        pace = max(top, self.transfer, self.issue)
        restarts = min(max(self.phases, 1), steps)
        if self.head:
            # the head holds the first step's loads, so the load stage has one item fewer than the others: the
            # span is the flow shop's, the largest of each stage's total plus the other stages' share of one step
            # before (the head already paid the loads') and after it
            later = stages[1:]
            span = max(load + sum(later) * restarts / steps, *(t + (sum(later) - t) * restarts / steps for t in later))
        else:
            span = top + (sum(stages) - top) * restarts / steps
        # the fill is what the flow shop's span takes beyond the pace: where the channel or the issue sets the pace
        # (above every stage), the stages' share of one step hides under it as far as it goes. Continuous and
        # monotone in every stage, the channel and the issue (subtracting the busiest stage instead, a faster
        # vector unit could raise an issue-bound kernel's prediction)
        fill = max(0.0, span - pace)
        after = max(compute + (store,))  # the stages the vector prologue holds back (the loads keep streaming)
        if steps > 1:
            # a store's data waits while the channel moves a load's (the load unit wins a tie, `simulator.engine`):
            # the store stage stretches by the loads' transfer time times the share u of the pipeline's time the
            # load stage is busy, squared: a store meets a load transfer as often as u says, and waits for more of
            # it the closer the loads run back to back (u = 1: streamed GEMMs' stores wait out every transfer; an
            # A-stationary GEMM with slack barely waits). Linear in u, the zoo plans' worst median was 10.6%, 8.0%
            # squared (bench/results/cost_error.md)
            after = max(after, store + self.load_transfer * min(1.0, load / (pace + fill)) ** 2)
        serial = self.serial_load + self.serial_vector + self.serial_store
        return self.head + max(pace, after, max(self.head_vector, self.lead) + after) + fill + serial


def _matmul_time(f: KernelFeatures, cfg: MachineConfig) -> int:
    """Preloads and matmuls on the pipelined array: an instruction waiting for the results (a drain, a streamed
    matmul, a step's hand-over to the other units) ends a segment (`KernelFeatures.matrix_segments`, counted from
    the program; a row without the count: one per drain or step); within one the tiles overlap as
    `timing.matrix_segment_cycles` says, at the kernel's average sizes, the tiles shared out as evenly as they go
    (some segments one more than others: rounding every segment up counted tiles the kernel does not have)."""
    if not f.matmuls:
        return f.preloads * timing.preload_cycles(cfg)
    tiles = max(f.preloads, 1)
    segments = min(max(f.matrix_segments or max(f.drains, f.steps), 1), tiles)
    rows, per_tile = _avg(f.matmul_rows, f.matmuls), _avg(f.matmuls, tiles)
    fewer, longer = divmod(tiles, segments)
    return (segments - longer) * timing.matrix_segment_cycles(cfg, fewer, per_tile, rows) + (
        longer * timing.matrix_segment_cycles(cfg, fewer + 1, per_tile, rows)
    )


def _dma_time(cfg: MachineConfig, transfers: int, bursts: int) -> int:
    """A DMA unit's busy time for `transfers` moving `bursts` in all: each pays the access latency, the channel
    moves the bursts."""
    nbytes = bursts * cfg.burst_bytes
    return transfers * timing.dma_cycles(cfg, 1, 0, 0) + timing.dma_transfer_cycles(cfg, 1, nbytes, nbytes)


def _vector_time(cfg: MachineConfig, passes: int, elems: int, chain_ops: int) -> int:
    return passes * timing.vector_cycles(cfg, _avg(elems, passes), VECTOR_LATENCY) + chain_ops * (
        timing.chain_op_cycles(cfg, VECTOR_LATENCY)
    )


def unit_times(f: KernelFeatures, cfg: MachineConfig) -> UnitTimes:
    skips = f.strategy in REGISTRY and REGISTRY[f.strategy].skips_zero_tiles
    kept = 1.0 - f.zero_tile_fraction if skips else 1.0
    matrix = kept * _matmul_time(f, cfg) + f.drains * timing.drain_cycles(
        cfg, _avg(f.drain_rows, f.drains), DRAIN_LATENCY
    )
    issue = f.instructions * timing.scalar_cycles(cfg)
    burst = cfg.burst_bytes
    per_phase = timing.dma_cycles(cfg, 1, burst, burst)
    # the matrix and vector units in series hand their work back and forth within a step (attention's scores,
    # softmax and product with V): the pipeline's steps are the loads' hand-overs, and the last one's compute and
    # store follow the loads whole (counting every hand-over as a step, the fill was a fraction of it)
    serial = f.strategy in REGISTRY and REGISTRY[f.strategy].serial_compute
    stepped = f.steps > 0  # a kernel without steps runs its stages in series: nothing to tell apart
    head = _dma_time(cfg, f.head_loads, f.head_load_bursts) if stepped and f.head_loads else 0
    head_vector = _vector_time(cfg, f.head_vector_instrs, f.head_vector_elems, 0) if stepped else 0
    # the first step's own loads after the head hold the first step back, beside any vector prologue (`lead`: an
    # A-stationary GEMM's first step after its resident A, a weight tile the matrix unit takes beside the
    # activation's quantization; none where the vector unit prepares the first step's operands meanwhile)
    lead = _dma_time(cfg, f.lead_loads, f.lead_load_bursts) if head and f.lead_loads else 0
    loads = (f.load_bursts - f.serial_load_bursts - (f.head_load_bursts if head else 0)) * burst
    piped_bytes = loads + (f.store_bursts - f.serial_store_bursts) * burst
    return UnitTimes(
        load=_dma_time(cfg, f.dma_loads, f.load_bursts),
        store=_dma_time(cfg, f.dma_stores, f.store_bursts),
        matrix=matrix,
        vector=_vector_time(cfg, f.vector_instrs, f.vector_pass_elems, f.chain_ops),
        issue=issue,
        fill=f.phases * per_phase,
        steps=f.load_steps if serial and f.load_steps else f.steps,
        transfer=timing.dma_transfer_cycles(cfg, 1, piped_bytes, piped_bytes),
        phases=max(f.phases - f.serial_phases, 1),
        serial_compute=serial,
        head=head,
        head_vector=head_vector,
        lead=lead,
        serial_load=_dma_time(cfg, f.serial_loads, f.serial_load_bursts) if f.serial_loads else 0,
        serial_vector=_vector_time(cfg, f.serial_vector_instrs, f.serial_vector_elems, f.serial_chain_ops),
        serial_store=_dma_time(cfg, f.serial_stores, f.serial_store_bursts) if f.serial_stores else 0,
        load_transfer=timing.dma_transfer_cycles(cfg, 1, loads, loads),
    )


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
