# amaranth: UnusedElaboratable=no
"""The responder's S1 distance checks: against the row S2 writes back, derived from S2's row
before its step, they equal the checks against that row once written."""

import random

import pytest
from amaranth import *
from amaranth.sim import Simulator

from hdl import protocol as P
from hdl.config import NicConfig
from hdl.transport.resp_admit import distance_after_step, distance_layout, writeback_layout
from hdl.transport.resp_layouts import CHUNK

PSN_MOD = 1 << P.PSN_BITS


class _AfterStep(Elaboratable):
    def __init__(self, config):
        self.config = config
        self.psn = Signal(P.PSN_BITS)
        self.wb = Signal(writeback_layout(config))
        self.got = Signal(distance_layout(config))

    def elaborate(self, platform):
        m = Module()
        got = distance_after_step(m, self.config, self.psn, self.wb)
        m.d.comb += [self.got[name].eq(value) for name, value in got.items()]
        return m


def _expected(config, psn, epsn, advance, mpr, rcv, placed_offset):
    """``distance_checks`` against the row after the step, computed in Python."""
    window = config.window_psns
    bits = config.window_bits
    if placed_offset is not None:
        rcv |= 1 << placed_offset
    rcv = (rcv >> advance) & ((1 << window) - 1)
    distance = (psn - epsn - advance) % PSN_MOD
    offset = distance % (1 << bits)
    below = distance >= PSN_MOD // 2
    return {
        "offset": offset, "d0": int(distance == 0), "below": int(below),
        "in_window": int(not below and distance >> 7 < mpr),
        "marked": rcv >> offset & 1,
        "below_marked": rcv >> ((offset - 1) % (1 << bits)) & 1,
    }


def _cases(config, rng, count):
    window = config.window_psns
    for _ in range(count):
        epsn = rng.choice([rng.randrange(PSN_MOD), PSN_MOD - rng.randrange(1, 40),
                           PSN_MOD // 2 - rng.randrange(-40, 40)])
        advance = rng.randrange(CHUNK + 1)
        mpr = rng.randrange(config.mpr_units + 1)
        rcv = rng.getrandbits(window) & rng.choice([0, (1 << window) - 1, 0xFFFF, 0xF0F0F0])
        placed_offset = rng.choice([None, rng.randrange(window)])
        shape = rng.randrange(4)
        if shape == 0:
            delta = rng.randrange(-40, window + 40)
        elif shape == 1:
            delta = rng.randrange(-3, CHUNK + 3)
        elif shape == 2:        # where the distance's top bit changes
            delta = PSN_MOD // 2 + rng.randrange(-CHUNK - 3, CHUNK + 3)
        else:
            delta = rng.randrange(PSN_MOD)
        psn = (epsn + delta) % PSN_MOD
        yield psn, epsn, advance, mpr, rcv, placed_offset


@pytest.mark.parametrize("mpr_units", [1, 2, 3])
def test_distance_after_the_step_is_the_distance_against_the_row_written(mpr_units):
    config = NicConfig(qps=4, mpr_units=mpr_units)
    dut = _AfterStep(config)
    rng = random.Random(mpr_units)
    checked = {"in_window": 0, "marked": 0, "below_marked": 0}

    async def testbench(ctx):
        for psn, epsn, advance, mpr, rcv, placed_offset in _cases(config, rng, 1500):
            placed = placed_offset is not None
            psn2 = (epsn + (placed_offset or 0)) % PSN_MOD
            ctx.set(dut.psn, psn)
            ctx.set(dut.wb.epsn, epsn)
            ctx.set(dut.wb.advance, advance)
            ctx.set(dut.wb.state.qp.mpr, mpr)
            ctx.set(dut.wb.rcv, rcv)
            ctx.set(dut.wb.placed, int(placed))
            ctx.set(dut.wb.psn_low, psn2 % (1 << config.window_bits))
            want = _expected(config, psn, epsn, advance, mpr, rcv, placed_offset)
            got = {name: ctx.get(dut.got[name]) for name in want}
            case = (psn, epsn, advance, mpr, placed_offset)
            for name in ("offset", "d0", "below", "in_window"):
                assert got[name] == want[name], (name, case)
            # The receive bits mean something only inside the window (S2 reads them there).
            if want["in_window"]:
                checked["in_window"] += 1
                assert got["marked"] == want["marked"], ("marked", case)
                checked["marked"] += want["marked"]
                if not want["d0"]:
                    assert got["below_marked"] == want["below_marked"], ("below_marked", case)
                    checked["below_marked"] += want["below_marked"]

    sim = Simulator(dut)
    sim.add_testbench(testbench)
    sim.run()
    # The random cases reach every kind of answer.
    assert all(checked.values()), checked
