"""What the receive parser's stages share: the header stacks and the byte offsets that follow
from them, the sizes that fix the parser's geometry, byte helpers, and the layouts of the
registers one stage hands to the next (:mod:`hdl.packet.parser` wires the stages).
"""

import zlib
from dataclasses import dataclass

from amaranth.hdl import Cat, Mux, Signal, signed
from amaranth.lib import data
from amaranth.utils import ceil_log2, exact_log2

from .. import protocol as P
from ..config import NicConfig
from . import layouts as L
from .headers import (
    DropReason,
    PacketKind,
    field_slices,
    net_beat_layout,
    opcode_kind,
    packet_header_layout,
)

__all__ = [
    "ETHERNET", "DOT1Q", "IPV4", "IPV6", "SRH", "UDP", "ICRC_MASKED_FIELDS", "ICRC_INIT_BYTES",
    "ICRC_RESIDUE", "SRH_ONE_SEGMENT_LEN", "ETHERNET_MIN_FRAME", "MODE_PLAIN", "MODE_SRV6",
    "MODE_SRH", "Stack", "STACKS", "TRANSPORT_SIZE", "L4_WINDOW", "HEADER_BYTES",
    "HEADER_QUEUE_DEPTH", "FLAG_NAMES", "max_frame_bytes", "icrc_mask_bytes", "wire_bytes",
    "wire_field", "field_offset", "priority_reason", "ParserGeometry", "check_config",
    "flags_layout", "input_beat_layout", "frame_layout", "windows_layout", "queue_entry_layout",
    "FIELD_CHECKS", "checks_layout", "VERDICT_CHECKS", "lengths_layout",
]


# Standard headers in front of the BTH and the ICRC facts live in hdl.packet.layouts.
ETHERNET, DOT1Q, IPV4, IPV6, SRH, UDP = L.ETHERNET, L.DOT1Q, L.IPV4, L.IPV6, L.SRH, L.UDP
ICRC_MASKED_FIELDS = L.ICRC_MASKED_FIELDS
ICRC_INIT_BYTES = L.ICRC_INIT_BYTES

#: SRH ``hdr_ext_len`` of a header with exactly one 16-byte segment and no TLVs (8-byte units
#: after the first 8 bytes).
SRH_ONE_SEGMENT_LEN = (SRH.size - 8) // 8

#: CRC of any message followed by its own CRC (little-endian): the ICRC check needs no
#: knowledge of where the ICRC starts, only that the frame ends with it.
ICRC_RESIDUE = zlib.crc32(zlib.crc32(b"").to_bytes(4, "little"))

MODE_PLAIN, MODE_SRV6, MODE_SRH = 0, 1, 2     # SRV6: outer next header 41 or 4; SRH: 43
#: Shortest Ethernet frame without FCS: shorter frames are padded to it, and a frame of exactly
#: this size may carry padding after its IP packet.
ETHERNET_MIN_FRAME = 60


@dataclass(frozen=True)
class Stack:
    """One header stack up to the UDP header: every byte offset in a frame follows from it."""
    vlan: bool
    mode: int           # MODE_PLAIN, MODE_SRV6 (outer IPv6, nh 41/4), MODE_SRH (outer nh 43)
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
        return IPV4.size if self.mode == MODE_PLAIN and self.inner_v4 else IPV6.size

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


STACKS = tuple(Stack(vlan, mode, v4) for vlan in (False, True)
               for mode in (MODE_PLAIN, MODE_SRV6, MODE_SRH) for v4 in (False, True))

