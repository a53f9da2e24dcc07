"""The register map: commands, status words and queues over the bus, and the generated docs."""

import pytest
from amaranth import *
from amaranth.hdl import unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from hdl import protocol as P
from hdl.control.regmap import (
    CommandBlock,
    ControlBlock,
    QueueBlock,
    RegisterBus,
    RegisterMap,
    StatusBlock,
    flatten,
    place,
)
from sim.driver import AmaranthBus, DriverError, RegisterDriver
from sim.tb.amsim import StreamDriver

REQUEST = data.StructLayout({"op": unsigned(2), "key": unsigned(40), "value": unsigned(70)})
RESPONSE = data.StructLayout({"errno": P.Errno, "data": unsigned(64)})
COUNTERS = data.ArrayLayout(32, 3)
SETTINGS = data.StructLayout({"mode": unsigned(3), "limit": unsigned(40)})
EVENT = data.StructLayout({"id": unsigned(8), "state": P.EvState, "wide": unsigned(40)})


class Store(wiring.Component):
    """A slow key/value store behind a command port: op 0 writes, 1 reads, else EINVAL; a key
    of 1000 or more is ENOENT. Answers after a few cycles, as real blocks may."""

    req: In(stream.Signature(REQUEST))
    resp: Out(stream.Signature(RESPONSE))
    counters: Out(COUNTERS)

    def elaborate(self, platform):
        m = Module()
        table = Array(Signal(70, name=f"slot{i}") for i in range(8))
        delay = Signal(3)
        held = Signal(REQUEST)
        pending = Signal()
        m.d.comb += self.req.ready.eq(~pending)
        with m.If(self.req.valid & self.req.ready):
            m.d.sync += [held.eq(self.req.payload), pending.eq(1), delay.eq(5),
                         self.counters[0].eq(self.counters[0] + 1)]
        with m.If(pending & (delay != 0)):
            m.d.sync += delay.eq(delay - 1)
        m.d.comb += self.resp.valid.eq(pending & (delay == 0))
        with m.If(held.key >= 1000):
            m.d.comb += self.resp.p.errno.eq(P.Errno.ENOENT)
        with m.Elif(held.op == 0):
            m.d.comb += self.resp.p.errno.eq(P.Errno.OK)
            with m.If(self.resp.valid & self.resp.ready):
                m.d.sync += table[held.key[:3]].eq(held.value)
        with m.Elif(held.op == 1):
            m.d.comb += [self.resp.p.errno.eq(P.Errno.OK),
                         self.resp.p.data.eq(table[held.key[:3]])]
        with m.Else():
            m.d.comb += self.resp.p.errno.eq(P.Errno.EINVAL)
        with m.If(self.resp.valid & self.resp.ready):
            m.d.sync += pending.eq(0)
        return m


REGMAP = RegisterMap([
    CommandBlock("store", REQUEST, RESPONSE, "A key/value store."),
    StatusBlock("counters", COUNTERS, "Counters."),
    ControlBlock("settings", SETTINGS, "Settings.", init={"mode": 2, "limit": 100}),
    QueueBlock("events", EVENT, "Events."),
], block_words=16)


def test_flatten_names_every_leaf_with_its_offset():
    assert flatten(REQUEST) == [("op", 0, 2), ("key", 2, 40), ("value", 42, 70)]
    assert flatten(COUNTERS) == [("[0]", 0, 32), ("[1]", 32, 32), ("[2]", 64, 32)]


def test_commands_status_and_queue_over_the_bus():
    m = Module()
    m.submodules.bus = bus = RegisterBus(REGMAP)
    m.submodules.store = store = Store()
    wiring.connect(m, bus.store_req, store.req)
    wiring.connect(m, store.resp, bus.store_resp)
    m.d.comb += bus.counters.eq(store.counters)
    events = stream.Signature(EVENT).create()
    m.d.comb += [bus.events.valid.eq(events.valid), bus.events.payload.eq(events.payload),
                 events.ready.eq(bus.events.ready)]
    sim = Simulator(m)
    sim.add_clock(1e-8)
    source = StreamDriver(events, bubbles=0.3, seed=4)
    source.send([{"id": i, "state": P.EvState.GOOD, "wide": i << 33} for i in range(5)])
    sim.add_process(source.process)

    async def bench(ctx):
        driver = RegisterDriver(REGMAP, AmaranthBus(ctx, bus.bus))
        value = (1 << 69) | 0x1234_5678_9ABC
        assert (await driver.command("store", op=0, key=3, value=value))["errno"] == 0
        assert (await driver.command("store", op=1, key=3))["data"] == value & (2**64 - 1)
        # Arguments are write-only: a read returns 0, whatever was written.
        args = REGMAP.base("store") + REGMAP.block("store").ARGS
        assert await driver.bus.read(args) == 0
        for op, key, errno in ((2, 1, "EINVAL"), (0, 1000, "ENOENT")):
            try:
                await driver.command("store", op=op, key=key)
            except DriverError as error:
                assert error.errno_name == errno
            else:
                raise AssertionError(f"op {op} key {key} should fail with {errno}")
        status = await driver.status("counters")
        assert status["[0]"] == 4
        seen = []
        for _ in range(200):
            entry = await driver.pop("events")
            if entry is not None:
                seen.append(entry)
            if len(seen) == 5:
                break
        assert [(e["id"], e["state"], e["wide"]) for e in seen] == \
            [(i, P.EvState.GOOD, i << 33) for i in range(5)]
        assert await driver.pop("events") is None
        assert await driver.status("settings") == {"mode": 2, "limit": 100}
        await driver.configure("settings", limit=(1 << 39) + 5)
        assert ctx.get(bus.settings.limit) == (1 << 39) + 5 and ctx.get(bus.settings.mode) == 2
        assert await driver.status("settings") == {"mode": 2, "limit": (1 << 39) + 5}

    sim.add_testbench(bench)
    sim.run()


