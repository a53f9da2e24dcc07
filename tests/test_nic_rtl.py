"""End-to-end: two NIC tops (hdl/nic.py) under cocotb on their exported Verilog, moving RDMA
WRITE and WRITE WITH IMMEDIATE traffic both ways through a reordering, duplicating network
(sim/tb/cocotb_loopback.py). The one test that stays green from the first RTL issue on.

Verilator (installed by ``make setup``): Icarus takes hours on two NICs. The configuration is
reduced (8 QPs, 16 EVs, a 128-PSN window) so the two NICs compile in minutes on two cores;
every block is still in, at the default data width and with 4 planes.
"""

import json

from sim.tb.pair import SMALL_CONFIG as TEST_CONFIG
from sim.tb.pair import NicPair
from sim.tb.runner import run_cocotb


def test_two_nics_loopback(tmp_path):
    run_cocotb(NicPair(TEST_CONFIG), toplevel="nic_pair", test_module="sim.tb.cocotb_loopback",
               build_dir=tmp_path, sim="verilator", quick_build=True,
               extra_env={"NIC_CONFIG": json.dumps(TEST_CONFIG.to_dict()), "QPS": 3,
                          "MESSAGES": 16, "SEED": 1, "DUPLICATE": 0.1,
                          "PCAP": tmp_path / "traffic.pcap"})
