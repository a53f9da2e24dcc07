# amaranth: UnusedElaboratable=no
"""Board tops and the self-test: UART, impaired fabric, checker, the whole self-test in the
Amaranth simulator, and every board top elaborated against its platform (no toolchain run)."""

import random

import pytest
from amaranth import Cat, Fragment, Instance, Module
from amaranth.build.res import ResourceManager
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator
from amaranth_boards.ecpix5 import ECPIX585Platform
from amaranth_boards.ulx3s import ULX3S_85F_Platform
from amaranth_boards.versa_ecp5 import VersaECP5Platform
from scapy.layers.l2 import Ether

from boards import selftest as S
from boards.ice40 import ICE40_COUNTERS, Ice40Selftest, frame_template
from boards.pll import PFD_HZ, VCO_HZ, Ecp5Pll, LockReset, ecp5_pll_dividers
from boards.tops import BOARDS, ULX3S_HZ, EngineBench, selftest_config
from boards.uart import UARTTx
from hdl import protocol as P
from hdl.config import NicConfig
from hdl.packet.headers import PacketKind
from sim import defaults as D
from sim.packets import trim
from sim.rtlpackets import frame_beats, frame_from_beats, packet_from_header
from sim.tb.amsim import StreamCollector, StreamDriver

# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def decode_uart(levels, divisor):
    """Bytes of an 8N1 line sampled once per cycle (``levels``), ``divisor`` cycles per bit."""
    out = []
    n = 0
    while n < len(levels):
        if levels[n] == 0:
            middle = n + divisor // 2
            if middle + 9 * divisor >= len(levels):
                break
            bits = [levels[middle + divisor * (k + 1)] for k in range(8)]
            assert levels[middle + 9 * divisor] == 1, "missing stop bit"
            out.append(sum(b << k for k, b in enumerate(bits)))
            n = middle + 9 * divisor
        else:
            n += 1
    return bytes(out)


def selftest_header(psn, plane, config, max_payload):
    """The generator's header for ``psn`` as a dict for :func:`packet_from_header`."""
    from ipaddress import IPv6Address
    length = S.payload_length(psn, max_payload)
    return {
        "kind": PacketKind.DATA, "port": plane, "payload_len": length,
        "eth_dst": int(D.NIC_B.mac.replace(":", ""), 16),
        "eth_src": int(D.NIC_A.mac.replace(":", ""), 16),
        "ipv6": 1, "ip_src": int(IPv6Address(D.NIC_A.ipv6)),
        "ip_dst": int(IPv6Address(D.NIC_B.ipv6)), "flow_label": psn & 0xFFFFF,
        "hop_limit": 64, "udp_sport": 0xC000 | psn & 0x3FFF,
        "bth": {"opcode": S.SELFTEST_OPCODE, "dqpn": D.QPN_B, "psn": psn, "ackreq": 1,
                "pkey": 0xFFFF, "ts": 1},
        "meth": {},
        "tseth": {"ftype": P.Ftype.TIMESTAMP},
        "reth": {"va": D.MR_BASE + ((psn & 0xFFF) << 12), "rkey": D.MR_RKEY, "dma_len": length},
    }


def selftest_frame(psn, plane, config, max_payload):
    header = selftest_header(psn, plane, config, max_payload)
    return bytes(packet_from_header(
        header, S.payload_pattern(psn, config.data_width, max_payload), config))


class FabricModel:
    """Reference of one plane's impairments: the same LFSR, the same per-frame decisions."""

    def __init__(self, seed):
        self.lfsr = seed

    def fate(self, kill, loss_rate, trim_rate):
        lfsr = self.lfsr
        self.lfsr = (lfsr >> 1) ^ (0xB400 if lfsr & 1 else 0)
        if kill or (lfsr & 0xFF) < loss_rate:
            return "killed" if kill else "lost"
        if (lfsr >> 8) < trim_rate:
            return "trimmed"
        return "pass"


# ---------------------------------------------------------------------------------------------
# UART
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bubbles", [0.0, 0.5])
def test_uart_sends_8n1(bubbles):
    divisor = 5
    dut = UARTTx(divisor=divisor)
    payload = bytes(random.Random(3).getrandbits(8) for _ in range(12))
    source = StreamDriver(dut.i, bubbles=bubbles, seed=4)
    source.send(list(payload))
    levels = []

    async def sample(ctx):
        for _ in range((len(payload) + 2) * 10 * divisor * 2):
            levels.append(ctx.get(dut.tx))
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_process(source.process)
    sim.add_testbench(sample)
    sim.run()
    assert decode_uart(levels, divisor) == payload


def test_uart_rejects_bad_divisor():
    with pytest.raises(ValueError, match="divisor must be an integer of at least 2, not 1"):
        UARTTx(divisor=1)


# ---------------------------------------------------------------------------------------------
# Fabric
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bubbles, backpressure, kill", [(0.3, 0.3, 0), (0.0, 0.0, 0),
                                                          (0.3, 0.3, 0b10)])
