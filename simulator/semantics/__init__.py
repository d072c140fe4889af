"""Numerics of every instruction as pure numpy functions, one module per unit family.

These are the machine's definition of "what the numbers are": the simulator's dispatch calls them, the
fusion engine's reference checks and the RTL co-simulation compare against them.
"""
