"""What the header builder's stages share: the packet layouts (which headers a frame
carries), the fixed field values, the source-word plan behind the header word multiplexer,
and the layouts of the registers one stage hands to the next (:mod:`hdl.packet.builder`
wires the stages).
"""

from amaranth import *
from amaranth.lib import data
from amaranth.utils import ceil_log2

from .. import protocol as P
from ..config import NicConfig
from . import layouts as L
from .headers import KIND_OPCODES, PacketKind, net_beat_layout

__all__ = [
    "Transport", "CONTROL_SIZES", "LAYOUT_ID_BITS", "LAYOUT_COUNT", "layout_id",
    "decode_layout_id", "layout_parts", "layout_segments", "header_bytes", "icrc_start",
    "IPV4_IDENTIFICATION", "IPV4_FLAGS_FRAGMENT", "SRV6_OUTER_HOP_LIMIT", "ICRC_INIT_BYTES",
    "PAYLOAD_FIFO_DEPTH", "DERIVE_CYCLES", "READY_AGE", "HDR", "MERGE", "PAY", "FLUSH",
    "check_config", "BuilderPlan", "derived_layout", "beat_control_layout", "keep_mask",
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
PAYLOAD_FIFO_DEPTH = 16        # payload beats the input may run ahead of the output
DERIVE_CYCLES = 4              # pipeline stages computing lengths and the IPv4 checksum


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


def keep_mask(count, lanes):
    """``lanes`` bits, the low ``count`` of them set."""
    return Cat(count > lane for lane in range(lanes))




# ---------------------------------------------------------------------------------------------
# Stage facts
# ---------------------------------------------------------------------------------------------

#: A header's age (cycles since its capture) at which the derived values are its.
READY_AGE = DERIVE_CYCLES + 1
#: Beat types of the beat pipeline: a header beat, the beat where the header's last bytes
#: meet the payload's first, a payload beat, the extra beat of a frame's tail.
HDR, MERGE, PAY, FLUSH = range(4)


def check_config(config):
    if not isinstance(config, NicConfig):
        raise TypeError(f"Configuration must be a NicConfig, not {config!r}")


def derived_layout():
    """What the derive pipeline computes for a header: lengths and the IPv4 checksum."""
    return data.StructLayout({
        "udp_len": 16, "ip4_total": 16, "outer_plen": 16, "ip_checksum": 16})


def beat_control_layout(plan):
    """What travels with a beat down the beat pipeline (P1 .. P7)."""
    lanes = plan.lanes
    count_bits = ceil_log2(lanes + 1)
    return data.StructLayout({
        "valid": 1, "start": 1, "type": 2, "count": count_bits, "last": 1,
        "crc_valid": 1, "crc_first": 1, "crc_lo": count_bits,
        "offset": max(1, ceil_log2(lanes // 4)),
        "port": net_beat_layout(plan.data_width, tagged=True)["port"].width,
    })


class BuilderPlan:
    """The elaboration-time tables of a builder of one data width: for every layout, its
    source words in wire order, header beats, payload lane and where the ICRC starts.

    Members
    -------
    data_width, lanes, word_lanes : int
        W, W/8 and W/32.
    source_words : int
        Source words, the constant zero word (``zero_word``) included.
    max_beats : int
        Header beats of the longest layout, plus one.
    beat_bits, index_bits : int
        Bits of a header beat index and of a source word index.
    """

    def __init__(self, config):
        check_config(config)
        lanes = self.lanes = config.data_width // 8
        self.data_width = config.data_width
        self.seg_base = {}
        index = 0
        for name in _SEGMENT_ORDER:
            self.seg_base[name] = index
            index += _SEGMENT_SIZES[name] // 4
        self.zero_word = index                      # a constant zero: beyond the header
        self.source_words = index + 1
        self.word_lanes = lanes // 4
        self.max_beats = 0
        self.layouts = []
        for lid in range(LAYOUT_COUNT):
            words = []
            for name, size in layout_parts(lid):
                base = self.seg_base[name]
                words += range(base, base + size // 4)
            length = header_bytes(lid)
            assert length == 4 * len(words) - 2 and length % 4 == 2
            start = icrc_start(lid)
            self.layouts.append({
                "words": words, "length": length, "header_beats": length // lanes,
                "payload_lane": length % lanes, "icrc_beat": start // lanes,
                "icrc_lane": start % lanes,
            })
            self.max_beats = max(self.max_beats, length // lanes + 1)
        self.beat_bits = ceil_log2(self.max_beats)
        self.index_bits = ceil_log2(self.source_words)

    def rom_init(self):
        """ROM word for (layout, header beat): the source word of each of ``W/32 + 1`` lanes.

        Beat ``k`` covers frame bytes ``k*lanes ..``, i.e. grid words ``k*W/32 .. k*W/32 +
        W/32``, of which the first and the last contribute two bytes each.
        """
        index_bits, beat_bits = self.index_bits, self.beat_bits
        init = []
        for lid in range(LAYOUT_COUNT):
            words = self.layouts[lid]["words"]
            for beat in range(1 << beat_bits):
                entry = 0
                for lane in range(self.word_lanes + 1):
                    position = beat * self.word_lanes + lane
                    source = words[position] if position < len(words) else self.zero_word
                    entry |= source << (lane * index_bits)
                init.append(entry)
        return init

    def table(self, key):
        """One value per layout id."""
        return [self.layouts[lid][key] for lid in range(LAYOUT_COUNT)]

    @staticmethod
    def control_bytes(hdr):
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

    def source_word_values(self, hdr, der):
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
            "ctl": self.control_bytes(hdr),
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
        assert len(words) == self.source_words
        return words, masks
