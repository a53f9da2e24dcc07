"""Pure-Python reference models of the NIC's blocks: scoreboards for the RTL tests and fast
model endpoints for the network simulations."""
