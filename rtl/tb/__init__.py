"""cocotb test modules (run inside the simulator process, started by `rtl.build`)."""
