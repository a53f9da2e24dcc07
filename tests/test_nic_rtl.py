"""End-to-end: the NIC top's exported Verilog under cocotb (Icarus, or SIM=verilator).

The one test that stays green from the first RTL issue on: sample frames of every type in
through the RX ports, and headers out through the TX ports and back in (sim/tb/cocotb_nic.py).
"""

import pytest

from hdl.config import NicConfig
from hdl.nic import MrcNic
from sim.tb.runner import run_cocotb


@pytest.mark.parametrize("data_width, ports", [(64, 4), (128, 2)])
def test_nic_end_to_end(tmp_path, data_width, ports):
    config = NicConfig(data_width=data_width, ports=ports)
    run_cocotb(MrcNic(config), toplevel="mrc_nic", test_module="sim.tb.cocotb_nic",
               build_dir=tmp_path, extra_env={"DATA_WIDTH": data_width, "PORTS": ports})
