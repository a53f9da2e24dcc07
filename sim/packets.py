"""Scapy layers and builders for every packet an MRC NIC of this project sends or accepts.

BTH and AETH come from :mod:`scapy.contrib.roce` (its BTH computes the RoCEv2 ICRC, our
independent check); RETH, ImmDt, this project's extension headers and the MRC 1.0 headers
(METH, TSETH, SETH, CC_STATE, NETH, PETH, ERTH, EETH, bound to the MRC 1.0 opcodes) are
generated from the single layout table :mod:`hdl.packet.layouts`. ``Ether(raw_bytes)`` decodes
any of our frames, in either format. The wire format is drawn in ``docs/wire-format.md``;
builders of MRC 1.0 packets are in :mod:`sim.mrc10`.
"""

from scapy.compat import raw
from scapy.contrib.roce import AETH, BTH
from scapy.fields import BitField, FieldLenField, XBitField, XStrLenField
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6, IPv6ExtHdrSegmentRouting
from scapy.layers.l2 import Dot1Q, Ether
from scapy.packet import Packet, Raw, bind_layers
from scapy.utils import wrpcap

from hdl import protocol as P
from hdl.packet import layouts as L

from . import defaults

__all__ = [
    "BTH", "AETH", "RETH", "ImmDt", "MDETH", "MACKETH", "MPRH",
    "METH", "TSETH", "SETH", "CC_STATE", "NETH", "PETH", "ERTH", "EETH",
    "BTH_RTX", "BTH_TS", "bth_rtx", "bth_ts", "bth_resv7",
    "data_packet", "ack_packet", "nack_packet", "probe_packet", "trim", "srv6_encapsulate",
    "icrc_ok", "is_trimmed", "write_pcap", "sack_from_bytes",
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


def _layer(header, fields_desc, **namespace):
    return type(header.name, (Packet,), {
        "name": header.title, "fields_desc": fields_desc, **namespace})


def _bth_opcode(layer):
    """The opcode of the BTH under ``layer``, or ``None`` when there is none."""
    while layer is not None and not isinstance(layer, BTH):
        layer = layer.underlayer
    return None if layer is None else layer.opcode


def _reth_payload(self, payload):
    # ImmDt follows the RETH only on the WITH_IMMEDIATE opcodes; in the current format the
    # MDETH comes next, in MRC 1.0 the payload.
    opcode = _bth_opcode(self)
    if opcode in P.IMMEDIATE_OPCODES or opcode in P.MRC10_IMMEDIATE_OPCODES:
        return ImmDt
    if opcode in P.MRC10_DATA_OPCODES:
        return self.default_payload_class(payload)
    return MDETH


def _immdt_payload(self, payload):
    if _bth_opcode(self) in P.MRC10_DATA_OPCODES:
        return self.default_payload_class(payload)
    return MDETH


RETH = _layer(L.RETH, _fields(L.RETH), guess_payload_class=_reth_payload)
ImmDt = _layer(L.IMMDT, _fields(L.IMMDT), guess_payload_class=_immdt_payload)
MDETH = _layer(L.MDETH, _fields(L.MDETH))
MPRH = _layer(L.MPRH, _fields(L.MPRH))


def _macketh_fields():
    out = []
    for f in L.MACKETH.fields:
        if f.name == "sack_bytes":     # computed from the bitmap when left as None
            out.append(FieldLenField("sack_bytes", None, length_of="sack", fmt="B"))
        else:
            out.append(XBitField(f.name, 0, f.bits))
    out.append(XStrLenField("sack", b"\x00" * 8, length_from=lambda p: p.sack_bytes))
    return out


def _sack_int(self):
    """The SACK bitmap as an integer: bit i covers PSN cum_psn + 1 + i."""
    return int.from_bytes(self.sack, "big")


MACKETH = _layer(L.MACKETH, _macketh_fields(), sack_int=_sack_int)

for _opcode in P.DATA_OPCODES:
    bind_layers(BTH, RETH, opcode=int(_opcode))
bind_layers(ImmDt, MDETH)
bind_layers(AETH, MACKETH)
for _opcode in P.PROBE_OPCODES:
    bind_layers(BTH, MPRH, opcode=int(_opcode))


# ---------------------------------------------------------------------------------------------
# MRC 1.0 layers (the NIC does not send them yet)
# ---------------------------------------------------------------------------------------------

def _resv7_bit(name):
    """The bit of Scapy's ``BTH.resv7`` that MRC 1.0 calls ``name`` (rtx or ts)."""
    field, mask = L.mrc10_bth_flag(name)
    assert field == "resv7"
    return mask


#: ``BTH.resv7`` bit of MRC 1.0's rtx: this packet is a retransmission.
BTH_RTX = _resv7_bit("rtx")
#: ``BTH.resv7`` bit of MRC 1.0's ts: a TSETH follows the METH.
BTH_TS = _resv7_bit("ts")


def bth_resv7(*, rtx=False, ts=False):
    """The value of Scapy's ``BTH.resv7`` that carries MRC 1.0's rtx and ts bits."""
    return (BTH_RTX if rtx else 0) | (BTH_TS if ts else 0)


def bth_rtx(bth):
    """MRC 1.0's BTH.rtx of a Scapy BTH."""
    return bool(bth.resv7 & BTH_RTX)


def bth_ts(bth):
    """MRC 1.0's BTH.ts of a Scapy BTH."""
    return bool(bth.resv7 & BTH_TS)


def _meth_payload(self, payload):
    # The TSETH is there exactly when BTH.ts is set.
    bth = self.underlayer
    return TSETH if isinstance(bth, BTH) and bth_ts(bth) else RETH


METH = _layer(L.METH, _fields(L.METH), guess_payload_class=_meth_payload)
TSETH = _layer(L.TSETH, _fields(L.TSETH))
SETH = _layer(L.SETH, _fields(L.SETH))
CC_STATE = _layer(L.CC_STATE, _fields(L.CC_STATE))
NETH = _layer(L.NETH, _fields(L.NETH))
PETH = _layer(L.PETH, _fields(L.PETH))
ERTH = _layer(L.ERTH, _fields(L.ERTH))
EETH = _layer(L.EETH, _fields(L.EETH))

for _opcode in P.MRC10_DATA_OPCODES:
    bind_layers(BTH, METH, opcode=int(_opcode))
bind_layers(TSETH, RETH)
bind_layers(BTH, AETH, opcode=int(P.Mrc10Opcode.ACKNOWLEDGE))
bind_layers(BTH, SETH, opcode=int(P.Mrc10Opcode.RELIABILITY_SACK))
bind_layers(SETH, CC_STATE)
bind_layers(BTH, NETH, opcode=int(P.Mrc10Opcode.RELIABILITY_NACK))
bind_layers(BTH, PETH, opcode=int(P.Mrc10Opcode.RELIABILITY_PROBE_REQUEST))
bind_layers(BTH, ERTH, opcode=int(P.Mrc10Opcode.ENDPOINT_REQUEST))
bind_layers(BTH, EETH, opcode=int(P.Mrc10Opcode.ENDPOINT_RESPONSE))


def sack_from_bytes(data):
    return int.from_bytes(data, "big")


def _sack_bytes(sack, sack_bytes):
    if sack_bytes not in P.SACK_BYTES_ALLOWED:
        raise ValueError(f"sack_bytes must be one of {P.SACK_BYTES_ALLOWED}, not {sack_bytes!r}")
    if not 0 <= sack < (1 << (8 * sack_bytes)):
        raise ValueError(f"SACK bitmap {sack:#x} does not fit in {sack_bytes} bytes")
    return sack.to_bytes(sack_bytes, "big")


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


def data_packet(opcode, *, dqpn, psn, va, rkey, payload=b"", dma_len=None, imm=None,
                ev_index=0, flags=0, tx_ts=0, ackreq=0, **kw):
    """An RDMA WRITE packet: BTH / RETH / [ImmDt] / MDETH / payload / ICRC.

    Underlay keywords: ``ip_version`` (6), ``src``/``dst`` (:class:`sim.defaults.Endpoint`),
    ``udp_sport``, ``flow_label``, ``dscp``, ``ecn`` (ECT(0)), ``hop_limit``, ``vlan``.
    """
    opcode = P.Opcode(opcode)
    if opcode not in P.DATA_OPCODES:
        raise ValueError(f"{opcode.name} is not an MRC data opcode")
    if (opcode in P.IMMEDIATE_OPCODES) != (imm is not None):
        raise ValueError(f"{opcode.name} {'needs' if imm is None else 'takes no'} immediate data")
    payload = bytes(payload)
    under = _underlay(**_common(kw))
    _reject_unknown(kw)
    pkt = under / BTH(opcode=int(opcode), dqpn=dqpn, psn=psn, ackreq=ackreq)
    pkt = pkt / RETH(va=va, rkey=rkey, dma_len=len(payload) if dma_len is None else dma_len)
    if imm is not None:
        pkt = pkt / ImmDt(imm=imm)
    pkt = pkt / MDETH(ev_index=ev_index, flags=int(flags), tx_ts=tx_ts)
    if payload:
        pkt = pkt / Raw(payload)
    return pkt


def ack_packet(*, dqpn, psn, cum_psn, sack=0, sack_bytes=8, msn=0, nak=None, ev_index=0,
               flags=0, ts_echo=0, svc_time=0, **kw):
    """An ACK (or, with ``nak``, a NACK): BTH / AETH / MACKETH / SACK bitmap / ICRC.

    ``psn`` is the PSN of the packet that triggered it (for a NACK, the PSN refused);
    ``cum_psn`` the cumulative PSN; ``sack`` an integer whose bit i covers cum_psn + 1 + i.
    """
    syndrome = P.AETH_ACK if nak is None else P.nak_syndrome(nak)
    under = _underlay(**_common(kw))
    _reject_unknown(kw)
    return (under / BTH(opcode=int(P.Opcode.ACKNOWLEDGE), dqpn=dqpn, psn=psn)
            / AETH(syndrome=syndrome, msn=msn)
            / MACKETH(ev_index=ev_index, flags=int(flags), cum_psn=cum_psn, ts_echo=ts_echo,
                      svc_time=svc_time, sack=_sack_bytes(sack, sack_bytes)))


def nack_packet(code, **kw):
    """A NACK with :class:`hdl.protocol.NakCode` ``code``; see :func:`ack_packet`."""
    return ack_packet(nak=P.NakCode(code), **kw)


def probe_packet(*, response=False, dqpn, probe_id, ev_index, src_qpn=0, tx_ts=0,
                 svc_time=0, flags=0, psn=0, **kw):
    """An EV probe request or response: BTH / MPRH / ICRC."""
    opcode = P.Opcode.PROBE_RESPONSE if response else P.Opcode.PROBE_REQUEST
    under = _underlay(**_common(kw))
    _reject_unknown(kw)
    return (under / BTH(opcode=int(opcode), dqpn=dqpn, psn=psn)
            / MPRH(probe_id=probe_id, ev_index=ev_index, flags=int(flags), src_qpn=src_qpn,
                   tx_ts=tx_ts, svc_time=svc_time))


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
    pkt = pkt.copy()
    if MDETH not in pkt:
        raise ValueError("only data packets (with an MDETH) are trimmed")
    pkt[MDETH].remove_payload()
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
