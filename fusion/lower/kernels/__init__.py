"""Kernel generators, one module per operator family; each turns one graph node into pipeline phases."""
