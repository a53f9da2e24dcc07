# amaranth: UnusedElaboratable=no
"""The header builder's stages on their own: each is a component with named ports that
refuses a bad config, and the derive pipeline's lengths and IPv4 checksum are those of the
frame Scapy builds.

The builder as a whole is tested in ``test_builder.py``.
"""

import random

import pytest
from amaranth.lib import stream
from amaranth.lib.wiring import In, Out, Signature
from amaranth.sim import Simulator
from scapy.compat import raw
from scapy.layers.inet import IP, UDP

from hdl import protocol as P
from hdl.config import NicConfig
from hdl.packet.build_assemble import BuildAssemble
from hdl.packet.build_control import BuildControl, BuildNext
from hdl.packet.build_defs import DERIVE_CYCLES, Transport, layout_id
from hdl.packet.build_intake import BuildDerive, BuildIntake
from hdl.packet.build_output import BuildOutput
from hdl.packet.builder import HeaderBuilder
from hdl.packet.headers import net_beat_layout, packet_beat_layout
from tests.hdl.test_builder import as_packet, random_data

STAGES = (BuildIntake, BuildDerive, BuildNext, BuildControl, BuildAssemble, BuildOutput)


@pytest.mark.parametrize("stage", STAGES, ids=lambda stage: stage.__name__)
def test_every_stage_refuses_a_config_that_is_not_a_nic_config(stage):
    with pytest.raises(TypeError, match="Configuration must be a NicConfig, not 64"):
        stage(config=64)


def test_the_builder_top_keeps_its_ports():
    config = NicConfig(data_width=128)
    assert HeaderBuilder(config=config).signature == Signature({
        "i": In(stream.Signature(packet_beat_layout(config))),
        "o": Out(stream.Signature(net_beat_layout(128, tagged=True))),
        "length_errors": Out(32),
    })


def test_the_derive_pipeline_gives_scapys_lengths_and_ipv4_checksum():
    """A header held at the pipeline's input has, DERIVE_CYCLES later, the UDP length, IPv4
    total length and checksum of the IPv4 frame Scapy builds from the same fields."""
    config = NicConfig()
    rng = random.Random(7)
    dut = BuildDerive(config=config)
    pkts = [random_data(rng, config, ip_version=4) for _ in range(6)]

    async def bench(ctx):
        for pkt in pkts:
            header, _payload = as_packet(pkt, config)
            ctx.set(dut.hdr, header)
            transport = Transport.data(
                ts=header["bth"]["ts"],
                immediate=header["bth"]["opcode"] in P.IMMEDIATE_OPCODES)
            ctx.set(dut.lid, layout_id(vlan=header.get("vlan_valid", 0), srv6=0, ipv6=0,
                                       transport=transport))
            await ctx.tick().repeat(DERIVE_CYCLES)
            frame = IP(raw(pkt[IP]))
            assert ctx.get(dut.derived.ip4_total) == frame.len
            assert ctx.get(dut.derived.ip_checksum) == frame.chksum
            assert ctx.get(dut.derived.udp_len) == frame[UDP].len

    sim = Simulator(dut)
    sim.add_clock(8e-9)
    sim.add_testbench(bench)
    sim.run()
