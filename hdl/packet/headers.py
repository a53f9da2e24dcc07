"""Gateware views of packets: beat layouts, the parsed-header struct and drop reasons.

The per-header structs are generated from :mod:`hdl.packet.layouts` (the one table), so the
gateware, the Scapy layers and the dissector cannot drift apart. Inside the gateware, fields
are accessed by name; big-endian wire bytes are converted only at the packet boundary (the
parser and the builder, using :func:`field_slices`).
"""

from amaranth.hdl import signed, unsigned
from amaranth.lib import data, enum

from .. import protocol as P
from . import layouts as L

__all__ = [
    "header_struct", "field_slices", "net_beat_layout", "packet_header_layout",
    "packet_beat_layout", "DropReason", "PacketKind", "KIND_OPCODES", "opcode_kind",
    "BTH_STRUCT", "RETH_STRUCT", "IMMDT_STRUCT", "AETH_STRUCT", "control_header_layout",
    "METH_STRUCT", "TSETH_STRUCT", "SETH_STRUCT", "CC_STATE_STRUCT", "NETH_STRUCT",
    "PETH_STRUCT", "ERTH_STRUCT", "EETH_STRUCT",
]


def header_struct(header):
    """A :class:`~amaranth.lib.data.StructLayout` with one member per field of ``header``.

    Member order follows the wire (first field first), which in a StructLayout means the first
    field holds the LEAST significant bits: the struct is a named view, not the wire image.
    Signed fields (two's complement on the wire) are ``signed`` members.
    """
    return data.StructLayout({f.name: (signed if f.signed else unsigned)(f.bits)
                              for f in header.fields})


