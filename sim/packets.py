"""Scapy layers and builders for every packet an MRC NIC of this project sends or accepts.

Every transport header is generated from the single layout table :mod:`hdl.packet.layouts`:
the BTH (a subclass of :class:`scapy.contrib.roce.BTH`, whose ICRC is our independent check,
with MRC 1.0's ``rtx`` and ``ts`` bits named), RETH, ImmDt and the MRC 1.0 headers (METH,
TSETH, SETH, CC_STATE, NETH, PETH, ERTH, EETH), bound to the MRC 1.0 opcodes. AETH is Scapy's
(cross-checked against the table). ``Ether(raw_bytes)`` decodes any of our frames. The wire
format is drawn in ``docs/wire-format.md``.

Every builder takes the underlay keywords ``ip_version`` (6), ``src``/``dst``
(:class:`sim.defaults.Endpoint`), ``udp_sport``, ``flow_label``, ``dscp``, ``ecn`` (ECT(0)),
``hop_limit`` and ``vlan``; control-packet builders take their header's fields by name.
"""

from zlib import crc32

from scapy.compat import raw
from scapy.contrib import roce
from scapy.contrib.roce import AETH
from scapy.fields import BitField, ByteEnumField, FCSField, XBitField
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6, IPv6ExtHdrSegmentRouting
from scapy.layers.l2 import Dot1Q, Ether
from scapy.packet import Packet, Raw, bind_layers, split_layers
from scapy.utils import wrpcap

from hdl import protocol as P
from hdl.packet import layouts as L

from . import defaults

__all__ = [
    "BTH", "AETH", "RETH", "ImmDt",
    "METH", "TSETH", "SETH", "CC_STATE", "NETH", "PETH", "ERTH", "EETH",
    "data_packet", "ack_packet", "nak_packet", "sack_packet", "nack_packet", "probe_packet",
    "endpoint_request", "endpoint_response", "sample_packets",
    "trim", "srv6_encapsulate", "icrc_ok", "is_trimmed", "write_pcap", "transport_payload",
]


# ---------------------------------------------------------------------------------------------
# Layers generated from hdl.packet.layouts
# ---------------------------------------------------------------------------------------------

class SignedBitField(BitField):
    """A two's complement bit field: reads negative where the top bit is set."""

    def m2i(self, pkt, x):
        return x - (1 << self.size) if x >> (self.size - 1) else x


def _fields(header, skip=()):
    return [(SignedBitField if f.signed else XBitField)(f.name, 0, f.bits)
            for f in header.fields if f.name not in skip]


def _layer(header, fields_desc, base=Packet, **namespace):
    return type(header.name, (base,), {
        "name": header.title, "fields_desc": fields_desc, **namespace})


def _bth_fields():
    out = []
    for f in L.BTH.fields:
        if f.name == "opcode":
            out.append(ByteEnumField("opcode", 0, {int(o): o.name for o in P.Opcode}))
        elif f.name == "pkey":
            out.append(XBitField("pkey", P.BTH_DEFAULT_PKEY, f.bits))
        else:
            out.append(BitField(f.name, 0, f.bits))
    out.append(FCSField("icrc", None, fmt="!I"))
    return out


def _compute_icrc(self, p):
    # scapy.contrib.roce.BTH.compute_icrc, which finds the BTH by its own class: the RoCEv2
    # masks (IP ToS/TTL/checksum or traffic class/flow label/hop limit, UDP checksum, BTH
    # FECN/BECN/resv6 as ones) and a CRC-32 over pseudo-LRH, IP, UDP, BTH and payload.
    udp = self.underlayer
    ip = udp.underlayer if isinstance(udp, UDP) else None
    if not isinstance(ip, (IP, IPv6)):
        return self.pack_icrc(0)
    pshdr = Raw(b"\xff" * 8) / ip.copy()
    if isinstance(ip, IP):
        pshdr.chksum, pshdr.ttl, pshdr.tos = 0xFFFF, 0xFF, 0xFF
    else:
        pshdr.hlim, pshdr.fl, pshdr.tc = 0xFF, 0xFFFFF, 0xFF
    pshdr[UDP].chksum = 0xFFFF
    bth = pshdr[type(self)]
    bth.fecn, bth.becn, bth.resv6 = 1, 1, 0x3F
    bth_bytes = bth.self_build()
    payload = raw(bth.payload)
    pshdr[UDP].payload = Raw(bth_bytes + payload + b"\xff" * 4)
    return self.pack_icrc(crc32(raw(pshdr)[:-4]) & 0xFFFFFFFF)


