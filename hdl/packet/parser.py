"""Receive parser: validates MRC frames, extracts their headers and realigns their payload.

Frames arrive as network beats (Ethernet without FCS). Every frame is written to a block-RAM
packet FIFO while a capture register keeps its first bytes and the ICRC is computed on the
fly; when the frame has ended, a short decode pipeline checks every header, in wire order,
and either queues the parsed header for the reader or drops the frame. The reader streams the
payload of accepted frames out of the FIFO, realigned to lane 0, with the header attached.
``docs/parser.md`` describes the checks, the drop reasons and the sizing.
"""

import zlib
from dataclasses import dataclass

from amaranth.hdl import Cat, Const, EnableInserter, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2, exact_log2

from .. import protocol as P
from ..config import NicConfig
from ..util import onehot_select
from . import layouts as L
from .crc import CRC32
from .headers import (
    DropReason,
    PacketKind,
    field_slices,
    net_beat_layout,
    opcode_kind,
    packet_beat_layout,
    packet_header_layout,
)
from .pktfifo import PacketFifo

__all__ = ["Parser", "ETHERNET", "DOT1Q", "IPV4", "IPV6", "SRH", "UDP", "ICRC_MASKED_FIELDS"]


# Standard headers in front of the BTH and the ICRC facts live in hdl.packet.layouts; these
# names stay importable from here.
ETHERNET, DOT1Q, IPV4, IPV6, SRH, UDP = L.ETHERNET, L.DOT1Q, L.IPV4, L.IPV6, L.SRH, L.UDP
ICRC_MASKED_FIELDS = L.ICRC_MASKED_FIELDS
ICRC_INIT_BYTES = L.ICRC_INIT_BYTES

#: SRH ``hdr_ext_len`` of a header with exactly one 16-byte segment and no TLVs (8-byte units
#: after the first 8 bytes).
SRH_ONE_SEGMENT_LEN = (SRH.size - 8) // 8

#: CRC of any message followed by its own CRC (little-endian): the ICRC check needs no
#: knowledge of where the ICRC starts, only that the frame ends with it.
ICRC_RESIDUE = zlib.crc32(zlib.crc32(b"").to_bytes(4, "little"))

_MODE_PLAIN, _MODE_SRV6, _MODE_SRH = 0, 1, 2     # SRV6: outer next header 41 or 4; SRH: 43
#: Shortest Ethernet frame without FCS: shorter frames are padded to it, and a frame of exactly
#: this size may carry padding after its IP packet.
ETHERNET_MIN_FRAME = 60


@dataclass(frozen=True)
class _Stack:
    """One header stack up to the UDP header: every byte offset in a frame follows from it."""
    vlan: bool
    mode: int           # _MODE_PLAIN, _MODE_SRV6 (outer IPv6, nh 41/4), _MODE_SRH (outer nh 43)
    inner_v4: bool      # the IP header the ICRC starts at (the only one when plain) is IPv4

    @property
    def code(self):
        return int(self.vlan) | int(self.inner_v4) << 1 | self.mode << 2

    @property
    def l3(self):
        return DOT1Q.size if self.vlan else ETHERNET.size

    @property
    def outer_size(self):
        """Size of the first IP header."""
        return IPV4.size if self.mode == _MODE_PLAIN and self.inner_v4 else IPV6.size

    @property
    def x(self):
        """Offset of the inner IP header (where the ICRC starts)."""
        return self.l3 + (0, IPV6.size, IPV6.size + SRH.size)[self.mode]

    @property
    def inner_size(self):
        return IPV4.size if self.inner_v4 else IPV6.size

    @property
    def u(self):
        return self.x + self.inner_size

    @property
    def t(self):
        return self.u + UDP.size


STACKS = tuple(_Stack(vlan, mode, v4) for vlan in (False, True)
               for mode in (_MODE_PLAIN, _MODE_SRV6, _MODE_SRH) for v4 in (False, True))

#: Bytes of transport headers after the BTH, by (kind, immediate, BTH.ts of a data packet).
#: A control packet is exactly its headers long.
_TRANSPORT_SIZE = {
    (opcode_kind(op), False, False): L.headers_size(headers)
    for op, headers in L.CONTROL_HEADERS.items()
} | {
    (PacketKind.DATA, imm, ts): L.headers_size(L.data_headers(op, ts=ts))
    for op, imm in ((P.Opcode.RDMA_WRITE_ONLY, False),
                    (P.Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE, True))
    for ts in (False, True)
}
_L4_WINDOW = UDP.size + L.BTH.size + max(_TRANSPORT_SIZE.values())
#: Bytes the capture register keeps: the longest legal header stack.
HEADER_BYTES = max(s.u for s in STACKS) + _L4_WINDOW


def max_frame_bytes(config):
    """The longest frame that can be legal: the longest stack and data headers, an MTU of
    payload, the ICRC (control packets are shorter)."""
    longest_data = max(size for (kind, _, _), size in _TRANSPORT_SIZE.items()
                       if kind == PacketKind.DATA)
    longest_control = max(_TRANSPORT_SIZE.values())
    return (max(s.t for s in STACKS) + L.BTH.size + P.ICRC_BYTES
            + max(longest_data + config.mtu, longest_control))