#: Bytes of transport headers after the BTH, by (kind, immediate, BTH.ts of a data packet).
#: A control packet is exactly its headers long.
TRANSPORT_SIZE = {
    (opcode_kind(op), False, False): L.headers_size(headers)
    for op, headers in L.CONTROL_HEADERS.items()
} | {
    (PacketKind.DATA, imm, ts): L.headers_size(L.data_headers(op, ts=ts))
    for op, imm in ((P.Opcode.RDMA_WRITE_ONLY, False),
                    (P.Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE, True))
    for ts in (False, True)
}
#: Bytes of the window on the UDP header and everything after it up to the payload.
L4_WINDOW = UDP.size + L.BTH.size + max(TRANSPORT_SIZE.values())
#: Bytes the capture register keeps: the longest legal header stack.
HEADER_BYTES = max(s.u for s in STACKS) + L4_WINDOW
#: Header queue entries (accepted frames waiting for the reader, plus reservations).
HEADER_QUEUE_DEPTH = 16
#: The stack flags the input stage tracks: the ethertype (after an optional 802.1Q tag), the
#: outer IPv6 next header (41, 4, 43) and the SRH's next header (4).
FLAG_NAMES = ("vlan", "v4", "v6", "nh41", "nh4", "nh43", "srh4")


def max_frame_bytes(config):
    """The longest frame that can be legal: the longest stack and data headers, an MTU of
    payload, the ICRC (control packets are shorter)."""
    longest_data = max(size for (kind, _, _), size in TRANSPORT_SIZE.items()
                       if kind == PacketKind.DATA)
    longest_control = max(TRANSPORT_SIZE.values())
    return (max(s.t for s in STACKS) + L.BTH.size + P.ICRC_BYTES
            + max(longest_data + config.mtu, longest_control))


def icrc_mask_bytes(inner_v4):
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

def wire_bytes(value, count):
    """``value`` as a list of ``count`` bytes, wire byte i in bits ``8*i .. 8*i+7``."""
    return [value[8 * i:8 * i + 8] for i in range(count)]


def wire_field(window, header, name, base=0):
    """Field ``name`` of ``header`` starting at byte ``base`` of ``window`` (a byte list)."""
    first, bit, bits = field_slices(header)[name]
    count = (bit + bits + 7) // 8
    value = Cat(*reversed(window[base + first:base + first + count]))   # big-endian
    low = count * 8 - bit - bits
    return value[low:low + bits]


def field_offset(header, name):
    """Byte offset of a byte-aligned field."""
    first, bit, _bits = field_slices(header)[name]
    assert bit == 0
    return first


def priority_reason(m, conditions, width):
    """The reason of the first true condition, NONE if none is: ``[(condition, reason)]``."""
    reason = Signal(width)
    for condition, value in reversed(conditions):
        reason_if = Signal(width)
        m.d.comb += reason_if.eq(Mux(condition, value.value, reason))
        reason = reason_if
    return reason


# ---------------------------------------------------------------------------------------------
# Geometry and the registers between stages
# ---------------------------------------------------------------------------------------------

def check_config(config):
    if not isinstance(config, NicConfig):
        raise TypeError(f"Config must be a NicConfig, not {config!r}")


