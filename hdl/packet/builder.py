"""Header builder: turns parsed headers plus payload beats into complete Ethernet frames.

The builder is the inverse of the parser: it takes the
:func:`~hdl.packet.headers.packet_beat_layout` stream (a header struct on every beat, the
payload from lane 0 of the first beat) and emits the wire frame as
:func:`~hdl.packet.headers.net_beat_layout` beats, with every length, the IPv4 header checksum
and the RoCEv2 ICRC computed in hardware. ``docs/builder.md`` explains the
pipeline; ``docs/wire-format.md`` is the packet specification.

How the header becomes bytes without a giant shifter. Every header a frame can carry is cut
into 32-bit *source words* on a grid that starts two bytes before the frame (the Ethernet
header is 14 bytes and every other header is a multiple of four, so the grid lines up with
every header boundary). Which source word lands at which position of the frame depends only on
the *layout* of the packet (VLAN, SRv6 mode, IP version, transport headers): 96 layouts. A ROM,
filled at elaboration time, holds for every layout and header beat the source word of each
word lane, so the datapath is one wide word multiplexer per lane, registered, and no byte is
ever shifted by a variable amount except the payload (by one of ``W/32`` offsets).
"""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from .. import protocol as P
from ..config import NicConfig
from ..util import validating
from . import layouts as L
from .crc import CRC32
from .headers import (
    KIND_OPCODES,
    PacketKind,
    net_beat_layout,
    packet_beat_layout,
    packet_header_layout,
)

__all__ = [
    "HeaderBuilder", "Transport", "CONTROL_SIZES", "layout_id", "decode_layout_id",
    "layout_parts", "layout_segments", "header_bytes", "icrc_start", "IPV4_IDENTIFICATION",
    "IPV4_FLAGS_FRAGMENT", "SRV6_OUTER_HOP_LIMIT", "ICRC_INIT_BYTES",
]


# ---------------------------------------------------------------------------------------------
# Fixed field values (documented in docs/builder.md)
# ---------------------------------------------------------------------------------------------

#: IPv4 identification. Scapy's default; the DF flag makes the value meaningless on the wire.
IPV4_IDENTIFICATION = 0x0001
#: IPv4 flags and fragment offset: DF set, offset 0 (RoCEv2 never fragments).
IPV4_FLAGS_FRAGMENT = 0x4000
#: Hop limit of the SRv6 outer IPv6 header (traffic class and flow label are 0), as
#: :func:`sim.packets.srv6_encapsulate` builds it.
SRV6_OUTER_HOP_LIMIT = 64
#: The pseudo-LRH that RoCEv2 puts in front of the IP header for the ICRC.
ICRC_INIT_BYTES = L.ICRC_INIT_BYTES
#: SRH length in 8-octet units beyond the first: one segment.
_SRH_HDR_EXT_LEN = (L.SRH.size - 8) // 8
_PAYLOAD_FIFO_DEPTH = 16        # payload beats the input may run ahead of the output
_DERIVE_CYCLES = 4              # pipeline stages computing lengths and the IPv4 checksum


# ---------------------------------------------------------------------------------------------
# Layouts: which headers a frame carries (elaboration-time model, shared with the docs/tests)
# ---------------------------------------------------------------------------------------------

#: The sizes of the control packets' headers after the BTH (AETH; PETH, ERTH; NETH; SETH +
#: CC_STATE, EETH), in bytes: one transport code each.
CONTROL_SIZES = tuple(sorted({L.headers_size(h) for h in L.CONTROL_HEADERS.values()}))


class Transport:
    """What follows the BTH: the three most significant bits of a layout id.

    Data packets: bit 0 is BTH.ts (a TSETH), bit 1 an ImmDt. Control packets: one code per
    header size (:data:`CONTROL_SIZES`); the header bytes come from the ``ctl`` segment, the
    kind's member of the header's control union.
    """
    DATA = 0            #: METH RETH payload
    DATA_TS = 1         #: METH TSETH RETH payload
    DATA_IMM = 2        #: METH RETH ImmDt payload
    DATA_TS_IMM = 3     #: METH TSETH RETH ImmDt payload
    CONTROL = 4         #: + index in CONTROL_SIZES: AETH, PETH/ERTH, NETH, SETH CC_STATE/EETH

    @staticmethod
    def data(*, ts, immediate):
        return int(bool(ts)) | int(bool(immediate)) << 1

    @staticmethod
    def control(size):
        return Transport.CONTROL + CONTROL_SIZES.index(size)


#: Bits of a layout id, and how many there are.
LAYOUT_ID_BITS = 7
LAYOUT_COUNT = 1 << LAYOUT_ID_BITS

#: Source segments in wire order. ``eth`` includes the two grid bytes before the frame; ``ctl``
#: is as long as the longest control header, and a control layout takes its first words.
_SEGMENT_ORDER = ("eth", "vlan", "outer", "srh", "ipv6", "ipv4", "udp", "bth", "meth", "tseth",
                  "reth", "immdt", "ctl")


#: Grid bytes in front of the frame, so that every header after the Ethernet one starts on
#: a 4-byte word.
_GRID_BYTES = 2

