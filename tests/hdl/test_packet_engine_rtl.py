"""The packet engine's exported Verilog under cocotb (Icarus, or SIM=verilator): sample frames
of every type in through the RX ports, and headers out through the TX ports and back in
(sim/tb/cocotb_nic.py)."""

import pytest

from hdl.config import NicConfig
from hdl.packet.engine import PacketEngine
from sim.env import BUILD
from sim.tb.runner import run_cocotb, simulator, source_key


@pytest.mark.parametrize("data_width, ports", [(64, 4), (128, 2)])
def test_packet_engine_end_to_end(data_width, ports):
    config = NicConfig(data_width=data_width, ports=ports)
    # Kept in build/ (ignored by git): exported and built again only when the gateware or the
    # configuration changed (sim.tb.runner.source_key).
    sim = simulator()
    run_cocotb(lambda: PacketEngine(config), toplevel="packet_engine",
               test_module="sim.tb.cocotb_nic",
               build_dir=BUILD / "tests" / f"packet_engine-{sim}-w{data_width}-p{ports}",
               sim=sim, reuse=True, export_key=source_key("packet_engine", config.to_dict()),
               extra_env={"DATA_WIDTH": data_width, "PORTS": ports})
