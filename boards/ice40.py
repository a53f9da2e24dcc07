"""The reduced self-test for the iCEBreaker (iCE40UP5K, 5,280 logic cells).

The packet engines do not fit an UP5K (the parser alone is ~16k LUT4 at W = 64), so this top
keeps the parts of the self-test that do, at the network level::

    FrameSource ─ 2 planes ─► ImpairedFabric ─► PortArbiter ─► FrameChecker ─► counters
    (self-test frames,         (kill, loss, trim   (the NIC's     (lengths, trim
     counting payload)          and delay lines)    own arbiter)   marking, payload)
                                                                   └─► Reporter ─► UART

What it contains: :class:`FrameSource` (frames of the self-test stack, header bytes from the
same template the header builder produces, with the PSN filled in, a counting-byte payload,
no ICRC: the 4 ICRC bytes are zero), the fabric of :mod:`boards.selftest` (identical
gateware, W = 64, two planes), :class:`~hdl.packet.ports.PortArbiter`, :class:`FrameChecker`
(frame length, trim marking, payload bytes), the :class:`~boards.selftest.Reporter` and
:class:`~boards.uart.UARTTx`. What it leaves out: the parser, the header builder and the
CRC-32 units (no ICRC is computed or checked).
"""

from ipaddress import IPv6Address

from amaranth import *
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from hdl import protocol as P
from hdl.config import NicConfig
from hdl.packet import layouts as L
from hdl.packet.headers import PacketKind, net_beat_layout
from hdl.packet.ports import PortArbiter
from hdl.util import validating
from sim import defaults as D

from .selftest import (
    IPV6_OFFSET,
    SELFTEST_HEADERS,
    SELFTEST_OPCODE,
    SELFTEST_STACK_BYTES,
    ImpairedFabric,
    Reporter,
    trimmed_frame_bytes,
)
from .uart import UARTTx

__all__ = ["frame_template", "PSN_OFFSET", "FrameSource", "FrameChecker", "Ice40Selftest",
           "Ice40Top", "ICE40_COUNTERS"]

DATA_WIDTH = 64
LANES = DATA_WIDTH // 8
#: Byte offset of the BTH PSN (24 bits, big-endian) in a self-test frame.
PSN_OFFSET = (SELFTEST_STACK_BYTES - L.headers_size(SELFTEST_HEADERS) - L.BTH.size
              + L.BTH.byte_offset("psn"))
ICE40_PAYLOAD = 64


def frame_template(payload_bytes=ICE40_PAYLOAD):
    """The header bytes of a self-test frame with PSN 0, as the header builder makes them."""
    from sim.rtlpackets import packet_from_header
    config = NicConfig(ports=2, mtu=512)
    header = {
        "kind": PacketKind.DATA, "payload_len": payload_bytes,
        "eth_dst": int(D.NIC_B.mac.replace(":", ""), 16),
        "eth_src": int(D.NIC_A.mac.replace(":", ""), 16),
        "ipv6": 1, "ip_src": int(IPv6Address(D.NIC_A.ipv6)),
        "ip_dst": int(IPv6Address(D.NIC_B.ipv6)), "hop_limit": 64, "udp_sport": 0xC000,
        "bth": {"opcode": SELFTEST_OPCODE, "dqpn": D.QPN_B, "psn": 0, "ackreq": 1,
                "pkey": 0xFFFF, "ts": 1},
        "meth": {},
        "tseth": {"ftype": P.Ftype.TIMESTAMP},
        "reth": {"va": D.MR_BASE, "rkey": D.MR_RKEY, "dma_len": payload_bytes},
    }
    frame = bytes(packet_from_header(header, bytes(payload_bytes), config))
    return frame[:SELFTEST_STACK_BYTES]


def _frame_bytes():
    return SELFTEST_STACK_BYTES + ICE40_PAYLOAD + P.ICRC_BYTES