_SEGMENT_SIZES = {
    "eth": L.ETHERNET.size + _GRID_BYTES, "vlan": L.DOT1Q_TAG_BYTES, "outer": L.IPV6.size,
    "srh": L.SRH.size, "ipv6": L.IPV6.size, "ipv4": L.IPV4.size, "udp": L.UDP.size,
    "bth": L.BTH.size, "meth": L.METH.size, "tseth": L.TSETH.size, "reth": L.RETH.size,
    "immdt": L.IMMDT.size, "ctl": max(CONTROL_SIZES),
}


def layout_id(*, vlan, srv6, ipv6, transport):
    """The 7-bit layout id: ``vlan | srv6 << 1 | ipv6 << 3 | transport << 4``.

    ``srv6`` is 0 (none), 1 (outer IPv6) or 2 (outer IPv6 and an SRH).
    """
    return int(vlan) | int(srv6) << 1 | int(ipv6) << 3 | int(transport) << 4


def decode_layout_id(lid):
    """``(vlan, srv6, ipv6, transport)`` of a layout id (the unused SRv6 code 3 reads as 2)."""
    return lid & 1, min((lid >> 1) & 3, 2), (lid >> 3) & 1, (lid >> 4) & 7


def layout_parts(lid):
    """``[(segment, bytes)]``: the source segments a layout's header is made of, in wire
    order, and how many bytes of each it takes (all but for ``ctl``)."""
    vlan, srv6, ipv6, transport = decode_layout_id(lid)
    segments = ["eth"]
    if vlan:
        segments.append("vlan")
    if srv6:
        segments.append("outer")
    if srv6 == 2:
        segments.append("srh")
    segments += ["ipv6" if ipv6 else "ipv4", "udp", "bth"]
    parts = [(name, _SEGMENT_SIZES[name]) for name in segments]
    if transport < Transport.CONTROL:
        parts += [("meth", L.METH.size)]
        if transport & 1:
            parts += [("tseth", L.TSETH.size)]
        parts += [("reth", L.RETH.size)]
        if transport & 2:
            parts += [("immdt", L.IMMDT.size)]
    else:
        parts += [("ctl", CONTROL_SIZES[transport - Transport.CONTROL])]
    return parts


def layout_segments(lid):
    """Names of the source segments a layout's header is made of, in wire order."""
    return [name for name, _size in layout_parts(lid)]


def header_bytes(lid):
    """Bytes of the frame before the payload (Ethernet header .. last transport header)."""
    return sum(size for _name, size in layout_parts(lid)) - _GRID_BYTES


def icrc_start(lid):
    """Frame offset of the first byte the ICRC covers: the (inner) IP header."""
    vlan, srv6, _ipv6, _transport = decode_layout_id(lid)
    return (L.ETHERNET.size + L.DOT1Q_TAG_BYTES * vlan + (L.IPV6.size if srv6 else 0)
            + (L.SRH.size if srv6 == 2 else 0))