def test_fabric_matches_reference(bubbles, backpressure, kill):
    """Each plane loses, trims and kills exactly the frames the LFSR model says; trimmed
    frames are byte for byte what sim.packets.trim makes; order within a plane is kept."""
    config = NicConfig(ports=2, mtu=512)
    max_payload = 64
    loss_rate, trim_rate = 50, 60
    dut = S.ImpairedFabric(data_width=64, delays=(3, 11))
    frames = {0: [], 1: []}
    for n in range(24):
        psn = D.INITIAL_PSN + n
        frames[n % 2].append(selftest_frame(psn, n % 2, config, max_payload))

    expected = {}
    counts = {}
    for plane in range(2):
        model = FabricModel(0xACE1 ^ (plane * 0x1F35))
        expected[plane] = []
        for frame in frames[plane]:
            fate = model.fate(kill >> plane & 1, loss_rate, trim_rate)
            counts[fate] = counts.get(fate, 0) + 1
            if fate == "pass":
                expected[plane].append(frame)
            elif fate == "trimmed":
                expected[plane].append(bytes(trim(Ether(frame))))

    drivers = [StreamDriver(dut.i[p], bubbles=bubbles, seed=10 + p) for p in range(2)]
    sinks = [StreamCollector(dut.o[p], backpressure=backpressure, seed=20 + p)
             for p in range(2)]
    for p in range(2):
        drivers[p].send([{"data": d, "keep": k, "first": f, "last": la}
                         for frame in frames[p] for d, k, f, la in frame_beats(frame, 64)])
    strobes = {"lost": 0, "killed": 0, "trimmed": 0, "frame": 0}

    async def count_strobes(ctx):
        names = list(strobes)
        async for _, _, *values in ctx.tick().sample(*(getattr(dut, n) for n in names)):
            for name, value in zip(names, values, strict=True):
                strobes[name] += bin(value).count("1")

    async def bench(ctx):
        ctx.set(dut.kill, kill)
        ctx.set(dut.loss_rate, loss_rate)
        ctx.set(dut.trim_rate, trim_rate)
        for _ in range(6000):
            await ctx.tick()
            if all(d.idle for d in drivers) and all(
                    sum(b.last for b in s.items) == len(expected[p])
                    for p, s in enumerate(sinks)):
                break
        for _ in range(40):
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    for process in [*(d.process for d in drivers), *(s.process for s in sinks)]:
        sim.add_process(process)
    sim.add_process(count_strobes)
    sim.add_testbench(bench)
    sim.run()
    for p in range(2):
        got, current = [], []
        for beat in sinks[p].items:
            current.append((int(beat.data), int(beat.keep), beat.first, beat.last))
            if beat.last:
                got.append(frame_from_beats(current, 64))
                current = []
        assert not current
        assert got == expected[p], f"plane {p}"
    assert strobes["frame"] == 24
    for name in ("lost", "killed", "trimmed"):
        assert strobes[name] == counts.get(name, 0)
    if kill:
        assert not sinks[1].items and counts["killed"] == 12


def test_delay_line_holds_each_beat():
    delay = 9
    dut = S.DelayLine(data_width=64, delay=delay, depth=16)
    times = {}

    async def bench(ctx):
        ctx.set(dut.o.ready, 1)
        for n in range(5):
            ctx.set(dut.i.payload, {"data": n, "keep": 0xFF, "first": 1, "last": 1})
            ctx.set(dut.i.valid, 1)
            await ctx.tick().until(dut.i.ready)
            times.setdefault(("in", n), cycle[0])
            ctx.set(dut.i.valid, 0)
            for _ in range(3):
                await ctx.tick()
        for _ in range(40):
            await ctx.tick()

    cycle = [0]

    async def watch(ctx):
        while True:
            _, _, valid, ready, payload = await ctx.tick().sample(dut.o.valid, dut.o.ready,
                                                                 dut.o.payload)
            cycle[0] += 1
            if valid and ready:
                times[("out", int(payload.data))] = cycle[0]

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_process(watch)
    sim.add_testbench(bench)
    sim.run()
    waits = {times[("out", n)] - times[("in", n)] for n in range(5)}
    # Every beat waits the same: the delay plus the FIFO's fixed latency.
    assert len(waits) == 1 and delay <= waits.pop() <= delay + 3