# Scapy's BTH computes the ICRC (post_build); this one names MRC 1.0's flag bits. It is a
# subclass, so code that looks for ``scapy.contrib.roce.BTH`` by isinstance finds it too.
BTH = _layer(L.BTH, _bth_fields(), base=roce.BTH, payload_guess=[],
             compute_icrc=_compute_icrc)
split_layers(UDP, roce.BTH, dport=P.ROCEV2_UDP_PORT)
bind_layers(UDP, BTH, dport=P.ROCEV2_UDP_PORT)


def _bth_opcode(layer):
    """The opcode of the BTH under ``layer``, or ``None`` when there is none."""
    while layer is not None and not isinstance(layer, roce.BTH):
        layer = layer.underlayer
    return None if layer is None else layer.opcode


def _reth_payload(self, payload):
    # ImmDt follows the RETH only on the WITH_IMMEDIATE opcodes, else the payload.
    if _bth_opcode(self) in P.IMMEDIATE_OPCODES:
        return ImmDt
    return self.default_payload_class(payload)


def _meth_payload(self, payload):
    # The TSETH is there exactly when BTH.ts is set.
    bth = self.underlayer
    return TSETH if isinstance(bth, roce.BTH) and bth.ts else RETH


RETH = _layer(L.RETH, _fields(L.RETH), guess_payload_class=_reth_payload)
ImmDt = _layer(L.IMMDT, _fields(L.IMMDT))
METH = _layer(L.METH, _fields(L.METH), guess_payload_class=_meth_payload)
TSETH = _layer(L.TSETH, _fields(L.TSETH))
SETH = _layer(L.SETH, _fields(L.SETH))
CC_STATE = _layer(L.CC_STATE, _fields(L.CC_STATE))
NETH = _layer(L.NETH, _fields(L.NETH))
PETH = _layer(L.PETH, _fields(L.PETH))
ERTH = _layer(L.ERTH, _fields(L.ERTH))
EETH = _layer(L.EETH, _fields(L.EETH))

#: The Scapy layer of every header of :mod:`hdl.packet.layouts` after the BTH.
LAYERS = {L.RETH: RETH, L.IMMDT: ImmDt, L.AETH: AETH, L.METH: METH, L.TSETH: TSETH,
          L.SETH: SETH, L.CC_STATE: CC_STATE, L.NETH: NETH, L.PETH: PETH, L.ERTH: ERTH,
          L.EETH: EETH}

for _opcode in P.DATA_OPCODES:
    bind_layers(BTH, METH, opcode=int(_opcode))
bind_layers(TSETH, RETH)
for _opcode, _headers in L.CONTROL_HEADERS.items():
    bind_layers(BTH, LAYERS[_headers[0]], opcode=int(_opcode))
    for _lower, _upper in zip(_headers, _headers[1:], strict=False):
        bind_layers(LAYERS[_lower], LAYERS[_upper])


def transport_payload(pkt):
    """The bytes after the last transport header of a decoded frame: a data packet's payload
    (``b""`` for a trimmed or empty one), ``b""`` for a control packet of the right length."""
    layer = pkt[BTH].payload
    while isinstance(layer, tuple(LAYERS.values())):
        layer = layer.payload
    return bytes(layer) if layer is not None else b""


# ---------------------------------------------------------------------------------------------
# Builders
# ---------------------------------------------------------------------------------------------

def _underlay(*, ip_version, src, dst, udp_sport, flow_label, dscp, ecn, hop_limit, vlan):
    if not 0 <= dscp < 64:
        raise ValueError(f"dscp must be from 0 to 63, not {dscp!r}")
    if not 0 <= ecn < 4:
        raise ValueError(f"ecn must be from 0 to 3, not {ecn!r}")
    ether = Ether(src=src.mac, dst=dst.mac)
    if vlan is not None:
        ether = ether / Dot1Q(vlan=vlan)
    tclass = (dscp << 2) | ecn
    if ip_version == 6:
        ip = IPv6(src=src.ipv6, dst=dst.ipv6, tc=tclass, fl=flow_label, hlim=hop_limit)
    elif ip_version == 4:
        if flow_label:
            raise ValueError("IPv4 has no flow label: the STEV format mode needs IPv6")
        ip = IP(src=src.ipv4, dst=dst.ipv4, tos=tclass, ttl=hop_limit, flags="DF")
    else:
        raise ValueError(f"ip_version must be 4 or 6, not {ip_version!r}")
    # RoCEv2 senders put 0 in the UDP checksum; the ICRC protects the packet.
    return ether / ip / UDP(sport=udp_sport, dport=P.ROCEV2_UDP_PORT, chksum=0)


