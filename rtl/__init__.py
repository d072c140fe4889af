"""RTL of the matrix, vector, epilogue and stream units, and the cocotb harness replaying the simulator on them.

See docs/cosim.md.
"""
