"""On-chip self-test: two NIC engines joined by an impaired multi-plane fabric.

::

    TrafficGenerator ─► EngineAdapter ─ engine A tx[0..P-1] ─► ImpairedFabric ─┐
                         (two engines)                  (kill, loss, trim, delay) │
    PayloadChecker  ◄── EngineAdapter ◄─ engine B rx[0..P-1] ◄──────────────────┘
           │
           └─► counters ─► Reporter ─► UARTTx (115200 8N1, one line per report period)
                       └─► status (LEDs)

The same :class:`SelfTest` runs in the Amaranth simulator (``tests/boards/test_boards.py``, with a
short report period) and on the ECP5 boards (``boards/tops.py``). Everything the checker
expects is derived from the PSN the generator put in the packet (payload length, payload
pattern), so packets may arrive in any order over the planes.

The engines are :class:`~hdl.packet.engine.PacketEngine` instances (header builder on A,
parser on B). The whole NIC, transport blocks included, runs in the transport self-test
(:mod:`boards.transport`), which reuses this module's fabric and report.
"""

from ipaddress import IPv6Address

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from hdl import protocol as P
from hdl.config import NicConfig
from hdl.packet import layouts as L
from hdl.packet.engine import PacketEngine
from hdl.packet.headers import DropReason, PacketKind, net_beat_layout, packet_beat_layout
from hdl.util import validating
from sim import defaults as D

from .uart import UARTTx

__all__ = [
    "COUNTERS", "SELFTEST_STACK_BYTES", "pattern_seed", "pattern_step", "payload_pattern",
    "payload_length", "trimmed_frame_bytes",
    "EngineAdapter", "TrafficGenerator", "PlaneImpairment", "DelayLine", "RegisterSlice",
    "ImpairedFabric",
    "PayloadChecker", "Reporter", "SelfTest",
]


# ---------------------------------------------------------------------------------------------
# The self-test's packets: one fixed stack, payload derived from the PSN
# ---------------------------------------------------------------------------------------------

#: The transport headers of every self-test packet: an RDMA WRITE ONLY with a TSETH, as every
#: data packet of this NIC.
SELFTEST_OPCODE = P.Opcode.RDMA_WRITE_ONLY
SELFTEST_HEADERS = L.data_headers(SELFTEST_OPCODE, ts=True)
#: Header bytes of every self-test packet: Ethernet, IPv6, UDP, BTH, METH, TSETH, RETH (no
#: VLAN, no SRv6). The fabric's trimmer rewrites fields at fixed offsets in it.
ETH_BYTES = L.ETHERNET.size
IPV6_OFFSET = ETH_BYTES
UDP_OFFSET = IPV6_OFFSET + L.IPV6.size
TRANSPORT_BYTES = L.BTH.size + L.headers_size(SELFTEST_HEADERS)
SELFTEST_STACK_BYTES = UDP_OFFSET + L.UDP.size + TRANSPORT_BYTES
#: The UDP length (and IPv6 payload length) of a trimmed self-test packet: headers + ICRC.
TRIMMED_UDP_LENGTH = L.UDP.size + TRANSPORT_BYTES + P.ICRC_BYTES
_IPV6_PAYLOAD_LENGTH = L.IPV6.byte_offset("payload_length")
_UDP_LENGTH = L.UDP.byte_offset("length")


def trimmed_frame_bytes():
    """Bytes of a trimmed self-test frame: the headers and a zero ICRC."""
    return SELFTEST_STACK_BYTES + P.ICRC_BYTES


_MASK64 = (1 << 64) - 1
_LANE_CONSTANT = 0x9E3779B97F4A7C15      # golden-ratio constant: distinct non-zero lane seeds


def _lane_constant(lane):
    return (_LANE_CONSTANT * (lane + 1)) & _MASK64 | 1


