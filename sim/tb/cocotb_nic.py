"""cocotb tests of the NIC top (hdl/nic.py) on its exported Verilog: the end-to-end bench.

Environment: DATA_WIDTH, PORTS, SEED. Every source inserts random bubbles and every sink
applies random backpressure.

- ``receive_samples``: one frame of every type (sim.samples) into random ports; every
  accepted packet's parsed header and payload equal Scapy's decode; counters add up.
- ``loopback``: headers and payloads into ``tx_packets``; each frame leaving a TX port is
  byte-identical to what sim.packets builds, and is fed back into the RX port of the same
  plane, where it must come out of ``rx_packets`` as the header and payload that went in.
"""

import os
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge
from scapy.compat import raw

from hdl.config import NicConfig
from hdl.packet.headers import DropReason, net_beat_layout, packet_beat_layout, packet_header_layout
from hdl.protocol import DEFAULT_TRIM_DSCP
from sim.rtlpackets import header_from_scapy, payload_from_scapy
from sim.samples import sample_packets
from sim.tb.streams import StreamSink, StreamSource, beats_to_bytes, frame_to_beats, pack, unpack

CONFIG = NicConfig(data_width=int(os.environ.get("DATA_WIDTH", "64")),
                   ports=int(os.environ.get("PORTS", "4")))
SEED = int(os.environ.get("SEED", "1"))
W = CONFIG.data_width


class NicBench:
    """Clock, reset, one source per RX port and ``tx_packets``, one sink per TX port and
    ``rx_packets``."""

    def __init__(self, dut, *, idle=0.3, backpressure=0.3):
        self.dut = dut
        net, packet = net_beat_layout(W), packet_beat_layout(CONFIG)
        self.packet_layout = packet
        self.rx = [StreamSource(dut, f"rx__{p}", net, dut.clk, idle=idle, seed=SEED + p)
                   for p in range(CONFIG.ports)]
        self.tx = [StreamSink(dut, f"tx__{p}", net, dut.clk, backpressure=backpressure,
                              seed=SEED + 100 + p) for p in range(CONFIG.ports)]
        self.tx_packets = StreamSource(dut, "tx_packets", packet, dut.clk, idle=idle,
                                       seed=SEED + 200)
        self.rx_packets = StreamSink(dut, "rx_packets", packet, dut.clk,
                                     backpressure=backpressure, seed=SEED + 300)

    async def start(self):
        Clock(self.dut.clk, 8, unit="ns").start()
        self.dut.rst.value = 1
        self.dut.trim_dscp.value = DEFAULT_TRIM_DSCP   # a register in the NIC top
        await ClockCycles(self.dut.clk, 3)
        self.dut.rst.value = 0
        for driver in [*self.rx, *self.tx, self.tx_packets, self.rx_packets]:
            cocotb.start_soon(driver.run())

    async def until(self, condition, *, cycles=200_000, what="condition"):
        for _ in range(cycles):
            if condition():
                return
            await RisingEdge(self.dut.clk)
        raise AssertionError(f"timed out after {cycles} cycles waiting for {what}")

    def received(self):
        """(header, payload) of every packet out of rx_packets so far."""
        return [(p[0]["header"], beats_to_bytes(p, W)) for p in self.rx_packets.packets()]


def packet_beats(header, payload):
    return frame_to_beats(payload, W, header=header)


def expected_header(pkt, port):
    header = header_from_scapy(pkt, CONFIG, port=port)
    if header["trimmed"]:
        header["payload_len"] = 0            # a trimmed packet's payload is not delivered
    return header


def assert_header(got, want, what):
    """Every field of the parsed header equals the expected one (missing fields are 0)."""
    layout = packet_header_layout(CONFIG)
    full = unpack(layout, pack(layout, want))
    for name, value in full.items():
        assert got[name] == value, f"{what}: header.{name} is {got[name]!r}, expected {value!r}"


@cocotb.test()
async def receive_samples(dut):
    bench = NicBench(dut)
    await bench.start()
    rng = random.Random(SEED)
    sent = {p: [] for p in range(CONFIG.ports)}
    for sample in sample_packets():
        port = rng.randrange(CONFIG.ports)
        sent[port].append(sample)
        bench.rx[port].send(frame_to_beats(raw(sample.packet), W))
    total = sum(len(s) for s in sent.values())
    await bench.until(lambda: bench.rx_packets.packet_count == total, what="every sample")
    got = {p: [] for p in range(CONFIG.ports)}
    for header, payload in bench.received():
        got[header["port"]].append((header, payload))
    for port in range(CONFIG.ports):
        assert len(got[port]) == len(sent[port]), f"port {port}"
        for (header, payload), sample in zip(got[port], sent[port], strict=True):
            want = expected_header(sample.packet, port)
            assert_header(header, want, sample.name)
            expect_payload = b"" if want["trimmed"] else payload_from_scapy(sample.packet)
            assert payload == expect_payload, sample.name
    counters = [int(dut.rx_counters.value.to_unsigned() >> (32 * r) & 0xFFFFFFFF)
                for r in range(len(DropReason))]
    assert counters[0] == total and sum(counters[1:]) == 0, counters


@cocotb.test()
async def loopback(dut):
    bench = NicBench(dut)
    await bench.start()
    rng = random.Random(SEED + 1)
    samples = [s for s in sample_packets() if s.name != "trimmed"]
    sent = []
    for sample in samples:
        port = rng.randrange(CONFIG.ports)
        header = header_from_scapy(sample.packet, CONFIG, port=port)
        payload = payload_from_scapy(sample.packet)
        sent.append((port, sample, header, payload))
        bench.tx_packets.send(packet_beats(header, payload))

    # Close the loop: each frame leaving TX port p re-enters on RX port p.
    looped = [0] * CONFIG.ports

    async def loop():
        while True:
            await RisingEdge(dut.clk)
            for port in range(CONFIG.ports):
                if looped[port] == bench.tx[port].packet_count:
                    continue
                frames = bench.tx[port].packets()
                while looped[port] < len(frames):
                    frame = beats_to_bytes(frames[looped[port]], W)
                    bench.rx[port].send(frame_to_beats(frame, W))
                    looped[port] += 1

    cocotb.start_soon(loop())
    await bench.until(lambda: bench.rx_packets.packet_count == len(sent), what="loopback")

    for port in range(CONFIG.ports):
        frames = [beats_to_bytes(f, W) for f in bench.tx[port].packets()]
        want = [raw(s.packet) for p, s, _, _ in sent if p == port]
        assert frames == want, f"TX port {port}: frames differ from sim.packets"
    got = {p: [] for p in range(CONFIG.ports)}
    for header, payload in bench.received():
        got[header["port"]].append((header, payload))
    for port in range(CONFIG.ports):
        mine = [(s, h, pl) for p, s, h, pl in sent if p == port]
        assert len(got[port]) == len(mine)
        for (header, payload), (sample, want, want_payload) in zip(got[port], mine, strict=True):
            assert_header(header, want, sample.name)
            assert payload == want_payload, sample.name
    assert int(dut.tx_length_errors.value.to_unsigned()) == 0
