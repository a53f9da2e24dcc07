"""Header layouts, in wire order: the one table every other view is built from.

The Scapy layers (:mod:`sim.packets`), the Wireshark dissector (:mod:`sim.dissector`), the
gateware's header structs, the parser's and builder's offsets and the ICRC masks are
generated from (or, for the headers Scapy already defines, cross-checked against) these
definitions, so a field can only ever be defined here.

Fields are listed in wire order, most significant bit first; multi-byte fields are
big-endian on the wire. Every header (and, where it differs, every field) carries a
``source``, the provenance ``docs/wire-format.md`` shows beside it:

``"mrc-1.0"``
    the OCP MRC 1.0 tables, as the public references cite them;
``"rocev2"``
    RoCEv2 / InfiniBand;
``"standard"``
    IEEE 802 and IETF headers in front of the BTH;
``"project"``
    this project's choice, where the MRC 1.0 references leave a field's meaning open (METH,
    the EETH op position, the unit of the 16-bit timestamps, what the entropy echo holds).

The NIC speaks MRC 1.0: the BTH, then the headers of the opcode table
(:data:`hdl.protocol.Opcode`): METH, [TSETH], RETH, [ImmDt] on data; SETH + CC_STATE, NETH,
AETH, PETH, ERTH or EETH on control packets.
"""

from dataclasses import dataclass

from hdl.protocol import IMMEDIATE_OPCODES, Opcode

#: Provenance tags and how ``docs/wire-format.md`` marks them.
SOURCES = {
    "mrc-1.0": "[MRC 1.0]",
    "rocev2": "[RoCEv2]",
    "standard": "[standard]",
    "project": "[project choice]",
}


@dataclass(frozen=True)
class Field:
    """One field of a header.

    ``signed`` fields are two's complement on the wire: :meth:`Header.unpack` returns them as
    negative numbers where the top bit is set and :meth:`Header.pack` takes the signed range.
    ``source`` overrides the header's provenance for this field (``None``: the header's).
    """
    name: str
    bits: int
    doc: str
    signed: bool = False
    source: str | None = None

    def __post_init__(self):
        if self.source is not None and self.source not in SOURCES:
            raise ValueError(f"Field source must be one of {sorted(SOURCES)}, "
                             f"not {self.source!r}")

    @property
    def minimum(self):
        return -(1 << (self.bits - 1)) if self.signed else 0

    @property
    def maximum(self):
        return (1 << (self.bits - 1)) - 1 if self.signed else (1 << self.bits) - 1

    def to_raw(self, value):
        """The unsigned bit pattern of ``value`` (two's complement for a signed field)."""
        return value & ((1 << self.bits) - 1)

    def from_raw(self, raw):
        """The value of the bit pattern ``raw`` (negative for a signed field's top bit)."""
        if self.signed and raw >> (self.bits - 1):
            return raw - (1 << self.bits)
        return raw


