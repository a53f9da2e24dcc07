# amaranth: UnusedElaboratable=no
"""The transport self-test: the bring-up script (recorded from the NIC driver, replayed from a
ROM), and the whole NIC in loopback through the impaired fabric, with loss and with a killed
plane: thousands of cycles of a whole NIC, run under Verilator (sim/tb/selftest.py)."""

import asyncio
import random

import pytest
from amaranth import Fragment, Instance, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator
from amaranth_boards.ecpix5 import ECPIX585Platform

from boards import transport as T
from boards.tops import BOARDS, TRANSPORT_HZ
from hdl.control.nicmap import nic_register_map
from hdl.control.regmap import bus_signature
from sim.tb.selftest import SelfTestBench, run_selftest_rtl
from tests.boards.test_boards import decode_uart

CONFIG = T.transport_config(100_000_000)


# ---------------------------------------------------------------------------------------------
# The script: recording and replay
# ---------------------------------------------------------------------------------------------

def test_recorded_bring_up_is_the_drivers_and_keeps_reset_values():
    """Every command the driver issues becomes its argument writes, GO, one WAIT on its status
    and one EXPECT on the errno bits; a read-modify-write of a control block keeps the fields it
    does not set at their reset values."""
    regmap = nic_register_map(CONFIG)
    ops = T.record_bring_up(CONFIG, port_wnd=5)
    assert ops[-1][0] == T.ScriptOp.END
    waits = [address for op, address, _ in ops if op == T.ScriptOp.WAIT]
    expects = [op for op in ops if op[0] == T.ScriptOp.EXPECT]
    assert len(waits) == len(expects) > 10
    gos = [address for op, address, _ in ops if op == T.ScriptOp.WRITE and
           any(address == w + 1 for w in waits)]
    assert len(gos) == len(waits)
    # Both QPs are connected, each to the other.
    base = regmap.base("tx")
    assert any(op == T.ScriptOp.WRITE and base <= address < base + regmap.block_words
               for op, address, _ in ops)
    # The port watch write keeps trim_dscp (same control block) at its reset value.
    settings = regmap.block("settings")
    fields = {path: (offset, width) for path, offset, width in
              regmap.to_dict()["settings"]["fields"]}
    settings_base = regmap.base("settings")
    words = {address: value for op, address, value in ops if op == T.ScriptOp.WRITE and
             settings_base <= address < settings_base + settings.words}
    value = sum(word << (32 * (address - settings_base)) for address, word in words.items())

    def field(name):
        offset, width = fields[name]
        return (value >> offset) & ((1 << width) - 1)
    assert field("port_wnd") == 5
    assert field("trim_dscp") == settings.init["trim_dscp"]


def test_recorder_refuses_reads_it_cannot_answer_ahead():
    regmap = nic_register_map(CONFIG)
    recorder = T.ScriptRecorder(regmap)
    address = regmap.base("requester_counters")
    with pytest.raises(ValueError, match=f"cannot read address {address:#x}"):
        asyncio.run(recorder.read(address))


class FakeRegisters(wiring.Component):
    """A command block at 0 (status bit 0 busy for ``busy`` reads after GO at 1, errno word
    at 2) and a counter at 3 that counts reads of it."""

    def __init__(self, *, busy, errno):
        self._busy, self._errno = busy, errno
        super().__init__({"bus": In(bus_signature(4)), "writes": Out(8)})

    def elaborate(self, platform):
        m = Module()
        left = Signal(8)
        counter = Signal(32, init=100)
        bus = self.bus
        with m.If(bus.w_en):
            m.d.sync += self.writes.eq(self.writes + 1)
            with m.If(bus.addr == 1):
                m.d.sync += left.eq(self._busy)
        with m.If(bus.r_en):
            with m.Switch(bus.addr):
                with m.Case(0):
                    m.d.sync += bus.r_data.eq(left != 0)
                    with m.If(left != 0):
                        m.d.sync += left.eq(left - 1)
                with m.Case(2):
                    m.d.sync += bus.r_data.eq(self._errno << 8)
                with m.Case(3):
                    m.d.sync += [bus.r_data.eq(counter), counter.eq(counter + 1)]
        return m


