"""The requester's parts on their own: the table ports, the walker, the send register, the
parameter checks.

The requester as a whole is checked against its model in ``test_requester.py``; these tests
pin down the rules of single engines that the whole only shows indirectly.
"""

import pytest
from amaranth import Module, Signal
from amaranth.sim import Simulator

from hdl.config import NicConfig
from hdl.transport.req_ack import AckProcessor
from hdl.transport.req_common import at_or_above, circular_span, clamp, ones
from hdl.transport.req_defs import WalkKind
from hdl.transport.req_retransmit import Walker
from hdl.transport.req_send import FeedbackMerge, SendRegister
from hdl.transport.req_tables import TABLE_ACCESS, requester_tables

CONFIG = NicConfig(qps=4, mpr_units=1, wr_slots=2)


def _run(dut, bench):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


def test_every_table_has_one_writer_and_its_read_ports_are_the_engines_reading_it():
    for name, (_shape, _depth, ports) in requester_tables(CONFIG).items():
        readers = [engine for engine, (reads, _) in TABLE_ACCESS.items() if name in reads]
        writers = [engine for engine, (_, writes) in TABLE_ACCESS.items() if name in writes]
        assert len(readers) == ports, name
        assert len(writers) == 1, name


def test_walker_gives_each_psn_of_a_walk_once_and_timeout_walks_first():
    dut = Walker(config=CONFIG)
    seen = []

    async def bench(ctx):
        ctx.set(dut.infer.payload, {"qpn": 1, "psn": 0xFFFFFF, "count": 2,
                                    "kind": WalkKind.INFER})
        ctx.set(dut.timeout.payload, {"qpn": 2, "psn": 10, "count": 3,
                                      "kind": WalkKind.TIMEOUT})
        ctx.set(dut.infer.valid, 1)
        ctx.set(dut.timeout.valid, 1)
        ctx.set(dut.o.ready, 1)
        for _ in range(10):
            _, _, timeout_taken, infer_taken, o_valid, step = await ctx.tick().sample(
                dut.timeout.valid & dut.timeout.ready, dut.infer.valid & dut.infer.ready,
                dut.o.valid, dut.o.payload)
            if timeout_taken:
                ctx.set(dut.timeout.valid, 0)
            if infer_taken:
                ctx.set(dut.infer.valid, 0)
            if o_valid:
                seen.append((step.qpn, step.psn, step.kind, step.first))

    _run(dut, bench)
    assert seen == [
        (2, 10, WalkKind.TIMEOUT, 1), (2, 11, WalkKind.TIMEOUT, 0), (2, 12, WalkKind.TIMEOUT, 0),
        (1, 0xFFFFFF, WalkKind.INFER, 1), (1, 0, WalkKind.INFER, 0),
    ]


def test_send_register_sends_resends_first_and_holds_a_walk_resend_behind_lost_feedback():
    dut = SendRegister(config=CONFIG)

    def item(qpn, psn, retransmission, walk):
        return {"request": {"qpn": qpn, "context": {"psn": psn,
                                                    "retransmission": retransmission}},
                "slot": 1, "walk": walk}

    async def bench(ctx):
        ctx.set(dut.o.ready, 1)
        ctx.set(dut.new.payload, item(0, 5, 0, 0))
        ctx.set(dut.new.valid, 1)
        ctx.set(dut.resend.payload, item(3, 7, 1, 1))
        ctx.set(dut.resend.valid, 1)
        ctx.set(dut.lost_pending, 1)
        # A held walk resend still goes before new packets: nothing leaves.
        for _ in range(3):
            assert not ctx.get(dut.resend.ready) and not ctx.get(dut.new.ready)
            await ctx.tick()
            assert not ctx.get(dut.o.valid)
        ctx.set(dut.lost_pending, 0)
        assert ctx.get(dut.resend.ready)
        assert ctx.get(dut.tables.write.meta.en)
        await ctx.tick()
        ctx.set(dut.resend.valid, 0)
        assert ctx.get(dut.o.valid)
        assert ctx.get(dut.o.payload.qpn) == 3 and ctx.get(dut.o.payload.context.psn) == 7
        assert ctx.get(dut.new.ready) and ctx.get(dut.events.packets)
        await ctx.tick()
        assert ctx.get(dut.o.payload.qpn) == 0 and ctx.get(dut.o.payload.context.psn) == 5
        assert not ctx.get(dut.o.payload.context.retransmission)

    _run(dut, bench)


def test_engines_reject_a_bad_configuration_and_bad_queue_depths():
    with pytest.raises(TypeError, match="Configuration must be a NicConfig, not"):
        Walker(config={"qps": 4})
    with pytest.raises(ValueError, match="Trim queue depth must be an integer of at least 2, "
                                         "not 1"):
        AckProcessor(config=CONFIG, trim_depth=1, qp_error_depth=4)
    with pytest.raises(ValueError, match="LOST queue depth must be an integer of at least 2"):
        FeedbackMerge(config=CONFIG, feedback_depth=4, lost_depth="4")


@pytest.mark.parametrize("width", [16, 128])
def test_circular_span_sets_the_bits_from_start_to_end_wrapping_at_width(width):
    """Every start and end, against the rotated run of ones (every bit when they are
    equal, as the docstring says)."""
    bits = (width - 1).bit_length()
    start, end, out = Signal(bits), Signal(bits), Signal(width)
    m = Module()
    m.d.comb += out.eq(circular_span(start, end, width))
    step = 1 if width <= 16 else 7

    async def bench(ctx):
        for s in range(0, width, step):
            for e in range(width):
                ctx.set(start, s)
                ctx.set(end, e)
                count = (e - s) % width or width
                run = (1 << count) - 1
                expected = ((run << s) | (run >> (width - s))) & ((1 << width) - 1)
                assert ctx.get(out) == expected, (s, e)

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()


@pytest.mark.parametrize("width", [2, 64, 256])
def test_decoded_thermometers_and_clamp_match_their_definitions(width):
    """``at_or_above`` (bits at or above a value, none past the width, for values up to
    four times it), ``ones`` (counts 0 to width) and ``clamp`` (24-bit distances, negative
    and far ones too, to a power-of-two and another limit), against plain Python."""
    bits = (width - 1).bit_length()
    value, count, distance = Signal(bits + 2), Signal(bits + 1), Signal(24)
    above, low, to64, to100 = Signal(width), Signal(width), Signal(7), Signal(7)
    m = Module()
    m.d.comb += [above.eq(at_or_above(value, width)), low.eq(ones(count, width)),
                 to64.eq(clamp(distance, 64)), to100.eq(clamp(distance, 100))]

    async def bench(ctx):
        for v in range(4 * width):
            ctx.set(value, v)
            assert ctx.get(above) == sum(1 << i for i in range(width) if i >= v), v
        for c in range(width + 1):
            ctx.set(count, c)
            assert ctx.get(low) == (1 << c) - 1, c
        for d in (0, 1, 63, 64, 65, 99, 100, 101, 127, 128, 1 << 22, (1 << 23) - 1,
                  1 << 23, (1 << 24) - 1):
            ctx.set(distance, d)
            negative = d >> 23
            assert ctx.get(to64) == (0 if negative else min(d, 64)), d
            assert ctx.get(to100) == (0 if negative else min(d, 100)), d

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
