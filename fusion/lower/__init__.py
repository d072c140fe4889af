"""Lowering of graphs to accelerator programs: the unfused baseline (one base-ISA kernel per node)."""
