"""PortArbiter / PortDemux: frames keep their port, whole and in order (Amaranth sim + cocotb)."""

import functools
import random

import pytest
from amaranth import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from hdl.packet.headers import net_beat_layout
from hdl.packet.ports import PortArbiter, PortDemux
from sim.tb.runner import run_cocotb


class PortLoop(wiring.Component):
    """Arbiter into demux: what a frame on port p must come out of."""

    def __init__(self, *, data_width, ports):
        self._args = dict(data_width=data_width, ports=ports)
        beat = stream.Signature(net_beat_layout(data_width))
        super().__init__({"i": In(beat).array(ports), "o": Out(beat).array(ports)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.arbiter = arbiter = PortArbiter(**self._args)
        m.submodules.demux = demux = PortDemux(**self._args)
        wiring.connect(m, arbiter.o, demux.i)
        for p in range(self._args["ports"]):
            wiring.connect(m, wiring.flipped(self.i[p]), arbiter.i[p])
            wiring.connect(m, demux.o[p], wiring.flipped(self.o[p]))
        return m


@pytest.mark.parametrize("ports", [1, 3])
def test_port_loop_amaranth(ports):
    dut = PortLoop(data_width=64, ports=ports)
    rng = random.Random(ports)
    frames = [(rng.randrange(ports), [rng.getrandbits(64) for _ in range(rng.randrange(1, 6))])
              for _ in range(30)]

    async def producer(ctx, port):
        for p, beats in frames:
            if p != port:
                continue
            for n, value in enumerate(beats):
                while rng.random() < 0.3:
                    await ctx.tick()
                ctx.set(dut.i[port].payload, {"data": value, "keep": 0xFF, "first": n == 0,
                                              "last": n == len(beats) - 1})
                ctx.set(dut.i[port].valid, 1)
                await ctx.tick().until(dut.i[port].ready)
                ctx.set(dut.i[port].valid, 0)

    async def consumer(ctx, port):
        want = [beats for p, beats in frames if p == port]
        got, current = [], []
        while len(got) < len(want):
            ctx.set(dut.o[port].ready, rng.random() > 0.3)
            _, _, valid, ready, payload = await ctx.tick().sample(
                dut.o[port].valid, dut.o[port].ready, dut.o[port].payload)
            if valid and ready:
                current.append(payload.data)
                if payload.last:
                    got.append(current)
                    current = []
        assert got == want

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    for port in range(ports):
        sim.add_testbench(functools.partial(producer, port=port))
        sim.add_testbench(functools.partial(consumer, port=port))
    sim.run()


def test_bad_port_count():
    with pytest.raises(ValueError, match="Port count must be an integer from 1 to 16, not 0"):
        PortArbiter(data_width=64, ports=0)


@pytest.mark.parametrize("ports, width", [(4, 64), (2, 128)])
def test_port_loop_rtl(tmp_path, ports, width):
    run_cocotb(PortLoop(data_width=width, ports=ports), toplevel="port_loop",
               test_module="sim.tb.cocotb_ports", build_dir=tmp_path,
               extra_env={"PORTS": ports, "DATA_WIDTH": width})