def test_bad_field_values_are_refused_before_the_bus():
    driver = RegisterDriver(REGMAP, bus=None)
    import asyncio
    for values, message in (({"nope": 1}, "no field"), ({"op": 4}, "from 0 to 3")):
        try:
            asyncio.run(driver.command("store", **values))
        except (KeyError, ValueError) as error:
            assert message in str(error)
        else:
            raise AssertionError(values)


def test_markdown_lists_every_field():
    text = REGMAP.markdown()
    for path, _, _ in flatten(REQUEST) + flatten(EVENT):
        assert f"`{path}`" in text


def test_docs_register_map_is_the_generated_one():
    """docs/registers.md is generated from the one description (mrc-nic registers)."""
    from hdl.config import NicConfig
    from hdl.control.nicmap import nic_register_map
    from sim.env import REPO
    assert (REPO / "docs" / "registers.md").read_text() == \
        nic_register_map(NicConfig()).markdown(), "run: mrc-nic registers --out docs/registers.md"


# ---------------------------------------------------------------------------------------------
# Field placement: no field straddles a 32-bit word
# ---------------------------------------------------------------------------------------------

def test_a_field_that_would_cross_a_word_starts_the_next_one():
    store = REGMAP.block("store")
    assert [(f.path, f.offset, f.width) for f in store.request_fields] == \
        [("op", 0, 2), ("key", 32, 40), ("value", 96, 70)]
    assert store.request_words == 6 and store.response_words == 3
    assert [(f.path, f.offset) for f in REGMAP.block("settings").fields] == \
        [("mode", 0), ("limit", 32)]
    # The port keeps the layout's own positions: only the bus sees register positions.
    assert [(f.path, f.source) for f in store.request_fields] == \
        [("op", 0), ("key", 2), ("value", 42)]


def test_a_block_may_allow_a_field_to_straddle():
    regmap = RegisterMap([CommandBlock("store", REQUEST, RESPONSE, "A store.",
                                       straddle=("key",))], block_words=16)
    fields = {f.path: f.offset for f in regmap.block("store").request_fields}
    assert fields == {"op": 0, "key": 2, "value": 64}


def test_map_refuses_a_straddling_field_and_names_it():
    class PackedStatus(StatusBlock):
        """A block that keeps its layout's own positions (crossing words)."""
        @property
        def fields(self):
            return place(self.layout, straddle=[path for path, _, _ in flatten(self.layout)])

    layout = data.StructLayout({"flags": unsigned(20), "count": unsigned(24)})
    with pytest.raises(ValueError, match=r"Block odd fields field 'count' \(24 bits at word 0 "
                                         r"bit 20\) straddles a 32-bit word"):
        RegisterMap([PackedStatus("odd", layout, "Odd.")])
    with pytest.raises(ValueError, match=r"Block odd: straddle names no field\(s\) \['cnt'\]"):
        RegisterMap([StatusBlock("odd", layout, "Odd.", straddle=("cnt",))])


def test_bus_words_hold_fields_at_their_register_positions():
    m = Module()
    m.submodules.bus = bus = RegisterBus(REGMAP)
    base = REGMAP.base("settings")

    async def bench(ctx):
        driver = AmaranthBus(ctx, bus.bus)
        await driver.write(base + 1, 0x89AB_CDEF)            # limit bits 31:0
        await driver.write(base + 2, 0x45)                   # limit bits 39:32
        await driver.write(base, 0b101)                      # mode
        assert ctx.get(bus.settings.limit) == 0x45_89AB_CDEF
        assert ctx.get(bus.settings.mode) == 0b101
        assert [await driver.read(base + i) for i in range(3)] == [0b101, 0x89AB_CDEF, 0x45]
        ctx.set(bus.counters[1], 0x1234)
        assert await driver.read(REGMAP.base("counters") + 1) == 0x1234

    sim = Simulator(m)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