def _icrc_masks():
    """``{(segment, word index): 4 mask bytes}`` of the words (on the 4-byte grid) with bits the
    ICRC sees as all ones (hdl.packet.layouts.ICRC_MASKED_FIELDS); other words are unmasked.
    The SRv6 outer header is not a key: the ICRC does not cover it."""
    masks = {}
    for name, header in (("ipv6", L.IPV6), ("ipv4", L.IPV4), ("udp", L.UDP), ("bth", L.BTH)):
        mask = L.icrc_byte_mask(header)
        for index in range(len(mask) // 4):
            word = tuple(mask[4 * index:4 * index + 4])
            if any(word):
                masks[(name, index)] = word
    return masks


_ICRC_MASKS = _icrc_masks()


# ---------------------------------------------------------------------------------------------
# Byte helpers (big-endian wire values to lane-ordered gateware values)
# ---------------------------------------------------------------------------------------------

def _be_bytes(value, nbytes):
    """The ``nbytes`` wire bytes of ``value`` sent most significant byte first."""
    value = Value.cast(value)
    assert len(value) <= 8 * nbytes
    value = value.as_unsigned() if len(value) == 8 * nbytes else \
        Cat(value, C(0, 8 * nbytes - len(value)))
    return [value[8 * (nbytes - 1 - i):8 * (nbytes - i)] for i in range(nbytes)]


def _const_bytes(*values):
    return [C(v, 8) for v in values]


def _header_bytes(view, header, overrides=None):
    """Wire bytes of a :mod:`hdl.packet.layouts` header from a struct view of its fields."""
    overrides = overrides or {}
    fields = [Value.cast(overrides.get(f.name, view[f.name])) for f in header.fields]
    for field, value in zip(header.fields, fields, strict=True):
        assert len(value) == field.bits, field.name
    return _be_bytes(Cat(*reversed(fields)), header.size)


def _keep_mask(count, lanes):
    """``lanes`` bits, the low ``count`` of them set."""
    return Cat(count > lane for lane in range(lanes))


# ---------------------------------------------------------------------------------------------
# The component
# ---------------------------------------------------------------------------------------------

class HeaderBuilder(wiring.Component):
    """Build complete RoCEv2/MRC Ethernet frames (no FCS) from headers and payload beats.

    Everything that depends on the packet length is computed in hardware from
    ``header.payload_len``: the IPv4 total length and header checksum, the IPv6 payload length,
    the UDP length and the SRv6 outer payload length. The ICRC is computed on the fly over the
    frame as it is emitted and appended after the payload.

    Input protocol: every beat of a packet carries the same ``header``. Payload byte 0 is lane
    0 of the packet's first beat; every beat but the last is full; the last beat's ``keep`` is
    a run of ones from lane 0 (``keep == 0`` on a one-beat packet: no payload). The input's
    ``first`` flag is not used: the beat after a ``last`` beat starts a packet.

    Length errors: the length fields always follow ``payload_len``, but the frame carries the
    payload bytes actually received. When their count differs from ``payload_len``, the frame
    is emitted anyway (a receiver drops it as a bad length) and ``length_errors`` counts it.

    Throughput and latency: one output beat per cycle while ``o`` is ready; back-to-back
    packets of any size leave with no idle cycle between frames when the input keeps up (at
    W = 256, runs of frames of at most three beats may lose about one cycle per two frames).
    The input runs up to 16 beats ahead into a payload FIFO, then waits while header beats are
    emitted. Latency, builder idle: 13 cycles from the clock edge that takes a packet's first
    input beat to the edge that hands its first frame beat to a ready ``o``.

    Which transport headers follow the BTH: for ``kind`` DATA, METH, a TSETH when
    ``header.bth.ts`` is set, RETH, and an ImmDt on the immediate opcodes; for a control kind,
    the AETH or the kind's member of ``header.ctl``, whose length is the header's (a control
    packet's payload is not sent: it has none).

    Parameters
    ----------
    config : :class:`~hdl.config.NicConfig`
        Uses ``data_width`` (64, 128 or 256).

    Members
    -------
    i : ``In(stream.Signature(packet_beat_layout(config)))``
        Headers and payload.
    o : ``Out(stream.Signature(net_beat_layout(config.data_width, tagged=True)))``
        Frames; ``port`` is ``header.port`` on every beat.
    length_errors : ``Out(32)``
        Packets whose payload byte count differed from ``header.payload_len`` (wraps).
    """

    def __init__(self, *, config):
        with validating(self):
            if not isinstance(config, NicConfig):
                raise TypeError(f"Configuration must be a NicConfig, not {config!r}")
        self._config = config
        self._lanes = config.data_width // 8
        self._plan()
        super().__init__({
            "i": In(stream.Signature(packet_beat_layout(config))),
            "o": Out(stream.Signature(net_beat_layout(config.data_width, tagged=True))),
            "length_errors": Out(32),
        })

    @property
    def config(self):
        return self._config

    # -- elaboration-time tables ---------------------------------------------------------------

    def _plan(self):
        lanes = self._lanes
        self._seg_base = {}
        index = 0
        for name in _SEGMENT_ORDER:
            self._seg_base[name] = index
            index += _SEGMENT_SIZES[name] // 4
        self._zero_word = index                     # a constant zero: beyond the header
        self._source_words = index + 1
        self._word_lanes = lanes // 4
        self._max_beats = 0
        self._layouts = []
        for lid in range(LAYOUT_COUNT):
            words = []
            for name, size in layout_parts(lid):
                base = self._seg_base[name]
                words += range(base, base + size // 4)
            length = header_bytes(lid)
            assert length == 4 * len(words) - 2 and length % 4 == 2
            start = icrc_start(lid)
            self._layouts.append({
                "words": words, "length": length, "header_beats": length // lanes,
                "payload_lane": length % lanes, "icrc_beat": start // lanes,
                "icrc_lane": start % lanes,
            })
            self._max_beats = max(self._max_beats, length // lanes + 1)

    def _rom_init(self, index_bits, beat_bits):
        """ROM word for (layout, header beat): the source word of each of ``W/32 + 1`` lanes.

        Beat ``k`` covers frame bytes ``k*lanes ..``, i.e. grid words ``k*W/32 .. k*W/32 +
        W/32``, of which the first and the last contribute two bytes each.
        """
        init = []
        for lid in range(LAYOUT_COUNT):
            words = self._layouts[lid]["words"]
            for beat in range(1 << beat_bits):
                entry = 0
                for lane in range(self._word_lanes + 1):
                    position = beat * self._word_lanes + lane
                    source = words[position] if position < len(words) else self._zero_word
                    entry |= source << (lane * index_bits)
                init.append(entry)
        return init

    def _table(self, key):
        return [self._layouts[lid][key] for lid in range(LAYOUT_COUNT)]

    # -- gateware ------------------------------------------------------------------------------

    def elaborate(self, platform):
        m = Module()

        config = self._config
        width = config.data_width
        lanes = self._lanes
        count_shape = range(lanes + 1)
        count_bits = ceil_log2(lanes + 1)
        offsets = lanes // 4                        # payload lane offsets: 2, 6, 10, ...
        offset_shape = range(offsets)
        beat_bits = ceil_log2(self._max_beats)
        index_bits = ceil_log2(self._source_words)
        hdr_layout = packet_header_layout(config)

        def table(values, shape):
            return Array(C(v, shape) for v in values)

        # --- Input: payload FIFO, packet boundaries, length check -----------------------------

        m.submodules.payload_fifo = pfifo = SyncFIFOBuffered(
            width=width + count_bits + 1, depth=_PAYLOAD_FIFO_DEPTH)
        ip = self.i.payload
        keep_end = Signal(count_shape)
        for lane in range(lanes):
            with m.If(ip.keep[lane]):
                m.d.comb += keep_end.eq(lane + 1)

        in_count = Signal(count_shape)              # non-last beats are full
        m.d.comb += in_count.eq(Mux(ip.last, keep_end, lanes))
        at_first = Signal(init=1)
        m.d.comb += [
            pfifo.w_en.eq(self.i.valid & self.i.ready),
            pfifo.w_data.eq(Cat(ip.data, in_count, ip.last)),
        ]
        capture = pfifo.w_en & at_first
        with m.If(pfifo.w_en):
            m.d.sync += at_first.eq(ip.last)

        # Bytes received per packet, compared with payload_len two cycles after the last beat.
        byte_count = Signal(24)
        check_valid = Signal()
        check_count = Signal(24)
        check_tail = Signal(count_shape)
        check_expected = Signal(16)
        length_error = Signal()
        m.d.sync += check_valid.eq(0)
        with m.If(pfifo.w_en):
            with m.If(ip.last):
                m.d.sync += [
                    byte_count.eq(0),
                    check_valid.eq(1),
                    check_count.eq(byte_count),
                    check_tail.eq(keep_end),
                    check_expected.eq(ip.header.payload_len),
                ]
            with m.Else():
                m.d.sync += byte_count.eq(byte_count + lanes)
        m.d.sync += length_error.eq(check_valid & (check_count + check_tail != check_expected))
        with m.If(length_error):
            m.d.sync += self.length_errors.eq(self.length_errors + 1)

        # --- Header stage I: capture and layout id ----------------------------------------------

        cap_hdr = Signal(hdr_layout)
        cap_lid = Signal(LAYOUT_ID_BITS)
        in_hdr = ip.header
        in_imm = in_hdr.bth.opcode.matches(*(int(op) for op in P.IMMEDIATE_OPCODES))
        in_transport = Signal(3)
        with m.Switch(in_hdr.kind):
            for kind, opcode in KIND_OPCODES.items():
                with m.Case(kind):
                    size = L.headers_size(L.CONTROL_HEADERS[opcode])
                    m.d.comb += in_transport.eq(Transport.control(size))
            with m.Default():
                m.d.comb += in_transport.eq(Cat(in_hdr.bth.ts, in_imm))
        in_srv6 = Mux(in_hdr.srv6_valid, Mux(in_hdr.srh_valid, 2, 1), 0)
        in_lid = Cat(in_hdr.vlan_valid, in_srv6[:2], in_hdr.ipv6, in_transport)

        # --- Derived values: lengths and IPv4 checksum ----------------------------------------
        #
        # A free-running pipeline of _DERIVE_CYCLES stages. It reads a header in I once, in the
        # cycle after its capture (age 0); at age _DERIVE_CYCLES its results are in `derived`
        # and are copied to wherever the header is then (I or N), so a header never waits in I
        # for them. Lengths are payload_len plus a per-layout constant; the checksum is the
        # complement of the one's complement sum of the IPv4 header's 16-bit words.

        udp_const, ip4_const, outer_const = [], [], []
        for lid in range(LAYOUT_COUNT):
            parts = layout_parts(lid)
            segments = layout_segments(lid)
            udp = sum(size for _name, size in parts[segments.index("udp"):]) + P.ICRC_BYTES
            inner = udp + (L.IPV6.size if "ipv6" in segments else L.IPV4.size)
            udp_const.append(udp)
            ip4_const.append(L.IPV4.size + udp)
            outer_const.append(inner + (L.SRH.size if "srh" in segments else 0))
        checksum_const = [0x4500 + IPV4_IDENTIFICATION + IPV4_FLAGS_FRAGMENT + P.IP_PROTO_UDP + c
                          for c in ip4_const]

        derived_layout = data.StructLayout({
            "udp_len": 16, "ip4_total": 16, "outer_plen": 16, "ip_checksum": 16})
        d1 = Signal(derived_layout)
        d2 = Signal(derived_layout)
        d3 = Signal(derived_layout)
        derived = Signal(derived_layout)            # the last stage
        sum_src = Signal(17)
        sum_dst = Signal(17)
        sum_var = Signal(17)
        sum_const = Signal(17)
        sum_addr = Signal(18)
        sum_rest = Signal(18)
        sum_fold = Signal(17)
        m.d.sync += [
            d1.udp_len.eq(cap_hdr.payload_len + table(udp_const, 16)[cap_lid]),
            d1.ip4_total.eq(cap_hdr.payload_len + table(ip4_const, 16)[cap_lid]),
            d1.outer_plen.eq(cap_hdr.payload_len + table(outer_const, 16)[cap_lid]),
            sum_src.eq(cap_hdr.ip_src[16:32] + cap_hdr.ip_src[0:16]),
            sum_dst.eq(cap_hdr.ip_dst[16:32] + cap_hdr.ip_dst[0:16]),
            sum_var.eq(Cat(cap_hdr.tclass, cap_hdr.hop_limit) + cap_hdr.payload_len),
            sum_const.eq(table(checksum_const, 17)[cap_lid]),
            d2.eq(d1),
            sum_addr.eq(sum_src + sum_dst),
            sum_rest.eq(sum_var + sum_const),
            d3.eq(d2),
            sum_fold.eq((sum_addr + sum_rest)[:16] + (sum_addr + sum_rest)[16:]),
            derived.eq(d3),
            derived.ip_checksum.eq(~(sum_fold[:16] + sum_fold[16])),
        ]

        # A header's age counts cycles since its capture; at _DERIVE_CYCLES, `derived` is its.
        ready_age = _DERIVE_CYCLES + 1
        cap_valid = Signal()
        cap_age = Signal(range(ready_age + 1))
        cap_der = Signal(derived_layout)

        # --- Header stage N: next packet to emit; stage C: the packet at the word mux ---------

        n_valid = Signal()
        n_claimed = Signal()                        # the control stage has started it
        n_hdr = Signal(hdr_layout)
        n_lid = Signal(LAYOUT_ID_BITS)
        n_age = Signal(range(ready_age + 1))
        n_der = Signal(derived_layout)
        c_hdr = Signal(hdr_layout)
        c_der = Signal(derived_layout)

        advance = Signal(init=1)                    # the whole beat pipeline moves (a register)
        n_release = Signal()                        # N moves to C
        i_to_n = Signal()
        m.d.comb += [
            i_to_n.eq(cap_valid & (~n_valid | n_release)),
            self.i.ready.eq(pfifo.w_rdy & (~at_first | ~cap_valid)),
        ]

        with m.If(i_to_n):
            m.d.sync += cap_valid.eq(0)
        with m.Elif(cap_valid & (cap_age != ready_age)):
            m.d.sync += cap_age.eq(cap_age + 1)
            with m.If(cap_age == _DERIVE_CYCLES):
                m.d.sync += cap_der.eq(derived)
        with m.If(capture):
            m.d.sync += [cap_valid.eq(1), cap_age.eq(0)]
        # Loaded whenever I is empty, whether or not a header arrives: the enable of these wide
        # registers is then a register, not the input's `valid`.
        with m.If(~cap_valid):
            m.d.sync += [cap_hdr.eq(in_hdr), cap_lid.eq(in_lid)]

        # N is released (moved to C) two or more cycles after its load, which needs age
        # ready_age - 2 (see `load`), so n_der is complete by then.
        with m.If(n_release):
            m.d.sync += [
                c_hdr.eq(n_hdr),
                c_der.eq(n_der),
                n_valid.eq(0),
            ]
        with m.Elif(n_valid & (n_age != ready_age)):
            m.d.sync += n_age.eq(n_age + 1)
            with m.If(n_age == _DERIVE_CYCLES):
                m.d.sync += n_der.eq(derived)
        with m.If(i_to_n):
            m.d.sync += [
                n_valid.eq(1),
                n_claimed.eq(0),
                n_hdr.eq(cap_hdr),
                n_lid.eq(cap_lid),
                n_age.eq(Mux(cap_age == ready_age, ready_age, cap_age + 1)),
                n_der.eq(Mux(cap_age == _DERIVE_CYCLES, derived, cap_der)),
            ]

        # --- Beat pipeline P0 (control) .. P7 (ICRC), all moving on `advance` -----------------

        HDR, MERGE, PAY, FLUSH = range(4)
        ctl_layout = data.StructLayout({
            "valid": 1, "start": 1, "type": 2, "count": count_bits, "last": 1,
            "crc_valid": 1, "crc_first": 1, "crc_lo": count_bits,
            "offset": max(1, ceil_log2(offsets)), "port": len(self.o.payload.port),
        })

        p0_active = Signal()
        p0_phase = Signal(2)
        p0_beat = Signal(beat_bits)
        p0_lid = Signal(LAYOUT_ID_BITS)
        p0_hdr_beats = Signal(beat_bits)
        p0_offset = Signal(offset_shape)            # payload lane offset = 2 + 4 * p0_offset
        p0_icrc_beat = Signal(beat_bits)
        p0_icrc_lane = Signal(count_shape)
        p0_port = Signal(len(self.o.payload.port))
        p0_left = Signal(count_shape)               # bytes of the flush beat

        fifo_data = pfifo.r_data[:width]
        fifo_count = pfifo.r_data[width:width + count_bits]
        fifo_last = pfifo.r_data[width + count_bits]
        payload_lane = Signal(range(lanes))
        m.d.comb += payload_lane.eq(2 + 4 * p0_offset)

        emit = Signal(ctl_layout)
        done = Signal()
        pop = Signal()
        header_like = (p0_phase == HDR) | (p0_phase == MERGE)
        m.d.comb += [
            emit.start.eq((p0_phase == HDR) & (p0_beat == 0)),
            emit.offset.eq(p0_offset),
            emit.port.eq(p0_port),
            emit.count.eq(lanes),
            emit.crc_valid.eq(~header_like | (p0_beat >= p0_icrc_beat)),
            emit.crc_first.eq(header_like & (p0_beat == p0_icrc_beat)),
            emit.crc_lo.eq(Mux(emit.crc_first, p0_icrc_lane, 0)),
        ]
        with m.If(p0_active):
            with m.Switch(p0_phase):
                with m.Case(HDR):
                    m.d.comb += [emit.valid.eq(1), emit.type.eq(HDR)]
                with m.Case(MERGE, PAY):
                    with m.If(pfifo.r_rdy):
                        m.d.comb += [
                            emit.valid.eq(1), pop.eq(1),
                            emit.type.eq(Mux(p0_phase == MERGE, MERGE, PAY)),
                        ]
                        with m.If(fifo_last & (fifo_count + payload_lane <= lanes)):
                            m.d.comb += [
                                emit.count.eq(fifo_count + payload_lane),
                                emit.last.eq(1),
                                done.eq(1),
                            ]
                with m.Case(FLUSH):
                    m.d.comb += [
                        emit.valid.eq(1), emit.type.eq(FLUSH), emit.count.eq(p0_left),
                        emit.last.eq(1), done.eq(1),
                    ]
        m.d.comb += pfifo.r_en.eq(advance & pop)

        load = Signal()
        # The derived values are first needed when the packet's first beat reaches P2, at
        # least two cycles after its load: the load may go ahead two cycles before they exist.
        m.d.comb += load.eq(advance & n_valid & ~n_claimed & (n_age >= ready_age - 2) &
                            (~p0_active | done))
        with m.If(advance):
            with m.Switch(p0_phase):
                with m.Case(HDR):
                    m.d.sync += p0_beat.eq(p0_beat + 1)
                    with m.If(p0_beat + 1 == p0_hdr_beats):
                        m.d.sync += p0_phase.eq(MERGE)
                with m.Case(MERGE, PAY):
                    with m.If(pop):
                        m.d.sync += p0_phase.eq(PAY)
                        with m.If(fifo_last & ~done):
                            m.d.sync += [
                                p0_phase.eq(FLUSH),
                                p0_left.eq(fifo_count + payload_lane - lanes),
                            ]
            with m.If(done):
                m.d.sync += p0_active.eq(0)
            with m.If(load):
                m.d.sync += [
                    n_claimed.eq(1),
                    p0_active.eq(1),
                    p0_phase.eq(HDR),
                    p0_beat.eq(0),
                    p0_lid.eq(n_lid),
                    p0_hdr_beats.eq(table(self._table("header_beats"), beat_bits)[n_lid]),
                    p0_offset.eq(table([(a - 2) // 4 for a in self._table("payload_lane")],
                                       offset_shape)[n_lid]),
                    p0_icrc_beat.eq(table(self._table("icrc_beat"), beat_bits)[n_lid]),
                    p0_icrc_lane.eq(table(self._table("icrc_lane"), count_shape)[n_lid]),
                    p0_port.eq(n_hdr.port),
                ]

        # ROM: the source word of every word lane of header beat p0_beat (read on `advance`).
        m.submodules.word_rom = rom = Memory(
            shape=unsigned(index_bits * (self._word_lanes + 1)),
            depth=LAYOUT_COUNT << beat_bits, init=self._rom_init(index_bits, beat_bits))
        rom_port = rom.read_port(domain="sync")
        m.d.comb += [
            rom_port.en.eq(advance),
            rom_port.addr.eq(Cat(p0_beat, p0_lid)),
        ]

        # P1: ROM data, popped payload.
        p1 = Signal(ctl_layout)
        p1_data = Signal(width)
        # P2: word selects, payload rotated to its lane offset.
        p2 = Signal(ctl_layout)
        p2_sel = Signal(index_bits * (self._word_lanes + 1))
        p2_rot = Signal(width)
        # P3: header bytes (and their ICRC masks) of the beat.
        p3 = Signal(ctl_layout)
        p3_hdr = Signal(width)
        p3_mask = Signal(width)
        p3_rot = Signal(width)
        carry = Signal(width)                       # the previous payload beat, rotated
        # P4: the frame beat (before the ICRC), and what the CRC sees of it.
        p4 = Signal(ctl_layout)
        p4_data = Signal(width)
        p4_crc_data = Signal(width)
        p4_crc_keep = Signal(lanes)
        # P5, P6: the frame beat while the CRC unit's data stage and loop take it (the unit
        # moves on `advance` too, so its stages stay in step with these).
        p5 = Signal(ctl_layout)
        p5_data = Signal(width)
        p6 = Signal(ctl_layout)
        p6_data = Signal(width)
        # P7: the frame beat, the CRC (its fold stage) including it; whether its ICRC spills
        # into an extra beat, decoded a stage early.
        p7 = Signal(ctl_layout)
        p7_data = Signal(width)
        p7_spills = Signal()

        m.d.comb += n_release.eq(advance & p1.valid & p1.start)

        rotated = Signal(width)
        with m.Switch(p1.offset):
            for offset in range(offsets):
                with m.Case(offset):
                    m.d.comb += rotated.eq(p1_data.rotate_left(8 * (2 + 4 * offset)))

        # Source words, from stage C's registers.
        words, masks = self._source_word_values(c_hdr, c_der)
        word_array = Array(words)
        mask_array = Array(C(mask, 32) for mask in masks)
        lane_words, lane_masks = [], []
        for lane in range(self._word_lanes + 1):
            sel = p2_sel.word_select(lane, index_bits)
            word = Signal(32, name=f"word{lane}")
            mask = Signal(32, name=f"mask{lane}")
            m.d.comb += [word.eq(word_array[sel]), mask.eq(mask_array[sel])]
            lane_words.append(word)
            lane_masks.append(mask)

        def grid_beat(values):
            return Cat(values[0][16:], *values[1:-1], values[-1][:16])

        # Merge of header, carried payload and rotated payload at P3.
        lo_lanes = Signal(lanes)                    # lanes below the payload offset
        with m.Switch(p3.offset):
            for offset in range(offsets):
                with m.Case(offset):
                    m.d.comb += lo_lanes.eq((1 << (2 + 4 * offset)) - 1)
        merged = Signal(width)
        merged_mask = Signal(width)
        for lane in range(lanes):
            byte = slice(8 * lane, 8 * lane + 8)
            with m.If((p3.type == HDR) | ((p3.type == MERGE) & lo_lanes[lane])):
                m.d.comb += [merged[byte].eq(p3_hdr[byte]), merged_mask[byte].eq(p3_mask[byte])]
            with m.Elif(lo_lanes[lane]):
                m.d.comb += merged[byte].eq(carry[byte])
            with m.Else():
                m.d.comb += merged[byte].eq(p3_rot[byte])
        crc_keep = Signal(lanes)
        m.d.comb += crc_keep.eq(_keep_mask(p3.count, lanes) & ~_keep_mask(p3.crc_lo, lanes))

        m.submodules.icrc = crc = CRC32(data_width=width, init_bytes=ICRC_INIT_BYTES)
        m.d.comb += [
            crc.en.eq(advance),
            crc.valid.eq(p4.valid & p4.crc_valid),
            crc.first.eq(p4.crc_first),
            crc.data.eq(p4_crc_data),
            crc.keep.eq(p4_crc_keep),
        ]

        with m.If(advance):
            m.d.sync += [
                p1.eq(emit),
                p1_data.eq(fifo_data),
                p2.eq(p1),
                p2_sel.eq(rom_port.data),
                p2_rot.eq(rotated),
                p3.eq(p2),
                p3_hdr.eq(grid_beat(lane_words)),
                p3_mask.eq(grid_beat(lane_masks)),
                p3_rot.eq(p2_rot),
                p4.eq(p3),
                p4_data.eq(merged),
                p4_crc_data.eq(merged | merged_mask),
                p4_crc_keep.eq(crc_keep),
                p5.eq(p4),
                p5_data.eq(p4_data),
                p6.eq(p5),
                p6_data.eq(p5_data),
                p7.eq(p6),
                p7_data.eq(p6_data),
                p7_spills.eq(p6.last & (p6.count > lanes - 4)),
            ]
            with m.If(p3.valid & ((p3.type == MERGE) | (p3.type == PAY))):
                m.d.sync += carry.eq(p3_rot)

        # --- P5: ICRC insertion, spill beat, output buffer ------------------------------------

        icrc = crc.crc                              # sent least significant byte first
        icrc_byte = [icrc[8 * j:8 * j + 8] for j in range(4)]
        with_icrc = Signal(width)
        spill_data = Signal(width)
        for lane in range(lanes):
            byte = slice(8 * lane, 8 * lane + 8)
            m.d.comb += with_icrc[byte].eq(p7_data[byte])
            for j in range(min(4, lane + 1)):
                with m.If(p7.count == lane - j):
                    m.d.comb += with_icrc[byte].eq(icrc_byte[j])
            for count in range(max(lanes - 3, lane + 1), lanes + 1):
                j = lane + lanes - count
                if j < 4:
                    with m.If(p7.count == count):
                        m.d.comb += spill_data[byte].eq(icrc_byte[j])

        spills = p7_spills
        spill_pending = Signal()
        beat_layout = net_beat_layout(width, tagged=True)
        out_beat = Signal(beat_layout)
        out_count = Signal(count_shape)
        out_write = Signal()
        out_ready = Signal()
        m.d.comb += [
            out_beat.port.eq(p7.port),
            out_beat.keep.eq(_keep_mask(out_count, lanes)),
        ]
        with m.If(spill_pending):
            m.d.comb += [
                out_beat.data.eq(spill_data),
                out_count.eq(p7.count + 4 - lanes),
                out_beat.last.eq(1),
            ]
        with m.Elif(p7.last):
            m.d.comb += [
                out_beat.data.eq(with_icrc),
                out_count.eq(Mux(spills, lanes, p7.count + 4)),
                out_beat.last.eq(~spills),
                out_beat.first.eq(p7.start),
            ]
        with m.Else():
            m.d.comb += [
                out_beat.data.eq(p7_data),
                out_count.eq(lanes),
                out_beat.first.eq(p7.start),
            ]
        m.d.comb += out_write.eq(p7.valid & out_ready)
        with m.If(out_write):
            m.d.sync += spill_pending.eq(spills & ~spill_pending)

        # Two-entry output buffer: `o.valid` and `o.payload` are registers, and the pipeline
        # sees a registered `out_ready`, so `o.ready` reaches only this buffer.
        skid_valid = Signal()
        skid = Signal(beat_layout)
        m.d.comb += out_ready.eq(~skid_valid)
        o_free = self.o.ready | ~self.o.valid
        with m.If(o_free):
            with m.If(skid_valid):
                m.d.sync += [self.o.payload.eq(skid), self.o.valid.eq(1), skid_valid.eq(0)]
            with m.Else():
                m.d.sync += [self.o.payload.eq(out_beat), self.o.valid.eq(out_write)]
        with m.Elif(out_write):
            m.d.sync += [skid.eq(out_beat), skid_valid.eq(1)]

        # `advance` enables every pipeline register, the CRC unit and the payload FIFO's read:
        # it is a register, computed a cycle ahead from the next values of the four registers
        # it depends on, so the wide fan-out starts at a flip-flop. It always equals
        # `(~p7.valid | out_ready) & ~(p7.valid & spills & ~spill_pending)`.
        next_p7_valid = Mux(advance, p6.valid, p7.valid)
        next_spills = Mux(advance, p6.last & (p6.count > lanes - 4), p7_spills)
        next_pending = Mux(out_write, spills & ~spill_pending, spill_pending)
        next_skid_valid = ~o_free & (skid_valid | out_write)
        m.d.sync += advance.eq((~next_p7_valid | ~next_skid_valid) &
                               ~(next_p7_valid & next_spills & ~next_pending))

        return m

    @staticmethod
    def _control_bytes(hdr):
        """The ``ctl`` segment: the wire bytes of the kind's control headers (the AETH, or the
        member of the control union), zero-padded to the longest."""
        size = _SEGMENT_SIZES["ctl"]
        members = {
            PacketKind.AETH: ((L.AETH, hdr.aeth),),
            PacketKind.SACK: ((L.SETH, hdr.ctl.sack.seth), (L.CC_STATE, hdr.ctl.sack.cc_state)),
            PacketKind.NACK: ((L.NETH, hdr.ctl.neth),),
            PacketKind.RPROBE: ((L.PETH, hdr.ctl.peth),),
            PacketKind.EP_REQUEST: ((L.ERTH, hdr.ctl.erth),),
            PacketKind.EP_RESPONSE: ((L.EETH, hdr.ctl.eeth),),
        }
        assert set(members) == set(KIND_OPCODES)
        out = _const_bytes(*bytes(size))
        for kind, parts in members.items():
            assert tuple(h for h, _ in parts) == L.CONTROL_HEADERS[KIND_OPCODES[kind]]
            wire = [byte for header, view in parts for byte in _header_bytes(view, header)]
            wire += _const_bytes(*bytes(size - len(wire)))
            out = [Mux(hdr.kind == kind, new, old) for new, old in zip(wire, out, strict=True)]
        return out

    def _source_word_values(self, hdr, der):
        """Every source word (lane order: wire byte 0 in bits 0..7) and its ICRC mask."""
        ip_type = Mux(hdr.srv6_valid | hdr.ipv6, P.ETHERTYPE_IPV6, P.ETHERTYPE_IPV4)
        inner_proto = Mux(hdr.ipv6, P.IP_PROTO_IPV6, P.IP_PROTO_IPV4)
        segments = {
            "eth": _const_bytes(0, 0) + _be_bytes(hdr.eth_dst, 6) + _be_bytes(hdr.eth_src, 6)
            + _be_bytes(Mux(hdr.vlan_valid, P.ETHERTYPE_VLAN, ip_type), 2),
            "vlan": _be_bytes(hdr.vlan_tci, 2) + _be_bytes(ip_type, 2),
            "outer": _const_bytes(0x60, 0, 0, 0) + _be_bytes(der.outer_plen, 2)
            + _be_bytes(Mux(hdr.srh_valid, P.IP_PROTO_ROUTING, inner_proto), 1)
            + _const_bytes(SRV6_OUTER_HOP_LIMIT)
            + _be_bytes(hdr.srv6_src, 16) + _be_bytes(hdr.srv6_dst, 16),
            "srh": _be_bytes(inner_proto, 1)
            + _const_bytes(_SRH_HDR_EXT_LEN, P.SRH_ROUTING_TYPE, 1, 0, 0, 0, 0)
            + _be_bytes(hdr.srh_segment, 16),
            "ipv6": _be_bytes(Cat(hdr.flow_label, hdr.tclass, C(6, 4)), 4)
            + _be_bytes(der.udp_len, 2) + _const_bytes(P.IP_PROTO_UDP)
            + _be_bytes(hdr.hop_limit, 1) + _be_bytes(hdr.ip_src, 16)
            + _be_bytes(hdr.ip_dst, 16),
            "ipv4": _const_bytes(0x45) + _be_bytes(hdr.tclass, 1) + _be_bytes(der.ip4_total, 2)
            + _be_bytes(C(IPV4_IDENTIFICATION, 16), 2) + _be_bytes(C(IPV4_FLAGS_FRAGMENT, 16), 2)
            + _be_bytes(hdr.hop_limit, 1) + _const_bytes(P.IP_PROTO_UDP)
            + _be_bytes(der.ip_checksum, 2) + _be_bytes(hdr.ip_src[:32], 4)
            + _be_bytes(hdr.ip_dst[:32], 4),
            "udp": _be_bytes(hdr.udp_sport, 2) + _be_bytes(C(P.ROCEV2_UDP_PORT, 16), 2)
            + _be_bytes(der.udp_len, 2) + _const_bytes(0, 0),
            "bth": _header_bytes(hdr.bth, L.BTH),
            "meth": _header_bytes(hdr.meth, L.METH),
            "tseth": _header_bytes(hdr.tseth, L.TSETH),
            "reth": _header_bytes(hdr.reth, L.RETH),
            "immdt": _header_bytes(hdr.immdt, L.IMMDT),
            "ctl": self._control_bytes(hdr),
        }
        words, masks = [], []
        for name in _SEGMENT_ORDER:
            wire = segments[name]
            assert len(wire) == _SEGMENT_SIZES[name], name
            for index in range(len(wire) // 4):
                words.append(Cat(*wire[4 * index:4 * index + 4]))
                assert len(words[-1]) == 32, name
                mask = _ICRC_MASKS.get((name, index), (0, 0, 0, 0))
                masks.append(int.from_bytes(bytes(mask), "little"))
        words.append(C(0, 32))
        masks.append(0)
        assert len(words) == self._source_words
        return words, masks