@dataclass(frozen=True)
class Header:
    name: str           #: short name, also the Scapy class name and the dissector prefix
    title: str
    source: str         #: provenance: a key of :data:`SOURCES`
    fields: tuple

    def __post_init__(self):
        if self.source not in SOURCES:
            raise ValueError(f"Header source must be one of {sorted(SOURCES)}, "
                             f"not {self.source!r}")

    @property
    def own(self):
        """True for a layout of this project's own invention."""
        return self.source == "project"

    def field_source(self, name):
        """Provenance of field ``name``: its own tag, else the header's."""
        return self.field(name).source or self.source

    @property
    def bits(self):
        return sum(f.bits for f in self.fields)

    @property
    def size(self):
        """Size in bytes."""
        assert self.bits % 8 == 0
        return self.bits // 8

    def bit_offset(self, name):
        """Offset of field ``name`` from the header's first bit on the wire."""
        offset = 0
        for field in self.fields:
            if field.name == name:
                return offset
            offset += field.bits
        raise KeyError(f"{self.name} has no field {name!r}")

    def byte_offset(self, name):
        """Offset of the byte that holds the first bit of field ``name``."""
        return self.bit_offset(name) // 8

    def field(self, name):
        for field in self.fields:
            if field.name == name:
                return field
        raise KeyError(f"{self.name} has no field {name!r}")

    def byte_mask(self, names):
        """``size`` bytes with every bit of the fields ``names`` set (e.g. ICRC masks)."""
        mask = 0
        for name in names:
            field = self.field(name)
            shift = self.bits - self.bit_offset(name) - field.bits
            mask |= ((1 << field.bits) - 1) << shift
        return mask.to_bytes(self.size, "big")

    def unpack(self, data):
        """Decode the fixed part of this header from the start of ``data`` into a dict."""
        if len(data) < self.size:
            raise ValueError(f"{self.name} needs {self.size} bytes, got {len(data)}")
        value = int.from_bytes(data[:self.size], "big")
        out, shift = {}, self.bits
        for field in self.fields:
            shift -= field.bits
            out[field.name] = field.from_raw((value >> shift) & ((1 << field.bits) - 1))
        return out

    def pack(self, **values):
        """Encode fields (missing ones are zero) into wire bytes."""
        unknown = set(values) - {f.name for f in self.fields}
        if unknown:
            raise KeyError(f"{self.name} has no field(s) {sorted(unknown)}")
        value = 0
        for field in self.fields:
            v = values.get(field.name, 0)
            if not isinstance(v, int) or not field.minimum <= v <= field.maximum:
                raise ValueError(f"{self.name}.{field.name} must be from {field.minimum} to "
                                 f"{field.maximum}, not {v!r}")
            value = (value << field.bits) | field.to_raw(v)
        return value.to_bytes(self.size, "big")


def _h(name, title, source, *fields):
    return Header(name, title, source,
                  tuple(f if isinstance(f, Field) else Field(*f) for f in fields))
# ---------------------------------------------------------------------------------------------
# Standard headers in front of the BTH
# ---------------------------------------------------------------------------------------------

def _standard(name, title, *fields):
    return Header(name, title, "standard", tuple(Field(n, bits, doc) for n, bits, doc in fields))


ETHERNET = _standard("Ethernet", "Ethernet II",
    ("dst", 48, "destination MAC address"), ("src", 48, "source MAC address"),
    ("ethertype", 16, "hdl.protocol.ETHERTYPE_*"))
DOT1Q = _standard("Dot1Q", "Ethernet II with an 802.1Q tag",
    ("dst", 48, "destination MAC address"), ("src", 48, "source MAC address"),
    ("tpid", 16, "0x8100"), ("tci", 16, "priority, DEI and VLAN id"),
    ("ethertype", 16, "ethertype of what follows the tag"))
IPV4 = _standard("IPv4", "IPv4 header without options",
    ("version", 4, "4"), ("ihl", 4, "header length in 32-bit words, 5"),
    ("tos", 8, "DSCP and ECN (masked in the ICRC)"), ("total_length", 16, "bytes of the packet"),
    ("identification", 16, "identification"), ("reserved", 1, "reserved flag"),
    ("df", 1, "don't fragment"), ("mf", 1, "more fragments"),
    ("frag_offset", 13, "fragment offset"), ("ttl", 8, "time to live (masked in the ICRC)"),
    ("protocol", 8, "next protocol"), ("checksum", 16, "header checksum (masked in the ICRC)"),
    ("src", 32, "source address"), ("dst", 32, "destination address"))
IPV6 = _standard("IPv6", "IPv6 header",
    ("version", 4, "6"), ("tclass", 8, "traffic class: DSCP and ECN (masked in the ICRC)"),
    ("flow_label", 20, "flow label (masked in the ICRC)"),
    ("payload_length", 16, "bytes after this header"), ("next_header", 8, "next header"),
    ("hop_limit", 8, "hop limit (masked in the ICRC)"), ("src", 128, "source address"),
    ("dst", 128, "destination address"))
