"""Instruction builders, one module per unit family: `build(machine, pc, instruction) -> step`."""