@dataclass(frozen=True)
class ParserGeometry:
    """Sizes that follow from a :class:`~hdl.config.NicConfig`: every stage derives its
    widths from these, so the stages always agree."""
    data_width: int
    lanes: int              # bytes per beat
    lane_bits: int
    max_frame: int          # max_frame_bytes(config)
    max_beats: int          # beats of the longest legal frame
    beat_bits: int          # a beat index within a frame, saturating at max_beats
    cap_beats: int          # beats the capture register keeps
    len_bits: int           # a frame length in bytes (up to max_beats + 1 beats)
    fifo_depth: int         # packet FIFO beats
    ptr_bits: int           # packet FIFO pointer (modulo 2 * fifo_depth)

    @classmethod
    def of(cls, config):
        check_config(config)
        lanes = config.bytes_per_beat
        max_frame = max_frame_bytes(config)
        max_beats = -(-max_frame // lanes)
        fifo_depth = 1 << ceil_log2(2 * max_beats + 16)
        return cls(
            data_width=config.data_width, lanes=lanes, lane_bits=exact_log2(lanes),
            max_frame=max_frame, max_beats=max_beats, beat_bits=ceil_log2(max_beats + 1),
            cap_beats=-(-HEADER_BYTES // lanes),
            len_bits=ceil_log2((max_beats + 1) * lanes + 1), fifo_depth=fifo_depth,
            ptr_bits=exact_log2(fifo_depth) + 1)


def flags_layout():
    """One bit per :data:`FLAG_NAMES` entry: the stack bytes matched so far in a frame."""
    return data.StructLayout({name: 1 for name in FLAG_NAMES})


def input_beat_layout(geometry):
    """The input stage's register (s1): the beat taken, its index, the frame's stack so far."""
    return data.StructLayout({
        "valid": 1,
        "beat": net_beat_layout(geometry.data_width, tagged=True),
        "index": geometry.beat_bits,
        "stack": 4,                 # Stack.code
        "stack_hot": len(STACKS),   # ``stack`` one-hot, in STACKS order
        "flags": flags_layout(),
    })


def _port_shape(geometry):
    return net_beat_layout(geometry.data_width, tagged=True)["port"].shape


def frame_layout(geometry):
    """A frame that has ended (D0): its capture and what the decode needs."""
    return data.StructLayout({
        "valid": 1,
        "cap": geometry.cap_beats * geometry.data_width,
        "len": geometry.len_bits,
        "flags": flags_layout(),
        "stack": 4,
        "hot": len(STACKS),         # ``stack`` one-hot, in STACKS order
        "port": _port_shape(geometry),
        "start": geometry.ptr_bits,     # FIFO beat of the frame's first byte
        "end": geometry.ptr_bits,       # FIFO beat after the frame (its start if not stored)
    })


def windows_layout(geometry):
    """The header windows of a frame (D1), cut at its stack's offsets, and its opcode class."""
    return data.StructLayout({
        "valid": 1,
        "eth": 8 * DOT1Q.size,
        "outer": 8 * IPV6.size,
        "srh": 8 * SRH.size,
        "inner": 8 * IPV6.size,
        "l4": 8 * L4_WINDOW,
        "len": geometry.len_bits,
        "too_long": 1,
        "flags": flags_layout(),
        "stack": 4,
        "port": _port_shape(geometry),
        "start": geometry.ptr_bits,
        "end": geometry.ptr_bits,
        "kind": PacketKind,
        "imm": 1,
        "opcode_ok": 1,
        # Frame bytes after the first IP header's fixed part (IPv6) or start (IPv4): what its
        # length field must say. Signed, so that a runt never matches a field value.
        "ip_room": signed(geometry.len_bits + 1),
    })


def queue_entry_layout(config, geometry):
    """A header queue entry: an accepted frame's header and where its payload is."""
    return data.StructLayout({
        "header": packet_header_layout(config),
        "pay_ptr": geometry.ptr_bits,       # FIFO beat holding the first payload byte
        "pay_lane": geometry.lane_bits,     # lane of the first payload byte
        "end_ptr": geometry.ptr_bits,       # FIFO beat after the frame
        "in_beats": geometry.beat_bits,     # FIFO beats the payload touches
        "out_beats": geometry.beat_bits,    # output beats (>= 1)
        "last_keep": geometry.lanes,        # keep of the last output beat
        "has_payload": 1,
        "seek_ptr": geometry.ptr_bits,      # where the reader goes: the payload, or past it
    })


#: Check bits the D2 stage registers from field values alone (names as in ``docs/parser.md``'s
#: order of checks); ``plain_v4``, ``srv6_v4``, ``trimmed``, ``srv6``, ``srh`` and
#: ``kind_data`` qualify the later checks.
FIELD_CHECKS = ("runt_eth", "runt_vlan", "bad_ethertype", "runt_ip", "bad_ip_header",
                "outer_len_bad", "bad_ip_protocol", "bad_srh", "bad_inner_header",
                "inner_tl_short", "bad_inner_protocol", "bad_udp_port", "bad_bth",
                "bad_opcode", "plain_v4", "srv6_v4", "trimmed", "srv6", "srh", "kind_data")


def checks_layout(geometry):
    """What D2 registers for the verdict: check bits, lengths relative to the first IP header,
    where the payload starts, the first adder level of the IPv4 header checksum."""
    return data.StructLayout({
        "valid": 1,
        "too_long": 1,
        "start": geometry.ptr_bits,
        "end": geometry.ptr_bits,
        "bits": data.StructLayout({name: 1 for name in FIELD_CHECKS}),
        "ip_len": 17,           # bytes of the first IP packet, from its header
        "inner_end": 18,        # where the inner IP packet says it ends
        "udp_end": 18,
        "need": 8,              # end of the transport headers plus the ICRC
        "dma_len": 32,
        "runt": data.StructLayout({"inner": 8, "udp": 8, "bth": 8}),    # ends of headers
        "pay_beat": range(HEADER_BYTES // geometry.lanes + 1),
        "pay_lane": geometry.lane_bits,
        "pairs": data.ArrayLayout(17, IPV4.size // 4),
    })


#: The verdict's checks in priority order (``docs/parser.md``, checks in order), in three parts:
#: before the first IP header's checksum check, between the two places an IPv4 checksum can
#: be checked (first IP header, inner IP header), and after them.
VERDICT_CHECKS = {
    "pre": (
        ("too_long", DropReason.OVERSIZE),
        ("runt_eth", DropReason.RUNT),
        ("runt_vlan", DropReason.RUNT),
        ("bad_ethertype", DropReason.BAD_ETHERTYPE),
        ("runt_ip", DropReason.RUNT),
        ("bad_ip_header", DropReason.BAD_IP_HEADER),
    ),
    "mid": (
        ("outer_len_bad", DropReason.BAD_IP_LENGTH),
        ("bad_ip_protocol", DropReason.BAD_IP_PROTOCOL),
        ("runt_srh", DropReason.RUNT),
        ("bad_srh", DropReason.BAD_IP_PROTOCOL),
        ("runt_inner", DropReason.RUNT),
        ("bad_inner_header", DropReason.BAD_IP_HEADER),
    ),
    "post": (
        ("inner_len_bad", DropReason.BAD_IP_LENGTH),
        ("bad_inner_protocol", DropReason.BAD_IP_PROTOCOL),
        ("runt_udp", DropReason.RUNT),
        ("bad_udp_port", DropReason.BAD_UDP_PORT),
        ("bad_udp_length", DropReason.BAD_UDP_LENGTH),
        ("runt_bth", DropReason.RUNT),
        ("bad_bth", DropReason.BAD_BTH),
        ("bad_opcode", DropReason.UNSUPPORTED_OPCODE),
        ("runt_data", DropReason.RUNT),
        ("bad_control_length", DropReason.BAD_LENGTH),
        ("over_mtu", DropReason.OVERSIZE),
        ("bad_dma_len", DropReason.BAD_LENGTH),
        ("bad_icrc", DropReason.BAD_ICRC),
    ),
}


def lengths_layout(config, geometry):
    """What D3 registers: the verdict's check bits, the IPv4 checksum sum, the header with
    its payload length, where the payload is."""
    return data.StructLayout({
        "valid": 1,
        "checks": data.StructLayout({
            part: data.StructLayout({name: 1 for name, _ in checks})
            for part, checks in VERDICT_CHECKS.items()}),
        "cks_sum": 20,
        "plain_v4": 1,          # check the first IP header's checksum
        "srv6_v4": 1,           # check the inner IP header's checksum
        "header": packet_header_layout(config),
        "end": geometry.ptr_bits,
        "pay_ptr": geometry.ptr_bits,
        "pay_lane": geometry.lane_bits,
    })