SRH = _standard("SRH", "IPv6 Segment Routing Header with one segment",
    ("next_header", 8, "next header"), ("hdr_ext_len", 8, "8-byte units after the first 8"),
    ("routing_type", 8, "4"), ("segments_left", 8, "segments left"),
    ("last_entry", 8, "index of the last segment"), ("flags", 8, "flags"), ("tag", 16, "tag"),
    ("segment", 128, "the one segment"))
UDP = _standard("UDP", "UDP header",
    ("sport", 16, "source port (carries the EV)"), ("dport", 16, "destination port, 4791"),
    ("length", 16, "bytes of UDP header and payload"),
    ("checksum", 16, "checksum, sent as 0 (masked in the ICRC)"))

#: Headers in front of the BTH.
STANDARD_HEADERS = (ETHERNET, DOT1Q, IPV4, IPV6, SRH, UDP)
#: Bytes the 802.1Q tag adds to the Ethernet header.
DOT1Q_TAG_BYTES = DOT1Q.size - ETHERNET.size


# ---------------------------------------------------------------------------------------------
# Transport headers (RoCEv2 and MRC 1.0)
# ---------------------------------------------------------------------------------------------

def _f(name, bits, doc, **kw):
    return Field(name, bits, doc, **kw)


_TIMESTAMP_UNIT = ("16-bit wire timestamp; its unit, 8 ns (TIMESTAMP_SHIFT in hdl/protocol.py), "
                   "is a project choice")

# InfiniBand Base Transport Header as RoCEv2 carries it, with the two flag bits MRC 1.0 adds in
# byte 8 (Scapy's BTH reads them as bits of its resv7; sim.packets.BTH names them). Field
# names are the RoCEv2 ones the gateware and Scapy use; the MRC 1.0 references' names are in
# the meaning column.
BTH = _h("BTH", "Base Transport Header", "rocev2",
    _f("opcode", 8, "operation (hdl.protocol.Opcode: the MRC 1.0 opcodes)", source="mrc-1.0"),
    _f("solicited", 1, "solicited event (MRC 1.0: se) [uncertain]: the MRC 1.0 references list "
       "m at bit 7 and se at bit 6 of byte 1; IBTA (and Scapy's and Wireshark's BTH) put SE at "
       "bit 7 and M at bit 6. MRC keeps the RoCEv2 BTH, so this layout follows IBTA; MRC sends "
       "0 in both"),
    _f("migreq", 1, "migration state (MRC 1.0: m) [uncertain]: bit 6 here, see solicited"),
    _f("padcount", 2, "pad count (MRC 1.0: pad); MRC sends 0 and drops any other value"),
    _f("version", 4, "transport header version (MRC 1.0: tver), 0"),
    _f("pkey", 16, "partition key"),
    _f("fecn", 1, "forward ECN (masked in the ICRC)"),
    _f("becn", 1, "backward ECN (masked in the ICRC)"),
    _f("resv6", 6, "reserved (masked in the ICRC)"),
    _f("dqpn", 24, "destination QP number (MRC 1.0: dqp); the endpoint QP on ENDPOINT_REQUEST "
       "and ENDPOINT_RESPONSE"),
    _f("ackreq", 1, "acknowledge request (MRC 1.0: a): the responder acknowledges this packet "
       "at once"),
    _f("resv1", 1, "reserved"),
    _f("rtx", 1, "this packet is a retransmission", source="mrc-1.0"),
    _f("ts", 1, "a TSETH follows the METH", source="mrc-1.0"),
    _f("resv4", 4, "reserved", source="mrc-1.0"),
    _f("psn", 24, "packet sequence number; cack_psn of a SACK, nack_psn of a NACK, the id "
       "(bits 15-0) of an endpoint request and its response"),
)

# RDMA Extended Transport Header: on EVERY MRC data packet, not only the first of a message.
RETH = _h("RETH", "RDMA Extended Transport Header", "rocev2",
    ("va", 64, "target virtual address of this packet's first payload byte"),
    ("rkey", 32, "remote key of the target memory region"),
    ("dma_len", 32, "bytes of payload in this packet"),
)

