"""cocotb module behind ``mrc-nic bench``: beat utilization of the parser and the builder.

Back-to-back packets with no bubbles and no backpressure, through the NIC top: frames into RX
port 0 (parser) and headers into ``tx_packets`` (builder, frames out of TX port 0). Reports
beats moved / cycles spanned on the parser's input and the builder's output, and simulated
cycles per wall-clock second. Writes ``BENCH_OUT`` (JSON). Measures; asserts nothing about speed.
"""

import json
import os
import time

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge
from scapy.compat import raw

from hdl import protocol as P
from hdl.config import NicConfig
from hdl.packet.headers import net_beat_layout, packet_beat_layout
from hdl.protocol import DEFAULT_TRIM_DSCP
from sim import packets as pk
from sim.rtlpackets import header_from_scapy, payload_from_scapy
from sim.tb.cocotb_nic import packet_beats
from sim.tb.streams import StreamSink, StreamSource, frame_to_beats

CONFIG = NicConfig(data_width=int(os.environ["DATA_WIDTH"]), ports=1)
PAYLOAD = int(os.environ["PAYLOAD"])
COUNT = int(os.environ.get("COUNT", "40"))


class Meter:
    """Counts handshakes on one stream port, and the cycles from the first to the last."""

    def __init__(self, dut, prefix):
        self.valid = getattr(dut, f"{prefix}__valid")
        self.ready = getattr(dut, f"{prefix}__ready")
        self.beats = 0
        self.first = self.last = None
        self.cycle = 0

    def sample(self):
        self.cycle += 1
        if int(self.valid.value) and int(self.ready.value):
            self.beats += 1
            self.first = self.cycle if self.first is None else self.first
            self.last = self.cycle

    @property
    def utilization(self):
        return self.beats / (self.last - self.first + 1) if self.beats else 0.0


async def measure(dut, source, frames, meter, sink, expected_packets):
    for frame in frames:
        source.send(frame)
    started, cycles = time.monotonic(), 0
    while sink.packet_count < expected_packets:
        await RisingEdge(dut.clk)
        meter.sample()
        cycles += 1
        if cycles > 200_000:
            raise AssertionError("bench did not finish")
    return cycles, time.monotonic() - started


@cocotb.test()
async def bench(dut):
    Clock(dut.clk, 8, unit="ns").start()
    dut.rst.value = 1
    dut.trim_dscp.value = DEFAULT_TRIM_DSCP   # a register in the NIC top
    width = CONFIG.data_width
    rx = StreamSource(dut, "rx__0", net_beat_layout(width), dut.clk)
    rx_packets = StreamSink(dut, "rx_packets", packet_beat_layout(CONFIG), dut.clk)
    tx_packets = StreamSource(dut, "tx_packets", packet_beat_layout(CONFIG), dut.clk)
    tx = StreamSink(dut, "tx__0", net_beat_layout(width), dut.clk)
    await ClockCycles(dut.clk, 3)
    dut.rst.value = 0
    for driver in (rx, rx_packets, tx_packets, tx):
        cocotb.start_soon(driver.run())

    packets = [pk.data_packet(P.Opcode.RDMA_WRITE_MIDDLE, dqpn=0x22, psn=n, va=n * PAYLOAD,
                              rkey=0xBEEF, payload=bytes((n + i) & 0xFF for i in range(PAYLOAD)))
               for n in range(COUNT)]
    parser_meter = Meter(dut, "rx__0")
    frames = [frame_to_beats(raw(p), width) for p in packets]
    parser_cycles, parser_wall = await measure(dut, rx, frames, parser_meter, rx_packets,
                                               COUNT)

    builder_meter = Meter(dut, "tx__0")
    beats = [packet_beats(header_from_scapy(p, CONFIG), payload_from_scapy(p))
             for p in packets]
    builder_cycles, builder_wall = await measure(dut, tx_packets, beats, builder_meter, tx,
                                                 COUNT)
    frame_bytes = len(raw(packets[0]))
    with open(os.environ["BENCH_OUT"], "w") as f:
        json.dump({
            "data_width": width, "payload_bytes": PAYLOAD, "frame_bytes": frame_bytes,
            "packets": COUNT,
            "parser": {"beats": parser_meter.beats, "utilization": parser_meter.utilization},
            "builder": {"beats": builder_meter.beats,
                        "utilization": builder_meter.utilization},
            "cycles": parser_cycles + builder_cycles,
            "cycles_per_second": (parser_cycles + builder_cycles) / (parser_wall + builder_wall),
        }, f)
