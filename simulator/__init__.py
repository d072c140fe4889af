"""Cycle-level simulator of the dynfuse accelerator: numpy semantics, event-driven timing, counters, traces.

Entry point: `simulate(program, config, inputs, checked=False, trace=False, record_transactions=False)`.

The choices the simulator makes where the contract leaves one are listed in docs/architecture.md,
"Decisions the simulator makes" (bounded stream FIFO, data work at issue, banks held for a whole
instruction, deadlock traps...).
"""

from simulator.area import Area, AreaTable, area
from simulator.config import PRESETS, MachineConfig, load_config
from simulator.energy import EnergyTable
from simulator.errors import ConfigError, SimulatorTrap
from simulator.run import RunResult, Transaction, simulate

__all__ = [
    "Area",
    "AreaTable",
    "ConfigError",
    "EnergyTable",
    "MachineConfig",
    "PRESETS",
    "RunResult",
    "SimulatorTrap",
    "Transaction",
    "area",
    "load_config",
    "simulate",
]
