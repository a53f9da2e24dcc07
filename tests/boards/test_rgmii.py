# amaranth: UnusedElaboratable=no
"""A NIC plane on a real port: the GMII port (MACs and clock crossings) with its GMII looped
back, alone in the Amaranth simulator and under the whole NIC in Verilator, and the ECP5
RGMII I/O elaborated against the ECPIX-5."""

import random

import pytest
from amaranth import Fragment, Instance, Module, Signal
from amaranth.sim import Simulator
from amaranth_boards.ecpix5 import ECPIX585Platform
from scapy.layers.inet import UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from boards import transport as T
from boards.rgmii import ETH_HZ, PORT_COUNTERS, RX_DELAY_TAPS, Ecp5Rgmii, GmiiPort
from boards.tops import BOARDS
from sim.rtlpackets import frame_beats
from sim.tb.selftest import SelfTestBench, run_selftest_rtl
from tests.boards.test_boards import _walk


def looped_port(*, corrupt_frame=None):
    """A GmiiPort whose GMII output is its input; with ``corrupt_frame`` = n, one data bit
    of the n-th frame on the wire (counting from 0) is flipped 40 bytes in."""
    m = Module()
    m.submodules.port = port = GmiiPort(data_width=64)
    frame = Signal(8)
    byte = Signal(16)
    was_en = Signal()
    m.d.eth += was_en.eq(port.tx_en)
    with m.If(port.tx_en):
        m.d.eth += byte.eq(byte + 1)
    with m.Elif(was_en):
        m.d.eth += [byte.eq(0), frame.eq(frame + 1)]
    flip = Signal()
    if corrupt_frame is not None:
        m.d.comb += flip.eq((frame == corrupt_frame) & (byte == 40))
    m.d.comb += [port.rxd.eq(port.txd ^ flip), port.rx_dv.eq(port.tx_en),
                 port.rx_er.eq(port.tx_er)]
    return m, port


def test_gmii_port_carries_frames_across_the_clock_domains():
    """Scapy frames into ``tx`` (``sync``, 50 MHz, random bubbles) come back on ``rx``
    (random backpressure) through both MACs and both clock crossings (``eth``, 125 MHz); a
    frame with a bit flipped on the wire is dropped and counted, the others are intact."""
    rng = random.Random(3)
    frames = [bytes(Ether(src="02:00:00:00:00:0a", dst="02:00:00:00:00:0b") / IPv6() /
                    UDP(sport=rng.randrange(1 << 16), dport=4791) /
                    Raw(bytes(rng.randrange(256) for _ in range(rng.randrange(10, 700)))))
              for _ in range(8)]
    m, port = looped_port(corrupt_frame=3)
    received = []
    result = {}

    async def source(ctx):
        for frame in frames:
            for data, keep, first, last in frame_beats(frame, 64):
                while rng.random() < 0.3:
                    ctx.set(port.tx.valid, 0)
                    await ctx.tick()
                ctx.set(port.tx.valid, 1)
                ctx.set(port.tx.p.data, data)
                ctx.set(port.tx.p.keep, keep)
                ctx.set(port.tx.p.first, first)
                ctx.set(port.tx.p.last, last)
                await ctx.tick().until(port.tx.ready)
            ctx.set(port.tx.valid, 0)

    async def collect(ctx):
        current = bytearray()
        async for _, _, valid, ready, data, keep, last in ctx.tick().sample(
                port.rx.valid, port.rx.ready, port.rx.p.data, port.rx.p.keep, port.rx.p.last):
            if valid and ready:
                current += bytes((data >> (8 * n)) & 0xFF for n in range(8) if keep >> n & 1)
                if last:
                    received.append(bytes(current))
                    current = bytearray()

    async def sink(ctx):
        for _ in range(40_000):
            ctx.set(port.rx.ready, rng.random() > 0.3)
            await ctx.tick()
            if len(received) == len(frames) - 1:
                break
        await ctx.tick().repeat(50)
        counters = ctx.get(port.counters)
        result.update(zip(PORT_COUNTERS, (int(counters[n]) for n in range(3)), strict=True))

    sim = Simulator(m)
    sim.add_clock(20e-9, domain="sync")
    sim.add_clock(8e-9, domain="eth")
    sim.add_testbench(source, background=True)
    sim.add_process(collect)
    sim.add_testbench(sink)
    sim.run()
    assert received == frames[:3] + frames[4:]
    assert result == {"tx_frames": 8, "rx_frames": 7, "rx_dropped": 1}


