"""Transport header layouts, in wire order: the one table every other view is built from.

The Scapy layers (:mod:`sim.packets`), the Wireshark dissector (:mod:`sim.dissector`) and the
gateware's header structs are generated from (or, for the headers Scapy already defines,
cross-checked against) these definitions, so a field can only ever be defined here.

Fields are listed in wire order, most significant bit first; multi-byte fields are
big-endian on the wire. ``own=True`` marks headers that are this project's choice (the OCP
byte layouts were not available); ``docs/wire-format.md`` draws each one.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Field:
    name: str
    bits: int
    doc: str


@dataclass(frozen=True)
class Header:
    name: str           #: short name, also the Scapy class name and the dissector prefix
    title: str
    own: bool           #: True: this project's own layout
    fields: tuple

    @property
    def bits(self):
        return sum(f.bits for f in self.fields)

    @property
    def size(self):
        """Size in bytes (of the fixed part, for MACKETH)."""
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

    def field(self, name):
        for field in self.fields:
            if field.name == name:
                return field
        raise KeyError(f"{self.name} has no field {name!r}")

    def unpack(self, data):
        """Decode the fixed part of this header from the start of ``data`` into a dict."""
        if len(data) < self.size:
            raise ValueError(f"{self.name} needs {self.size} bytes, got {len(data)}")
        value = int.from_bytes(data[:self.size], "big")
        out, shift = {}, self.bits
        for field in self.fields:
            shift -= field.bits
            out[field.name] = (value >> shift) & ((1 << field.bits) - 1)
        return out

    def pack(self, **values):
        """Encode fields (missing ones are zero) into wire bytes."""
        unknown = set(values) - {f.name for f in self.fields}
        if unknown:
            raise KeyError(f"{self.name} has no field(s) {sorted(unknown)}")
        value = 0
        for field in self.fields:
            v = values.get(field.name, 0)
            if not 0 <= v < (1 << field.bits):
                raise ValueError(f"{self.name}.{field.name} must be from 0 to "
                                 f"{(1 << field.bits) - 1}, not {v!r}")
            value = (value << field.bits) | v
        return value.to_bytes(self.size, "big")


def _h(name, title, own, *fields):
    return Header(name, title, own, tuple(Field(*f) for f in fields))


# InfiniBand Base Transport Header, as RoCEv2 carries it (Scapy: scapy.contrib.roce.BTH).
BTH = _h("BTH", "Base Transport Header", False,
    ("opcode", 8, "operation (hdl.protocol.Opcode)"),
    ("solicited", 1, "solicited event"),
    ("migreq", 1, "migration state"),
    ("padcount", 2, "pad bytes before the ICRC; MRC sends 0 and drops any other value"),
    ("version", 4, "transport header version, 0"),
    ("pkey", 16, "partition key"),
    ("fecn", 1, "forward ECN (masked in the ICRC)"),
    ("becn", 1, "backward ECN (masked in the ICRC)"),
    ("resv6", 6, "reserved (masked in the ICRC)"),
    ("dqpn", 24, "destination QP number"),
    ("ackreq", 1, "acknowledge request: the responder ACKs this packet at once"),
    ("resv7", 7, "reserved"),
    ("psn", 24, "packet sequence number"),
)

# RDMA Extended Transport Header: on EVERY MRC data packet, not only the first of a message.
RETH = _h("RETH", "RDMA Extended Transport Header", False,
    ("va", 64, "target virtual address of this packet's first payload byte"),
    ("rkey", 32, "remote key of the target memory region"),
    ("dma_len", 32, "bytes of payload in this packet"),
)

# Immediate data, on WRITE LAST/ONLY WITH IMMEDIATE.
IMMDT = _h("ImmDt", "Immediate Data", False,
    ("imm", 32, "immediate data, delivered in the responder's completion"),
)

# ACK Extended Transport Header (Scapy: scapy.contrib.roce.AETH).
AETH = _h("AETH", "ACK Extended Transport Header", False,
    ("syndrome", 8, "0x1F: ACK; 0x60 | NakCode: NAK"),
    ("msn", 24, "message sequence number: messages completed in order"),
)

# MRC Data Extended Transport Header: on every data packet, after RETH (and ImmDt).
MDETH = _h("MDETH", "MRC Data Extended Transport Header", True,
    ("ev_index", 16, "index of the EV in the sender's EV profile; echoed in the ACK"),
    ("flags", 8, "hdl.protocol.DataFlags"),
    ("rsvd", 8, "reserved, 0"),
    ("tx_ts", 32, "sender's transmit time, ns modulo 2**32; echoed in the ACK"),
)

# MRC ACK Extended Transport Header: after the AETH of every ACK and NACK. Its fixed part is
# followed by a SACK bitmap of sack_bytes bytes.
MACKETH = _h("MACKETH", "MRC ACK Extended Transport Header", True,
    ("ev_index", 16, "EV index echoed from the packet that triggered this ACK"),
    ("flags", 8, "hdl.protocol.AckFlags"),
    ("sack_bytes", 8, "bytes of SACK bitmap that follow (8, 16, 32, 64 or 128)"),
    ("rsvd", 8, "reserved, 0"),
    ("cum_psn", 24, "cumulative PSN: every PSN up to and including it has arrived"),
    ("ts_echo", 32, "tx_ts of the triggering packet"),
    ("svc_time", 32, "responder service time in ns (valid with flag SERVICE_TIME)"),
)

# MRC Probe Header: after the BTH of probe requests and responses.
MPRH = _h("MPRH", "MRC Probe Header", True,
    ("probe_id", 32, "request id, echoed in the response"),
    ("ev_index", 16, "index of the EV probed, in the requester's profile"),
    ("flags", 8, "hdl.protocol.ProbeFlags"),
    ("rsvd", 8, "reserved, 0"),
    ("rsvd2", 8, "reserved, 0"),
    ("src_qpn", 24, "requester's QP number (0 for a QP-less probe)"),
    ("tx_ts", 32, "requester's transmit time, ns modulo 2**32, echoed"),
    ("svc_time", 32, "responder service time in ns (responses)"),
)

#: The headers this project adds to RoCEv2 (plus RETH and ImmDt that Scapy lacks).
GENERATED_SCAPY_HEADERS = (RETH, IMMDT, MDETH, MACKETH, MPRH)
ALL_HEADERS = (BTH, RETH, IMMDT, AETH, MDETH, MACKETH, MPRH)


def markdown_table(header):
    """The field table of ``header`` as ``docs/wire-format.md`` shows it (a test compares)."""
    lines = [f"{header.name} ({header.size} bytes{', this project' if header.own else ''}):", "",
             "| byte | bit | bits | field | meaning |", "| ---: | ---: | ---: | --- | --- |"]
    for field in header.fields:
        offset = header.bit_offset(field.name)
        lines.append(f"| {offset // 8} | {offset % 8} | {field.bits} | `{field.name}` | "
                     f"{field.doc} |")
    return "\n".join(lines)