def run_script(ops, *, busy, errno, timeout=16, cycles=200):
    m = Module()
    m.submodules.script = script = T.BusScript(ops, address_bits=4, monitor=(3,),
                                               timeout=timeout)
    m.submodules.regs = regs = FakeRegisters(busy=busy, errno=errno)
    wiring.connect(m, script.bus, regs.bus)
    result = {}

    async def bench(ctx):
        await ctx.tick().repeat(cycles)
        result.update(done=ctx.get(script.done), error=ctx.get(script.error),
                      failed_at=ctx.get(script.failed_at), writes=ctx.get(regs.writes),
                      captured=ctx.get(script.captured[0]))

    sim = Simulator(m)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return result


SCRIPT = [(T.ScriptOp.WRITE, 4, 7), (T.ScriptOp.WRITE, 1, 1), (T.ScriptOp.WAIT, 0, 1),
          (T.ScriptOp.EXPECT, 2, 0xFF00), (T.ScriptOp.END, 0, 0)]


def test_bus_script_waits_checks_and_then_monitors():
    result = run_script(SCRIPT, busy=5, errno=0)
    assert result["done"] == 1 and result["error"] == 0
    assert result["writes"] == 2
    # The monitor loop reads the counter over and over after END.
    assert result["captured"] > 120


@pytest.mark.parametrize("busy, errno, failed_at", [(0, 3, 3), (40, 0, 2)])
def test_bus_script_stops_on_a_refused_command_or_a_hung_one(busy, errno, failed_at):
    """A non-zero errno stops the script at its EXPECT; a busy flag still set after
    ``timeout`` polls stops it at its WAIT; neither reaches END."""
    result = run_script(SCRIPT, busy=busy, errno=errno)
    assert (result["done"], result["error"], result["failed_at"]) == (0, 1, failed_at)
    assert result["captured"] == 0


def test_bus_script_rejects_bad_scripts():
    with pytest.raises(ValueError, match="ending with ScriptOp.END"):
        T.BusScript(SCRIPT[:-1], address_bits=4)
    with pytest.raises(ValueError, match="out of range"):
        T.BusScript([(T.ScriptOp.WRITE, 16, 0), (T.ScriptOp.END, 0, 0)], address_bits=4)
    with pytest.raises(ValueError, match="timeout"):
        T.BusScript(SCRIPT, address_bits=4, timeout=0)


# ---------------------------------------------------------------------------------------------
# The whole NIC in loopback
# ---------------------------------------------------------------------------------------------

