"""The packet engine's exported Verilog under cocotb (Icarus, or SIM=verilator): sample frames
of every type in through the RX ports, and headers out through the TX ports and back in
(sim/tb/cocotb_nic.py)."""

import pytest

from hdl.config import NicConfig
from hdl.packet.engine import PacketEngine
from sim.tb.runner import run_cocotb


@pytest.mark.parametrize("data_width, ports", [(64, 4), (128, 2)])
def test_packet_engine_end_to_end(tmp_path, data_width, ports):
    config = NicConfig(data_width=data_width, ports=ports)
    run_cocotb(PacketEngine(config), toplevel="packet_engine", test_module="sim.tb.cocotb_nic",
               build_dir=tmp_path, extra_env={"DATA_WIDTH": data_width, "PORTS": ports})