# Immediate data, on WRITE LAST/ONLY WITH IMMEDIATE.
IMMDT = _h("ImmDt", "Immediate Data", "rocev2",
    ("imm", 32, "immediate data, delivered in the responder's completion"),
)

# ACK Extended Transport Header (Scapy: scapy.contrib.roce.AETH), on ACKNOWLEDGE: RoCE's fatal
# NAKs.
AETH = _h("AETH", "ACK Extended Transport Header", "rocev2",
    ("syndrome", 8, "0x60 | NakCode: NAK (RoCE's fatal errors); 0x1F: ACK"),
    ("msn", 24, "message sequence number: messages completed in order"),
)


# MRC Extended Transport Header: first after the BTH of every MRC 1.0 data packet. The
# references give the names and sizes only; the meaning is this project's reading of RC's
# message sequence numbering.
METH = _h("METH", "MRC Extended Transport Header", "mrc-1.0",
    _f("rqmsn", 16, "receive-queue message sequence number, modulo 2**16: how many messages "
       "that consume a pre-posted receive buffer (WRITE WITH IMMEDIATE) the QP sent before "
       "this packet's message, so a responder placing out of order knows which receive "
       "buffer completes it", source="project"),
    _f("msn", 16, "message sequence number, modulo 2**16: how many messages the QP sent "
       "before this packet's message; every packet of a message carries the same value",
       source="project"),
)

# Timestamp Extended Transport Header: after the METH when BTH.ts = 1.
TSETH = _h("TSETH", "Timestamp Extended Transport Header", "mrc-1.0",
    _f("tx_timestamp", 16, "sender's transmit time: " + _TIMESTAMP_UNIT, source="project"),
    _f("tsr", 1, "timestamp request"),
    _f("reserved", 11, "reserved"),
    _f("ftype", 4, "format type (hdl.protocol.Ftype)"),
)

# SACK Extended Transport Header, on RELIABILITY_SACK, followed by CC_STATE. BTH.dqpn is the
# requester's QP and BTH.psn is cack_psn.
SETH = _h("SETH", "SACK Extended Transport Header", "mrc-1.0",
    _f("type", 4, "header type, 0"),
    _f("next_header", 5, "next header, 0"),
    _f("m", 2, "SACK mark for the triggering packet's EV (hdl.protocol.SackMark)"),
    _f("reserved0", 3, "reserved"),
    _f("pr", 1, "1: this SACK answers a reliability probe (ack_psn_offset is its probe_id)"),
    _f("reserved1", 1, "reserved"),
    _f("ack_psn_offset", 16, "ack_psn = cack_psn + ack_psn_offset is the PSN that triggered "
       "this SACK; the probe_id answered when pr = 1", signed=True),
    _f("entropy", 32, "the EV the triggering packet arrived with. Field [MRC 1.0]; its "
       "composition is a project choice: the UDP source port in bits 15-0, the IPv6 flow "
       "label's low 16 bits in bits 31-16 (0 for IPv4)", source="project"),
    _f("spdcid", 16, "source PDC id"),
    _f("dpdcid", 16, "destination PDC id"),
    _f("reserved2", 8, "reserved"),
    _f("cack_psn", 24, "cumulative PSN acknowledged, equal to BTH.psn"),
    _f("cc_type", 4, "congestion control type"),
    _f("cc_flags", 4, "congestion control flags"),
    _f("mpr", 8, "responder's max PSN range"),
    _f("sack_psn_offset", 16, "the bitmap's base PSN is cack_psn + sack_psn_offset",
       signed=True),
    _f("sack_bitmap", 64, "64 PSNs from the base PSN"),
)

# Congestion control state, after the SETH.
CC_STATE = _h("CC_STATE", "Congestion Control State", "mrc-1.0",
    _f("tx_timestamp", 16, "tx_timestamp echoed from the triggering packet's TSETH (the PETH's "
       "for a probe answer): " + _TIMESTAMP_UNIT, source="project"),
    _f("reserved", 1, "reserved"),
    _f("ooo_count", 15, "packets the responder holds out of order"),
    _f("restore_cwnd", 1, "restore the congestion window"),
    _f("rcv_cwnd_pen", 7, "receiver's congestion window penalty"),
    _f("rcvd_bytes", 24, "bytes the responder has received"),
)