def pattern_seed(psn, data_width):
    """Reference: the first payload beat of packet ``psn`` (an int of ``data_width`` bits)."""
    word = (psn | psn << 24 | psn << 48) & _MASK64
    return sum((word ^ _lane_constant(j)) << 64 * j for j in range(data_width // 64))


def pattern_step(value, data_width):
    """Reference: the payload beat after ``value`` (xorshift64 on each 64-bit lane)."""
    out = 0
    for j in range(data_width // 64):
        x = value >> 64 * j & _MASK64
        x ^= x << 13 & _MASK64
        x ^= x >> 7
        x ^= x << 17 & _MASK64
        out |= x << 64 * j
    return out


def payload_length(psn, max_payload):
    """Reference: payload bytes of packet ``psn``, 1 .. ``max_payload`` (a power of two)."""
    return 1 + (psn * 7 & (max_payload - 1))


def payload_pattern(psn, data_width, max_payload):
    """Reference: the payload bytes of packet ``psn``."""
    length = payload_length(psn, max_payload)
    lanes = data_width // 8
    out = bytearray()
    value = pattern_seed(psn, data_width)
    while len(out) < length:
        out += value.to_bytes(lanes, "little")
        value = pattern_step(value, data_width)
    return bytes(out[:length])


def _hw_seed(psn, data_width):
    word = Cat(psn, psn, psn[:16])
    return Cat(*(word ^ _lane_constant(j) for j in range(data_width // 64)))


def _hw_step(value, data_width):
    lanes = []
    for j in range(data_width // 64):
        x = value[64 * j:64 * j + 64]
        x1 = (x ^ (x << 13))[:64]
        x2 = x1 ^ (x1 >> 7)
        lanes.append((x2 ^ (x2 << 17))[:64])
    return Cat(*lanes)


def _hw_length(psn, max_payload):
    # 7 * psn as a shift and a subtraction: a `*` maps to a DSP block, slow on ECP5.
    return 1 + (((psn << 3) - psn)[:max_payload.bit_length() - 1])



def _drive_header(header, *, psn, plane, length, trimmed=0, trim_dscp=0):
    """Statements giving ``header`` the fields the generator sends for packet ``psn``."""
    assert D.MR_BASE & 0xFFFFFF == 0
    return [
        header.kind.eq(PacketKind.DATA),
        header.trimmed.eq(trimmed),
        header.port.eq(plane),
        header.payload_len.eq(Mux(trimmed, 0, length)),
        header.eth_dst.eq(int(D.NIC_B.mac.replace(":", ""), 16)),
        header.eth_src.eq(int(D.NIC_A.mac.replace(":", ""), 16)),
        header.ipv6.eq(1),
        header.ip_src.eq(int(IPv6Address(D.NIC_A.ipv6))),
        header.ip_dst.eq(int(IPv6Address(D.NIC_B.ipv6))),
        header.tclass.eq(Mux(trimmed, trim_dscp << 2, 0)),
        header.flow_label.eq(psn[:20]),
        header.hop_limit.eq(64),
        header.udp_sport.eq(0xC000 | psn[:14]),
        header.bth.opcode.eq(SELFTEST_OPCODE),
        header.bth.ts.eq(1),
        header.bth.dqpn.eq(D.QPN_B),
        header.bth.psn.eq(psn),
        header.bth.ackreq.eq(1),
        header.bth.pkey.eq(0xFFFF),
        # OR, not +: the region base has its low 24 bits clear (an adder would be a long path).
        header.reth.va.eq(D.MR_BASE | (psn[:12] << 12)),
        header.reth.rkey.eq(D.MR_RKEY),
        header.reth.dma_len.eq(length),
        # METH and TSETH constant (the iCE40 frame source patches only the PSN).
        header.tseth.ftype.eq(P.Ftype.TIMESTAMP),
    ]

def _check_config(config):
    if not isinstance(config, NicConfig):
        raise TypeError(f"config must be a NicConfig, not {config!r}")


def _check_max_payload(max_payload, config):
    if (not isinstance(max_payload, int) or max_payload < 1
            or max_payload & (max_payload - 1) or max_payload > config.mtu):
        raise ValueError(f"max_payload must be a power of two from 1 to the MTU "
                         f"({config.mtu}), not {max_payload!r}")


# ---------------------------------------------------------------------------------------------
# Engines
# ---------------------------------------------------------------------------------------------

class EngineAdapter(wiring.Component):
    """The two NIC engines as the self-test sees them: packets into A, packets out of B.

    Engine A's transmit path (header builder, port demux) sends; engine B's receive path
    (port arbiter, parser) receives. Their other halves are instantiated but idle, and are
    removed by synthesis because nothing observes them.

    Parameters
    ----------
    config : NicConfig

    Members
    -------
    tx_packets : ``In(stream.Signature(packet_beat_layout(config)))``
        Packets for engine A to send (header ``port`` picks the plane).
    net_tx : ``Out(stream.Signature(net_beat_layout(W))).array(ports)``
        Engine A's frames, per plane.
    net_rx : ``In(stream.Signature(net_beat_layout(W))).array(ports)``
        Frames into engine B, per plane.
    rx_packets : ``Out(stream.Signature(packet_beat_layout(config)))``
        Packets engine B accepted.
    rx_verdict_valid, rx_verdict_reason : ``Out(1)``, ``Out(DropReason)``
        Engine B's per-frame verdict strobe.
    tx_errors : ``Out(32)``
        Engine A's length errors plus bad-port frames (both 0 when the generator is right).
    """

    def __init__(self, *, config):
        with validating(self):
            _check_config(config)
        self._config = config
        beat = stream.Signature(net_beat_layout(config.data_width))
        packet = stream.Signature(packet_beat_layout(config))
        super().__init__({
            "tx_packets": In(packet),
            "net_tx": Out(beat).array(config.ports),
            "net_rx": In(beat).array(config.ports),
            "rx_packets": Out(packet),
            "rx_verdict_valid": Out(1),
            "rx_verdict_reason": Out(DropReason),
            "tx_errors": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.nic_a = nic_a = PacketEngine(self._config)
        m.submodules.nic_b = nic_b = PacketEngine(self._config)
        wiring.connect(m, wiring.flipped(self.tx_packets), nic_a.tx_packets)
        wiring.connect(m, nic_b.rx_packets, wiring.flipped(self.rx_packets))
        for port in range(self._config.ports):
            wiring.connect(m, nic_a.tx[port], wiring.flipped(self.net_tx[port]))
            wiring.connect(m, wiring.flipped(self.net_rx[port]), nic_b.rx[port])
        m.d.comb += [
            nic_b.trim_dscp.eq(self._config.trim_dscp),
            self.rx_verdict_valid.eq(nic_b.rx_verdict_valid),
            self.rx_verdict_reason.eq(nic_b.rx_verdict_reason),
            self.tx_errors.eq(nic_a.tx_length_errors + nic_a.tx_bad_port),
        ]
        return m


# ---------------------------------------------------------------------------------------------
# Traffic generator
# ---------------------------------------------------------------------------------------------

class TrafficGenerator(wiring.Component):
    """RDMA WRITE ONLY packets from NIC A's QP to NIC B's, sprayed round-robin over the planes.

    Packet n has PSN ``INITIAL_PSN + n`` (24-bit, wrapping), plane ``n mod ports``, flow label
    (the EV) the PSN's low 20 bits, :func:`payload_length` bytes of :func:`payload_pattern`;
    addresses, QPNs and the memory region come from :mod:`sim.defaults`. One beat per cycle
    while ``o`` is ready, ``gap`` idle cycles between packets.

    Parameters
    ----------
    config : NicConfig
    max_payload : int
        Power of two, at most the MTU: payloads are 1 .. ``max_payload`` bytes.

    Members
    -------
    o : ``Out(stream.Signature(packet_beat_layout(config)))``
    enable : ``In(1)``
        Start new packets (a packet once started is finished).
    limit : ``In(32)``
        Stop after this many packets; 0 = never stop.
    gap : ``In(8)``
        Idle cycles after each packet.
    sent : ``Out(32)``
        Packets sent (fully transferred).
    """

    def __init__(self, *, config, max_payload):
        with validating(self):
            _check_config(config)
            _check_max_payload(max_payload, config)
        self._config = config
        self._max_payload = max_payload
        super().__init__({
            "o": Out(stream.Signature(packet_beat_layout(config))),
            "enable": In(1),
            "limit": In(32),
            "gap": In(8),
            "sent": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        config = self._config
        width = config.data_width
        lanes = width // 8

        psn = Signal(24, init=D.INITIAL_PSN)
        plane = Signal(range(config.ports))
        busy = Signal()                         # a packet is being sent
        remaining = Signal(range(self._max_payload + 1))    # payload bytes not yet sent
        pattern = Signal(width)
        first = Signal()
        idle = Signal(8)
        length = Signal(16)

        m.d.comb += [
            *_drive_header(self.o.p.header, psn=psn, plane=plane, length=length),
            self.o.p.data.eq(pattern),
            self.o.p.first.eq(first),
            self.o.p.last.eq(remaining <= lanes),
            self.o.p.keep.eq(Mux(remaining >= lanes, (1 << lanes) - 1,
                                 (C(1, lanes + 1) << remaining[:exact_log2(lanes) + 1]) - 1)),
            self.o.valid.eq(busy),
        ]

        may_start = self.enable & ((self.limit == 0) | (self.sent != self.limit)) & (idle == 0)
        with m.If(~busy):
            with m.If(idle != 0):
                m.d.sync += idle.eq(idle - 1)
            with m.Elif(may_start):
                next_length = _hw_length(psn, self._max_payload)
                m.d.sync += [
                    busy.eq(1),
                    first.eq(1),
                    length.eq(next_length),
                    remaining.eq(next_length),
                    pattern.eq(_hw_seed(psn, width)),
                ]
        with m.Elif(self.o.ready):
            m.d.sync += [
                first.eq(0),
                remaining.eq(remaining - lanes),
                pattern.eq(_hw_step(pattern, width)),
            ]
            with m.If(self.o.p.last):
                m.d.sync += [
                    busy.eq(0),
                    idle.eq(self.gap),
                    psn.eq(psn + 1),
                    plane.eq(Mux(plane == config.ports - 1, 0, plane + 1)),
                    self.sent.eq(self.sent + 1),
                ]
        return m


# ---------------------------------------------------------------------------------------------
# Impaired fabric
# ---------------------------------------------------------------------------------------------

class _Fate:
    PASS = 0
    TRIM = 1
    DROP = 2


class PlaneImpairment(wiring.Component):
    """One plane's impairments, decided per frame at its first beat: kill, loss, trim.

    A frame is dropped whole while ``kill`` is high (checked at its first beat), else lost
    with probability ``loss_rate / 256``, else trimmed with probability ``trim_rate / 256``,
    from a 16-bit Galois LFSR stepped once per frame (low byte: loss, high byte: trim).
    Trimming is what ``sim.packets.trim`` does to a self-test frame (fixed offsets of the
    :data:`SELFTEST_STACK_BYTES`-byte IPv6 stack): DSCP set to ``trim_dscp`` (ECN kept), IPv6
    payload length and UDP length rewritten, the payload cut, the ICRC zero. Frames of another
    stack are trimmed at the same offsets and arrive damaged: the self-test sends none.

    Combinational: no latency, one beat per cycle; dropped beats are accepted at full rate.
    The loss and trim compares are made a cycle ahead, from the value the LFSR takes at the
    next clock edge, and registered: a frame's fate at its first beat is ``kill`` and two
    flip-flops, and a new ``loss_rate`` or ``trim_rate`` applies to frames starting from the
    cycle after it is set. Where a trimmed first beat is the same as the original (no
    rewritten byte and no cut in it), the trim select of the data reads the registered fate
    of the frame in progress only.

    Members
    -------
    i, o : ``In/Out(stream.Signature(net_beat_layout(W)))``
    kill : ``In(1)``
    loss_rate, trim_rate : ``In(8)``
        Probabilities in 1/256.
    frame, lost, killed, trimmed : ``Out(1)``
        One-cycle strobes when a frame's first beat is taken, with its fate.
    """

    def __init__(self, *, data_width, seed, trim_dscp=P.DEFAULT_TRIM_DSCP):
        with validating(self):
            if data_width not in (64, 128, 256):
                raise ValueError(f"data_width must be 64, 128 or 256, not {data_width!r}")
            if not isinstance(seed, int) or not 1 <= seed <= 0xFFFF:
                raise ValueError(f"seed must be an integer from 1 to 65535, not {seed!r}")
        self._data_width = data_width
        self._seed = seed
        self._trim_dscp = trim_dscp
        beat = stream.Signature(net_beat_layout(data_width))
        super().__init__({
            "i": In(beat),
            "o": Out(beat),
            "kill": In(1),
            "loss_rate": In(8),
            "trim_rate": In(8),
            "frame": Out(1),
            "lost": Out(1),
            "killed": Out(1),
            "trimmed": Out(1),
        })

    def _rewrites(self):
        """``{byte offset: function(original byte) -> new byte}`` of a trimmed frame."""
        dscp = self._trim_dscp
        out = {
            IPV6_OFFSET: lambda b: C(0x60 | dscp >> 2, 8),
            IPV6_OFFSET + 1: lambda b: Cat(b[:6], C(dscp & 3, 2)),
            IPV6_OFFSET + _IPV6_PAYLOAD_LENGTH: lambda b: C(TRIMMED_UDP_LENGTH >> 8, 8),
            IPV6_OFFSET + _IPV6_PAYLOAD_LENGTH + 1: lambda b: C(TRIMMED_UDP_LENGTH & 0xFF, 8),
            UDP_OFFSET + _UDP_LENGTH: lambda b: C(TRIMMED_UDP_LENGTH >> 8, 8),
            UDP_OFFSET + _UDP_LENGTH + 1: lambda b: C(TRIMMED_UDP_LENGTH & 0xFF, 8),
        }
        for n in range(P.ICRC_BYTES):
            out[SELFTEST_STACK_BYTES + n] = lambda b: C(0, 8)
        return out

    def elaborate(self, platform):
        m = Module()
        lanes = self._data_width // 8
        frame_bytes = trimmed_frame_bytes()
        cut_beat = (frame_bytes - 1) // lanes
        cut_lanes = frame_bytes - cut_beat * lanes

        lfsr = Signal(16, init=self._seed)
        in_frame = Signal()
        fate = Signal(2)                    # of the frame in progress
        beat = Signal(range(cut_beat + 2))  # beat index inside the frame, saturating
        start = self.i.valid & ~in_frame
        transfer = self.i.valid & self.i.ready

        # Galois LFSR, taps 16, 14, 13, 11 (maximal length), stepped at each frame's start.
        stepped = Mux(lfsr[0], (lfsr >> 1) ^ 0xB400, lfsr >> 1)
        step = start & transfer
        # The loss and trim compares of the LFSR's next value, registered: both candidates are
        # compared and the step selects between the results, so the compares start at
        # flip-flops and nothing after `lose`/`trim` is arithmetic (the compare in front of
        # the fate select, and through it the data select of a wide beat, was the 125 MHz
        # self-test's longest path).
        lose = Signal()
        trim = Signal()
        m.d.sync += [
            lose.eq(Mux(step, stepped[:8] < self.loss_rate, lfsr[:8] < self.loss_rate)),
            trim.eq(Mux(step, stepped[8:] < self.trim_rate, lfsr[8:] < self.trim_rate)),
        ]

        decided = Signal(2)
        with m.If(self.kill | lose):
            m.d.comb += decided.eq(_Fate.DROP)
        with m.Elif(trim):
            m.d.comb += decided.eq(_Fate.TRIM)
        current = Mux(in_frame, fate, decided)

        # Trimmed beat: fields rewritten by offset; the cut beat ends the frame.
        trimmed_data = Signal(self._data_width)
        m.d.comb += trimmed_data.eq(self.i.p.data)
        for offset, rewrite in self._rewrites().items():
            lane = offset % lanes
            with m.If(beat == offset // lanes):
                m.d.comb += trimmed_data[8 * lane:8 * lane + 8].eq(
                    rewrite(self.i.p.data[8 * lane:8 * lane + 8]))
        at_cut = beat == cut_beat
        past_cut = beat > cut_beat
        # Outside a frame `beat` is 0; when a trimmed beat 0 equals the original, the data
        # select needs only `fate` (the last frame's outside a frame: harmless at beat 0).
        first_beat_kept = cut_beat > 0 and all(offset >= lanes for offset in self._rewrites())
        trim_data = (fate == _Fate.TRIM) if first_beat_kept else (current == _Fate.TRIM)

        m.d.comb += [
            self.o.p.first.eq(self.i.p.first),
            self.o.p.data.eq(self.i.p.data),
            self.o.p.keep.eq(self.i.p.keep),
            self.o.p.last.eq(self.i.p.last),
        ]
        with m.Switch(current):
            with m.Case(_Fate.PASS):
                m.d.comb += [self.o.valid.eq(self.i.valid), self.i.ready.eq(self.o.ready)]
            with m.Case(_Fate.TRIM):
                with m.If(past_cut):
                    m.d.comb += self.i.ready.eq(1)
                with m.Else():
                    m.d.comb += [self.o.valid.eq(self.i.valid), self.i.ready.eq(self.o.ready)]
            with m.Default():
                m.d.comb += self.i.ready.eq(1)
        with m.If(trim_data):
            m.d.comb += self.o.p.data.eq(trimmed_data)
            with m.If(at_cut):
                m.d.comb += [
                    self.o.p.last.eq(1),
                    self.o.p.keep.eq(self.i.p.keep & ((1 << cut_lanes) - 1)),
                    self.o.p.data.eq(trimmed_data[:8 * cut_lanes]),
                ]

        with m.If(transfer):
            m.d.sync += [in_frame.eq(~self.i.p.last),
                         beat.eq(Mux(self.i.p.last, 0, Mux(past_cut, beat, beat + 1)))]
            with m.If(start):
                m.d.sync += [fate.eq(decided), lfsr.eq(stepped)]
                m.d.comb += [
                    self.frame.eq(1),
                    self.killed.eq(self.kill),
                    self.lost.eq(~self.kill & (decided == _Fate.DROP)),
                    self.trimmed.eq(decided == _Fate.TRIM),
                ]
        return m


class DelayLine(wiring.Component):
    """Hold every beat for at least ``delay`` cycles: a plane's propagation delay.

    A FIFO of ``depth`` beats (block RAM when large enough) whose entries carry the cycle they
    may leave (entry cycle + ``delay``, 16 bits), and a head register the oldest entry waits in;
    it leaves once that cycle has come.
    Order is kept. At one beat per cycle a plane needs ``depth >= delay`` to run at full rate;
    with less it backpressures. A head held back (by ``o.ready``) more than 2**15 cycles past
    its due cycle looks early again until the 16-bit counter comes round (the self-test's
    sinks are always ready).

    Members
    -------
    i, o : ``In/Out(stream.Signature(net_beat_layout(W)))``
    """

    def __init__(self, *, data_width, delay, depth):
        with validating(self):
            if not isinstance(delay, int) or not 0 <= delay < 1 << 15:
                raise ValueError(f"delay must be an integer from 0 to 32767, not {delay!r}")
            if not isinstance(depth, int) or depth < 2:
                raise ValueError(f"depth must be an integer of at least 2, not {depth!r}")
        self._layout = net_beat_layout(data_width)
        self._delay = delay
        self._depth = depth
        beat = stream.Signature(self._layout)
        super().__init__({"i": In(beat), "o": Out(beat)})

    def elaborate(self, platform):
        m = Module()
        # Each entry carries the cycle it may leave (``due``), so the head's test is one
        # subtract (its sign) after the block RAM, not a subtract and then a compare: that
        # pair was the ECPIX-5 self-test's critical path at 100 MHz (docs/boards.md).
        now = Signal(16)
        m.d.sync += now.eq(now + 1)
        entry = data.StructLayout({"beat": self._layout, "due": 16})
        m.submodules.fifo = fifo = SyncFIFOBuffered(width=entry.size, depth=self._depth)
        # The head waits in flip-flops (``head``), so the due test starts from a register, not
        # from the block RAM's output: the RAM's clock-to-out in front of the subtract was
        # once the Versa self-test's critical path at 100 MHz.
        head = Signal(entry)
        head_valid = Signal()
        early = Signal(16)
        load = Signal()
        m.d.comb += [
            fifo.w_data.eq(Cat(self.i.payload, (now + self._delay)[:16])),
            fifo.w_en.eq(self.i.valid),
            self.i.ready.eq(fifo.w_rdy),
            early.eq(now - head.due),                   # negative (bit 15) while not due
            self.o.payload.eq(head.beat),
            self.o.valid.eq(head_valid & ~early[15]),
            load.eq(~head_valid | (self.o.valid & self.o.ready)),
            fifo.r_en.eq(load),
        ]
        with m.If(load):
            m.d.sync += [head.eq(fifo.r_data), head_valid.eq(fifo.r_rdy)]
        return m


class RegisterSlice(wiring.Component):
    """A two-entry skid buffer: every output and ``i.ready`` come from flip-flops, so no
    combinational path crosses it. One cycle of latency, one transfer per cycle.

    Members
    -------
    i, o : ``In/Out(stream.Signature(layout))``
    """

    def __init__(self, layout):
        self._layout = layout
        super().__init__({"i": In(stream.Signature(layout)), "o": Out(stream.Signature(layout))})

    def elaborate(self, platform):
        m = Module()
        skid = Signal(self._layout)
        skid_valid = Signal()
        m.d.comb += self.i.ready.eq(~skid_valid)
        with m.If(self.o.ready | ~self.o.valid):
            with m.If(skid_valid):
                m.d.sync += [self.o.payload.eq(skid), self.o.valid.eq(1), skid_valid.eq(0)]
            with m.Else():
                m.d.sync += [self.o.payload.eq(self.i.payload), self.o.valid.eq(self.i.valid)]
        with m.Elif(self.i.valid & self.i.ready):
            m.d.sync += [skid.eq(self.i.payload), skid_valid.eq(1)]
        return m


class ImpairedFabric(wiring.Component):
    """P planes, each :class:`PlaneImpairment` then :class:`DelayLine`, with a
    :class:`RegisterSlice` at both ends so that no combinational path runs from the sending
    engine's ``ready`` logic to the receiving engine (both are large).

    Parameters
    ----------
    data_width : int
    delays : tuple of int
        Per-plane delay in cycles; its length is the plane count.
    trim_dscp : int

    Members
    -------
    i, o : ``In/Out(stream.Signature(net_beat_layout(W))).array(planes)``
    kill : ``In(planes)``
        Bit p kills plane p (whole frames, decided at each frame's first beat).
    loss_rate, trim_rate : ``In(8)``
        Per-frame probabilities in 1/256, the same on every plane (each has its own LFSR).
    frame, lost, killed, trimmed : ``Out(planes)``
        Per-plane strobes of :class:`PlaneImpairment`.
    """

    def __init__(self, *, data_width, delays, trim_dscp=P.DEFAULT_TRIM_DSCP):
        with validating(self):
            if not isinstance(delays, tuple) or not 1 <= len(delays) <= 16:
                raise ValueError(f"delays must be a tuple of 1 to 16 plane delays, "
                                 f"not {delays!r}")
        self._data_width = data_width
        self._delays = delays
        self._trim_dscp = trim_dscp
        planes = len(delays)
        beat = stream.Signature(net_beat_layout(data_width))
        super().__init__({
            "i": In(beat).array(planes),
            "o": Out(beat).array(planes),
            "kill": In(planes),
            "loss_rate": In(8),
            "trim_rate": In(8),
            "frame": Out(planes),
            "lost": Out(planes),
            "killed": Out(planes),
            "trimmed": Out(planes),
        })

    def elaborate(self, platform):
        m = Module()
        for plane, delay in enumerate(self._delays):
            impair = PlaneImpairment(data_width=self._data_width, seed=0xACE1 ^ (plane * 0x1F35),
                                     trim_dscp=self._trim_dscp)
            line = DelayLine(data_width=self._data_width, delay=delay,
                             depth=max(16, 1 << (delay + 8).bit_length()))
            layout = net_beat_layout(self._data_width)
            m.submodules[f"in_slice{plane}"] = in_slice = RegisterSlice(layout)
            m.submodules[f"impair{plane}"] = impair
            m.submodules[f"delay{plane}"] = line
            m.submodules[f"out_slice{plane}"] = out_slice = RegisterSlice(layout)
            wiring.connect(m, wiring.flipped(self.i[plane]), in_slice.i)
            wiring.connect(m, in_slice.o, impair.i)
            wiring.connect(m, impair.o, line.i)
            wiring.connect(m, line.o, out_slice.i)
            wiring.connect(m, out_slice.o, wiring.flipped(self.o[plane]))
            m.d.comb += [
                impair.kill.eq(self.kill[plane]),
                impair.loss_rate.eq(self.loss_rate),
                impair.trim_rate.eq(self.trim_rate),
                self.frame[plane].eq(impair.frame),
                self.lost[plane].eq(impair.lost),
                self.killed[plane].eq(impair.killed),
                self.trimmed[plane].eq(impair.trimmed),
            ]
        return m


# ---------------------------------------------------------------------------------------------
# Checker
# ---------------------------------------------------------------------------------------------

class PayloadChecker(wiring.Component):
    """Check every packet engine B delivers against what the generator sent with its PSN.

    A packet is good when its whole parsed header is the one the generator built for its PSN
    (every field: addresses, QPN, lengths, EV, ...; the ingress port is the plane it was sent
    on), its delivered bytes number :func:`payload_length` of its PSN and equal
    :func:`payload_pattern`. A trimmed packet is good when its header is the sent one with the
    trim DSCP, ``payload_len`` 0, and it carries no payload. Always
    ready; the input beat is registered before anything reads it (the engine's header output
    is a bank select, and the whole header is compared), and a packet is counted three cycles
    after its last beat.

    Members
    -------
    i : ``In(stream.Signature(packet_beat_layout(config)))``
    received, trimmed, bad : ``Out(32)``
        Good data packets, good trimmed packets, packets failing any check.
    """

    def __init__(self, *, config, max_payload):
        with validating(self):
            _check_config(config)
            _check_max_payload(max_payload, config)
        self._config = config
        self._max_payload = max_payload
        super().__init__({
            "i": In(stream.Signature(packet_beat_layout(config))),
            "received": Out(32),
            "trimmed": Out(32),
            "bad": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        width = self._config.data_width
        lanes = width // 8
        m.d.comb += self.i.ready.eq(1)

        # Stage 0: register the beat as it comes (the compare below reads every header bit).
        valid_in = Signal()
        beat_in = Signal(packet_beat_layout(self._config))
        m.d.sync += [valid_in.eq(self.i.valid), beat_in.eq(self.i.payload)]

        valid = Signal()
        # Stage 1: register the beat again, and compare its whole header with the one the
        # generator sent for its PSN (the ingress port is the plane it was sent on).
        beat = Signal(packet_beat_layout(self._config))
        header_mismatch = Signal()
        incoming = beat_in.header
        expected_header = Signal.like(incoming)
        # The two length fields are checked in stage 2 (the length needs an adder); here
        # they are copied so the comparison ignores them.
        m.d.comb += [
            *_drive_header(expected_header, psn=incoming.bth.psn, plane=incoming.port,
                           length=0, trimmed=incoming.trimmed,
                           trim_dscp=self._config.trim_dscp),
            expected_header.payload_len.eq(incoming.payload_len),
            expected_header.reth.dma_len.eq(incoming.reth.dma_len),
        ]
        first_length = Signal(16)               # the payload length of the PSN (first beat)
        m.d.sync += [
            valid.eq(valid_in),
            beat.eq(beat_in),
            header_mismatch.eq(incoming.as_value() != expected_header.as_value()),
            first_length.eq(_hw_length(incoming.bth.psn, self._max_payload)),
        ]
        header = beat.header

        # Stage 2: compare the payload with the expected pattern (from the PSN on the first
        # beat).
        expected_next = Signal(width)           # pattern of the beat after the current one
        expected_length = Signal(16)
        bytes_seen = Signal(16)
        failed = Signal()                       # a check failed earlier in this packet
        psn = header.bth.psn
        expected = Mux(beat.first, _hw_seed(psn, width), expected_next)
        length = Mux(beat.first, first_length, expected_length)
        seen = Mux(beat.first, 0, bytes_seen)
        keep_bits = Cat(*(beat.keep[n].replicate(8) for n in range(lanes)))
        count = Signal(range(lanes + 1))
        m.d.comb += count.eq(sum(beat.keep[n] for n in range(lanes)))
        data_bad = ((beat.data ^ expected) & keep_bits) != 0
        length_bad = (header.reth.dma_len != length) | (
            header.payload_len != Mux(header.trimmed, 0, length))
        beat_bad = (failed & ~beat.first) | header_mismatch | length_bad | (
            ~header.trimmed & data_bad) | (header.trimmed & (beat.keep != 0))
        with m.If(valid):
            m.d.sync += [
                expected_next.eq(_hw_step(expected, width)),
                expected_length.eq(length),
                bytes_seen.eq(seen + count),
                failed.eq(beat_bad),
            ]
        # Stage 3: count the packet (its verdict registered first: the checks and the
        # counters' enables in one cycle were the ECPIX-5 self-test's critical path at 125 MHz).
        done = Signal()
        done_bad = Signal()
        done_trimmed = Signal()
        m.d.sync += [
            done.eq(valid & beat.last),
            done_bad.eq(beat_bad | (~header.trimmed & (seen + count != length))),
            done_trimmed.eq(header.trimmed),
        ]
        with m.If(done):
            with m.If(done_bad):
                m.d.sync += self.bad.eq(self.bad + 1)
            with m.Elif(done_trimmed):
                m.d.sync += self.trimmed.eq(self.trimmed + 1)
            with m.Else():
                m.d.sync += self.received.eq(self.received + 1)
        return m


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------

def _nibble_ascii(nibble):
    return Mux(nibble < 10, ord("0") + nibble, ord("a") - 10 + nibble)


class Reporter(wiring.Component):
    """Print a snapshot of the counters as one text line every ``period`` cycles.

    The line is ``"MRC name=XXXXXXXX name=XXXXXXXX ...\\r\\n"``, each value 8 lower-case hex
    digits; all values are snapshotted in the same cycle. A period that starts while the
    previous line is still being sent is skipped (its counters are in the next line).

    Members
    -------
    values : ``In(data.ArrayLayout(32, len(names)))``
    o : ``Out(stream.Signature(8))``
        Characters, to :class:`~boards.uart.UARTTx`.
    tick : ``Out(1)``
        One-cycle strobe at the start of every period (also drives the LED heartbeat).
    """

    def __init__(self, *, names, period):
        with validating(self):
            if not isinstance(period, int) or period < 1:
                raise ValueError(f"period must be a positive integer, not {period!r}")
            if not names or not all(isinstance(n, str) and n.isidentifier() for n in names):
                raise ValueError(f"names must be a non-empty sequence of identifiers, "
                                 f"not {names!r}")
        self._names = tuple(names)
        self._period = period
        super().__init__({
            "values": In(data.ArrayLayout(32, len(self._names))),
            "o": Out(stream.Signature(8)),
            "tick": Out(1),
        })

    def line_items(self):
        """The line as ``("char", code)`` and ``("nibble", counter, index)`` items."""
        items = [("char", ord(c)) for c in "MRC"]
        for index, name in enumerate(self._names):
            items += [("char", ord(c)) for c in f" {name}="]
            items += [("nibble", index, 7 - n) for n in range(8)]
        items += [("char", 13), ("char", 10)]
        return items

    def elaborate(self, platform):
        m = Module()
        items = self.line_items()
        count = len(self._names)
        timer = Signal(range(self._period))
        # The digit sent is always the top nibble of ``current``, a copy of the counter being
        # printed that shifts by 4 bits per digit; it is reloaded from the snapshot (by a
        # registered counter index) while the text before the counter is sent. An indexed pick
        # of any nibble of any counter by position (a mux over 32 x N bits), and then shifting
        # the whole snapshot (an enable fanned out to 32 x N flip-flops), were in turn the
        # 125 MHz ECPIX-5 self-test's critical path (docs/boards.md).
        snapshot = Signal(data.ArrayLayout(32, count))
        current = Signal(32)
        index = Signal(range(count))
        position = Signal(range(len(items)))
        active = Signal()
        is_char = Signal()
        char = Signal(8)
        last_digit = Signal()                   # the counter's last (lowest) digit

        m.d.comb += self.tick.eq(timer == 0)
        m.d.sync += timer.eq(Mux(timer == self._period - 1, 0, timer + 1))
        with m.If(self.tick & ~active):
            m.d.sync += [snapshot.eq(self.values), index.eq(0), position.eq(0),
                         active.eq(1)]

        # ``is_char``, ``char`` and ``last_digit`` describe ``items[position]`` and are
        # registered: they are decoded ahead while the current one is sent (the decode of the
        # position behind the UART handshake was the critical path next).
        def item_bits(item):
            """``is_char``, ``char`` and ``last_digit`` of ``item`` (all 0 past the end)."""
            if item is None:
                return 0, 0, 0
            if item[0] == "char":
                return 1, item[1], 0
            return 0, 0, int(item[2] == 0)

        def as_value(bits):
            return Cat(C(bits[0], 1), C(bits[1], 8), C(bits[2], 1))

        def decode(at, is_char_, char_, last_digit_):
            with m.Switch(at):
                for n, item in enumerate(items):
                    with m.Case(n):
                        m.d.comb += Cat(is_char_, char_, last_digit_).eq(
                            as_value(item_bits(item)))

        # Two positions ahead: the decode of ``position + 2`` is registered into ``ahead_*``
        # (the next position's item), which ``is_char``, ``char`` and ``last_digit`` take at
        # the handshake. Yosys turns the decode into a ROM and may move a register behind it
        # to its address; the second register keeps the ROM's logic out of the cycle that
        # feeds ``current``.
        ahead_is_char = Signal()
        ahead_char = Signal(8)
        ahead_last_digit = Signal()
        later_position = Signal(range(len(items) + 2))
        later_is_char = Signal()
        later_char = Signal(8)
        later_last_digit = Signal()
        m.d.comb += later_position.eq(position + 2)
        decode(later_position, later_is_char, later_char, later_last_digit)

        second = items[1] if len(items) > 1 else None
        with m.If(self.tick & ~active):
            m.d.sync += [Cat(is_char, char, last_digit).eq(as_value(item_bits(items[0]))),
                         Cat(ahead_is_char, ahead_char, ahead_last_digit).eq(
                             as_value(item_bits(second)))]
        with m.Elif(self.o.valid & self.o.ready):
            m.d.sync += [is_char.eq(ahead_is_char), char.eq(ahead_char),
                         last_digit.eq(ahead_last_digit),
                         ahead_is_char.eq(later_is_char), ahead_char.eq(later_char),
                         ahead_last_digit.eq(later_last_digit)]
        m.d.comb += [
            self.o.payload.eq(Mux(is_char, char, _nibble_ascii(current[-4:]))),
            self.o.valid.eq(active),
        ]
        with m.If(is_char):
            m.d.sync += current.eq(snapshot[index])
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += position.eq(position + 1)
            with m.If(~is_char):
                m.d.sync += current.eq(current << 4)
                with m.If(last_digit & (index != count - 1)):
                    m.d.sync += index.eq(index + 1)
            with m.If(position == len(items) - 1):
                m.d.sync += active.eq(0)
        return m


# ---------------------------------------------------------------------------------------------
# Status logic shared by the self-tests (this one and boards.transport)
# ---------------------------------------------------------------------------------------------

def popcount(bits):
    return sum(bits[n] for n in range(len(bits)))


def kill_schedule(m, *, tick, heartbeat, plane, planes):
    """Toggle ``heartbeat`` every report period (``tick``) and return a ``planes``-bit mask
    that kills ``plane`` (None: none) during the fourth of every four periods."""
    periods = Signal(2)
    with m.If(tick):
        m.d.sync += [periods.eq(periods + 1), heartbeat.eq(~heartbeat)]
    auto = Signal(planes)
    if plane is not None:
        m.d.comb += auto[plane].eq(periods == 3)
    return auto


def fabric_counts(m, fabric, names):
    """The fabric's per-plane strobes ``names``, registered (off the critical paths), and a
    32-bit count of each over all planes: ``(strobes, counts)``, dicts by name."""
    strobes, counts = {}, {}
    for name in names:
        strobes[name] = strobe = Signal(len(getattr(fabric, name)), name=f"{name}_strobe")
        counts[name] = count = Signal(32, name=f"{name}_count")
        m.d.sync += [strobe.eq(getattr(fabric, name)), count.eq(count + popcount(strobe))]
    return strobes, counts


def activity_flag(m, *, tick, progress, activity):
    """``activity``: ``progress`` (a counter) moved during the last report period."""
    recent = Signal()
    with m.If(tick):
        m.d.sync += [activity.eq(recent), recent.eq(0)]
    last = Signal(32)
    m.d.sync += last.eq(progress)
    with m.If(last != progress):
        m.d.sync += recent.eq(1)


# ---------------------------------------------------------------------------------------------
# The self-test
# ---------------------------------------------------------------------------------------------

#: The counters of :class:`SelfTest`, in ``counters`` order and in the UART line. Per-plane
#: counters ``pass<p>`` (frames the fabric let through on plane p) follow these.
COUNTERS = (
    "sent",         # packets the generator handed to engine A
    "accepted",     # frames engine B's parser accepted
    "received",     # good data packets at the checker
    "trimmed",      # good trimmed packets at the checker
    "bad",          # packets failing a check (payload, length, header)
    "dropped",      # frames engine B's parser dropped (any reason)
    "lost",         # frames the fabric lost (LFSR)
    "killed",       # frames dropped on a killed plane
    "txerr",        # engine A: length errors + bad-port frames
)


class SelfTest(wiring.Component):
    """Generator, engine A, impaired fabric, engine B, checker, UART report, LED status.

    When all is well, after the traffic drains: ``accepted = sent - lost - killed``,
    ``received + trimmed = accepted``, ``trimmed`` = frames the fabric trimmed, and ``bad``,
    ``dropped`` and ``txerr`` stay 0.

    Parameters
    ----------
    config : NicConfig
        Engine configuration; ``ports`` is the plane count, ``clock_hz`` sets the baud divisor.
    max_payload : int
        Largest payload (power of two, at most the MTU).
    delays : tuple of int
        Per-plane fabric delay in cycles; its length must equal ``config.ports``.
    loss_rate, trim_rate : int
        Reset values of the fabric's per-frame probabilities, in 1/256.
    report_period : int
        Cycles between UART lines (``config.clock_hz`` for one per second).
    baud : int
        UART rate.
    packet_limit : int
        Stop after this many packets; 0 = run forever.
    gap : int
        Idle cycles between packets.
    auto_kill : bool
        Kill the last plane during every fourth report period (boards without buttons).

    Members
    -------
    uart_tx : ``Out(1, init=1)``
    kill : ``In(ports)``
        Bit p kills plane p (OR-ed with the automatic schedule).
    counters : ``Out(data.ArrayLayout(32, len(COUNTERS) + ports))``
    heartbeat, activity, error : ``Out(1)``
        Toggles each report period; a packet was received in the last period; a check failed
        (``bad``, ``dropped`` or ``txerr`` not 0), sticky.
    killed_planes : ``Out(ports)``
        The planes being killed now.
    """

    def __init__(self, *, config, max_payload=256, delays=None, loss_rate=8, trim_rate=8,
                 report_period=None, baud=115200, packet_limit=0, gap=0, auto_kill=False):
        with validating(self):
            _check_config(config)
            _check_max_payload(max_payload, config)
            delays = tuple(16 + 24 * p for p in range(config.ports)) if delays is None \
                else delays
            if not isinstance(delays, tuple) or len(delays) != config.ports:
                raise ValueError(f"delays must be a tuple of {config.ports} plane delays, "
                                 f"not {delays!r}")
            for name, rate in (("loss_rate", loss_rate), ("trim_rate", trim_rate)):
                if not isinstance(rate, int) or not 0 <= rate <= 255:
                    raise ValueError(f"{name} must be an integer from 0 to 255, not {rate!r}")
            report_period = config.clock_hz if report_period is None else report_period
            if not isinstance(report_period, int) or report_period < 1:
                raise ValueError(f"report_period must be a positive integer, "
                                 f"not {report_period!r}")
            divisor = round(config.clock_hz / baud)
            if divisor < 2:
                raise ValueError(f"baud must be at most clock_hz / 2, not {baud!r}")
            if not isinstance(gap, int) or not 0 <= gap <= 255:
                raise ValueError(f"gap must be an integer from 0 to 255, not {gap!r}")
        self._config = config
        self._max_payload = max_payload
        self._delays = delays
        self._loss_rate = loss_rate
        self._trim_rate = trim_rate
        self._report_period = report_period
        self._divisor = divisor
        self._packet_limit = packet_limit
        self._gap = gap
        self._auto_kill = auto_kill
        #: The engines, reachable for tests (their ``rx_packets`` is the checker's input).
        self.engines = EngineAdapter(config=config)
        ports = config.ports
        super().__init__({
            "uart_tx": Out(1, init=1),
            "kill": In(ports),
            "counters": Out(data.ArrayLayout(32, len(COUNTERS) + ports)),
            "heartbeat": Out(1),
            "activity": Out(1),
            "error": Out(1),
            "killed_planes": Out(ports),
        })

    @property
    def config(self):
        return self._config

    @property
    def counter_names(self):
        return COUNTERS + tuple(f"pass{p}" for p in range(self._config.ports))

    def elaborate(self, platform):
        m = Module()
        config = self._config
        ports = config.ports
        names = self.counter_names
        index = {name: n for n, name in enumerate(names)}

        m.submodules.generator = generator = TrafficGenerator(
            config=config, max_payload=self._max_payload)
        m.submodules.engines = engines = self.engines
        m.submodules.fabric = fabric = ImpairedFabric(
            data_width=config.data_width, delays=self._delays, trim_dscp=config.trim_dscp)
        m.submodules.checker = checker = PayloadChecker(
            config=config, max_payload=self._max_payload)
        m.submodules.reporter = reporter = Reporter(names=names, period=self._report_period)
        m.submodules.uart = uart = UARTTx(divisor=self._divisor)

        wiring.connect(m, generator.o, engines.tx_packets)
        for p in range(ports):
            wiring.connect(m, engines.net_tx[p], fabric.i[p])
            wiring.connect(m, fabric.o[p], engines.net_rx[p])
        wiring.connect(m, engines.rx_packets, checker.i)
        wiring.connect(m, reporter.o, uart.i)
        m.d.comb += self.uart_tx.eq(uart.tx)

        # Kill schedule: the last plane during the fourth of every four report periods.
        auto = kill_schedule(m, tick=reporter.tick, heartbeat=self.heartbeat, planes=ports,
                             plane=ports - 1 if self._auto_kill else None)
        # Registered: the kill inputs and the fabric's strobes are off the critical paths.
        kill = Signal(ports)
        m.d.sync += kill.eq(self.kill | auto)
        m.d.comb += [
            fabric.kill.eq(kill),
            self.killed_planes.eq(kill),
            fabric.loss_rate.eq(self._loss_rate),
            fabric.trim_rate.eq(self._trim_rate),
            generator.enable.eq(1),
            generator.limit.eq(self._packet_limit),
            generator.gap.eq(self._gap),
        ]

        # Counters.
        counters = self.counters
        m.d.comb += [
            counters[index["sent"]].eq(generator.sent),
            counters[index["received"]].eq(checker.received),
            counters[index["trimmed"]].eq(checker.trimmed),
            counters[index["bad"]].eq(checker.bad),
            counters[index["txerr"]].eq(engines.tx_errors),
        ]
        accepted = Signal(32)
        dropped = Signal(32)
        with m.If(engines.rx_verdict_valid):
            with m.If(engines.rx_verdict_reason == DropReason.NONE):
                m.d.sync += accepted.eq(accepted + 1)
            with m.Else():
                m.d.sync += dropped.eq(dropped + 1)
        strobes, counts = fabric_counts(m, fabric, ("frame", "lost", "killed"))
        m.d.comb += [
            counters[index["accepted"]].eq(accepted),
            counters[index["dropped"]].eq(dropped),
            counters[index["lost"]].eq(counts["lost"]),
            counters[index["killed"]].eq(counts["killed"]),
        ]
        for p in range(ports):
            passed = Signal(32, name=f"pass{p}")
            with m.If(strobes["frame"][p] & ~strobes["lost"][p] & ~strobes["killed"][p]):
                m.d.sync += passed.eq(passed + 1)
            m.d.comb += counters[index[f"pass{p}"]].eq(passed)
        m.d.comb += reporter.values.eq(counters)

        # Status.
        activity_flag(m, tick=reporter.tick, progress=checker.received, activity=self.activity)
        with m.If((checker.bad != 0) | (dropped != 0) | (engines.tx_errors != 0)):
            m.d.sync += self.error.eq(1)
        return m
