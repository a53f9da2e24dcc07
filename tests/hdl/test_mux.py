"""Packet arbiter, packet demux and stream merge: packets stay whole, nothing lost or duplicated,
with bubbles and backpressure."""

import random

import pytest
from amaranth import *
from amaranth.hdl import unsigned
from amaranth.lib import data
from amaranth.sim import Simulator

from hdl.packet.mux import PacketArbiter, PacketDemux, StreamMerge
from sim.tb.amsim import StreamCollector, StreamDriver

BEAT = data.StructLayout({"source": unsigned(4), "packet": unsigned(8), "index": unsigned(8),
                          "last": unsigned(1)})


def packets_for(source, rng, count):
    out = []
    for packet in range(count):
        length = rng.randint(1, 5)
        out.append([{"source": source, "packet": packet, "index": i, "last": int(i == length - 1)}
                    for i in range(length)])
    return out


@pytest.mark.parametrize("bubbles, backpressure", [(0.0, 0.0), (0.3, 0.3)])
def test_arbiter_keeps_packets_whole_and_loses_nothing(bubbles, backpressure):
    rng = random.Random(1)
    dut = PacketArbiter(layout=BEAT, count=3)
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sent = {s: packets_for(s, rng, 20) for s in range(3)}
    for s in range(3):
        driver = StreamDriver(dut.i[s], bubbles=bubbles, seed=s)
        driver.send([beat for packet in sent[s] for beat in packet])
        sim.add_process(driver.process)
    sink = StreamCollector(dut.o, backpressure=backpressure, seed=9)
    sim.add_process(sink.process)
    total = sum(len(p) for s in sent for p in sent[s])

    async def bench(ctx):
        await sink.wait(ctx, total)
    sim.add_testbench(bench)
    sim.run()
    beats = sink.as_dicts()
    received = {s: [] for s in range(3)}
    current = None
    for beat in beats:
        if current is None:
            current = beat["source"]
            received[current].append([])
        assert beat["source"] == current, "packets interleaved"
        received[current][-1].append(beat)
        if beat["last"]:
            current = None
    assert received == sent


@pytest.mark.parametrize("bubbles, backpressure", [(0.0, 0.0), (0.3, 0.3)])
def test_demux_steers_by_select_and_counts_unknown(bubbles, backpressure):
    rng = random.Random(2)
    dut = PacketDemux(layout=BEAT, count=2)
    m = Module()
    m.submodules.dut = dut
    m.d.comb += dut.select.eq(dut.i.payload.source)     # source 2 is out of range: dropped
    sim = Simulator(m)
    sim.add_clock(1e-8)
    packets = [p for s in range(3) for p in packets_for(s, rng, 10)]
    rng.shuffle(packets)
    driver = StreamDriver(dut.i, bubbles=bubbles, seed=3)
    driver.send([beat for packet in packets for beat in packet])
    sinks = [StreamCollector(dut.o[k], backpressure=backpressure, seed=k) for k in range(2)]
    for process in (driver.process, *(s.process for s in sinks)):
        sim.add_process(process)

    async def bench(ctx):
        for k in range(2):
            await sinks[k].wait(ctx, sum(len(p) for p in packets if p[0]["source"] == k))
        while not driver.idle:
            await ctx.tick()
        await ctx.tick()
        assert ctx.get(dut.dropped) == sum(1 for p in packets if p[0]["source"] == 2)
    sim.add_testbench(bench)
    sim.run()
    for k in range(2):
        assert sinks[k].as_dicts() == [b for p in packets if p[0]["source"] == k for b in p]


@pytest.mark.parametrize("bubbles, backpressure", [(0.0, 0.0), (0.4, 0.4)])
def test_merge_delivers_every_transfer_once_in_per_input_order(bubbles, backpressure):
    dut = StreamMerge(layout=BEAT, count=3)
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    for s in range(3):
        driver = StreamDriver(dut.i[s], bubbles=bubbles, seed=s)
        driver.send([{"source": s, "packet": k, "index": 0, "last": 1} for k in range(30)])
        sim.add_process(driver.process)
    sink = StreamCollector(dut.o, backpressure=backpressure, seed=7)
    sim.add_process(sink.process)

    async def bench(ctx):
        await sink.wait(ctx, 90)
        for _ in range(10):
            await ctx.tick()
        assert len(sink.items) == 90
    sim.add_testbench(bench)
    sim.run()
    got = sink.as_dicts()
    for s in range(3):
        assert [b["packet"] for b in got if b["source"] == s] == list(range(30))