def run_external_plane(*, cycles, dead):
    """The whole NIC (50 MHz) with plane 0 through the on-chip fabric and plane 1 on the GMII
    port, its GMII looped back (125 MHz); ``dead``: plane 1's frames go nowhere instead (its
    ``ext_tx`` always ready, nothing on its ``ext_rx``) and the port stays idle. Under
    Verilator (sim/tb/selftest.py: thousands of cycles of a whole NIC); ``dead`` is a knob,
    so both kinds of run share one build. Returns the :class:`SelfTestRun`."""
    config = T.transport_config(50_000_000)

    def make():
        m = Module()
        m.submodules.selftest = dut = T.TransportSelfTest(
            config=config, loss_rate=0, report_period=5000, baud=config.clock_hz // 2,
            wr_limit=24, external_planes=(1,), extra_counters=PORT_COUNTERS)
        m.submodules.loop, port = looped_port()
        drain = Signal()
        tx, rx = dut.ext_tx[0], dut.ext_rx[0]
        m.d.comb += [port.tx.p.eq(tx.p), port.tx.valid.eq(tx.valid & ~drain),
                     tx.ready.eq(port.tx.ready | drain),
                     rx.p.eq(port.rx.p), rx.valid.eq(port.rx.valid & ~drain),
                     port.rx.ready.eq(rx.ready | drain),
                     dut.extra.eq(port.counters)]
        return SelfTestBench(m, dut, knobs={"dead": drain}), dut

    return run_selftest_rtl(make, name="transport_external_plane", cycles=cycles, params=(),
                            period_ns=20, eth_period_ns=8, knobs={"dead": int(dead)})


def test_transport_selftest_with_a_plane_on_the_gmii_port():
    """The whole NIC with plane 1 through the MACs and clock crossings (GMII looped back at
    125 MHz, NIC at 50 MHz) and plane 0 through the on-chip fabric: every work request
    completes and checks, and the port carried frames both ways, none dropped."""
    config = T.transport_config(50_000_000)
    result = run_external_plane(cycles=9_000, dead=False).counters
    assert result["script"] == 1
    assert result["posted"] == result["completed"] == 24
    assert result["bad"] == 0 and result["dropped"] == 0 and result["rx_dropped"] == 0
    assert result["tx_frames"] > 10 and result["rx_frames"] == result["tx_frames"]
    assert result["placed"] >= sum(T.wr_length(n, config.mtu) for n in range(24))


def test_transport_selftest_survives_a_dead_external_plane():
    """Nothing on the port (every frame sent on plane 1 vanishes, nothing comes back): the
    NIC moves its traffic onto plane 0 and every work request still completes and checks."""
    run = run_external_plane(cycles=14_000, dead=True)
    result = {**run.counters, "sent_on_plane1": run.ext_frames}
    assert result["sent_on_plane1"] > 0
    assert result["posted"] == result["completed"] == 24
    assert result["bad"] == 0 and result["retx"] > 0


def test_ecp5_rgmii_uses_ddr_io_and_input_delays():
    """The ECPIX-5 RGMII top: five receive pins each through a DELAYF of RX_DELAY_TAPS and an
    IDDRX1F, six transmit pins (four data, control, clock) each from an ODDRX1F, all
    clocked by the PHY's receive clock."""
    platform = ECPIX585Platform()
    fragment = Fragment.get(BOARDS["ecpix5-rgmii"].top("ecpix5-rgmii"), platform)
    instances = [sub for _, sub in _walk(fragment) if isinstance(sub, Instance)]
    kinds = [sub.type for sub in instances]
    assert kinds.count("IDDRX1F") == 5 and kinds.count("ODDRX1F") == 6
    delays = [sub for sub in instances if sub.type == "DELAYF"]
    assert len(delays) == 5
    assert {sub.parameters["DEL_VALUE"] for sub in delays} == {f"DELAY{RX_DELAY_TAPS}"}
    selftest = next(origin for origins, _ in _walk(fragment) for origin in origins
                    if isinstance(origin, T.TransportSelfTest))
    assert selftest.counter_names[-3:] == PORT_COUNTERS
    # nextpnr times the eth domain by the receive clock pin's 125 MHz.
    assert ETH_HZ in {f for *_, f in platform.iter_port_clock_constraints()}


def test_port_and_phy_reject_bad_parameters():
    with pytest.raises(ValueError, match="fifo_depth must be a power of two"):
        GmiiPort(fifo_depth=6)
    with pytest.raises(ValueError, match="max_frame"):
        GmiiPort(max_frame=10)
    with pytest.raises(ValueError, match="rx_delay_taps must be an integer from 0 to 127"):
        Ecp5Rgmii(None, rx_delay_taps=128)
    with pytest.raises(ValueError, match="external_planes"):
        T.TransportSelfTest(config=T.transport_config(50_000_000), external_planes=(0, 1))
