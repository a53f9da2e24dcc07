"""PortArbiter / PortDemux: frames keep their port, whole and in order (Amaranth sim + cocotb)."""

import functools
import itertools
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


@pytest.mark.parametrize("ports", [1, 2, 5])
def test_arbiter_back_to_back_frames_round_robin_no_idle_cycle(ports):
    """Every port always has a frame waiting and the consumer is always ready: after the first
    beat the output moves a beat in every cycle, and frames come from the ports in turn.
    (Random bubbles and backpressure are covered by the loop tests; this one measures the
    arbiter's own throughput, so its inputs and output never stall.)"""
    dut = PortArbiter(data_width=64, ports=ports)
    lengths = [1, 3, 8, 2, 5]
    frames_per_port = 6
    log = []

    async def producer(ctx, port):
        for f in range(frames_per_port):
            length = lengths[(port + f) % len(lengths)]
            for n in range(length):
                ctx.set(dut.i[port].payload, {"data": port << 16 | f << 8 | n, "keep": 0xFF,
                                              "first": n == 0, "last": n == length - 1})
                ctx.set(dut.i[port].valid, 1)
                await ctx.tick().until(dut.i[port].ready)
        ctx.set(dut.i[port].valid, 0)

    async def consumer(ctx):
        ctx.set(dut.o.ready, 1)
        cycle = 0
        total = sum(lengths[(p + f) % len(lengths)]
                    for p in range(ports) for f in range(frames_per_port))
        while len(log) < total:
            _, _, valid, payload = await ctx.tick().sample(dut.o.valid, dut.o.payload)
            if valid:
                log.append((cycle, int(payload.port), int(payload.data), int(payload.last)))
            cycle += 1
            assert cycle < 10 * total

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    for port in range(ports):
        sim.add_testbench(functools.partial(producer, port=port))
    sim.add_testbench(consumer)
    sim.run()
    cycles = [c for c, *_ in log]
    # One-beat frames may cost an idle cycle (the round-robin moves on a cycle late); with
    # none the stream is gap-free.
    one_beat = sum(1 for *_, data, last in log if last and data & 0xFF == 0)
    assert cycles[-1] - cycles[0] + 1 <= len(log) + one_beat
    starts = [port for _c, port, data, _l in log if data & 0xFF == 0]
    if ports > 1:
        # In turn: no port starts two frames in a row while another waits, except after a
        # one-beat frame (at most twice), and every port's frames arrive whole and in order.
        runs = [len(list(group)) for _port, group in itertools.groupby(starts)]
        assert max(runs[:-1] or [1]) <= 2
    for port in range(ports):
        mine = [data for _c, p, data, _l in log if p == port]
        assert mine == [port << 16 | f << 8 | n for f in range(frames_per_port)
                        for n in range(lengths[(port + f) % len(lengths)])]


def test_bad_port_count():
    with pytest.raises(ValueError, match="Port count must be an integer from 1 to 16, not 0"):
        PortArbiter(data_width=64, ports=0)


@pytest.mark.parametrize("ports, width", [(4, 64), (2, 128)])
def test_port_loop_rtl(tmp_path, ports, width):
    run_cocotb(PortLoop(data_width=width, ports=ports), toplevel="port_loop",
               test_module="sim.tb.cocotb_ports", build_dir=tmp_path,
               extra_env={"PORTS": ports, "DATA_WIDTH": width})
