"""cocotb test: frames from P ports through PortArbiter and back out of PortDemux.

Run by tests/hdl/test_ports.py on a top that wires the arbiter's output into the demux; every
frame must leave on the port it entered, whole and unchanged, under random bubbles on every
input and random backpressure on every output.
"""

import os
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge

from hdl.packet.headers import net_beat_layout
from sim.tb.streams import StreamSink, StreamSource, beats_to_bytes, frame_to_beats

PORTS = int(os.environ["PORTS"])
WIDTH = int(os.environ["DATA_WIDTH"])
FRAMES = int(os.environ.get("FRAMES", "40"))


@cocotb.test()
async def frames_keep_their_port(dut):
    Clock(dut.clk, 10, unit="ns").start()
    dut.rst.value = 1
    layout = net_beat_layout(WIDTH)
    sources = [StreamSource(dut, f"i__{p}", layout, dut.clk, idle=0.3, seed=p)
               for p in range(PORTS)]
    sinks = [StreamSink(dut, f"o__{p}", layout, dut.clk, backpressure=0.3, seed=100 + p)
             for p in range(PORTS)]
    await ClockCycles(dut.clk, 2)
    dut.rst.value = 0
    for driver in sources + sinks:
        cocotb.start_soon(driver.run())

    rng = random.Random(7)
    expected = [[] for _ in range(PORTS)]
    for _ in range(FRAMES):
        port = rng.randrange(PORTS)
        frame = bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 200)))
        expected[port].append(frame)
        sources[port].send(frame_to_beats(frame, WIDTH))

    for _ in range(20000):
        await RisingEdge(dut.clk)
        if all(s.packet_count == len(e) for s, e in zip(sinks, expected, strict=True)):
            break
    for port in range(PORTS):
        got = [beats_to_bytes(p, WIDTH) for p in sinks[port].packets()]
        assert got == expected[port], f"port {port}"
        assert all(p[0]["first"] for p in sinks[port].packets())