def _common(kw):
    return dict(
        ip_version=kw.pop("ip_version", 6), src=kw.pop("src", defaults.NIC_A),
        dst=kw.pop("dst", defaults.NIC_B), udp_sport=kw.pop("udp_sport", 0xC000),
        flow_label=kw.pop("flow_label", 0), dscp=kw.pop("dscp", 0),
        ecn=kw.pop("ecn", 0b10), hop_limit=kw.pop("hop_limit", 64), vlan=kw.pop("vlan", None))


def _reject_unknown(kw):
    if kw:
        raise TypeError(f"unknown argument(s): {', '.join(sorted(kw))}")


def _names(layer):
    return {f.name for f in layer.fields_desc}


def _take(fields, layer):
    """Pop the fields of ``layer`` out of ``fields`` (the rest are underlay keywords)."""
    return {name: fields.pop(name) for name in list(fields) if name in _names(layer)}


def _bth(opcode, *, dqpn, psn, ackreq=0, rtx=False, ts=False):
    return BTH(opcode=int(opcode), dqpn=dqpn, psn=psn, ackreq=ackreq, rtx=int(rtx), ts=int(ts))


def data_packet(opcode, *, dqpn, psn, va, rkey, payload=b"", dma_len=None, imm=None,
                rqmsn=0, msn=0, rtx=False, tseth=None, ackreq=0, **kw):
    """An RDMA WRITE: BTH / METH / [TSETH] / RETH / [ImmDt] / payload / ICRC.

    ``tseth``: a dict of TSETH fields (``tx_timestamp``, ``tsr``, ``ftype``); with it BTH.ts is
    set. ``rtx`` sets BTH.rtx (a retransmission).
    """
    opcode = P.Opcode(opcode)
    if opcode not in P.DATA_OPCODES:
        raise ValueError(f"{opcode.name} is not an MRC data opcode")
    if (opcode in P.IMMEDIATE_OPCODES) != (imm is not None):
        raise ValueError(f"{opcode.name} {'needs' if imm is None else 'takes no'} immediate data")
    payload = bytes(payload)
    under = _underlay(**_common(kw))
    _reject_unknown(kw)
    pkt = (under / _bth(opcode, dqpn=dqpn, psn=psn, ackreq=ackreq, rtx=rtx,
                        ts=tseth is not None)
           / METH(rqmsn=rqmsn, msn=msn))
    if tseth is not None:
        pkt = pkt / TSETH(**tseth)
    pkt = pkt / RETH(va=va, rkey=rkey, dma_len=len(payload) if dma_len is None else dma_len)
    if imm is not None:
        pkt = pkt / ImmDt(imm=imm)
    if payload:
        pkt = pkt / Raw(payload)
    return pkt


def ack_packet(*, dqpn, psn, syndrome=P.AETH_ACK, msn=0, **kw):
    """ACKNOWLEDGE: BTH / AETH / ICRC (RoCE's fatal NAKs are AETH NAKs on this opcode)."""
    under = _underlay(**_common(kw))
    _reject_unknown(kw)
    return (under / _bth(P.Opcode.ACKNOWLEDGE, dqpn=dqpn, psn=psn)
            / AETH(syndrome=syndrome, msn=msn))


def nak_packet(code, *, dqpn, psn, msn=0, **kw):
    """A fatal AETH NAK with :class:`hdl.protocol.NakCode` ``code`` for the PSN ``psn``."""
    return ack_packet(dqpn=dqpn, psn=psn, syndrome=P.nak_syndrome(P.NakCode(code)), msn=msn,
                      **kw)


def sack_packet(*, dqpn, cack_psn, cc_state=None, **fields):
    """RELIABILITY_SACK: BTH (psn = cack_psn) / SETH / CC_STATE / ICRC.

    ``fields`` are SETH fields (and underlay keywords); ``cc_state`` a dict of CC_STATE fields.
    """
    seth = _take(fields, SETH)
    under = _underlay(**_common(fields))
    _reject_unknown(fields)
    return (under / _bth(P.Opcode.RELIABILITY_SACK, dqpn=dqpn, psn=cack_psn)
            / SETH(cack_psn=cack_psn, **seth) / CC_STATE(**(cc_state or {})))