@pytest.mark.parametrize("seed", [1, 2])
def test_delay_line_keeps_order_and_delay_under_bubbles_and_backpressure(seed):
    """Random input bubbles and output backpressure: every beat leaves once, in order, and
    never before ``delay`` cycles after it entered (the head waits in a register)."""
    delay, count = 6, 40
    rng = random.Random(seed)
    dut = S.DelayLine(data_width=64, delay=delay, depth=8)
    entered, left = {}, []
    cycle = [0]

    async def clock(ctx):
        while True:
            await ctx.tick()
            cycle[0] += 1

    async def source(ctx):
        for n in range(count):
            while rng.random() < 0.3:
                await ctx.tick()
            ctx.set(dut.i.payload, {"data": n, "keep": 0xFF, "first": 1, "last": 1})
            ctx.set(dut.i.valid, 1)
            await ctx.tick().until(dut.i.ready)
            entered[n] = cycle[0]
            ctx.set(dut.i.valid, 0)

    async def sink(ctx):
        while len(left) < count:
            ctx.set(dut.o.ready, rng.random() < 0.6)
            _, _, valid, ready, payload = await ctx.tick().sample(dut.o.valid, dut.o.ready,
                                                                 dut.o.payload)
            if valid and ready:
                left.append((int(payload.data), cycle[0]))

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_process(clock)
    sim.add_testbench(source)
    sim.add_testbench(sink)
    sim.run_until(2e-3)             # 2,000 cycles; the beats need about 150
    assert [n for n, _ in left] == list(range(count))
    assert all(at - entered[n] >= delay for n, at in left)


# ---------------------------------------------------------------------------------------------
# Checker
# ---------------------------------------------------------------------------------------------

