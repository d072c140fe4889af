"""What every cost model sees about a kernel candidate, and what it answers.

`KernelFeatures` is plain data computed from a candidate before it is simulated (shapes, work, traffic,
schedule choices, the data's sparsity); it is also the row format of the HPM calibration dataset, so
field names are stable: append, never rename.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Protocol

from simulator.config import MachineConfig


@dataclass(frozen=True)
class KernelFeatures:
    ops: tuple[str, ...]  # op types of the group in topological order, e.g. ("MatMul", "Add", "Relu")
    strategy: str  # "unfused", "epilogue", "chain", "stream", "transpose_load", "zero_skip", ...
    dtype: str  # "int8" or "fp32"
    shapes: tuple[tuple[int, ...], ...]  # input shapes of the group, then output shapes
    macs: int  # matrix-unit multiply-accumulates
    vector_elems: int  # vector-unit element operations (elements x ops)
    dram_read_bytes: int  # DRAM traffic the kernel's DMA performs
    dram_write_bytes: int
    tile_m: int  # activation rows streamed per matmul (0 without a matmul)
    tile_n: int  # output columns per weight tile
    tile_k: int  # reduction depth per weight tile
    loop_order: str  # e.g. "nkm" (outer to inner) or "" without a matmul
    zero_tile_fraction: float  # fraction of all-zero tiles in the operand a zero-skip kernel tests
    instructions: int  # static instruction count of the generated kernel
    # appended by the fusion engine (counts from the generated program; defaults keep old rows loadable)
    dma_loads: int = 0  # dma.ld / dma.ldt instructions
    dma_stores: int = 0
    preloads: int = 0  # mx.preload
    matmuls: int = 0  # mx.mm / mx.mma / mx.mms
    matmul_rows: int = 0  # activation rows over all matmuls
    drains: int = 0  # mx.drain
    drain_rows: int = 0
    vector_instrs: int = 0  # vector instructions that make a pass over their elements (v.*, vc.ld, vc.lds, vc.r*)
    vector_pass_elems: int = 0  # elements over those passes
    chain_ops: int = 0  # vc.* register-to-register ops and vc.st (pipeline latency only)
    phases: int = 0  # fenced pipeline phases
    zero_tests: int = 0  # bz.tile / bnz.tile
    steps: int = 0  # pipeline steps: token handovers into the main compute unit (matrix, else vector): overlap
    load_steps: int = 0  # of the steps, the load unit's hand-overs (0 in old rows: every step one)
    load_bursts: int = 0  # DRAM bursts of the loads (strided rows start their own bursts)
    store_bursts: int = 0
    matrix_segments: int = 0  # runs of matmuls whose results an instruction waits for (0: not counted, old rows)
    # the pipeline's shape (features.py; 0 in old rows: the whole kernel one pipeline without a separate fill)
    head_loads: int = 0  # loads the pipelined phases issue before the load unit's first token: the pipeline's fill
    head_load_bursts: int = 0
    head_vector_instrs: int = 0  # vector passes before the vector unit's first token into the main unit (a prologue)
    head_vector_elems: int = 0
    serial_loads: int = 0  # in fenced phases that hand no step to the main unit: run in series, not pipelined
    serial_load_bursts: int = 0
    serial_stores: int = 0
    serial_store_bursts: int = 0
    serial_vector_instrs: int = 0
    serial_vector_elems: int = 0
    serial_chain_ops: int = 0
    serial_phases: int = 0
    lead_loads: int = 0  # the first step's own loads after a prologue's head (features.py): beside its vector work
    lead_load_bursts: int = 0

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class CostEstimate:
    cycles: float
    energy_pj: float
    spread: float | None = None  # relative standard deviation of the cycles' error (measured - predicted) /
    # predicted, as the model knows it for this prediction; None: the model does not know (the planner assumes
    # `planner.DEFAULT_SPREAD`). The planner measures where the expected regret of trusting `cycles` is large.


class CostModel(Protocol):
    """Predicts without simulating; `name` appears in reports (`--cost-model analytic|hpm`)."""

    name: str

    def predict(self, features: KernelFeatures, config: MachineConfig) -> CostEstimate: ...

    def predict_group(self, features: Sequence[KernelFeatures], config: MachineConfig) -> list[CostEstimate]:
        """The schedules of one set of nodes priced together (a model may rank them better than one by one)."""
        ...