def nack_packet(*, dqpn, nack_psn, nack_reason, **fields):
    """RELIABILITY_NACK: BTH (psn = nack_psn) / NETH / ICRC."""
    neth = _take(fields, NETH)
    under = _underlay(**_common(fields))
    _reject_unknown(fields)
    return (under / _bth(P.Opcode.RELIABILITY_NACK, dqpn=dqpn, psn=nack_psn)
            / NETH(nack_psn=nack_psn, nack_reason=int(P.NackReason(nack_reason)), **neth))


def probe_packet(*, dqpn, psn, probe_id, **fields):
    """RELIABILITY_PROBE_REQUEST: BTH / PETH / ICRC (consumes no PSN; answered by a SACK with
    pr = 1)."""
    peth = _take(fields, PETH)
    under = _underlay(**_common(fields))
    _reject_unknown(fields)
    return (under / _bth(P.Opcode.RELIABILITY_PROBE_REQUEST, dqpn=dqpn, psn=psn)
            / PETH(probe_id=probe_id, **peth))


def _endpoint_id(request_id):
    if not 0 <= request_id < 1 << P.ENDPOINT_ID_BITS:
        raise ValueError(f"request_id must be from 0 to {(1 << P.ENDPOINT_ID_BITS) - 1}, "
                         f"not {request_id!r}")
    return request_id


def endpoint_request(*, request_id, op, dqpn=P.ENDPOINT_QPN, **fields):
    """ENDPOINT_REQUEST: BTH (psn[15:0] = ``request_id``) / ERTH / ICRC."""
    erth = _take(fields, ERTH)
    under = _underlay(**_common(fields))
    _reject_unknown(fields)
    return (under / _bth(P.Opcode.ENDPOINT_REQUEST, dqpn=dqpn, psn=_endpoint_id(request_id))
            / ERTH(op=int(P.EndpointOp(op)), **erth))


def endpoint_response(*, request_id, op, dqpn=P.ENDPOINT_QPN, **fields):
    """ENDPOINT_RESPONSE: BTH (psn[15:0] echoes ``request_id``) / EETH / ICRC."""
    eeth = _take(fields, EETH)
    under = _underlay(**_common(fields))
    _reject_unknown(fields)
    return (under / _bth(P.Opcode.ENDPOINT_RESPONSE, dqpn=dqpn, psn=_endpoint_id(request_id))
            / EETH(op=int(P.EndpointOp(op)), **eeth))


def sample_packets():
    """One packet of every MRC 1.0 type, ``(name, packet)`` pairs, every field non-zero
    where it is not reserved."""
    payload = bytes(range(48))
    common = dict(dqpn=0x22, va=0x1_0000_0000, rkey=0xBEEF, payload=payload)
    out = []
    for n, opcode in enumerate(sorted(P.DATA_OPCODES)):
        imm = 0x1000_0000 + n if opcode in P.IMMEDIATE_OPCODES else None
        tseth = (dict(tx_timestamp=0x1234 + n, tsr=1, ftype=int(P.Ftype.TIMESTAMP))
                 if n % 2 else None)
        out.append((opcode.name.lower(), data_packet(
            opcode, psn=0x300 + n, imm=imm, rqmsn=0x10 + n, msn=0x20 + n, rtx=n == 3,
            tseth=tseth, ackreq=int(n == 5), **common)))
    out.append(("acknowledge", nak_packet(P.NakCode.REMOTE_ACCESS, dqpn=0x11, psn=0x305,
                                          msn=3)))
    out.append(("sack", sack_packet(
        dqpn=0x11, cack_psn=0x302, m=int(P.SackMark.SKIP_ONCE), ack_psn_offset=-2 + 5,
        entropy=0xC003_0000, spdcid=0x0101, dpdcid=0x0202, cc_type=3, cc_flags=5, mpr=4,
        sack_psn_offset=1, sack_bitmap=0b1011,
        cc_state=dict(tx_timestamp=0x1235, ooo_count=3, restore_cwnd=1, rcv_cwnd_pen=9,
                      rcvd_bytes=0x1_2345))))
    out.append(("sack_probe_answer", sack_packet(
        dqpn=0x11, cack_psn=0x305, pr=1, ack_psn_offset=0x0777)))
    out.append(("nack", nack_packet(
        dqpn=0x11, nack_psn=0x304, nack_reason=P.NackReason.TRIMMED, vendor_info=0x5A,
        entropy=0xC004, spdcid=0x0101, dpdcid=0x0202, cc_type=2, cc_flags=1,
        tx_timestamp=0x1238)))
    out.append(("probe", probe_packet(
        dqpn=0x22, psn=0x306, probe_id=0x0777, vendor_info=0x3C, spdcid=0x0101,
        dpdcid=0x0202, tx_timestamp=0x4321, tsr=1, ftype=int(P.Ftype.TIMESTAMP))))
    out.append(("endpoint_request", endpoint_request(
        request_id=0xABCD, op=P.EndpointOp.EV_PROBE, vendor_info=0x11,
        port_status_mask=0x0000_00FF, tx_timestamp=0x5555, tsr=1,
        ftype=int(P.Ftype.TIMESTAMP))))
    out.append(("endpoint_response", endpoint_response(
        request_id=0xABCD, op=P.EndpointOp.EV_PROBE, tx_timestamp=0x5555)))
    return out


