# amaranth: UnusedElaboratable=no
"""RegisterSlice: order, full throughput, and no combinational path through it."""

import random

import pytest
from amaranth.hdl import unsigned
from amaranth.lib import data
from amaranth.sim import Simulator

from hdl.packet.headers import net_beat_layout
from hdl.packet.slice import RegisterSlice
from sim.tb.amsim import StreamCollector, StreamDriver, const_to_dict

BEAT = net_beat_layout(64, tagged=True)


def _beats(count, seed):
    rng = random.Random(seed)
    return [{"data": rng.getrandbits(64), "keep": rng.getrandbits(8), "first": rng.getrandbits(1),
             "last": rng.getrandbits(1), "port": rng.randrange(16)} for _ in range(count)]


def _run(dut, payloads, *, bubbles, backpressure, seed=0):
    source = StreamDriver(dut.i, bubbles=bubbles, seed=seed)
    sink = StreamCollector(dut.o, backpressure=backpressure, seed=seed + 1)
    source.send(payloads)

    async def check(ctx):
        await sink.wait(ctx, len(payloads), timeout=20 * len(payloads) + 100)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_process(source.process)
    sim.add_process(sink.process)
    sim.add_testbench(check)
    sim.run()
    return sink


@pytest.mark.parametrize("bubbles,backpressure", [(0.3, 0.3), (0.0, 0.5), (0.5, 0.0), (0.1, 0.8)])
def test_order_with_bubbles_and_backpressure(bubbles, backpressure):
    dut = RegisterSlice(shape=BEAT)
    payloads = _beats(400, seed=int(bubbles * 10 + backpressure * 100))
    sink = _run(dut, payloads, bubbles=bubbles, backpressure=backpressure, seed=7)
    assert sink.as_dicts() == payloads


def test_full_throughput_and_latency():
    """0/0: one beat per cycle, the first offered one cycle after it was taken."""
    dut = RegisterSlice(shape=unsigned(16))
    count = 200
    accepted, delivered = [], []

    async def bench(ctx):
        for n in range(count):
            ctx.set(dut.i.valid, 1)
            ctx.set(dut.i.payload, n)
            ctx.set(dut.o.ready, 1)
            _, _, i_ready, o_valid, o_payload = await ctx.tick().sample(
                dut.i.ready, dut.o.valid, dut.o.payload)
            assert i_ready, f"slice stalled an always-ready stream at beat {n}"
            accepted.append(n)
            if o_valid:
                delivered.append(o_payload)
        ctx.set(dut.i.valid, 0)
        for _ in range(3):
            _, _, o_valid, o_payload = await ctx.tick().sample(dut.o.valid, dut.o.payload)
            if o_valid:
                delivered.append(o_payload)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    # Sampled at the tick that takes beat n, the output still shows beat n - 1.
    assert delivered == list(range(count))


def test_stall_fills_skid_then_drops_ready():
    """A beat taken while the output stalls is kept, and ready falls until it has moved."""
    dut = RegisterSlice(shape=unsigned(8))
    trace = []

    async def bench(ctx):
        ctx.set(dut.o.ready, 0)
        ctx.set(dut.i.valid, 1)
        for value in (1, 2, 3):
            ctx.set(dut.i.payload, value)
            _, _, i_ready, o_valid, o_payload = await ctx.tick().sample(
                dut.i.ready, dut.o.valid, dut.o.payload)
            trace.append((i_ready, o_valid, o_payload))
            if not i_ready:
                break
        ctx.set(dut.i.valid, 0)
        ctx.set(dut.o.ready, 1)
        out = []
        for _ in range(4):
            _, _, o_valid, o_payload = await ctx.tick().sample(dut.o.valid, dut.o.payload)
            if o_valid:
                out.append(o_payload)
        trace.append(out)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    # Beat 1 into the output register, beat 2 into the skid, then ready is low for beat 3.
    assert [t[0] for t in trace[:3]] == [1, 1, 0]
    assert trace[-1] == [1, 2]


def test_no_combinational_path():
    """o.valid/o.payload do not follow i in the same cycle; i.ready does not follow o.ready."""
    dut = RegisterSlice(shape=unsigned(8))

    async def bench(ctx):
        ctx.set(dut.i.valid, 1)
        ctx.set(dut.i.payload, 0x5A)
        assert ctx.get(dut.o.valid) == 0
        ctx.set(dut.o.ready, 0)
        await ctx.tick()
        await ctx.tick()            # output holds 0x5A, skid holds 0x5A again
        assert ctx.get(dut.i.ready) == 0
        ctx.set(dut.o.ready, 1)
        assert ctx.get(dut.i.ready) == 0
        ctx.set(dut.i.payload, 0x33)
        assert ctx.get(dut.o.payload) == 0x5A

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


def test_struct_shape_kept():
    layout = data.StructLayout({"a": 3, "b": unsigned(5)})
    dut = RegisterSlice(shape=layout)
    assert dut.shape is layout
    payloads = [{"a": n % 8, "b": n % 32} for n in range(50)]
    sink = _run(dut, payloads, bubbles=0.3, backpressure=0.3, seed=3)
    assert [const_to_dict(x) for x in sink.items] == payloads


def test_bad_shape():
    with pytest.raises(TypeError, match="shape must be a shape-castable object, not 'x'"):
        RegisterSlice(shape="x")
