"""sim/tb/verilated.py: the same Amaranth bench on Amaranth's Python simulator and on the
Verilator model gives the same values in every cycle.

The design has what the benches of the suite touch: comb outputs of inputs, registers from the
first clock edge on, a struct port, a signed port, a port wider than 64 bits, and a stream
through a FIFO with random bubbles and backpressure; the bench samples at clock edges, reads
after them, and writes from processes and testbenches.
"""

import random

import pytest
from amaranth import Module, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator as PySimulator

from sim.tb.amsim import StreamCollector, StreamDriver, const_to_dict
from sim.tb.verilated import Simulator as VerilatedSimulator

PAIR = data.StructLayout({"low": 5, "high": 11})


class Sample(wiring.Component):
    a: In(8)
    b: In(8)
    en: In(1)
    pair: In(PAIR)
    delta: In(signed(6))
    wide: In(100)
    total: Out(9)
    acc: Out(16)
    swapped: Out(PAIR)
    level: Out(signed(12))
    wide_q: Out(100)
    cycles: Out(32)
    i: In(stream.Signature(16))
    o: Out(stream.Signature(16))

    def elaborate(self, platform):
        m = Module()
        m.submodules.fifo = fifo = SyncFIFOBuffered(width=16, depth=4)
        m.d.comb += [
            self.total.eq(self.a + self.b),
            fifo.w_data.eq(self.i.payload ^ self.acc), fifo.w_en.eq(self.i.valid),
            self.i.ready.eq(fifo.w_rdy),
            self.o.payload.eq(fifo.r_data), self.o.valid.eq(fifo.r_rdy),
            fifo.r_en.eq(self.o.ready),
        ]
        m.d.sync += [
            self.cycles.eq(self.cycles + 1),
            self.swapped.low.eq(self.pair.high[:5]),
            self.swapped.high.eq(self.pair.low),
            self.level.eq(self.level + self.delta),
            self.wide_q.eq(self.wide.rotate_left(3) ^ self.cycles),
        ]
        with m.If(self.en):
            m.d.sync += self.acc.eq(self.acc + self.a)
        return m


def trace(simulator, seed):
    """Run the bench on ``simulator``; return everything it saw, cycle by cycle."""
    dut = Sample()
    rng = random.Random(seed)
    seen = []
    source = StreamDriver(dut.i, bubbles=0.3, seed=seed + 1)
    sink = StreamCollector(dut.o, backpressure=0.4, seed=seed + 2)
    source.send([rng.getrandbits(16) for _ in range(60)])

    async def inputs(ctx):                      # a process: sets, never reads
        while True:
            ctx.set(dut.b, rng.getrandbits(8))
            ctx.set(dut.delta, rng.randrange(-32, 32))
            ctx.set(dut.pair, {"low": rng.getrandbits(5), "high": rng.getrandbits(11)})
            await ctx.tick()

    async def bench(ctx):
        # Sampled before the first edge, and read after it: the first edge counts.
        ctx.set(dut.en, 1)
        ctx.set(dut.a, 3)
        _, _, acc, cycles = await ctx.tick().sample(dut.acc, dut.cycles)
        seen.append(("first", acc, cycles, ctx.get(dut.acc), ctx.get(dut.cycles)))
        for n in range(150):
            ctx.set(dut.a, rng.getrandbits(8))
            ctx.set(dut.en, rng.random() < 0.5)
            ctx.set(dut.wide, rng.getrandbits(100))
            seen.append(("comb", ctx.get(dut.total)))          # a testbench's set settles
            if n % 7 == 0:
                ctx.set(dut.wide[90:], 0x3FF)                  # a slice of a port
            clk, rst, *values = await ctx.tick().sample(dut.acc, dut.swapped, dut.level,
                                                        dut.wide_q, dut.i.ready)
            seen.append(("edge", clk, rst, values[0], const_to_dict(values[1]), *values[2:]))
            seen.append(("after", ctx.get(dut.acc), ctx.get(dut.swapped.high),
                         ctx.get(dut.level), ctx.get(dut.wide_q), ctx.get(dut.o.payload)))
        values = await ctx.tick().sample(dut.acc, dut.o.payload).until(dut.cycles[3])
        seen.append(("until", values))
        seen.append(("repeat", await ctx.tick().sample(dut.cycles).repeat(3)))
        await sink.wait(ctx, 60)
        seen.append(("stream", sink.items))

    async def counter(ctx):                     # async for, in a background testbench
        async for _, _, cycles in ctx.tick().sample(dut.cycles):
            seen.append(("count", cycles))

    sim = simulator(dut)
    sim.add_clock(1e-8)
    sim.add_process(inputs)
    sim.add_process(source.process)
    sim.add_process(sink.process)
    sim.add_testbench(counter, background=True)
    sim.add_testbench(bench)
    sim.run()
    return seen


@pytest.mark.parametrize("seed", [1, 2])
def test_the_verilator_model_sees_what_the_python_simulator_sees(seed):
    want = trace(PySimulator, seed)
    got = trace(VerilatedSimulator, seed)
    assert ("first", 0, 0, 3, 1) in want
    assert len(got) == len(want)
    for n, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g == w, f"entry {n}: Verilator {g}, Python simulator {w}"


def test_only_ports_can_be_touched_and_processes_cannot_read():
    dut = Sample()
    inner = Signal(4)
    errors = []

    async def process(ctx):
        try:
            ctx.get(dut.acc)
        except TypeError as e:
            errors.append(str(e))
        await ctx.tick()

    async def bench(ctx):
        with pytest.raises(NotImplementedError, match="is not a port"):
            ctx.get(inner)
        with pytest.raises(NotImplementedError, match="is an output"):
            ctx.set(dut.acc, 1)
        await ctx.tick()

    sim = VerilatedSimulator(dut)
    sim.add_clock(1e-8)
    sim.add_process(process)
    sim.add_testbench(bench)
    sim.run()
    assert errors and errors[0].startswith("`.get()` cannot be used")


@pytest.mark.parametrize("simulator", [PySimulator, VerilatedSimulator])
def test_the_first_clock_edge_counts_when_nothing_was_read_before_it(simulator):
    dut = Sample()
    seen = []

    async def bench(ctx):
        ctx.set(dut.en, 1)
        ctx.set(dut.a, 3)
        await ctx.tick()
        seen.append((ctx.get(dut.acc), ctx.get(dut.cycles)))

    sim = simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert seen == [(3, 1)]