# NACK Extended Transport Header, on RELIABILITY_NACK. BTH.psn is nack_psn.
NETH = _h("NETH", "NACK Extended Transport Header", "mrc-1.0",
    _f("reserved0", 16, "0"),
    _f("nack_reason", 8, "why (hdl.protocol.NackReason)"),
    _f("vendor_info", 8, "vendor information"),
    _f("entropy", 32, "the EV the refused packet arrived with, composed as SETH.entropy",
       source="project"),
    _f("spdcid", 16, "source PDC id"),
    _f("dpdcid", 16, "destination PDC id"),
    _f("reserved1", 8, "reserved"),
    _f("nack_psn", 24, "the PSN refused, equal to BTH.psn"),
    _f("cc_type", 4, "congestion control type"),
    _f("cc_flags", 4, "congestion control flags"),
    _f("reserved2", 8, "reserved"),
    _f("tx_timestamp", 16, "tx_timestamp echoed from the refused packet: " + _TIMESTAMP_UNIT,
       source="project"),
)

# Probe Extended Transport Header, on RELIABILITY_PROBE_REQUEST: consumes no PSN, answered by
# a SACK with pr = 1.
PETH = _h("PETH", "Probe Extended Transport Header", "mrc-1.0",
    _f("reserved0", 16, "0"),
    _f("reserved1", 8, "reserved"),
    _f("vendor_info", 8, "vendor information"),
    _f("probe_id", 16, "probe id, echoed in the answering SACK's ack_psn_offset"),
    _f("reserved2", 16, "reserved"),
    _f("spdcid", 16, "source PDC id"),
    _f("dpdcid", 16, "destination PDC id"),
    _f("tx_timestamp", 16, "sender's transmit time: " + _TIMESTAMP_UNIT, source="project"),
    _f("tsr", 1, "timestamp request"),
    _f("reserved3", 11, "reserved"),
    _f("ftype", 4, "format type (hdl.protocol.Ftype)"),
)

# Endpoint Request Transport Header, on ENDPOINT_REQUEST: BTH.dqpn is the endpoint QP
# (hdl.protocol.ENDPOINT_QPN), BTH.psn[15:0] an id private to the requester.
ERTH = _h("ERTH", "Endpoint Request Transport Header", "mrc-1.0",
    _f("reserved0", 14, "reserved"),
    _f("op", 2, "endpoint operation (hdl.protocol.EndpointOp)"),
    _f("reserved1", 8, "reserved"),
    _f("vendor_info", 8, "vendor information"),
    _f("port_status_mask", 32, "ports whose status is asked for"),
    _f("reserved2", 32, "reserved"),
    _f("tx_timestamp", 16, "requester's transmit time: " + _TIMESTAMP_UNIT, source="project"),
    _f("tsr", 1, "timestamp request"),
    _f("reserved3", 11, "reserved"),
    _f("ftype", 4, "format type (hdl.protocol.Ftype)"),
)

# Endpoint Response Extended Transport Header, on ENDPOINT_RESPONSE: BTH.psn[15:0] echoes the
# request's id. The references disagree on where op sits in byte 1 (bits 5-4 with reserved
# bits 6 and 3, or bits 3-2); this is the one place that decides it.
EETH = _h("EETH", "Endpoint Response Extended Transport Header", "mrc-1.0",
    _f("reserved0", 12, "reserved"),
    _f("op", 2, "endpoint operation answered (hdl.protocol.EndpointOp) [uncertain]: "
       "bits 3-2 of byte 1; one reference puts it at bits 5-4", source="project"),
    _f("reserved1", 2, "reserved"),
    _f("reserved2", 208, "reserved"),
    _f("tx_timestamp", 16, "tx_timestamp echoed from the request: " + _TIMESTAMP_UNIT,
       source="project"),
    _f("reserved3", 48, "reserved"),
)