def srv6_encapsulate(pkt, *, dst, segment=None, src=None):
    """Put ``pkt``'s IP packet inside an outer IPv6 header addressed to the expanded EV.

    ``dst`` (16 bytes or an address string) becomes the outer destination; with ``segment``
    an SRH (routing type 4) carrying it follows (Segments Left 1). The ICRC covers the inner
    packet only, so switches may rewrite the outer header as they consume uSIDs.
    """
    from ipaddress import IPv6Address

    def addr(value):
        return str(IPv6Address(bytes(value))) if isinstance(value, (bytes, bytearray)) else value

    ether = pkt[Ether]
    inner = ether.payload.copy()
    if isinstance(inner, Dot1Q):
        raise ValueError("SRv6 encapsulation of a VLAN-tagged frame is not supported")
    inner_nh = P.IP_PROTO_IPV6 if isinstance(inner, IPv6) else P.IP_PROTO_IPV4
    outer_src = src or (inner.src if isinstance(inner, IPv6) else defaults.NIC_A.ipv6)
    outer = Ether(src=ether.src, dst=ether.dst)
    if segment is None:
        outer = outer / IPv6(src=outer_src, dst=addr(dst), nh=inner_nh)
    else:
        outer = (outer / IPv6(src=outer_src, dst=addr(dst), nh=P.IP_PROTO_ROUTING)
                 / IPv6ExtHdrSegmentRouting(nh=inner_nh, addresses=[addr(segment)], segleft=1,
                                            lastentry=0))
    return outer / inner


def trim(pkt, *, dscp=P.DEFAULT_TRIM_DSCP):
    """What a trimming switch makes of a data packet: headers kept, payload dropped, DSCP set.

    The IP and UDP lengths (and the IPv4 checksum) are rewritten to match; the 4-byte ICRC
    field is kept as the trailer but is zero and not checked by receivers
    (docs/wire-format.md, "Trimmed packets").
    """
    pkt = Ether(raw(pkt))
    if METH not in pkt:
        raise ValueError("only data packets (with a METH) are trimmed")
    last = pkt[ImmDt] if ImmDt in pkt else pkt[RETH]
    last.remove_payload()
    pkt[BTH].icrc = 0
    inner_udp = pkt[UDP]
    ip = inner_udp.underlayer
    if isinstance(ip, IPv6):
        ip.tc = (dscp << 2) | (ip.tc & 3)
        ip.plen = None
    else:
        ip.tos = (dscp << 2) | (ip.tos & 3)
        ip.len = None
        ip.chksum = None
    inner_udp.len = None
    # Outer SRv6 lengths follow the inner packet.
    layer = pkt[Ether].payload
    while layer is not ip and layer is not None:
        if isinstance(layer, IPv6):
            layer.plen = None
        layer = layer.payload
    return Ether(raw(pkt))


def _inner_ip(pkt):
    return pkt[UDP].underlayer


def is_trimmed(pkt, *, dscp=P.DEFAULT_TRIM_DSCP):
    ip = _inner_ip(pkt)
    tclass = ip.tc if isinstance(ip, IPv6) else ip.tos
    return tclass >> 2 == dscp


def icrc_ok(frame):
    """True when the ICRC of ``frame`` (bytes or a packet) is what Scapy computes for it."""
    pkt = Ether(bytes(frame)) if isinstance(frame, (bytes, bytearray)) else Ether(raw(frame))
    carried = raw(pkt)[-4:]
    fresh = pkt.copy()
    fresh[BTH].icrc = None
    return raw(fresh)[-4:] == carried


def write_pcap(path, packets):
    """Write frames (packets or bytes) as an Ethernet pcap."""
    wrpcap(str(path), [Ether(bytes(p)) if isinstance(p, (bytes, bytearray)) else p
                       for p in packets], linktype=1)   # DLT_EN10MB, also when empty