class FrameSource(wiring.Component):
    """Self-test frames on two planes, alternating; payload byte i of PSN p is ``p + i``
    (mod 256). One beat per cycle while the plane's output is ready.

    Members
    -------
    o : ``Out(stream.Signature(net_beat_layout(64))).array(2)``
    sent : ``Out(32)``
    """

    def __init__(self):
        self._template = frame_template()
        super().__init__({
            "o": Out(stream.Signature(net_beat_layout(DATA_WIDTH))).array(2),
            "sent": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        frame_bytes = _frame_bytes()
        beats = (frame_bytes + LANES - 1) // LANES
        beat = Signal(range(beats))
        psn = Signal(24, init=D.INITIAL_PSN)
        plane = Signal()

        data = Signal(DATA_WIDTH)
        with m.Switch(beat):
            for b in range(beats):
                with m.Case(b):
                    for lane in range(LANES):
                        offset = b * LANES + lane
                        byte = data[8 * lane:8 * lane + 8]
                        if PSN_OFFSET <= offset < PSN_OFFSET + 3:
                            shift = 8 * (PSN_OFFSET + 2 - offset)
                            m.d.comb += byte.eq(psn[shift:shift + 8])
                        elif offset < SELFTEST_STACK_BYTES:
                            m.d.comb += byte.eq(self._template[offset])
                        elif offset < SELFTEST_STACK_BYTES + ICE40_PAYLOAD:
                            m.d.comb += byte.eq(psn[:8] + (offset - SELFTEST_STACK_BYTES))
        last = beat == beats - 1
        tail = frame_bytes - (beats - 1) * LANES
        for p in range(2):
            m.d.comb += [
                self.o[p].p.data.eq(data),
                self.o[p].p.keep.eq(Mux(last, (1 << tail) - 1, (1 << LANES) - 1)),
                self.o[p].p.first.eq(beat == 0),
                self.o[p].p.last.eq(last),
                self.o[p].valid.eq(plane == p),
            ]
        ready = Mux(plane, self.o[1].ready, self.o[0].ready)
        with m.If(ready):
            m.d.sync += beat.eq(Mux(last, 0, beat + 1))
            with m.If(last):
                m.d.sync += [psn.eq(psn + 1), plane.eq(~plane), self.sent.eq(self.sent + 1)]
        return m


class FrameChecker(wiring.Component):
    """Classify each frame: good (full length, payload as :class:`FrameSource` made it),
    trimmed (DSCP = trim code point and the trimmed length) or bad. Always ready.

    Members
    -------
    i : ``In(stream.Signature(net_beat_layout(64, tagged=True)))``
    received, trimmed, bad : ``Out(32)``
    """

    def __init__(self, *, trim_dscp=P.DEFAULT_TRIM_DSCP):
        self._trim_dscp = trim_dscp
        super().__init__({
            "i": In(stream.Signature(net_beat_layout(DATA_WIDTH, tagged=True))),
            "received": Out(32),
            "trimmed": Out(32),
            "bad": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        m.d.comb += self.i.ready.eq(1)
        beat = Signal(range(64))
        psn_low = Signal(8)
        dscp = Signal(6)
        failed = Signal()
        count = Signal(range(LANES + 1))
        m.d.comb += count.eq(sum(self.i.p.keep[n] for n in range(LANES)))
        length = Signal(16)

        # Bytes the checks need, at fixed offsets (the IPv6 traffic class, the PSN's low byte).
        def byte_at(offset):
            lane = offset % LANES
            return (beat == offset // LANES), self.i.p.data[8 * lane:8 * lane + 8]

        here, value = byte_at(PSN_OFFSET + 2)
        psn_now = Mux(here, value, psn_low)
        tc_hi_here, tc_hi = byte_at(IPV6_OFFSET)
        tc_lo_here, tc_lo = byte_at(IPV6_OFFSET + 1)

        payload_bad = Signal()
        for lane in range(LANES):
            offset = beat * LANES + lane
            in_payload = (offset >= SELFTEST_STACK_BYTES) & (
                offset < SELFTEST_STACK_BYTES + ICE40_PAYLOAD)
            expected = (psn_now + offset - SELFTEST_STACK_BYTES)[:8]
            with m.If(self.i.p.keep[lane] & in_payload
                      & (self.i.p.data[8 * lane:8 * lane + 8] != expected)):
                m.d.comb += payload_bad.eq(1)

        with m.If(self.i.valid):
            total = length + count
            new_dscp = Cat(Mux(tc_lo_here, tc_lo[6:], dscp[:2]),
                           Mux(tc_hi_here, tc_hi[:4], dscp[2:]))
            m.d.sync += [psn_low.eq(psn_now), dscp.eq(new_dscp), length.eq(total),
                         beat.eq(beat + 1)]
            is_trimmed = new_dscp == self._trim_dscp
            bad_now = failed | (payload_bad & ~is_trimmed)
            m.d.sync += failed.eq(bad_now)
            with m.If(self.i.p.last):
                m.d.sync += [beat.eq(0), length.eq(0), failed.eq(0)]
                with m.If(is_trimmed & ~bad_now & (total == trimmed_frame_bytes())):
                    m.d.sync += self.trimmed.eq(self.trimmed + 1)
                with m.Elif(~is_trimmed & ~bad_now & (total == _frame_bytes())):
                    m.d.sync += self.received.eq(self.received + 1)
                with m.Else():
                    m.d.sync += self.bad.eq(self.bad + 1)
        return m


#: Counters of the iCE40 self-test, in its UART line.
ICE40_COUNTERS = ("sent", "received", "trimmed", "bad", "lost", "killed")


class Ice40Selftest(wiring.Component):
    """The reduced self-test without board I/O (simulated by ``tests/boards/test_boards.py``).

    Members
    -------
    uart_tx : ``Out(1, init=1)``
    kill : ``In(2)``
    counters : ``Out(data.ArrayLayout(32, 6))``, in :data:`ICE40_COUNTERS` order
    heartbeat, error : ``Out(1)``
    killed_planes : ``Out(2)``
        The planes being killed now: ``kill``, and with ``auto_kill`` plane 1 during every
        fourth report period (for boards without a button, the ECPIX-5 CI top).
    """

    def __init__(self, *, clock_hz=12_000_000, report_period=None, baud=115200,
                 delays=(8, 20), loss_rate=8, trim_rate=8, auto_kill=False):
        with validating(self):
            if round(clock_hz / baud) < 2:
                raise ValueError(f"baud must be at most clock_hz / 2, not {baud!r}")
        self._period = clock_hz if report_period is None else report_period
        self._divisor = round(clock_hz / baud)
        self._delays = delays
        self._loss_rate = loss_rate
        self._trim_rate = trim_rate
        self._auto_kill = auto_kill
        from amaranth.lib import data
        super().__init__({
            "uart_tx": Out(1, init=1),
            "kill": In(2),
            "counters": Out(data.ArrayLayout(32, len(ICE40_COUNTERS))),
            "heartbeat": Out(1),
            "error": Out(1),
            "killed_planes": Out(2),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.source = source = FrameSource()
        m.submodules.fabric = fabric = ImpairedFabric(data_width=DATA_WIDTH,
                                                      delays=self._delays)
        m.submodules.arbiter = arbiter = PortArbiter(data_width=DATA_WIDTH, ports=2)
        m.submodules.checker = checker = FrameChecker()
        m.submodules.reporter = reporter = Reporter(names=ICE40_COUNTERS, period=self._period)
        m.submodules.uart = uart = UARTTx(divisor=self._divisor)
        for p in range(2):
            wiring.connect(m, source.o[p], fabric.i[p])
            wiring.connect(m, fabric.o[p], arbiter.i[p])
        wiring.connect(m, arbiter.o, checker.i)
        wiring.connect(m, reporter.o, uart.i)
        lost = Signal(32)
        killed = Signal(32)
        m.d.sync += [lost.eq(lost + fabric.lost[0] + fabric.lost[1]),
                     killed.eq(killed + fabric.killed[0] + fabric.killed[1])]
        values = [source.sent, checker.received, checker.trimmed, checker.bad, lost, killed]
        for n, value in enumerate(values):
            m.d.comb += self.counters[n].eq(value)
        m.d.comb += [
            reporter.values.eq(self.counters),
            self.uart_tx.eq(uart.tx),
            fabric.loss_rate.eq(self._loss_rate),
            fabric.trim_rate.eq(self._trim_rate),
        ]
        periods = Signal(2)
        with m.If(reporter.tick):
            m.d.sync += [self.heartbeat.eq(~self.heartbeat), periods.eq(periods + 1)]
        # Registered, as in the engine self-test: the kill inputs stay off the fabric's paths.
        kill = Signal(2)
        m.d.sync += kill.eq(self.kill | Cat(C(0, 1), (periods == 3) & self._auto_kill))
        m.d.comb += [fabric.kill.eq(kill), self.killed_planes.eq(kill)]
        with m.If(checker.bad != 0):
            m.d.sync += self.error.eq(1)
        return m


class Ice40Top(Elaboratable):
    """:class:`Ice40Selftest` on the iCEBreaker: green LED heartbeat, red LED error, the user
    button kills plane 1, counters on the UART (115200 8N1 from 12 MHz: divisor 104)."""

    def elaborate(self, platform):
        m = Module()
        m.submodules.selftest = selftest = Ice40Selftest(
            clock_hz=int(platform.default_clk_frequency))
        from .tops import input_pin, output_pin
        m.d.comb += [
            output_pin(m, platform.request("uart", 0, dir="-").tx).eq(selftest.uart_tx),
            output_pin(m, platform.request("led_g", 0, dir="-")).eq(selftest.heartbeat),
            output_pin(m, platform.request("led_r", 0, dir="-")).eq(selftest.error),
        ]
        button = input_pin(m, platform.request("button", 0, dir="-"))
        sync = Signal(2)
        m.d.sync += sync.eq(Cat(button, sync[0]))
        m.d.comb += selftest.kill.eq(Cat(C(0, 1), sync[1]))
        return m