def _icrc_mask_bytes(inner_v4):
    """Per byte from the inner IP header on: the bits the ICRC replaces by ones (as values)."""
    ip = IPV4 if inner_v4 else IPV6
    size = ip.size + UDP.size + L.BTH.size
    mask = [0] * size
    parts = [(ICRC_MASKED_FIELDS[4 if inner_v4 else 6], 0),
             (ICRC_MASKED_FIELDS["udp"], ip.size),
             (ICRC_MASKED_FIELDS["bth"], ip.size + UDP.size)]
    for fields, base in parts:
        for header, name in fields:
            first, bit, bits = field_slices(header)[name]
            for k in range(bits):
                wire_bit = bit + k                  # 0 = most significant bit of the byte
                mask[base + first + wire_bit // 8] |= 0x80 >> (wire_bit % 8)
    while mask and mask[-1] == 0:
        mask.pop()
    return mask


# ---------------------------------------------------------------------------------------------
# Byte helpers
# ---------------------------------------------------------------------------------------------

def _bytes(value, count):
    """``value`` as a list of ``count`` bytes, wire byte i in bits ``8*i .. 8*i+7``."""
    return [value[8 * i:8 * i + 8] for i in range(count)]


def _field(window, header, name, base=0):
    """Field ``name`` of ``header`` starting at byte ``base`` of ``window`` (a byte list)."""
    first, bit, bits = field_slices(header)[name]
    count = (bit + bits + 7) // 8
    value = Cat(*reversed(window[base + first:base + first + count]))   # big-endian
    low = count * 8 - bit - bits
    return value[low:low + bits]


def _offset(header, name):
    first, bit, _bits = field_slices(header)[name]
    assert bit == 0
    return first


def _priority(m, conditions, width):
    """The reason of the first true condition, NONE if none is: ``[(condition, reason)]``."""
    reason = Signal(width)
    for condition, value in reversed(conditions):
        reason_if = Signal(width)
        m.d.comb += reason_if.eq(Mux(condition, value.value, reason))
        reason = reason_if
    return reason


class Parser(wiring.Component):
    """Parse, validate and realign received MRC frames; drop bad ones whole, counting why.

    Store and forward: a frame is only forwarded once all of it, ICRC included, has been
    checked. Input frames (Ethernet without FCS) are delimited by ``last`` (``first`` is not
    needed); ``keep`` is taken as full on every beat but the last, whose valid lanes start at
    lane 0. Every frame gets one verdict, in input order: accepted frames come out of ``o`` once,
    in order; dropped frames leave nothing on ``o``. Bad input never stalls the parser.

    Checks, in the order that decides the reported reason (``docs/parser.md``): frame longer
    than the longest legal frame (OVERSIZE, before anything else); Ethernet/802.1Q; the first IP
    header (IPv4 without options and fragments, checksum verified; or IPv6), its length against
    the frame (a 60-byte frame may be padded), its protocol; SRv6 (outer next header 41 or 4,
    or 43 with a type-4 SRH of one segment) and the inner IP header; UDP port 4791 and length; BTH
    version and pad count; the opcode (not an MRC 1.0 opcode: UNSUPPORTED_OPCODE); the transport
    headers' lengths (RUNT when the frame ends before a data packet's METH, [TSETH], RETH,
    [ImmDt] and ICRC do, which BTH.ts and the opcode decide; BAD_LENGTH when a control packet is
    not exactly its headers and the ICRC long); payload over the MTU; RETH ``dma_len``; the
    ICRC last. A data frame whose inner traffic class carries the trim DSCP is a trimmed DATA
    packet: its ICRC and ``dma_len`` are not checked and its payload is discarded.

    Throughput: one beat per cycle (II = 1) for back-to-back frames of any size, as long as
    ``o`` is ready; ``i.ready`` drops only when the packet FIFO or the header queue is full
    because ``o`` is backpressured. Latency (cycles, no backpressure): the verdict strobe comes
    6 cycles after the cycle that transfers a frame's last beat; the first output beat of an
    accepted frame 10 cycles after it for a packet without payload, 12 for one with payload
    (11 at W = 256, which reads the packet FIFO without an output register).

    Parameters
    ----------
    config : :class:`~hdl.config.NicConfig`
        ``data_width`` (64, 128 or 256), ``mtu`` and the initial ``trim_dscp``.

    Members
    -------
    i : ``In(stream.Signature(net_beat_layout(data_width, tagged=True)))``
        Received frames; ``port`` is taken from the first beat.
    o : ``Out(stream.Signature(packet_beat_layout(config)))``
        Accepted packets: the parsed header (stable on every beat) and the payload from lane 0
        of the first beat; ``keep``/``last`` on the last beat. A packet without payload (a
        control packet, a trimmed or zero-length write) is one beat with ``first``, ``last``
        and ``keep == 0``.
    trim_dscp : ``In(6, init=config.trim_dscp)``
        The DSCP that marks trimmed packets.
    counters : ``Out(data.ArrayLayout(32, len(DropReason)))``
        Element 0 counts accepted frames, element ``r`` frames dropped for
        :class:`DropReason` ``r``. Wrapping (modulo 2**32); updated the cycle after the verdict.
    verdict_valid : ``Out(1)``
        One-cycle strobe per input frame, in input order.
    verdict_reason : ``Out(DropReason)``
        ``NONE`` for an accepted frame, else why it was dropped; valid with ``verdict_valid``.
    """

    #: Header queue entries (accepted frames waiting for the reader, plus reservations).
    HEADER_QUEUE_DEPTH = 16

    def __init__(self, *, config):
        if not isinstance(config, NicConfig):
            raise TypeError(f"Config must be a NicConfig, not {config!r}")
        self._config = config
        lanes = config.bytes_per_beat
        self._lanes = lanes
        self._max_frame = max_frame_bytes(config)
        self._max_beats = -(-self._max_frame // lanes)
        self._fifo_depth = 1 << ceil_log2(2 * self._max_beats + 16)
        super().__init__({
            "i": In(stream.Signature(net_beat_layout(config.data_width, tagged=True))),
            "o": Out(stream.Signature(packet_beat_layout(config))),
            "trim_dscp": In(6, init=config.trim_dscp),
            "counters": Out(data.ArrayLayout(32, len(DropReason))),
            "verdict_valid": Out(1),
            "verdict_reason": Out(DropReason),
        })

    @property
    def config(self):
        return self._config

    @property
    def max_frame_bytes(self):
        """Frames longer than this are dropped (OVERSIZE) without being stored."""
        return self._max_frame

    @property
    def fifo_depth(self):
        """Beats of the packet FIFO: at least two of the longest frames."""
        return self._fifo_depth

    # -----------------------------------------------------------------------------------------

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        W = cfg.data_width
        lanes = self._lanes
        lane_bits = exact_log2(lanes)
        max_beats = self._max_beats
        beat_bits = ceil_log2(max_beats + 1)
        cap_beats = -(-HEADER_BYTES // lanes)
        len_bits = ceil_log2((max_beats + 1) * lanes + 1)
        hq_depth = self.HEADER_QUEUE_DEPTH
        header_layout = packet_header_layout(cfg)

        # A registered FIFO read (for timing) costs the reader one cycle per frame; at W = 256
        # the shortest frames leave no cycle to spare, so that width reads the RAM directly.
        m.submodules.fifo = fifo = PacketFifo(width=W, depth=self._fifo_depth,
                                              registered_read=W <= 128)
        m.submodules.crc = crc = CRC32(data_width=W, init_bytes=ICRC_INIT_BYTES,
                                       residue=ICRC_RESIDUE)
        ptr_bits = fifo.ptr_bits

        entry_layout = data.StructLayout({
            "header": header_layout,
            "pay_ptr": ptr_bits,        # FIFO beat holding the first payload byte
            "pay_lane": lane_bits,      # lane of the first payload byte
            "end_ptr": ptr_bits,        # FIFO beat after the frame
            "in_beats": beat_bits,      # FIFO beats the payload touches
            "out_beats": beat_bits,     # output beats (>= 1)
            "last_keep": lanes,         # keep of the last output beat
            "has_payload": 1,
            "seek_ptr": ptr_bits,       # where the reader goes: the payload, or past the frame
        })
        m.submodules.queue = queue = SyncFIFOBuffered(width=entry_layout.size, depth=hq_depth)

        # =====================================================================================
        # Input: admission, and byte matches that locate the header stack (registered into s1)
        # =====================================================================================
        in_beat = Signal(beat_bits)         # index of the next input beat within its frame
        in_flight = Signal(range(hq_depth + 1))     # frames started, verdict not yet given
        frame_start = Signal()
        accept = Signal()
        # Room for the beat in s1 and this one (FIFO space falls by at most one beat a cycle, so
        # a margin of one more lets the conditions be registered); a frame start needs a header
        # queue reservation (the sum below rises by at most one a cycle).
        fifo_room = Signal(init=1)
        queue_room = Signal(init=1)
        m.d.sync += [
            fifo_room.eq(fifo.w_space >= 3),
            queue_room.eq(queue.level + in_flight < hq_depth - 1),
        ]
        m.d.comb += [
            frame_start.eq(in_beat == 0),
            self.i.ready.eq(fifo_room & (~frame_start | queue_room)),
            accept.eq(self.i.valid & self.i.ready),
        ]
        with m.If(accept):
            with m.If(self.i.payload.last):
                m.d.sync += in_beat.eq(0)
            with m.Elif(in_beat != max_beats):
                m.d.sync += in_beat.eq(in_beat + 1)

        # Byte values at fixed frame offsets that select the stack: (offset, value, bytes).
        ethertype_at = _offset(ETHERNET, "ethertype")
        vlan_ethertype_at = _offset(DOT1Q, "ethertype")
        nh_in_ipv6 = _offset(IPV6, "next_header")
        nh_in_srh = IPV6.size + _offset(SRH, "next_header")
        matches = {
            "vlan": (ethertype_at, P.ETHERTYPE_VLAN, 2),
            "v4": (ethertype_at, P.ETHERTYPE_IPV4, 2),
            "v6": (ethertype_at, P.ETHERTYPE_IPV6, 2),
            "vlan_v4": (vlan_ethertype_at, P.ETHERTYPE_IPV4, 2),
            "vlan_v6": (vlan_ethertype_at, P.ETHERTYPE_IPV6, 2),
        }
        for vlan in (False, True):
            l3 = DOT1Q.size if vlan else ETHERNET.size
            tag = "vlan_" if vlan else ""
            matches[tag + "nh41"] = (l3 + nh_in_ipv6, P.IP_PROTO_IPV6, 1)
            matches[tag + "nh4"] = (l3 + nh_in_ipv6, P.IP_PROTO_IPV4, 1)
            matches[tag + "nh43"] = (l3 + nh_in_ipv6, P.IP_PROTO_ROUTING, 1)
            matches[tag + "srh4"] = (l3 + nh_in_srh, P.IP_PROTO_IPV4, 1)

        # The frame's stack flags so far, and the stack they select, are decided here, in the
        # input stage, from this beat's byte matches and a running register: s1 receives them
        # registered, so its CRC mask select and the stack's one-hot decode start at flip-flops
        # (behind the flag logic they were the 125 MHz self-test's critical path).
        flag_names = ("vlan", "v4", "v6", "nh41", "nh4", "nh43", "srh4")
        hit = {}
        in_bytes = _bytes(self.i.payload.data, lanes)
        for name, (offset, value, count) in matches.items():
            lane = offset % lanes
            wire = Cat(*reversed(in_bytes[lane:lane + count]))
            hit[name] = Signal(name=f"in_hit_{name}")
            m.d.comb += hit[name].eq((in_beat == offset // lanes) & (wire == value))
        # ``flag``: the flags up to the beat in s1 (registered); ``in_flag``: up to this beat.
        flag = {name: Signal(name=f"frame_{name}") for name in flag_names}
        in_flag = {name: Signal(name=f"in_{name}") for name in flag_names}
        prev = {name: flag[name] & ~frame_start for name in flag_names}
        m.d.comb += in_flag["vlan"].eq(prev["vlan"] | hit["vlan"])
        for name in flag_names[1:]:
            m.d.comb += in_flag[name].eq(
                prev[name] | Mux(in_flag["vlan"], hit["vlan_" + name], hit[name]))
        in_mode = Signal(2)
        in_inner_v4 = Signal()
        with m.If(in_flag["v6"] & (in_flag["nh41"] | in_flag["nh4"])):
            m.d.comb += [in_mode.eq(_MODE_SRV6), in_inner_v4.eq(in_flag["nh4"])]
        with m.Elif(in_flag["v6"] & in_flag["nh43"]):
            m.d.comb += [in_mode.eq(_MODE_SRH), in_inner_v4.eq(in_flag["srh4"])]
        with m.Else():
            m.d.comb += [in_mode.eq(_MODE_PLAIN), in_inner_v4.eq(in_flag["v4"])]

        s1_valid = Signal()
        s1 = Signal(net_beat_layout(W, tagged=True))
        s1_beat = Signal(beat_bits)
        in_stack = Signal(4)
        stack = Signal(4)
        stack_hot = Signal(len(STACKS))     # ``stack`` one-hot, in STACKS order
        m.d.comb += in_stack.eq(Cat(in_flag["vlan"], in_inner_v4, in_mode))
        m.d.sync += s1_valid.eq(accept)
        with m.If(accept):
            m.d.sync += [s1.eq(self.i.payload), s1_beat.eq(in_beat), stack.eq(in_stack),
                         stack_hot.eq(Cat(in_stack == st.code for st in STACKS))]
            m.d.sync += [flag[name].eq(in_flag[name]) for name in flag_names]

        # =====================================================================================
        # s1: capture, tail window, FIFO write, ICRC preparation
        # =====================================================================================
        s1_first = Signal()
        m.d.comb += s1_first.eq(s1_beat == 0)

        # ICRC preparation: from the inner IP header on, variant fields forced to ones. Until
        # the outer next header is known the stack is taken as plain; an SRv6 frame restarts
        # the CRC at its inner header, always in a later beat than the next header byte.
        crc_masks = {v4: _icrc_mask_bytes(v4) for v4 in (False, True)}
        crc_beats = max((s.x + len(crc_masks[s.inner_v4]) - 1) // lanes + 1 for s in STACKS)
        crc_keep = Signal(lanes)
        crc_mask = Signal(W)
        crc_first = Signal()
        with m.Switch(stack):
            for s in STACKS:
                with m.Case(s.code):
                    mask_bytes = crc_masks[s.inner_v4]
                    with m.Switch(s1_beat):
                        for beat in range(crc_beats):
                            keep, mask = 0, 0
                            for lane in range(lanes):
                                rel = beat * lanes + lane - s.x
                                if rel >= 0:
                                    keep |= 1 << lane
                                if 0 <= rel < len(mask_bytes):
                                    mask |= mask_bytes[rel] << (8 * lane)
                            with m.Case(beat):
                                m.d.comb += [crc_keep.eq(keep), crc_mask.eq(mask),
                                             crc_first.eq(s.x // lanes == beat)]
                        with m.Default():
                            m.d.comb += crc_keep.eq((1 << lanes) - 1)
            with m.Default():
                m.d.comb += crc_keep.eq((1 << lanes) - 1)
        all_lanes = (1 << lanes) - 1
        frame_keep = Signal(lanes)
        m.d.comb += frame_keep.eq(Mux(s1.last, s1.keep, all_lanes))
        s2_valid = Signal()
        s2_first = Signal()
        s2_keep = Signal(lanes)
        s2_data = Signal(W)
        m.d.sync += [
            s2_valid.eq(s1_valid),
            s2_first.eq(crc_first),
            s2_keep.eq(crc_keep & frame_keep),
            s2_data.eq(s1.data | crc_mask),
        ]
        m.d.comb += [
            crc.valid.eq(s2_valid),
            crc.first.eq(s2_first),
            crc.keep.eq(s2_keep),
            crc.data.eq(s2_data),
        ]

        # Capture of the first HEADER_BYTES.
        cap = Signal(cap_beats * W)
        with m.If(s1_valid):
            with m.Switch(s1_beat):
                for slot in range(cap_beats):
                    with m.Case(slot):
                        m.d.sync += cap.word_select(slot, W).eq(s1.data)

        # Packet FIFO: every beat of a frame up to the longest legal frame; a longer frame is
        # rolled back at its first excess beat and the rest of it is not stored.
        start_reg = Signal(ptr_bits)
        start_ptr = Signal(ptr_bits)
        port_reg = Signal.like(s1.port)
        port = Signal.like(s1.port)
        stored = Signal()
        m.d.comb += [
            start_ptr.eq(Mux(s1_first, fifo.w_ptr, start_reg)),
            port.eq(Mux(s1_first, s1.port, port_reg)),
            stored.eq(s1_beat < max_beats),
            fifo.w_data.eq(s1.data),
            fifo.w_en.eq(s1_valid & stored),
            fifo.w_commit.eq(s1_valid & stored & s1.last),
            fifo.w_rollback.eq(s1_valid & ~stored),
        ]
        with m.If(s1_valid):
            m.d.sync += [start_reg.eq(start_ptr), port_reg.eq(port)]

        last_bytes = Signal(range(lanes + 1))
        for lane in range(lanes):
            with m.If(s1.keep[lane]):
                m.d.comb += last_bytes.eq(lane + 1)

        # =====================================================================================
        # D0: the frame has ended: freeze what the decode needs
        # =====================================================================================
        d0_valid = Signal()
        d0_cap = Signal.like(cap)
        d0_len = Signal(len_bits)
        d0_flag = {name: Signal(name=f"d0_{name}") for name in flag_names}
        d0_stack = Signal(4)
        # The stack decoded one-hot (STACKS order) when the frame ends: D1's header windows
        # select with these flip-flops directly (a 4-bit decode in front of a select that
        # fans out to every window bit was the 125 MHz self-test's critical path).
        d0_hot = Signal(len(STACKS))
        d0_port = Signal.like(port)
        d0_start = Signal(ptr_bits)
        d0_end = Signal(ptr_bits)
        frame_end = Signal()
        m.d.comb += frame_end.eq(s1_valid & s1.last)
        m.d.sync += d0_valid.eq(frame_end)
        with m.If(frame_end):
            # The capture as it will be once this last beat is in.
            m.d.sync += d0_cap.eq(cap)
            with m.Switch(s1_beat):
                for slot in range(cap_beats):
                    with m.Case(slot):
                        m.d.sync += d0_cap.word_select(slot, W).eq(s1.data)
            m.d.sync += [
                d0_len.eq(s1_beat * lanes + last_bytes),
                d0_stack.eq(stack),
                d0_hot.eq(stack_hot),
                d0_port.eq(port),
                d0_start.eq(start_ptr),
                d0_end.eq(Mux(stored, fifo.w_ptr + 1, start_ptr)),
            ]
            m.d.sync += [d0_flag[name].eq(flag[name]) for name in flag_names]

        # =====================================================================================
        # D1: windows on the headers at the offsets of the frame's stack
        # =====================================================================================
        cap_bytes = _bytes(d0_cap, cap_beats * lanes)
        d1_valid = Signal()
        d1_eth = Signal(8 * DOT1Q.size)
        d1_outer = Signal(8 * IPV6.size)
        d1_srh = Signal(8 * SRH.size)
        d1_inner = Signal(8 * IPV6.size)
        d1_l4 = Signal(8 * _L4_WINDOW)
        d1_len = Signal(len_bits)
        d1_too_long = Signal()
        d1_flag = {name: Signal(name=f"d1_{name}") for name in flag_names}
        d1_stack = Signal(4)
        d1_port = Signal.like(port)
        d1_start = Signal(ptr_bits)
        d1_end = Signal(ptr_bits)
        d1_kind = Signal(PacketKind)
        d1_imm = Signal()
        d1_opcode_ok = Signal()
        d1m = Module()             # D1 registers load when D0 holds a frame
        m.submodules.d1 = EnableInserter(d0_valid)(d1m)
        m.d.sync += d1_valid.eq(d0_valid)
        d1m.d.sync += [
            d1_eth.eq(d0_cap[:8 * DOT1Q.size]),
            d1_len.eq(d0_len),
            d1_too_long.eq(d0_len > self._max_frame),
            d1_stack.eq(d0_stack),
            d1_port.eq(d0_port),
            d1_start.eq(d0_start),
            d1_end.eq(d0_end),
        ]
        d1m.d.sync += [d1_flag[name].eq(d0_flag[name]) for name in flag_names]
        # Frame bytes after the first IP header's fixed part (IPv6) or start (IPv4): what its
        # length field must say. Signed, so that a runt never matches a field value.
        d1_ip_room = Signal(signed(len_bits + 1))
        with d1m.Switch(Cat(d0_flag["vlan"], d0_flag["v4"])):
            for vlan in (0, 1):
                for v4 in (0, 1):
                    with d1m.Case(vlan | v4 << 1):
                        before = (DOT1Q.size if vlan else ETHERNET.size) + (0 if v4 else IPV6.size)
                        d1m.d.sync += d1_ip_room.eq(d0_len - before)

        def window(offset, size):
            return Cat(*cap_bytes[offset:offset + size])

        # The opcode is decoded at each stack's BTH position from the frozen capture, and the
        # small result selected by the stack: a decoder behind the window mux would be slower.
        opcode_at = _offset(L.BTH, "opcode")
        opcode_class = {}
        for s in STACKS:
            code = Signal(5, name=f"opcode_class_{s.code}")    # Cat(ok, imm, kind)
            opcode_class[s.code] = code
            with d1m.Switch(cap_bytes[s.t + opcode_at]):
                for op in sorted(P.SUPPORTED_OPCODES):
                    kind = opcode_kind(op)
                    with d1m.Case(op):
                        d1m.d.comb += code.eq(Cat(Const(1, 1),
                                                  Const(op in P.IMMEDIATE_OPCODES, 1),
                                                  Const(kind.value, 3)))
        # Every stack code is in STACKS: exactly one bit of d0_hot is set.
        d1m.d.sync += [
            d1_outer.eq(onehot_select(d0_hot, [window(s.l3, IPV6.size) for s in STACKS])),
            d1_srh.eq(onehot_select(d0_hot, [window(s.l3 + IPV6.size, SRH.size) for s in STACKS])),
            d1_inner.eq(onehot_select(d0_hot, [window(s.x, IPV6.size) for s in STACKS])),
            d1_l4.eq(onehot_select(d0_hot, [window(s.u, _L4_WINDOW) for s in STACKS])),
            Cat(d1_opcode_ok, d1_imm, d1_kind.as_value()).eq(
                onehot_select(d0_hot, [opcode_class[s.code] for s in STACKS])),
        ]

        # =====================================================================================
        # D2: header fields, content checks, lengths relative to the first IP header
        # =====================================================================================
        eth = _bytes(d1_eth, DOT1Q.size)
        outer = _bytes(d1_outer, IPV6.size)
        srh = _bytes(d1_srh, SRH.size)
        inner = _bytes(d1_inner, IPV6.size)
        l4 = _bytes(d1_l4, _L4_WINDOW)
        bth_at = UDP.size
        ext_at = UDP.size + L.BTH.size
        vlan, v4, v6 = d1_flag["vlan"], d1_flag["v4"], d1_flag["v6"]
        d1_mode = d1_stack[2:4]
        d1_inner_v4 = d1_stack[1]
        srv6 = d1_mode != _MODE_PLAIN
        kind_data = d1_kind == PacketKind.DATA
        # A TSETH follows the METH of a data packet with BTH.ts (ts means nothing elsewhere).
        data_ts = Signal()
        m.d.comb += data_ts.eq(kind_data & _field(l4, L.BTH, "ts", bth_at))

        d2_valid = Signal()
        d2_hdr = Signal(header_layout)
        d2m = Module()
        m.submodules.d2 = EnableInserter(d1_valid)(d2m)
        m.d.sync += d2_valid.eq(d1_valid)
        # The ICRC verdict: the CRC unit's `match` is for the frame's last beat while the frame
        # is in D2 (s2 feeds the unit the cycle after s1; its data stage and loop take two
        # more), and the next frame's beats reach the loop only after that.
        d2_crc_ok = crc.match

        # Check bits known from field values alone.
        def v4_field(window_, name):
            return _field(window_, IPV4, name)

        def v6_field(window_, name):
            return _field(window_, IPV6, name)

        def v4_header_bad(window_):
            return ((v4_field(window_, "version") != 4) | (v4_field(window_, "ihl") != 5) |
                    v4_field(window_, "mf") | (v4_field(window_, "frag_offset") != 0))

        # The first IP header's length field: IPv4 total length, IPv6 payload length.
        outer_len_field = Mux(v4, v4_field(outer, "total_length"),
                              v6_field(outer, "payload_length"))
        outer_len = Signal(17)      # bytes of the first IP packet, from its header
        d2m.d.comb += outer_len.eq(outer_len_field + Mux(v4, 0, IPV6.size))
        outer_nh = v6_field(outer, "next_header")
        srh_nh = _field(srh, SRH, "next_header")
        inner_proto = Mux(d1_inner_v4, v4_field(inner, "protocol"), v6_field(inner, "next_header"))
        udp_len = _field(l4, UDP, "length")
        # The RETH follows the METH and, with BTH.ts, the TSETH.
        reth_at = ext_at + L.METH.size
        dma_len = Mux(data_ts, _field(l4, L.RETH, "dma_len", reth_at + L.TSETH.size),
                      _field(l4, L.RETH, "dma_len", reth_at))
        tclass = Mux(d1_inner_v4, v4_field(inner, "tos"), v6_field(inner, "tclass"))

        c = {}                      # D2 check bits, registered
        for name in ("runt_eth", "runt_vlan", "bad_ethertype", "runt_ip", "bad_ip_header",
                     "outer_len_bad", "bad_ip_protocol", "bad_srh", "bad_inner_header",
                     "inner_tl_short", "bad_inner_protocol", "bad_udp_port", "bad_bth",
                     "bad_opcode", "plain_v4", "srv6_v4", "trimmed", "srv6", "srh",
                     "kind_data"):
            c[name] = Signal(name=f"d2_{name}")
        n = d1_len
        l3 = Mux(vlan, DOT1Q.size, ETHERNET.size)
        outer_hdr = Mux(v4, IPV4.size, IPV6.size)
        # A frame of exactly the Ethernet minimum may carry padding after the IP packet.
        pad = (n == ETHERNET_MIN_FRAME) & (
            outer_len_field < ETHERNET_MIN_FRAME - l3 - Mux(v4, 0, IPV6.size))
        d2m.d.sync += [
            c["runt_eth"].eq(n < ETHERNET.size),
            c["runt_vlan"].eq(vlan & (n < DOT1Q.size)),
            c["bad_ethertype"].eq(~v4 & ~v6),
            c["runt_ip"].eq(n < l3 + outer_hdr),
            c["bad_ip_header"].eq(Mux(v4, v4_header_bad(outer),
                                      v6_field(outer, "version") != 6)),
            c["outer_len_bad"].eq((v4 & (outer_len < IPV4.size)) |
                                  ~((outer_len_field == d1_ip_room) | pad)),
            c["bad_ip_protocol"].eq(Mux(v4, v4_field(outer, "protocol") != P.IP_PROTO_UDP,
                                        ~outer_nh.matches(P.IP_PROTO_UDP, P.IP_PROTO_IPV6,
                                                          P.IP_PROTO_IPV4,
                                                          P.IP_PROTO_ROUTING))),
            c["bad_srh"].eq((_field(srh, SRH, "routing_type") != P.SRH_ROUTING_TYPE) |
                            (_field(srh, SRH, "hdr_ext_len") != SRH_ONE_SEGMENT_LEN) |
                            ~srh_nh.matches(P.IP_PROTO_IPV6, P.IP_PROTO_IPV4)),
            c["bad_inner_header"].eq(Mux(d1_inner_v4, v4_header_bad(inner),
                                         v6_field(inner, "version") != 6)),
            c["inner_tl_short"].eq(d1_inner_v4 & (v4_field(inner, "total_length") < IPV4.size)),
            c["bad_inner_protocol"].eq(inner_proto != P.IP_PROTO_UDP),
            c["bad_udp_port"].eq(_field(l4, UDP, "dport") != P.ROCEV2_UDP_PORT),
            c["bad_bth"].eq((_field(l4, L.BTH, "version", bth_at) != P.BTH_VERSION) |
                            (_field(l4, L.BTH, "padcount", bth_at) != 0)),
            c["bad_opcode"].eq(~d1_opcode_ok),
            c["plain_v4"].eq(~srv6 & d1_inner_v4),
            c["srv6_v4"].eq(srv6 & d1_inner_v4),
            c["trimmed"].eq(kind_data & (tclass[2:] == self.trim_dscp)),
            c["srv6"].eq(srv6),
            c["srh"].eq(d1_mode == _MODE_SRH),
            c["kind_data"].eq(kind_data),
        ]

        # Lengths, all relative to the first IP header (after the check of the IP length, the
        # frame ends exactly `ip_len` bytes after it, padding excluded).
        d2_ip_len = Signal(17)
        d2_inner_end = Signal(18)       # where the inner IP packet says it ends
        d2_udp_end = Signal(18)
        d2_need = Signal(8)             # end of the transport headers plus the ICRC
        d2_dma_len = Signal(32)
        d2_runt = {name: Signal(8, name=f"d2_min_{name}") for name in ("inner", "udp", "bth")}
        d2_pay_beat = Signal(range(HEADER_BYTES // lanes + 1))
        d2_pay_lane = Signal(lane_bits)
        inner_len = Mux(d1_inner_v4, v4_field(inner, "total_length"),
                        v6_field(inner, "payload_length") + IPV6.size)
        inner_rel = Signal(8)
        udp_rel = Signal(8)
        need_rel = Signal(8)
        with d2m.Switch(Cat(d1_stack, d1_kind.as_value(), d1_imm, data_ts)):
            for s in STACKS:
                for (kind, imm, ts), size in _TRANSPORT_SIZE.items():
                    code = s.code | kind.value << 4 | int(imm) << 7 | int(ts) << 8
                    headers_end = s.t + L.BTH.size + size      # where a payload starts
                    with d2m.Case(code):
                        d2m.d.comb += [
                            inner_rel.eq(s.x - s.l3),
                            udp_rel.eq(s.u - s.l3),
                            need_rel.eq(headers_end + P.ICRC_BYTES - s.l3),
                        ]
                        d2m.d.sync += [
                            d2_runt["inner"].eq(s.x - s.l3 + s.inner_size),
                            d2_runt["udp"].eq(s.u - s.l3 + UDP.size),
                            d2_runt["bth"].eq(s.t - s.l3 + L.BTH.size),
                            d2_pay_beat.eq(headers_end // lanes),
                            d2_pay_lane.eq(headers_end % lanes),
                        ]
        d2m.d.sync += [
            d2_ip_len.eq(outer_len),
            d2_inner_end.eq(inner_rel + inner_len),
            d2_udp_end.eq(udp_rel + udp_len),
            d2_need.eq(need_rel),
            d2_dma_len.eq(dma_len),
        ]

        # IPv4 header checksum, first adder level (the inner window is the only IPv4 header).
        words = [Cat(inner[2 * k + 1], inner[2 * k]) for k in range(IPV4.size // 2)]
        d2_pairs = [Signal(17, name=f"d2_cks_pair{k}") for k in range(len(words) // 2)]
        d2m.d.sync += [pair.eq(words[2 * k] + words[2 * k + 1]) for k, pair in enumerate(d2_pairs)]

        # The parsed header (payload_len is filled in by D3).
        hdr = Signal(header_layout)
        tx = ext_at                 # transport headers after the BTH, in the L4 window
        d2m.d.comb += [
            hdr.kind.eq(d1_kind),
            hdr.trimmed.eq(kind_data & (tclass[2:] == self.trim_dscp)),
            hdr.port.eq(d1_port),
            hdr.eth_dst.eq(_field(eth, ETHERNET, "dst")),
            hdr.eth_src.eq(_field(eth, ETHERNET, "src")),
            hdr.vlan_valid.eq(vlan),
            hdr.vlan_tci.eq(Mux(vlan, _field(eth, DOT1Q, "tci"), 0)),
            hdr.ipv6.eq(~d1_inner_v4),
            hdr.ip_src.eq(Mux(d1_inner_v4, v4_field(inner, "src"), v6_field(inner, "src"))),
            hdr.ip_dst.eq(Mux(d1_inner_v4, v4_field(inner, "dst"), v6_field(inner, "dst"))),
            hdr.tclass.eq(tclass),
            hdr.flow_label.eq(Mux(d1_inner_v4, 0, v6_field(inner, "flow_label"))),
            hdr.hop_limit.eq(Mux(d1_inner_v4, v4_field(inner, "ttl"),
                                 v6_field(inner, "hop_limit"))),
            hdr.srv6_valid.eq(srv6),
            hdr.udp_sport.eq(_field(l4, UDP, "sport")),
        ]
        with d2m.If(srv6):
            d2m.d.comb += [hdr.srv6_src.eq(v6_field(outer, "src")),
                         hdr.srv6_dst.eq(v6_field(outer, "dst"))]
        with d2m.If(d1_mode == _MODE_SRH):
            d2m.d.comb += [hdr.srh_valid.eq(1), hdr.srh_segment.eq(_field(srh, SRH, "segment"))]
        for f in L.BTH.fields:
            d2m.d.comb += hdr.bth[f.name].eq(_field(l4, L.BTH, f.name, bth_at))
        with d2m.If(kind_data):
            for f in L.METH.fields:
                d2m.d.comb += hdr.meth[f.name].eq(_field(l4, L.METH, f.name, tx))
            with d2m.If(data_ts):
                for f in L.TSETH.fields:
                    d2m.d.comb += hdr.tseth[f.name].eq(_field(l4, L.TSETH, f.name,
                                                            tx + L.METH.size))
            # RETH and ImmDt sit one TSETH further with BTH.ts.
            for header, member, at in ((L.RETH, hdr.reth, reth_at),
                                       (L.IMMDT, hdr.immdt, reth_at + L.RETH.size)):
                for f in header.fields:
                    value = Mux(data_ts, _field(l4, header, f.name, at + L.TSETH.size),
                                _field(l4, header, f.name, at))
                    if header is L.IMMDT:
                        value = Mux(d1_imm, value, 0)
                    d2m.d.comb += member[f.name].eq(value)
        with d2m.If(d1_kind == PacketKind.AETH):
            for f in L.AETH.fields:
                d2m.d.comb += hdr.aeth[f.name].eq(_field(l4, L.AETH, f.name, tx))
        # Control headers: the union member of the kind (the others overlap it).
        control = (
            (PacketKind.SACK, ((L.SETH, hdr.ctl.sack.seth, tx),
                               (L.CC_STATE, hdr.ctl.sack.cc_state, tx + L.SETH.size))),
            (PacketKind.NACK, ((L.NETH, hdr.ctl.neth, tx),)),
            (PacketKind.RPROBE, ((L.PETH, hdr.ctl.peth, tx),)),
            (PacketKind.EP_REQUEST, ((L.ERTH, hdr.ctl.erth, tx),)),
            (PacketKind.EP_RESPONSE, ((L.EETH, hdr.ctl.eeth, tx),)),
        )
        with d2m.Switch(d1_kind):
            for kind, parts in control:
                with d2m.Case(kind):
                    for header, member, at in parts:
                        for f in header.fields:
                            d2m.d.comb += member[f.name].eq(_field(l4, header, f.name, at))
        d2m.d.sync += d2_hdr.eq(hdr)

        d2_too_long = Signal()
        d2_start = Signal(ptr_bits)
        d2_end = Signal(ptr_bits)
        d2m.d.sync += [d2_too_long.eq(d1_too_long), d2_start.eq(d1_start), d2_end.eq(d1_end)]

        # =====================================================================================
        # D3: length checks against the IP length; checksum sum; payload length and place
        # =====================================================================================
        d3_valid = Signal()
        d3m = Module()
        m.submodules.d3 = EnableInserter(d2_valid)(d3m)
        m.d.sync += d3_valid.eq(d2_valid)
        d3_hdr = Signal(header_layout)
        d3_cks_sum = Signal(20)
        d3_end = Signal(ptr_bits)
        d3_pay_ptr = Signal(ptr_bits)
        d3_pay_lane = Signal(lane_bits)
        d3_plain_v4 = Signal()
        d3_srv6_v4 = Signal()
        ip_len = d2_ip_len
        payload = Signal(17)
        d3m.d.comb += payload.eq(ip_len - d2_need)
        srv6_2 = c["srv6"]
        data_2 = c["kind_data"]
        checks_pre = [                       # before the first IP header's checksum
            (d2_too_long, DropReason.OVERSIZE),
            (c["runt_eth"], DropReason.RUNT),
            (c["runt_vlan"], DropReason.RUNT),
            (c["bad_ethertype"], DropReason.BAD_ETHERTYPE),
            (c["runt_ip"], DropReason.RUNT),
            (c["bad_ip_header"], DropReason.BAD_IP_HEADER),
        ]
        checks_mid = [                       # between the two possible checksum positions
            (c["outer_len_bad"], DropReason.BAD_IP_LENGTH),
            (c["bad_ip_protocol"], DropReason.BAD_IP_PROTOCOL),
            (c["srh"] & (ip_len < IPV6.size + SRH.size), DropReason.RUNT),
            (c["srh"] & c["bad_srh"], DropReason.BAD_IP_PROTOCOL),
            (srv6_2 & (ip_len < d2_runt["inner"]), DropReason.RUNT),
            (srv6_2 & c["bad_inner_header"], DropReason.BAD_IP_HEADER),
        ]
        checks_post = [
            (srv6_2 & (c["inner_tl_short"] | (d2_inner_end != ip_len)),
             DropReason.BAD_IP_LENGTH),
            (srv6_2 & c["bad_inner_protocol"], DropReason.BAD_IP_PROTOCOL),
            (ip_len < d2_runt["udp"], DropReason.RUNT),
            (c["bad_udp_port"], DropReason.BAD_UDP_PORT),
            (d2_udp_end != ip_len, DropReason.BAD_UDP_LENGTH),
            (ip_len < d2_runt["bth"], DropReason.RUNT),
            (c["bad_bth"], DropReason.BAD_BTH),
            (c["bad_opcode"], DropReason.UNSUPPORTED_OPCODE),
            (data_2 & (ip_len < d2_need), DropReason.RUNT),
            (~data_2 & (ip_len != d2_need), DropReason.BAD_LENGTH),
            (data_2 & (payload > cfg.mtu), DropReason.OVERSIZE),
            (data_2 & ~c["trimmed"] & (d2_dma_len != payload), DropReason.BAD_LENGTH),
            (~c["trimmed"] & ~d2_crc_ok, DropReason.BAD_ICRC),
        ]
        # The check bits are registered; D4 encodes their priority.
        reason_width = DropReason.as_shape().width
        d3_checks = {}
        for part, checks in (("pre", checks_pre), ("mid", checks_mid), ("post", checks_post)):
            d3_checks[part] = []
            for k, (condition, why) in enumerate(checks):
                failed = Signal(name=f"d3_{part}{k}_{why.name.lower()}")
                d3m.d.sync += failed.eq(condition)
                d3_checks[part].append((failed, why))
        p = d2_pairs
        d3m.d.sync += [
            d3_cks_sum.eq((p[0] + p[1]) + (p[2] + p[3]) + p[4]),
            d3_plain_v4.eq(c["plain_v4"]),
            d3_srv6_v4.eq(c["srv6_v4"]),
            d3_hdr.eq(d2_hdr),
            d3_hdr.payload_len.eq(Mux(data_2 & ~c["trimmed"], payload, 0)),
            d3_end.eq(d2_end),
            d3_pay_ptr.eq(d2_start + d2_pay_beat),
            d3_pay_lane.eq(d2_pay_lane),
        ]

        # =====================================================================================
        # D4: the verdict; accepted frames queue their header for the reader
        # =====================================================================================
        cks_ok = d3_cks_sum.matches(*(k * 0xFFFF for k in range(1, IPV4.size // 2 + 1)))
        d3_reason = {part: _priority(m, checks, reason_width)
                     for part, checks in d3_checks.items()}
        reason = Signal(DropReason)
        with m.If(d3_reason["pre"] != DropReason.NONE.value):
            m.d.comb += reason.eq(d3_reason["pre"])
        with m.Elif(d3_plain_v4 & ~cks_ok):
            m.d.comb += reason.eq(DropReason.BAD_IP_HEADER)
        with m.Elif(d3_reason["mid"] != DropReason.NONE.value):
            m.d.comb += reason.eq(d3_reason["mid"])
        with m.Elif(d3_srv6_v4 & ~cks_ok):
            m.d.comb += reason.eq(DropReason.BAD_IP_HEADER)
        with m.Else():
            m.d.comb += reason.eq(d3_reason["post"])

        d4_entry = Signal(entry_layout)
        pay_len = d3_hdr.payload_len
        d4m = Module()
        m.submodules.d4 = EnableInserter(d3_valid)(d4m)
        m.d.sync += self.verdict_valid.eq(d3_valid)
        d4m.d.sync += [
            self.verdict_reason.eq(reason),
            d4_entry.header.eq(d3_hdr),
            d4_entry.pay_ptr.eq(d3_pay_ptr),
            d4_entry.pay_lane.eq(d3_pay_lane),
            d4_entry.end_ptr.eq(d3_end),
            d4_entry.has_payload.eq(pay_len != 0),
            d4_entry.seek_ptr.eq(Mux(pay_len != 0, d3_pay_ptr, d3_end)),
            d4_entry.in_beats.eq((pay_len + d3_pay_lane + lanes - 1) >> lane_bits),
            d4_entry.out_beats.eq(Mux(pay_len == 0, 1, (pay_len + lanes - 1) >> lane_bits)),
        ]
        tail_len = pay_len[:lane_bits]          # bytes in the last output beat, 0 meaning all
        d4m.d.sync += d4_entry.last_keep.eq(
            Cat(((tail_len == 0) | (tail_len > lane)) & (pay_len != 0) for lane in range(lanes)))
        # The queue's write enable reaches every cell of a wide LUT-RAM: it comes straight from
        # a flip-flop (the verdict's compare in front of that fan-out was a 125 MHz critical
        # path).
        accepted = Signal()
        m.d.sync += accepted.eq(d3_valid & (reason == DropReason.NONE))
        m.d.comb += [
            queue.w_en.eq(accepted),
            queue.w_data.eq(d4_entry),
        ]
        for index in range(len(DropReason)):
            with m.If(self.verdict_valid & (self.verdict_reason.as_value() == index)):
                m.d.sync += self.counters[index].eq(self.counters[index] + 1)

        # Frames between admission and verdict hold a header-queue reservation each.
        started = accept & frame_start
        with m.If(started & ~self.verdict_valid):
            m.d.sync += in_flight.eq(in_flight + 1)
        with m.Elif(~started & self.verdict_valid):
            m.d.sync += in_flight.eq(in_flight - 1)

        # Where the last frame with a verdict ends: when no accepted frame is waiting, every
        # beat before it can be released (frames dropped after they were committed).
        verdict_end = Signal(ptr_bits)
        with m.If(self.verdict_valid):
            m.d.sync += verdict_end.eq(d4_entry.end_ptr)

        # =====================================================================================
        # Reader: payload beats of accepted frames, realigned to lane 0, header attached
        # =====================================================================================
        # A frame starts when the reader is idle and the queue has an entry: the entry is popped
        # and copied (its header into one of two banks), and the reader seeks to the payload.
        # Only registers decide this, so `o.ready` reaches no wide enable and no pointer adder.
        cur = Signal(entry_layout)
        m.d.comb += cur.eq(queue.r_data)
        active = Signal()
        has_payload = Signal()
        have_prev = Signal()
        prev_beat = Signal(W)
        in_left = Signal(beat_bits)     # FIFO beats of the payload still to take
        in_more = Signal()              # in_left != 0
        out_left = Signal(beat_bits)    # output beats still to give
        out_last = Signal()             # out_left == 1
        out_first = Signal()
        lane = Signal(lane_bits)
        last_keep = Signal(lanes)
        bank = Signal()                 # header bank of the frame being read
        o_bank = Signal()               # header bank of the beat in the output register
        banks = [Signal(header_layout, name=f"header_bank{k}") for k in range(2)]

        start = Signal()
        m.d.comb += [
            start.eq(~active & queue.r_rdy),
            # At a frame's start, go to its payload (or past it); when idle with nothing
            # accepted waiting, release every frame that has had its verdict.
            fifo.r_seek.eq(~active & (queue.r_rdy | (queue.level == 0))),
            fifo.r_seek_ptr.eq(Mux(queue.r_rdy, cur.seek_ptr, verdict_end)),
        ]
        with m.If(start):
            m.d.sync += [
                active.eq(1),
                has_payload.eq(cur.has_payload),
                have_prev.eq(0),
                in_left.eq(cur.in_beats),
                in_more.eq(cur.in_beats != 0),
                out_left.eq(cur.out_beats),
                out_last.eq(cur.out_beats == 1),
                out_first.eq(1),
                lane.eq(cur.pay_lane),
                last_keep.eq(cur.last_keep),
                bank.eq(~bank),
            ]
            with m.If(bank):
                m.d.sync += banks[0].eq(cur.header)
            with m.Else():
                m.d.sync += banks[1].eq(cur.header)

        o_free = Signal()
        emit = Signal()
        consume = Signal()
        m.d.comb += o_free.eq(~self.o.valid | self.o.ready)
        with m.If(active):
            with m.If(~has_payload):
                m.d.comb += emit.eq(o_free)
            with m.Elif(~have_prev):
                m.d.comb += consume.eq(fifo.r.valid)
            with m.Elif(in_more):
                m.d.comb += [emit.eq(o_free & fifo.r.valid), consume.eq(o_free & fifo.r.valid)]
            with m.Else():
                m.d.comb += emit.eq(o_free)
        m.d.comb += [
            fifo.r.ready.eq(consume),
            queue.r_en.eq(start),
            self.o.payload.header.eq(Mux(o_bank, banks[1], banks[0])),
        ]

        with m.If(consume):
            m.d.sync += [prev_beat.eq(fifo.r.payload), have_prev.eq(1),
                         in_left.eq(in_left - 1), in_more.eq(in_left != 1)]
        with m.If(self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        with m.If(emit):
            joined = Cat(prev_beat, Mux(in_more, fifo.r.payload, 0))
            keep = Mux(out_last, last_keep, (1 << lanes) - 1) & has_payload.replicate(lanes)
            kept = Cat(keep[k].replicate(8) for k in range(lanes))
            m.d.sync += [
                out_left.eq(out_left - 1),
                out_last.eq(out_left == 2),
                out_first.eq(0),
                o_bank.eq(bank),
                self.o.valid.eq(1),
                self.o.payload.data.eq(joined.bit_select(Cat(Const(0, 3), lane), W) & kept),
                self.o.payload.keep.eq(keep),
                self.o.payload.first.eq(out_first),
                self.o.payload.last.eq(out_last),
            ]
            with m.If(out_last):
                m.d.sync += active.eq(0)

        return m
