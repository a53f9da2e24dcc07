"""cocotb module behind ``mrc-nic replay``: frames of a capture through the NIC's receive path.

Reads ``REPLAY_IN`` (JSON: config dict and frames as hex with their port), feeds the frames
back to back into the RX ports, records the parser's verdict strobe for every frame and the
packets that come out of ``rx_packets``, and writes ``REPLAY_OUT`` (JSON).
"""

import json
import os
import time

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge

from hdl.config import NicConfig
from hdl.packet.headers import DropReason, net_beat_layout, packet_beat_layout
from sim.tb.streams import StreamSink, StreamSource, beats_to_bytes, frame_to_beats


@cocotb.test()
async def replay(dut):
    job = json.loads(open(os.environ["REPLAY_IN"]).read())
    config = NicConfig.from_dict(job["config"])
    width = config.data_width
    Clock(dut.clk, 8, unit="ns").start()
    dut.rst.value = 1
    dut.trim_dscp.value = config.trim_dscp   # a register in the NIC top
    sources = [StreamSource(dut, f"rx__{p}", net_beat_layout(width), dut.clk)
               for p in range(config.ports)]
    sink = StreamSink(dut, "rx_packets", packet_beat_layout(config), dut.clk)
    await ClockCycles(dut.clk, 3)
    dut.rst.value = 0
    for driver in [*sources, sink]:
        cocotb.start_soon(driver.run())

    verdicts = []
    cycles = [0]

    async def watch():
        while True:
            await RisingEdge(dut.clk)
            cycles[0] += 1
            if int(dut.rx_verdict_valid.value):
                verdicts.append(DropReason(int(dut.rx_verdict_reason.value.to_unsigned())))

    cocotb.start_soon(watch())
    started = time.monotonic()
    # One frame at a time keeps verdicts in capture order whatever the ports.
    for number, frame in enumerate(job["frames"]):
        sources[frame["port"]].send(frame_to_beats(bytes.fromhex(frame["hex"]), width))
        for _ in range(100_000):
            await RisingEdge(dut.clk)
            if len(verdicts) > number:
                break
        else:
            raise AssertionError(f"frame {number + 1}: no verdict after 100000 cycles")
    await ClockCycles(dut.clk, 200)         # let the last accepted packet drain

    packets = []
    for beats in sink.packets():
        header = beats[0]["header"]
        packets.append({"port": header["port"], "opcode": header["bth"]["opcode"],
                        "dqpn": header["bth"]["dqpn"], "psn": header["bth"]["psn"],
                        "trimmed": header["trimmed"], "payload_len": header["payload_len"],
                        "payload_ok": len(beats_to_bytes(beats, width)) == header["payload_len"]})
    counters = dut.rx_counters.value.to_unsigned()
    with open(os.environ["REPLAY_OUT"], "w") as f:
        json.dump({
            "verdicts": [v.name.lower() for v in verdicts],
            "cycles": cycles[0],
            "wall_seconds": time.monotonic() - started,
            "packets": packets,
            "counters": {r.name.lower(): (counters >> (32 * r.value)) & 0xFFFFFFFF
                         for r in DropReason},
        }, f)