#: The MRC 1.0 extension headers, in the order of the opcode table.
MRC10_HEADERS = (METH, TSETH, SETH, CC_STATE, NETH, PETH, ERTH, EETH)
#: What follows the SETH of a RELIABILITY_SACK: 36 bytes in all.
SACK_HEADERS = (SETH, CC_STATE)

#: The headers after the BTH of every control opcode (the opcode table). A control packet is
#: exactly these bytes (and the ICRC): it carries no payload.
CONTROL_HEADERS = {
    Opcode.ACKNOWLEDGE: (AETH,),
    Opcode.ENDPOINT_REQUEST: (ERTH,),
    Opcode.ENDPOINT_RESPONSE: (EETH,),
    Opcode.RELIABILITY_SACK: SACK_HEADERS,
    Opcode.RELIABILITY_NACK: (NETH,),
    Opcode.RELIABILITY_PROBE_REQUEST: (PETH,),
}


def data_headers(opcode, *, ts):
    """The headers after the BTH of a data packet with ``opcode`` and BTH.ts = ``ts``, in wire
    order: METH, [TSETH], RETH, [ImmDt]; the payload follows them."""
    return ((METH,) + ((TSETH,) if ts else ()) + (RETH,)
            + ((IMMDT,) if Opcode(opcode) in IMMEDIATE_OPCODES else ()))


def headers_size(headers):
    """Bytes of ``headers`` together."""
    return sum(h.size for h in headers)


# ---------------------------------------------------------------------------------------------
# ICRC (RoCEv2)
# ---------------------------------------------------------------------------------------------

#: Fields replaced by all ones before the ICRC is computed (RoCEv2), per IP version.
ICRC_MASKED_FIELDS = {
    4: ((IPV4, "tos"), (IPV4, "ttl"), (IPV4, "checksum")),
    6: ((IPV6, "tclass"), (IPV6, "flow_label"), (IPV6, "hop_limit")),
    "udp": ((UDP, "checksum"),),
    "bth": ((BTH, "fecn"), (BTH, "becn"), (BTH, "resv6")),
}
#: The pseudo-LRH that RoCEv2 puts in front of the IP header for the ICRC.
ICRC_INIT_BYTES = b"\xff" * 8


def icrc_byte_mask(header):
    """``header.size`` bytes: the bits of ``header`` the ICRC sees as all ones."""
    names = [name for fields in ICRC_MASKED_FIELDS.values()
             for masked, name in fields if masked is header]
    return header.byte_mask(names)


# ---------------------------------------------------------------------------------------------
# Collections and the documentation view
# ---------------------------------------------------------------------------------------------

#: The headers Scapy lacks: RETH, ImmDt and the MRC 1.0 ones (the BTH is generated too, as a
#: subclass of Scapy's that names rtx and ts; AETH is Scapy's, cross-checked).
GENERATED_SCAPY_HEADERS = (RETH, IMMDT, *MRC10_HEADERS)
#: Every transport header: the BTH and what follows it on the wire.
ALL_HEADERS = (BTH, RETH, IMMDT, AETH, *MRC10_HEADERS)


def markdown_table(header):
    """The field table of ``header`` as ``docs/wire-format.md`` shows it (a test compares)."""
    lines = [f"{header.name} ({header.size} bytes, {SOURCES[header.source]}):", "",
             "| byte | bit | bits | field | source | meaning |",
             "| ---: | ---: | ---: | --- | --- | --- |"]
    for field in header.fields:
        offset = header.bit_offset(field.name)
        signed = ", signed" if field.signed else ""
        doc = field.doc.replace("|", "\\|")
        lines.append(f"| {offset // 8} | {offset % 8} | {field.bits}{signed} | `{field.name}` | "
                     f"{SOURCES[header.field_source(field.name)]} | {doc} |")
    return "\n".join(lines)


def transport_markdown():
    """The transport header tables of ``docs/wire-format.md`` (a test compares).

    Regenerate with ``python -m hdl.packet.layouts``.
    """
    return "\n\n".join(markdown_table(h) for h in ALL_HEADERS)


if __name__ == "__main__":
    print(transport_markdown())
