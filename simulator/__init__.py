"""Cycle-level simulator of the dynfuse accelerator: numpy semantics, event-driven timing, counters, traces.

Entry point: `simulate(program, config, inputs, checked=False, trace=False, record_transactions=False)`.

Rules the simulator adds to docs/architecture.md (where the contract leaves a choice):
- Data work happens when an instruction issues, in program order; the timing engine then decides when
  each unit runs it. Programs must order dependent units with tokens or `fence`; checked mode reports
  any pair of accesses they leave unordered.
- A `sync.pop` must come after its matching `sync.push` in program order (else a trap); a `vc.lds` must
  come after the `mx.mms` it reads, and starts no earlier than that stream begins.
- A unit instruction holds every bank it touches for its whole duration; load and store DMAs share one
  DRAM channel, whose busy time shows up as `*_stall_dram`.
- Matrix unit: `mx.mm*` write accumulator addresses only; `mx.drain` drains at most N columns and reads the
  accumulator as i32 after an i8 preload, f32 after an f32 preload.
- Vector shifts use the low 3 (i8) or 5 (i32) bits of the shift amount; f32 scalar operands are the fp32
  bits of the register.
- The matrix -> vector stream FIFO is unbounded (`mx.mms` never waits for `vc.lds`).
- `dispatch` costs like a taken/not-taken branch; `lw`/`sw` stall for the DRAM latency.
- A kernel's `cycle` counter is its share of the timeline: from entering its first instruction until
  another kernel is entered or the program halts.
"""

from simulator.config import PRESETS, MachineConfig, load_config
from simulator.energy import EnergyTable
from simulator.errors import ConfigError, SimulatorTrap
from simulator.run import RunResult, Transaction, simulate

__all__ = [
    "ConfigError",
    "EnergyTable",
    "MachineConfig",
    "PRESETS",
    "RunResult",
    "SimulatorTrap",
    "Transaction",
    "load_config",
    "simulate",
]
