# amaranth: UnusedElaboratable=no
"""The execute stage's precomputed sums: the prefix counts of message ends and the sums the
step selects equal the count and the sum made after the step is known."""

import random

import pytest
from amaranth import *
from amaranth.sim import Simulator

from hdl.transport.resp_bits import prefix_counts, select_sum


class _PrefixCounts(Elaboratable):
    def __init__(self, width):
        self.bits = Signal(width)
        self.counts = [Signal(range(width + 1), name=f"count{k}") for k in range(width + 1)]

    def elaborate(self, platform):
        m = Module()
        counts = prefix_counts(m, self.bits, "ends")
        m.d.comb += [mine.eq(count) for mine, count in zip(self.counts, counts, strict=True)]
        return m


class _SelectSum(Elaboratable):
    def __init__(self, width, increments, inc_bits):
        self.base = Signal(width)
        self.increments = [Signal(inc_bits, name=f"inc{k}") for k in range(increments)]
        self.index = Signal(range(increments))
        self.sum = Signal(width)

    def elaborate(self, platform):
        m = Module()
        m.d.comb += self.sum.eq(select_sum(m, self.base, self.increments, self.index, "sum"))
        return m


def _run(dut, testbench):
    sim = Simulator(dut)
    sim.add_testbench(testbench)
    sim.run()


@pytest.mark.parametrize("width", [1, 5, 16])
def test_prefix_count_k_is_the_number_of_set_bits_below_k(width):
    dut = _PrefixCounts(width)
    rng = random.Random(width)
    patterns = [0, (1 << width) - 1] + [rng.getrandbits(width) for _ in range(60)]

    async def testbench(ctx):
        for bits in patterns:
            ctx.set(dut.bits, bits)
            for k, count in enumerate(dut.counts):
                assert ctx.get(count) == bin(bits & ((1 << k) - 1)).count("1"), (bits, k)

    _run(dut, testbench)


@pytest.mark.parametrize("width, inc_bits", [(24, 5), (8, 5), (5, 5), (3, 5)])
def test_the_selected_sum_is_the_base_plus_the_selected_increment(width, inc_bits):
    increments = 17
    dut = _SelectSum(width, increments, inc_bits)
    rng = random.Random(width)
    mod = 1 << width
    carries = 0

    async def testbench(ctx):
        nonlocal carries
        for _ in range(150):
            # Bases whose low bits carry into the high ones for most increments, and any.
            base = rng.choice([rng.randrange(mod), mod - 1 - rng.randrange(20),
                               (rng.randrange(mod) | 0x1F) & (mod - 1)])
            incs = [rng.randrange(1 << inc_bits) for _ in range(increments)]
            ctx.set(dut.base, base)
            for signal, inc in zip(dut.increments, incs, strict=True):
                ctx.set(signal, inc)
            for index in range(increments):
                ctx.set(dut.index, index)
                expected = (base + incs[index]) % mod
                carries += (base % (1 << min(inc_bits, width))) + incs[index] >= 1 << inc_bits
                assert ctx.get(dut.sum) == expected, (base, incs[index])

    _run(dut, testbench)
    assert carries > 0      # the carry into the high bits was exercised
