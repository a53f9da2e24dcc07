"""End-to-end: two NIC tops (hdl/nic.py) under cocotb on their exported Verilog, moving RDMA
WRITE and WRITE WITH IMMEDIATE traffic both ways through a reordering, duplicating network
(sim/tb/cocotb_loopback.py). The one test that stays green from the first RTL issue on.

Verilator when available (it is installed by ``make setup``): Icarus takes hours on two NICs.
"""

from hdl.config import NicConfig
from sim.tb.pair import NicPair
from sim.tb.runner import run_cocotb


def test_two_nics_loopback(tmp_path):
    config = NicConfig(ports=4, qps=16)
    run_cocotb(NicPair(config), toplevel="nic_pair", test_module="sim.tb.cocotb_loopback",
               build_dir=tmp_path, sim="verilator",
               extra_env={"DATA_WIDTH": 64, "PORTS": 4, "QPS_BUILD": 16, "QPS": 3,
                          "MESSAGES": 12, "SEED": 1, "PCAP": tmp_path / "traffic.pcap"})