def run_transport(*, cycles, wr_limit, loss_rate, kill_window=None, divisor=2):
    """Run the transport self-test under Verilator; return the counters by name (and the
    error flag) and the UART lines. Plane 1 is killed during ``kill_window`` (cycles). The
    loss rate, the WR limit and the kill window are knobs, set per run: one build serves
    every run."""
    def make():
        dut = T.TransportSelfTest(config=CONFIG, report_period=5000,
                                  baud=CONFIG.clock_hz // divisor, knobs=True)
        return SelfTestBench(dut, dut, kill=0b10, kill_window="run",
                             knobs={"loss_rate": dut.loss_rate, "wr_limit": dut.wr_limit}), dut

    first, end = kill_window or (0, 0)
    run = run_selftest_rtl(make, name="transport", cycles=cycles, params=(divisor,),
                           knobs={"loss_rate": loss_rate, "wr_limit": wr_limit,
                                  "kill_first": first, "kill_end": end})
    result = {**run.counters, "error": run.error}
    text = decode_uart(run.levels, divisor).decode()
    # Complete lines only: the run may end in the middle of one.
    return result, [line for line in text.split("\r\n")[:-1] if line.startswith("MRC")]


def expected_bytes(count):
    return sum(T.wr_length(n, CONFIG.mtu) for n in range(count))


def test_transport_selftest_recovers_every_loss():
    """With 24/256 of all frames (data and ACKs) lost, every work request completes, in
    order, with SUCCESS and its length; every placed byte is the memory pattern; the NIC
    resent what was lost; the parser dropped nothing; and the UART reports it."""
    result, lines = run_transport(cycles=12_000, wr_limit=40, loss_rate=24)
    assert result["script"] == 1, "bring-up failed"
    assert result["posted"] == result["completed"] == 40
    assert result["imm"] == sum(T.wr_is_imm(n) for n in range(40)) == 10
    assert result["bad"] == 0 and result["dropped"] == 0 and result["error"] == 0
    assert result["lost"] > 0 and result["retx"] > 0
    assert result["placed"] >= expected_bytes(40)
    fields = dict(item.split("=") for item in lines[-1].split()[1:])
    assert list(fields) == list(T.TRANSPORT_COUNTERS) + [name for name, *_ in T.MONITORED]
    assert int(fields["script"], 16) == 1 and int(fields["bad"], 16) == 0
    assert 0 < int(fields["completed"], 16) <= result["completed"]


def test_transport_selftest_routes_around_a_killed_plane():
    """Plane 1 killed for 12,000 cycles from just after bring-up: frames on it are dropped,
    the requester resends them on plane 0 (timeouts and inference), and every work request
    completes with nothing lost or corrupted; placement goes on during the kill."""
    result, _ = run_transport(cycles=15_000, wr_limit=48, loss_rate=0,
                              kill_window=(2_500, 14_500))
    assert result["script"] == 1
    assert result["killed"] > 0 and result["retx"] > 0
    assert result["posted"] == result["completed"] == 48
    assert result["bad"] == 0 and result["dropped"] == 0 and result["error"] == 0
    assert result["placed"] >= expected_bytes(48)


def test_transport_selftest_rejects_bad_parameters():
    with pytest.raises(ValueError, match="delays must be a tuple of 2"):
        T.TransportSelfTest(config=CONFIG, delays=(1,))
    with pytest.raises(ValueError, match="loss_rate must be an integer from 0 to 255"):
        T.TransportSelfTest(config=CONFIG, loss_rate=256)
    with pytest.raises(ValueError, match="baud"):
        T.TransportSelfTest(config=CONFIG, baud=CONFIG.clock_hz)


def test_pattern_memory_matches_the_python_pattern():
    """Fetches at unaligned addresses and odd lengths come back as pattern_byte of each
    address, full beats but the last, with random output backpressure."""
    dut = T.PatternMemory(CONFIG)
    rng = random.Random(5)
    requests = [(T.MR_BASE + rng.randrange(1 << 20), rng.randrange(1, 600)) for _ in range(12)]
    received = []

    async def source(ctx):
        for address, length in requests:
            ctx.set(dut.req.valid, 1)
            ctx.set(dut.req.p.addr, address)
            ctx.set(dut.req.p.length, length)
            await ctx.tick().until(dut.req.ready)
            ctx.set(dut.req.valid, 0)
            for _ in range(rng.randrange(3)):
                await ctx.tick()

    async def sink(ctx):
        while len(received) < len(requests):
            ctx.set(dut.o.ready, rng.random() > 0.3)
            await ctx.tick()

    async def collect(ctx):
        current = bytearray()
        async for _, _, valid, ready, data, keep, last in ctx.tick().sample(
                dut.o.valid, dut.o.ready, dut.o.p.data, dut.o.p.keep, dut.o.p.last):
            if valid and ready:
                lanes = [n for n in range(8) if keep >> n & 1]
                assert lanes == list(range(len(lanes)))
                current += bytes((data >> (8 * n)) & 0xFF for n in lanes)
                if last:
                    received.append(bytes(current))
                    current = bytearray()
                else:
                    assert len(lanes) == 8

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(source, background=True)
    sim.add_process(collect)
    sim.add_testbench(sink)
    sim.run()
    assert received == [bytes(T.pattern_byte(address + i) for i in range(length))
                        for address, length in requests]


def test_transport_top_runs_the_whole_nic_from_the_pll():
    platform = ECPIX585Platform()
    fragment = Fragment.get(BOARDS["ecpix5-transport"].top("ecpix5-transport"), platform)
    from tests.boards.test_boards import _walk
    plls = [sub for _, sub in _walk(fragment) if isinstance(sub, Instance)
            and sub.type == "EHXPLLL"]
    assert len(plls) == 1
    assert plls[0].attrs["FREQUENCY_PIN_CLKOP"] == f"{TRANSPORT_HZ / 1e6:g}"
    selftest = next(origin for origins, _ in _walk(fragment) for origin in origins
                    if isinstance(origin, T.TransportSelfTest))
    assert selftest.config.clock_hz == TRANSPORT_HZ
    assert selftest.config.qps >= 2
    # Router1 did not converge at this density: the board uses router2.
    assert BOARDS["ecpix5-transport"].router == BOARDS["ecpix5-rgmii"].router == "router2"