def field_slices(header):
    """``{name: (first_byte, bit_in_byte, bits)}`` of every field, for byte-level extraction."""
    out = {}
    for f in header.fields:
        offset = header.bit_offset(f.name)
        out[f.name] = (offset // 8, offset % 8, f.bits)
    return out


BTH_STRUCT = header_struct(L.BTH)
RETH_STRUCT = header_struct(L.RETH)
IMMDT_STRUCT = header_struct(L.IMMDT)
AETH_STRUCT = header_struct(L.AETH)
METH_STRUCT = header_struct(L.METH)
TSETH_STRUCT = header_struct(L.TSETH)
SETH_STRUCT = header_struct(L.SETH)
CC_STATE_STRUCT = header_struct(L.CC_STATE)
NETH_STRUCT = header_struct(L.NETH)
PETH_STRUCT = header_struct(L.PETH)
ERTH_STRUCT = header_struct(L.ERTH)
EETH_STRUCT = header_struct(L.EETH)


class PacketKind(enum.Enum, shape=3):
    """What the transport headers after the BTH are (decided by the opcode, MRC 1.0)."""
    DATA = 0            #: 0xC6-0xCB: METH [TSETH] RETH [ImmDt] payload
    SACK = 1            #: 0xDC RELIABILITY_SACK: SETH CC_STATE
    NACK = 2            #: 0xDD RELIABILITY_NACK: NETH
    AETH = 3            #: 0xD1 ACKNOWLEDGE: AETH (fatal NAKs)
    RPROBE = 4          #: 0xDE RELIABILITY_PROBE_REQUEST: PETH
    EP_REQUEST = 5      #: 0xD8 ENDPOINT_REQUEST: ERTH (EV probes)
    EP_RESPONSE = 6     #: 0xD9 ENDPOINT_RESPONSE: EETH


#: The opcode of every control kind (the opcode table; data kinds have six opcodes).
KIND_OPCODES = {
    PacketKind.AETH: P.Opcode.ACKNOWLEDGE,
    PacketKind.SACK: P.Opcode.RELIABILITY_SACK,
    PacketKind.NACK: P.Opcode.RELIABILITY_NACK,
    PacketKind.RPROBE: P.Opcode.RELIABILITY_PROBE_REQUEST,
    PacketKind.EP_REQUEST: P.Opcode.ENDPOINT_REQUEST,
    PacketKind.EP_RESPONSE: P.Opcode.ENDPOINT_RESPONSE,
}


def opcode_kind(opcode):
    """The :class:`PacketKind` of an MRC opcode; :class:`ValueError` for any other."""
    if opcode in P.DATA_OPCODES:
        return PacketKind.DATA
    for kind, kind_opcode in KIND_OPCODES.items():
        if opcode == kind_opcode:
            return kind
    raise ValueError(f"BTH opcode {opcode:#04x} is not an MRC opcode")


def control_header_layout():
    """The headers of control packets, which never occur together: one union, as wide as the
    widest (SETH + CC_STATE, or EETH). Which member is valid follows from ``kind``."""
    return data.UnionLayout({
        "sack": data.StructLayout({"seth": SETH_STRUCT, "cc_state": CC_STATE_STRUCT}),
        "neth": NETH_STRUCT,
        "peth": PETH_STRUCT,
        "erth": ERTH_STRUCT,
        "eeth": EETH_STRUCT,
    })


class DropReason(enum.Enum, shape=5):
    """Why the parser dropped a frame. Names are the ``reason`` strings of ``mrc-nic replay``
    (lower case) and the per-reason counters; documented in ``docs/parser.md``."""
    NONE = 0                #: accepted
    RUNT = 1                #: frame ends before its headers do (truncated)
    BAD_ETHERTYPE = 2       #: neither IPv4 nor IPv6 (after at most one 802.1Q tag)
    BAD_IP_HEADER = 3       #: IP version mismatch, IPv4 options, fragment, bad IPv4 checksum
    BAD_IP_LENGTH = 4       #: IP length does not match the frame
    BAD_IP_PROTOCOL = 5     #: not UDP (or, in SRv6, not IPv6-in-IPv6 / a type-4 SRH)
    BAD_UDP_PORT = 6        #: UDP destination port is not 4791
    BAD_UDP_LENGTH = 7      #: UDP length does not match the IP length
    BAD_BTH = 8             #: BTH version not 0 or pad count not 0
    UNSUPPORTED_OPCODE = 9  #: not an MRC opcode (SEND, READ, ATOMIC, CNP, ...)
    BAD_LENGTH = 10         #: RETH dma_len differs from the payload, or a control packet is not
                            #: exactly its headers long
    OVERSIZE = 11           #: payload over the MTU, or frame longer than the largest legal one
    BAD_ICRC = 12           #: ICRC mismatch


PORT_BITS = 4   #: up to 16 network ports (planes)


def net_beat_layout(data_width, *, tagged=False):
    """One beat of an Ethernet frame (no FCS): wire byte i is ``data[8*i:8*i+8]``.

    ``keep`` marks valid byte lanes; every beat but the last is full, the last one's valid
    lanes start at lane 0. With ``tagged`` the beat also carries the ``port`` (plane) it
    arrived on or leaves by, as between the port arbiter/demux and the packet engines.
    """
    fields = {
        "data": unsigned(data_width),
        "keep": unsigned(data_width // 8),
        "first": unsigned(1),
        "last": unsigned(1),
    }
    if tagged:
        fields["port"] = unsigned(PORT_BITS)
    return data.StructLayout(fields)


def packet_header_layout(config):
    """Everything the parser extracts from a frame and the builder needs to make one."""
    return data.StructLayout({
        "kind": PacketKind,
        "trimmed": unsigned(1),                 # DSCP == trim code point: payload gone
        "port": unsigned(PORT_BITS),            # ingress / egress port (plane), 0-based
        "payload_len": unsigned(16),            # bytes of payload after the headers
        "eth_dst": unsigned(48),
        "eth_src": unsigned(48),
        "vlan_valid": unsigned(1),
        "vlan_tci": unsigned(16),
        "ipv6": unsigned(1),                    # 0: IPv4 (addresses in the low 32 bits)
        "ip_src": unsigned(128),
        "ip_dst": unsigned(128),
        "tclass": unsigned(8),                  # DSCP << 2 | ECN
        "flow_label": unsigned(20),
        "hop_limit": unsigned(8),
        "srv6_valid": unsigned(1),              # outer IPv6 around the packet
        "srv6_src": unsigned(128),
        "srv6_dst": unsigned(128),
        "srh_valid": unsigned(1),
        "srh_segment": unsigned(128),
        "udp_sport": unsigned(16),
        "bth": BTH_STRUCT,
        "meth": METH_STRUCT,                    # DATA
        "tseth": TSETH_STRUCT,                  # DATA with bth.ts = 1 (else zero)
        "reth": RETH_STRUCT,                    # DATA
        "immdt": IMMDT_STRUCT,                  # DATA with immediate
        "aeth": AETH_STRUCT,                    # AETH
        "ctl": control_header_layout(),         # SACK, NACK, RPROBE, EP_REQUEST, EP_RESPONSE
    })


def packet_beat_layout(config):
    """A payload beat with its packet's header: the parser's output, the builder's input.

    ``header`` is stable for every beat of a packet. Payload bytes start at lane 0 of the
    first beat. A packet without payload (control packet, trimmed, zero-length write) is a single
    beat with ``first``, ``last`` and ``keep == 0``.
    """
    return data.StructLayout({
        "header": packet_header_layout(config),
        "data": unsigned(config.data_width),
        "keep": unsigned(config.data_width // 8),
        "first": unsigned(1),
        "last": unsigned(1),
    })
