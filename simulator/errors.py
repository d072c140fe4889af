"""Errors the simulator raises: a bad machine configuration, or a trap in the simulated program."""

from __future__ import annotations

from isa.errors import DynfuseError


class ConfigError(DynfuseError):
    """A machine configuration value is invalid; the message names the field."""


class SimulatorTrap(DynfuseError):
    """A precise trap: the program did something the machine refuses (bad access, bad dtype, race, runaway).

    `pc` is the instruction index, `instruction_text` its assembly text, `cycle` the issue cycle of the
    faulting instruction and `reason` a one-line explanation.
    """

    def __init__(self, pc: int, instruction_text: str, cycle: int, reason: str) -> None:
        self.pc = pc
        self.instruction_text = instruction_text
        self.cycle = cycle
        self.reason = reason
        super().__init__(f"trap at pc {pc} ({instruction_text}), cycle {cycle}: {reason}")


class Fault(Exception):
    """Raised inside an instruction's work; the machine turns it into a SimulatorTrap with pc and cycle."""

    pc: int | None = None  # the instruction's, when the issue loop does not know it (`Machine._first`)

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)
