# amaranth: UnusedElaboratable=no
"""The receive parser's stages on their own: each is a component with named ports that
refuses a bad config, and the input stage's stack tracker finds every legal header stack.

The parser as a whole is tested in ``test_parser.py``; these tests pin what the stages
promise each other.
"""

import pytest
from amaranth.lib import data, stream
from amaranth.lib.wiring import In, Out, Signature
from amaranth.sim import Simulator
from scapy.compat import raw

from hdl.config import NicConfig
from hdl.packet.headers import DropReason, net_beat_layout, packet_beat_layout
from hdl.packet.parse_decode import ParseChecks, ParseFields, ParseWindows
from hdl.packet.parse_defs import (
    FIELD_CHECKS,
    MODE_PLAIN,
    MODE_SRH,
    MODE_SRV6,
    STACKS,
    VERDICT_CHECKS,
    ParserGeometry,
    Stack,
    checks_layout,
)
from hdl.packet.parse_input import ParseInput
from hdl.packet.parse_reader import ParseReader
from hdl.packet.parse_store import ParseCapture, ParseIcrc
from hdl.packet.parse_verdict import ParseLengths, ParseVerdict
from hdl.packet.parser import Parser
from sim import packets as pk
from tests.hdl.test_parser import add_vlan, frame_beats, pack, stream_put, write

STAGES = (ParseInput, ParseIcrc, ParseCapture, ParseWindows, ParseFields, ParseChecks,
          ParseLengths, ParseVerdict, ParseReader)


@pytest.mark.parametrize("stage", STAGES, ids=lambda stage: stage.__name__)
def test_every_stage_refuses_a_config_that_is_not_a_nic_config(stage):
    with pytest.raises(TypeError, match="Config must be a NicConfig, not 64"):
        stage(config=64)


def test_the_parser_top_keeps_its_ports():
    config = NicConfig(data_width=128)
    assert Parser(config=config).signature == Signature({
        "i": In(stream.Signature(net_beat_layout(128, tagged=True))),
        "o": Out(stream.Signature(packet_beat_layout(config))),
        "trim_dscp": In(6, init=config.trim_dscp),
        "counters": Out(data.ArrayLayout(32, len(DropReason))),
        "verdict_valid": Out(1),
        "verdict_reason": Out(DropReason),
    })


def test_every_check_of_d2_is_registered_and_every_verdict_check_named_once():
    geometry = ParserGeometry.of(NicConfig())
    assert [name for name, _ in checks_layout(geometry)["bits"].shape] == list(FIELD_CHECKS)
    names = [name for checks in VERDICT_CHECKS.values() for name, _ in checks]
    assert len(names) == len(set(names))
    reasons = {why for checks in VERDICT_CHECKS.values() for _, why in checks}
    assert reasons == set(DropReason) - {DropReason.NONE}


def test_the_geometry_follows_the_config():
    g = ParserGeometry.of(NicConfig(data_width=256, mtu=1024))
    assert (g.lanes, g.lane_bits) == (32, 5)
    assert g.max_beats * g.lanes >= g.max_frame > (g.max_beats - 1) * g.lanes
    assert g.fifo_depth >= 2 * g.max_beats + 16 and g.fifo_depth & (g.fifo_depth - 1) == 0
    assert g.ptr_bits == g.fifo_depth.bit_length()


def _stack_frames():
    """One frame per legal stack, and the stack it has."""
    w4, w6 = write(b"s" * 8, ip_version=4), write(b"s" * 8)
    cases = [
        (raw(w6), MODE_PLAIN, False),
        (raw(w4), MODE_PLAIN, True),
        (raw(pk.srv6_encapsulate(w6, dst=bytes(16))), MODE_SRV6, False),
        (raw(pk.srv6_encapsulate(w4, dst=bytes(16))), MODE_SRV6, True),
        (raw(pk.srv6_encapsulate(w6, dst=bytes(16), segment=bytes(16))), MODE_SRH, False),
        (raw(pk.srv6_encapsulate(w4, dst=bytes(16), segment=bytes(16))), MODE_SRH, True),
    ]
    return [(add_vlan(frame) if vlan else frame, Stack(vlan, mode, v4))
            for vlan in (False, True) for frame, mode, v4 in cases]


@pytest.mark.parametrize("data_width", [64, 256])
def test_the_input_stage_tracks_every_stack_by_the_last_beat(data_width):
    """Back-to-back frames of all twelve stacks: the beat registered with each frame's last
    beat carries its stack, one-hot too, and the first beat of a frame forgets the last."""
    config = NicConfig(data_width=data_width)
    dut = ParseInput(config=config)
    cases = _stack_frames()
    assert {stack for _, stack in cases} == set(STACKS)
    layout = dut.i.payload.shape()
    seen = []

    async def producer(ctx):
        ctx.set(dut.fifo_space, 100)
        for frame, _ in cases:
            for beat in frame_beats(frame, config.bytes_per_beat):
                await stream_put(ctx, dut.i, pack(layout, beat))

    async def monitor(ctx):
        while True:
            await ctx.tick()
            if ctx.get(dut.o.valid) and ctx.get(dut.o.beat.last):
                seen.append((ctx.get(dut.o.stack), ctx.get(dut.o.stack_hot)))

    sim = Simulator(dut)
    sim.add_clock(8e-9)
    sim.add_testbench(producer)
    sim.add_testbench(monitor, background=True)
    sim.run_until(8e-9 * 400)
    assert seen == [(stack.code, 1 << STACKS.index(stack)) for _, stack in cases]


def test_the_input_stage_waits_for_fifo_space_and_a_header_queue_reservation():
    """``i.ready`` follows registered room: FIFO space of 3 beats, and at a frame start a
    header queue entry beyond the frames that hold reservations."""
    dut = ParseInput(config=NicConfig())

    async def bench(ctx):
        ctx.set(dut.fifo_space, 2)
        await ctx.tick()
        assert not ctx.get(dut.i.ready)
        ctx.set(dut.fifo_space, 3)
        await ctx.tick()
        assert ctx.get(dut.i.ready)
        ctx.set(dut.queue_level, 14)            # 16 entries, one kept spare
        await ctx.tick()
        assert ctx.get(dut.i.ready)
        ctx.set(dut.i.valid, 1)                 # a one-beat frame takes a reservation
        ctx.set(dut.i.payload.last, 1)
        await ctx.tick()
        ctx.set(dut.i.valid, 0)
        await ctx.tick()
        assert not ctx.get(dut.i.ready)
        ctx.set(dut.verdict_valid, 1)           # its verdict gives it back
        await ctx.tick()
        ctx.set(dut.verdict_valid, 0)
        await ctx.tick()
        assert ctx.get(dut.i.ready)

    sim = Simulator(dut)
    sim.add_clock(8e-9)
    sim.add_testbench(bench)
    sim.run()
