"""cocotb testbench building blocks: stream drivers and monitors, and the runner."""