def test_checker_flags_corruption():
    """Good packets count as received; a flipped payload byte, header field or length as bad."""
    config = NicConfig(ports=2, mtu=512)
    max_payload = 32
    dut = S.PayloadChecker(config=config, max_payload=max_payload)
    from sim.rtlpackets import payload_beats
    beats = []
    kinds = []
    for n in range(12):
        psn = D.INITIAL_PSN + n
        header = selftest_header(psn, n % 2, config, max_payload)
        payload = bytearray(S.payload_pattern(psn, 64, max_payload))
        kind = ("good", "payload", "header", "length")[n % 4]
        if kind == "payload":
            payload[len(payload) // 2] ^= 0x10
        elif kind == "header":
            header["bth"]["dqpn"] ^= 1
        elif kind == "length":
            header["reth"]["dma_len"] += 1
        kinds.append(kind)
        for d, k, f, la in payload_beats(payload, 64):
            beats.append({"header": header, "data": d, "keep": k, "first": f, "last": la})
    driver = StreamDriver(dut.i, bubbles=0.3, seed=5)
    driver.send(beats)

    async def bench(ctx):
        for _ in range(500):
            await ctx.tick()
        assert ctx.get(dut.received) == kinds.count("good")
        assert ctx.get(dut.bad) == len(kinds) - kinds.count("good")

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_process(driver.process)
    sim.add_testbench(bench)
    sim.run()


# ---------------------------------------------------------------------------------------------
# The whole self-test
# ---------------------------------------------------------------------------------------------

def run_selftest(dut, *, cycles, divisor, kill=0):
    """Run the self-test; return final counters, B's packets and the UART lines."""
    levels = []
    packets = []
    result = {}
    rx = dut.engines.rx_packets

    async def monitor(ctx):
        # Sampling only the fields the checks need keeps the simulation fast.
        current = []
        async for _, _, tx, valid, ready, data, keep, last, psn, trimmed in ctx.tick().sample(
                dut.uart_tx, rx.valid, rx.ready, rx.p.data, rx.p.keep, rx.p.last,
                rx.p.header.bth.psn, rx.p.header.trimmed):
            levels.append(tx)
            if valid and ready:
                current.append((data, keep, psn, trimmed))
                if last:
                    packets.append(current)
                    current = []

    async def bench(ctx):
        ctx.set(dut.kill, kill)
        await ctx.tick().repeat(cycles)
        counters = ctx.get(dut.counters)
        result.update(zip(dut.counter_names, (int(counters[n]) for n in
                                              range(len(dut.counter_names))), strict=True))

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_process(monitor)
    sim.add_testbench(bench)
    sim.run()
    text = decode_uart(levels, divisor).decode()
    return result, packets, [line for line in text.split("\r\n") if line.startswith("MRC")]


@pytest.mark.parametrize("kill", [0, 0b10])
def test_selftest_passes_in_simulation(kill):
    """received + trimmed = sent - lost - killed, no bad packets, no parser drops, every
    received payload equals the Python pattern of its PSN, a killed plane passes nothing, and
    the UART line reports the counters."""
    config = NicConfig(ports=2, mtu=256, clock_hz=1_000_000)
    max_payload = 64
    divisor = 2
    dut = S.SelfTest(config=config, max_payload=max_payload, packet_limit=16,
                     report_period=100_000, baud=500_000, loss_rate=40, trim_rate=40)
    counters, packets, lines = run_selftest(dut, cycles=1800, divisor=divisor, kill=kill)
    assert counters["sent"] == 16
    assert counters["bad"] == counters["dropped"] == counters["txerr"] == 0
    assert counters["accepted"] == counters["sent"] - counters["lost"] - counters["killed"]
    assert counters["received"] + counters["trimmed"] == counters["accepted"]
    assert counters["pass0"] + counters["pass1"] == counters["accepted"]
    assert counters["lost"] > 0 and counters["trimmed"] > 0
    if kill:
        assert counters["pass1"] == 0 and counters["killed"] == 8
    else:
        assert counters["killed"] == 0
    assert len(packets) == counters["accepted"]
    for beats in packets:
        _, _, psn, trimmed = beats[0]
        got = frame_from_beats([(data, keep) for data, keep, _, _ in beats], 64)
        if trimmed:
            assert got == b""
        else:
            assert got == S.payload_pattern(psn, 64, max_payload)
    # The UART line that starts at reset carries the reset values, all zero.
    # (the run ends while it is still being sent).
    full = "MRC" + "".join(f" {n}=00000000" for n in dut.counter_names)
    assert len(lines) == 1 and len(lines[0]) > 60 and full.startswith(lines[0])


@pytest.mark.parametrize("backpressure", [0.0, 0.3])
def test_reporter_line_has_snapshot_values(backpressure):
    """One line per period with every value as 8 hex digits, snapshotted at the period start
    (values changing while the line is sent do not tear it)."""
    names = ("sent", "lost")
    dut = S.Reporter(names=names, period=600)
    sink = StreamCollector(dut.o, backpressure=backpressure, seed=7)

    async def bench(ctx):
        for cycle in range(1300):
            ctx.set(dut.values, [0x12345678 + cycle, 0xABCDEF00 + 2 * cycle])
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_process(sink.process)
    sim.add_testbench(bench)
    sim.run()
    text = bytes(int(c) for c in sink.items).decode()
    lines = text.split("\r\n")
    assert lines[0] == "MRC sent=12345678 lost=abcdef00"
    assert lines[1] == f"MRC sent={0x12345678 + 600:08x} lost={0xABCDEF00 + 1200:08x}"


def test_selftest_rejects_bad_parameters():
    config = NicConfig(ports=2, mtu=256)
    with pytest.raises(ValueError, match="max_payload must be a power of two"):
        S.SelfTest(config=config, max_payload=100)
    with pytest.raises(ValueError, match="delays must be a tuple of 2 plane delays"):
        S.SelfTest(config=config, delays=(1, 2, 3))
    with pytest.raises(ValueError, match="loss_rate must be an integer from 0 to 255"):
        S.SelfTest(config=config, loss_rate=300)


def run_network_selftest(dut, cycles, *, kill=None, on_cycle=None):
    """Run ``Ice40Selftest`` for ``cycles`` (``kill`` driven on its kill input,
    ``on_cycle(ctx, cycle)`` after each tick); return its counters by name."""
    result = {}

    async def bench(ctx):
        if kill is not None:
            ctx.set(dut.kill, kill)
        for cycle in range(cycles):
            await ctx.tick()
            if on_cycle is not None:
                on_cycle(ctx, cycle)
        counters = ctx.get(dut.counters)
        result.update(zip(ICE40_COUNTERS, (int(counters[n]) for n in range(6)), strict=True))

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return result


def test_ice40_selftest_passes_in_simulation():
    dut = Ice40Selftest(clock_hz=1_000_000, report_period=1000, baud=250_000, loss_rate=40,
                        trim_rate=40)
    result = run_network_selftest(dut, 1500, kill=0b01)
    done = result["received"] + result["trimmed"] + result["lost"] + result["killed"]
    assert result["bad"] == 0 and result["trimmed"] > 0 and result["lost"] > 0
    assert result["killed"] >= result["sent"] // 2 - 1
    # Frames still inside the fabric's delay lines or the checker: at most a few.
    assert 0 <= result["sent"] - done <= 3
    assert len(frame_template()) == S.SELFTEST_STACK_BYTES


def test_ci_top_selftest_passes_with_auto_kill():
    """The CI bitstream's gateware (``ecpix5-ci``: the network-level self-test with the
    ECPIX-5's automatic kill schedule; here with a short report period): plane 1 is killed
    during the fourth period only, and every frame is accounted for with none bad."""
    period = 400
    dut = Ice40Selftest(clock_hz=1_000_000, report_period=period, baud=250_000, loss_rate=40,
                        trim_rate=40, auto_kill=True)
    killed_at = []

    def watch(ctx, cycle):
        if ctx.get(dut.killed_planes):
            killed_at.append(cycle)

    result = run_network_selftest(dut, 5 * period + 200, on_cycle=watch)
    # One period in four, from a report tick (the first tick is at reset, so the first kill
    # period starts at the third tick); the kill register follows the tick by a cycle.
    assert killed_at and 2 * period <= killed_at[0] <= 2 * period + 5
    assert len(killed_at) == period and killed_at[-1] - killed_at[0] == period - 1
    done = result["received"] + result["trimmed"] + result["lost"] + result["killed"]
    assert result["bad"] == 0 and result["killed"] > 0 and result["trimmed"] > 0
    assert 0 <= result["sent"] - done <= 3


# ---------------------------------------------------------------------------------------------
# Board tops
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("board", sorted(BOARDS))
def test_board_top_elaborates(board):
    """Each top elaborates against its platform and asks for a clock and a UART pin."""
    entry = BOARDS[board]
    platform = entry.platform()
    requested = []
    request = platform.request

    def recording_request(name, number=0, **kwargs):
        requested.append(name)
        return request(name, number, **kwargs)
    platform.request = recording_request
    Fragment.get(entry.top(board), platform)
    assert "uart" in requested
    assert any(name.startswith(("led", "rgb_led")) for name in requested)
    # The engines run from the board's default clock, which carries a frequency constraint.
    assert platform.lookup(platform.default_clk).clock.frequency > 0


def test_engine_bench_elaborates():
    config = selftest_config(125e6)
    Fragment.get(EngineBench(config), None)


def test_cli_lists_boards_and_rejects_unknown(capsys):
    from boards.cli import main
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert all(board in out for board in BOARDS) and "engine-w64-q256" in out
    assert main(["synth-report", "--boards", "nope"]) == 2
    assert "board must be one of" in capsys.readouterr().err
    assert main(["synth-report", "--boards", "", "--benches", "nope"]) == 2


def test_report_reader_parses_nextpnr_output(tmp_path):
    """The report entry takes BEL counts and fmax from report.json and the critical path's
    ends from the log."""
    import json

    from boards.build import read_report
    (tmp_path / "report.json").write_text(json.dumps({
        "utilization": {"TRELLIS_COMB": {"used": 10, "available": 20},
                        "DP16KD": {"used": 1, "available": 208}},
        "fmax": {"clk": {"achieved": 130.123, "constraint": 125.0}}}))
    (tmp_path / "top.tim").write_text(
        "Info: Critical path report for clock 'clk' (posedge -> posedge):\n"
        "Info:       type curr  total name\n"
        "Info:   clk-to-q  0.31  0.31 Source a.b_FF.Q\n"
        "Info:    routing  1.00  1.31 Net x\n"
        "Info:                          Sink c.d_FF.DI\n"
        "Info: 0.31 ns logic, 1.00 ns routing\n"
        "\n")
    report = read_report(tmp_path)
    assert report["resources"] == {"lut": {"used": 10, "available": 20},
                                   "bram": {"used": 1, "available": 208}}
    assert report["fmax"] == {"clk": {"achieved_mhz": 130.12, "constraint_mhz": 125.0}}
    path = report["critical_path"]["clk"]
    assert (path["from"], path["to"]) == ("a.b_FF.Q", "c.d_FF.DI")
    assert path["summary"] == "0.31 ns logic, 1.00 ns routing"


class TinyTable(wiring.Component):
    """A per-QP table the size of ``config.qps`` for the scaling flow's own test."""

    def __init__(self, *, config):
        self._qps = config.qps
        super().__init__({"addr": In(config.qpn_bits), "data": In(36), "we": In(1),
                          "q": Out(36)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.table = table = Memory(shape=36, depth=self._qps, init=[])
        write, read = table.write_port(), table.read_port()
        m.d.comb += [write.addr.eq(self.addr), write.data.eq(self.data), write.en.eq(self.we),
                     read.addr.eq(self.addr + 1), self.q.eq(read.data)]
        return m


def test_scaling_synth_maps_tables_and_merges_report(tmp_path, monkeypatch):
    """A per-QP table lands in DP16KD at 1024 entries; the entry says synth only; the report
    keeps earlier entries of other builds and replaces its own."""
    import json

    from boards import build as B
    monkeypatch.setitem(B.SCALING_BLOCKS, "tiny", ("tests.boards.test_boards", "TinyTable"))
    out = tmp_path / "report.json"
    out.write_text(json.dumps({"results": [{"kind": "board", "board": "ecpix5"},
                                           {"kind": "scaling", "label": "tiny-q1024", "old": 1}]}))
    monkeypatch.setattr(B, "BUILD", tmp_path)
    document = B.scaling_report(blocks=["tiny"], qps=[1024], out=out, log=lambda _: None)
    assert [e.get("board") or e.get("label") for e in document["results"]] == \
        ["ecpix5", "tiny-q1024"]
    entry = document["results"][1]
    assert entry["stage"] == "synth" and entry["qps"] == 1024 and "old" not in entry
    assert entry["memories"] == [{"memory": "top.table", "mapped": "DP16KD", "width": 36,
                                  "depth": 1024, "kbits": 36.0, "dp16kd_estimate": 2}]
    assert entry["resources"]["dp16kd"] == 2 and entry["fits"]
    assert json.loads(out.read_text()) == document


class Echo(wiring.Component):
    """Two inputs echoed on one output (the block bench's own test)."""

    a: In(5)
    b: In(3)
    y: Out(8)

    def elaborate(self, platform):
        m = Module()
        m.d.comb += self.y.eq(Cat(self.a, self.b))
        return m


def test_block_bench_scans_every_input_and_folds_every_output():
    """The bench's chain drives every input bit of the block (the last bit shifted in is the
    first input's bit 0) and its MISR signature depends on every output bit."""
    from boards.tops import BlockBench
    with pytest.raises(TypeError, match="block must be a wiring.Component, not 1"):
        BlockBench(1)
    with pytest.raises(ValueError, match="name must be an identifier, not 'a b'"):
        BlockBench(Echo(), name="a b")

    def run(bits):
        bench = BlockBench(Echo(), name="echo")
        seen = {"inputs": [], "signature": []}

        async def drive(ctx):
            for bit in bits:
                ctx.set(bench.scan_in, bit)
                await ctx.tick()
                seen["inputs"].append((ctx.get(bench.block.a), ctx.get(bench.block.b)))
            for _ in range(8):
                ctx.set(bench.scan_in, 0)
                await ctx.tick()
                seen["signature"].append(ctx.get(bench.scan_out))
        sim = Simulator(bench)
        sim.add_clock(1e-6)
        sim.add_testbench(drive)
        sim.run()
        return seen

    rng = random.Random(5)
    bits = [rng.getrandbits(1) for _ in range(8)]
    seen = run(bits)
    chain = int("".join(map(str, bits)), 2)
    assert seen["inputs"][-1] == (chain & 0x1F, chain >> 5)
    # Flipping any one input bit (so one output bit in one cycle) changes the signature.
    for n in range(len(bits)):
        other = list(bits)
        other[n] ^= 1
        assert run(other)["signature"] != seen["signature"], n


def test_scaling_place_skips_blocks_that_do_not_fit(tmp_path, monkeypatch):
    """``--place`` places and routes only the QP counts Yosys says fit the 85F; the others get
    an entry that says why they were not placed."""
    from boards import build as B
    placed = []

    def fake_synth(block, qps, **_):
        fits = qps <= 64
        return {"kind": "scaling", "stage": "synth", "label": f"{block}-q{qps}", "qps": qps,
                "resources": {"dp16kd": 100 if fits else 240}, "fits": fits}

    def fake_place(block, qps, *, timeout=None, **_):
        placed.append((block, qps, timeout))
        return {"kind": "scaling", "stage": "pnr", "label": f"{block}-q{qps}-pnr"}
    monkeypatch.setattr(B, "synth_block", fake_synth)
    monkeypatch.setattr(B, "place_block", fake_place)
    document = B.scaling_report(blocks=["requester"], qps=[64, 256], out=tmp_path / "r.json",
                                log=lambda _: None, place=True, timeout=60)
    assert placed == [("requester", 64, 60)]
    labels = [e["label"] for e in document["results"]]
    assert labels == ["requester-q64", "requester-q64-pnr", "requester-q256",
                      "requester-q256-pnr"]
    assert document["results"][3]["error"] == (
        "not placed: does not fit the LFE5UM5G-85F (Yosys: 240 DP16KD of 208)")


def test_scaling_memory_log_parser():
    from boards.build import _yosys_memories
    log = ("mapping memory top.qp_mem via $__TRELLIS_DPR16X4_\n"
           "mapping memory top.big via $__DP16KD_\n"
           "using FF mapping for memory top.regs\n"
           "no valid mapping found for memory top.odd\n")
    assert _yosys_memories(log) == [
        {"memory": "top.qp_mem", "mapped": "TRELLIS_DPR16X4"},
        {"memory": "top.big", "mapped": "DP16KD"},
        {"memory": "top.regs", "mapped": "FF"}, {"memory": "top.odd", "mapped": "FF"}]


def test_cli_scaling_rejects_bad_arguments(capsys):
    from boards.cli import main
    assert main(["synth-report", "--scaling", "--blocks", "nope"]) == 2
    assert "block must be one of requester, responder, path_select" in capsys.readouterr().err
    assert main(["synth-report", "--scaling", "--qps", "x"]) == 2
    assert main(["synth-report", "--scaling", "--blocks", "responder", "--qps", "100"]) == 2
    assert "NicConfig.qps" in capsys.readouterr().err
    assert main(["synth-report", "--place"]) == 2
    assert capsys.readouterr().err == ("mrc-nic boards synth-report: --place: places the "
                                       "scaling blocks: it needs --scaling\n")


def test_engine_pipeline_option():
    from hdl.packet.engine import PacketEngine
    config = NicConfig(ports=2)
    with pytest.raises(TypeError, match="pipeline must be a bool, not 1"):
        PacketEngine(config, pipeline=1)
    fragment = Fragment.get(PacketEngine(config), None)
    names = {name for _, name, _ in fragment.subfragments}
    assert {"rx_slice", "tx_slice"} <= names
    names = {name for _, name, _ in Fragment.get(PacketEngine(config, pipeline=False),
                                              None).subfragments}
    assert not {"rx_slice", "tx_slice"} & names


def test_partial_report_of_a_stopped_build(tmp_path):
    """A bench build stopped by its timeout is recorded as incomplete, with the utilisation and
    the last fmax estimate nextpnr logged."""
    from boards.build import _partial_report
    (tmp_path / "top.tim").write_text(
        "Info: Device utilisation:\n"
        "Info: \t          TRELLIS_COMB:   37826/  83640    45%\n"
        "Info: \t              DP16KD:       6/    208     2%\n"
        "Info: Max frequency for clock 'clk': 58.09 MHz (FAIL at 125.00 MHz)\n"
        "Info: Routing..\n"
        "Info:     312000 |   106846     204737 |  490   500 |     94137|       3.13    1628.73|\n")
    report = _partial_report(tmp_path, 40 * 60)
    assert report["complete"] is False
    assert report["resources"] == {"lut": {"used": 37826, "available": 83640},
                                   "bram": {"used": 6, "available": 208}}
    assert report["fmax"] == {"clk": {"achieved_mhz_estimate": 58.09, "constraint_mhz": 125.0}}
    assert "stopped after 40 min during routing (94137 overused wires left)" in report["note"]


# ---------------------------------------------------------------------------------------------
# PLL
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("clki, clkop, expected", [
    # ecppll's own choices, from files it generated (12 -> 16, 48 -> 160, 25 -> 168.75 MHz).
    (12e6, 16e6, (3, 4, 37)), (48e6, 160e6, (3, 10, 4)), (25e6, 168.75e6, (4, 27, 4)),
    # The boards' oscillators to the engine's 125 MHz.
    (100e6, 125e6, (4, 5, 5)), (25e6, 125e6, (1, 5, 5)),
])
def test_pll_dividers_match_ecppll_and_keep_the_limits(clki, clkop, expected):
    clki_div, clkfb_div, clkop_div, achieved = ecp5_pll_dividers(clki, clkop)
    assert (clki_div, clkfb_div, clkop_div) == expected and achieved == pytest.approx(clkop)
    pfd = clki / clki_div
    assert PFD_HZ[0] <= pfd <= PFD_HZ[1] and VCO_HZ[0] <= achieved * clkop_div <= VCO_HZ[1]
    assert achieved == pytest.approx(pfd * clkfb_div)


@pytest.mark.parametrize("clki, clkop, message", [
    (5e6, 125e6, "clki_hz must be from 8 to 400 MHz"),
    (100e6, 500e6, "clkop_hz must be from 3.125 to 400 MHz"),
    (100e6, "125", "clkop_hz must be from"),
])
def test_pll_frequencies_out_of_range_are_refused_by_name(clki, clkop, message):
    with pytest.raises(ValueError, match=message):
        ecp5_pll_dividers(clki, clkop)


def test_pll_refuses_a_frequency_it_can_only_approach():
    platform = ECPIX585Platform()
    port = platform.request("clk100", dir="-")
    with pytest.raises(ValueError, match=r"clkop_hz: the ECP5 PLL makes 12\.5 MHz at best"):
        Ecp5Pll(port, clki_hz=100e6, clkop_hz=12.3456e6)


def test_ecpix5_125_top_runs_the_selftest_at_125_mhz_from_the_pll():
    platform = ECPIX585Platform()
    top = BOARDS["ecpix5-125"].top("ecpix5-125")
    fragment = Fragment.get(top, platform)
    plls = [sub for _, sub in _walk(fragment) if isinstance(sub, Instance)
            and sub.type == "EHXPLLL"]
    assert len(plls) == 1
    params = plls[0].parameters
    assert (params["CLKI_DIV"], params["CLKFB_DIV"], params["CLKOP_DIV"]) == (4, 5, 5)
    assert params["FEEDBK_PATH"] == "CLKOP"
    # The self-test's UART divider and report period follow the PLL's clock ...
    selftest = next(origin for origins, _ in _walk(fragment) for origin in origins
                    if isinstance(origin, S.SelfTest))
    assert selftest._config.clock_hz == 125_000_000
    # ... whose constraint nextpnr derives from the oscillator's 100 MHz and the dividers (a
    # constraint on the domain's clock signal would name a net synthesis renames).
    assert {f for *_, f in platform.iter_port_clock_constraints()} == {100e6}
    assert not list(ResourceManager.iter_signal_clock_constraints(platform))
    assert plls[0].attrs["FREQUENCY_PIN_CLKOP"] == "125"
    # The plain ``ecpix5`` and ``versa`` self-tests run from the 100 MHz oscillator, no PLL.
    for name, platform_class in (("ecpix5", ECPIX585Platform), ("versa", VersaECP5Platform)):
        fragment = Fragment.get(BOARDS[name].top(name), platform_class())
        assert not [sub for _, sub in _walk(fragment) if isinstance(sub, Instance)
                    and sub.type == "EHXPLLL"]
        selftest = next(origin for origins, _ in _walk(fragment) for origin in origins
                        if isinstance(origin, S.SelfTest))
        assert selftest._config.clock_hz == 100_000_000


def test_ulx3s_top_runs_the_selftest_at_50_mhz_from_the_pll():
    """The ULX3S's 25 MHz oscillator feeds the PLL; the self-test (UART divisor, report period)
    runs at the PLL's 50 MHz, whose constraint nextpnr derives from the 25 MHz pin."""
    platform = ULX3S_85F_Platform()
    fragment = Fragment.get(BOARDS["ulx3s"].top("ulx3s"), platform)
    plls = [sub for _, sub in _walk(fragment) if isinstance(sub, Instance)
            and sub.type == "EHXPLLL"]
    assert len(plls) == 1
    params = plls[0].parameters
    assert (params["CLKI_DIV"], params["CLKFB_DIV"], params["CLKOP_DIV"]) == (1, 2, 12)
    assert plls[0].attrs["FREQUENCY_PIN_CLKOP"] == "50"
    assert {f for *_, f in platform.iter_port_clock_constraints()} == {25e6}
    selftest = next(origin for origins, _ in _walk(fragment) for origin in origins
                    if isinstance(origin, S.SelfTest))
    assert selftest._config.clock_hz == ULX3S_HZ == 50_000_000


def test_pll_drives_the_sync_reset_through_a_global_buffer():
    """The reset fans out to every ``sync`` flip-flop's LSR: a DCCA puts it on a global network
    (nextpnr promotes only clocks by itself). The DCCA passes LockReset's output unchanged, so
    reset still leaves every flip-flop on the same edge; ``global_reset=False`` wires it
    directly. The 100 MHz tops have no PLL and no such buffer."""
    platform = ECPIX585Platform()
    port = platform.request("clk100", dir="-")
    for global_reset in (True, False):
        pll = Ecp5Pll(port, clki_hz=100e6, clkop_hz=125e6, global_reset=global_reset)
        fragment = Fragment.get(pll, platform)
        cd_sync = fragment.domains["sync"]
        lock_reset = next(origin for origins, _ in _walk(fragment) for origin in origins
                          if isinstance(origin, LockReset))
        buffers = [sub for _, sub in _walk(fragment) if isinstance(sub, Instance)
                   and sub.type == "DCCA"]
        direct = [stmt for stmt in fragment.statements.get("comb", ())
                  if stmt.lhs is cd_sync.rst]
        if global_reset:
            assert len(buffers) == 1 and not direct
            ports = buffers[0].ports
            assert ports["CLKI"][0] is lock_reset.rst and ports["CLKI"][1] == "i"
            assert ports["CLKO"][0] is cd_sync.rst and ports["CLKO"][1] == "o"
            assert ports["CE"][0].value == 1 and ports["CE"][1] == "i"
        else:
            assert not buffers
            assert len(direct) == 1 and direct[0].rhs is lock_reset.rst
    fragment = Fragment.get(BOARDS["ecpix5-125"].top("ecpix5-125"), ECPIX585Platform())
    assert len([sub for _, sub in _walk(fragment) if isinstance(sub, Instance)
                and sub.type == "DCCA"]) == 1
    fragment = Fragment.get(BOARDS["ecpix5"].top("ecpix5"), ECPIX585Platform())
    assert not [sub for _, sub in _walk(fragment) if isinstance(sub, Instance)
                and sub.type == "DCCA"]
    with pytest.raises(TypeError, match="global_reset must be a bool, not 1"):
        Ecp5Pll(port, clki_hz=100e6, clkop_hz=125e6, global_reset=1)


def _walk(fragment):
    """``(origins, fragment)`` of every fragment under ``fragment`` (origins: the
    elaboratables that made it)."""
    for sub, _, _ in fragment.subfragments:
        yield tuple(getattr(sub, "origins", None) or ()), sub
        if not isinstance(sub, Instance):
            yield from _walk(sub)


def test_lock_reset_holds_until_cycles_after_lock_and_again_on_loss():
    dut = LockReset(cycles=2)
    trace = []

    async def bench(ctx):
        for locked in [0] * 3 + [1] * 5 + [0] + [1] * 4:
            ctx.set(dut.locked, locked)
            await ctx.tick()
            trace.append(ctx.get(dut.rst))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    # Out of reset on the second edge after LOCK; back in reset on the edge that sees it
    # fall, out again two edges after it returns.
    assert trace == [1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0]
    with pytest.raises(ValueError, match="cycles must be an integer from 1 to 16, not 0"):
        LockReset(cycles=0)


@pytest.mark.parametrize("router", [None, "router2"])
def test_board_builds_pass_their_router_to_nextpnr(tmp_path, router):
    """The 125 MHz ECPIX-5 self-test routes with router2 (router1 did not converge there); the
    flow hands a board's router to nextpnr, and only then. The 100 MHz tops keep nextpnr's
    default, router1, which gives them the higher fmax (docs/boards.md)."""
    from boards.build import _platform_build
    seen = {}

    class Platform:
        def build(self, top, **options):
            seen.update(options)
            raise RuntimeError("stop here")

    with pytest.raises(Exception, match="stop here"):
        _platform_build(Platform(), None, tmp_path, seed=1, allow_timing_fail=False,
                        family="ecp5", router=router)
    assert ("--router router2" in seen["nextpnr_opts"]) is (router == "router2")
    assert "--router" not in seen["nextpnr_opts"] or router
    assert BOARDS["ecpix5-125"].router == "router2"
    assert all(BOARDS[name].router is None for name in ("ecpix5", "ecpix5-ci", "versa"))
