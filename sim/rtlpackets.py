"""Scapy packets <-> the gateware's packet header struct, and frames <-> network beats.

:func:`header_from_scapy` fills the :func:`hdl.packet.headers.packet_header_layout` struct (as
the dict that ``ctx.set`` and ``layout.const`` accept) from any frame of ``sim.packets``:
what a parser should extract, and what the header builder needs to rebuild the frame.
:func:`packet_from_header` goes the other way, building the Scapy frame that
:class:`hdl.packet.builder.HeaderBuilder` emits for a header and payload. The beat helpers cut
a payload or frame into ``(data, keep, first, last)`` beats as the streams carry them.
"""

from ipaddress import IPv4Address, IPv6Address

from scapy.compat import raw
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6, IPv6ExtHdrSegmentRouting
from scapy.layers.l2 import Dot1Q, Ether
from scapy.packet import Raw

from hdl import protocol as P
from hdl.packet import layouts as L
from hdl.packet.builder import IPV4_IDENTIFICATION, SRV6_OUTER_HOP_LIMIT
from hdl.packet.headers import KIND_OPCODES, PacketKind, opcode_kind

from . import packets as pk

__all__ = [
    "header_from_scapy", "payload_from_scapy", "packet_from_header", "payload_beats",
    "frame_beats", "frame_from_beats",
]



def _mac_int(mac):
    return int(mac.replace(":", ""), 16)


def _mac_str(value):
    return ":".join(f"{b:02x}" for b in value.to_bytes(6, "big"))


def _fields(layer, header):
    return {f.name: int(getattr(layer, f.name)) for f in header.fields}


#: The ``ctl`` member of every control kind's headers (None: the AETH, outside the union).
CTL_MEMBERS = {
    PacketKind.AETH: None, PacketKind.SACK: "sack", PacketKind.NACK: "neth",
    PacketKind.RPROBE: "peth", PacketKind.EP_REQUEST: "erth", PacketKind.EP_RESPONSE: "eeth",
}
#: PacketKind of every control opcode, and the ``ctl`` member its headers fill.
CONTROL_KINDS = {KIND_OPCODES[kind]: (kind, member) for kind, member in CTL_MEMBERS.items()}


def _decode(pkt):
    """A fully built copy of ``pkt``, decoded from its bytes (every field concrete)."""
    return Ether(raw(pkt))


def payload_from_scapy(pkt):
    """The payload bytes of a data packet (after the RETH or ImmDt, before the ICRC); else
    ``b""``."""
    pkt = _decode(pkt)
    if pk.METH not in pkt:
        return b""
    return pk.transport_payload(pkt)


def _ctl(pkt, member):
    """The ``ctl`` union member dict of a control packet."""
    if member == "sack":
        return {"sack": {"seth": _fields(pkt[pk.SETH], L.SETH),
                         "cc_state": _fields(pkt[pk.CC_STATE], L.CC_STATE)}}
    header = {"neth": L.NETH, "peth": L.PETH, "erth": L.ERTH, "eeth": L.EETH}[member]
    return {member: _fields(pkt[pk.LAYERS[header]], header)}


def header_from_scapy(pkt, config, *, port=0):
    """The :func:`~hdl.packet.headers.packet_header_layout` dict of an MRC frame.

    ``port`` is the egress/ingress port to put in the struct (it is not in the frame). Raises
    :class:`ValueError` for frames the NIC does not build: a non-MRC opcode or an SRH with
    other than one segment. Only the members the kind uses are in the dict (``tseth`` only
    with BTH.ts, ``immdt`` only on the immediate opcodes, one member of ``ctl``).
    """
    pkt = _decode(pkt)
    header = {"port": port}
    header["eth_dst"] = _mac_int(pkt[Ether].dst)
    header["eth_src"] = _mac_int(pkt[Ether].src)
    layer = pkt[Ether].payload
    if isinstance(layer, Dot1Q):
        header["vlan_valid"] = 1
        header["vlan_tci"] = layer.prio << 13 | layer.dei << 12 | layer.vlan
        layer = layer.payload
    udp = pkt[UDP]
    ip = udp.underlayer
    if layer is not ip:
        if not isinstance(layer, IPv6):
            raise ValueError(f"Expected an outer IPv6 header, not {layer.name}")
        header["srv6_valid"] = 1
        header["srv6_src"] = int(IPv6Address(layer.src))
        header["srv6_dst"] = int(IPv6Address(layer.dst))
        srh = layer.payload
        if isinstance(srh, IPv6ExtHdrSegmentRouting):
            if len(srh.addresses) != 1:
                raise ValueError(f"The SRH must carry one segment, not {len(srh.addresses)}")
            header["srh_valid"] = 1
            header["srh_segment"] = int(IPv6Address(srh.addresses[0]))
    if isinstance(ip, IPv6):
        header.update(ipv6=1, ip_src=int(IPv6Address(ip.src)), ip_dst=int(IPv6Address(ip.dst)),
                      tclass=ip.tc, flow_label=ip.fl, hop_limit=ip.hlim)
    else:
        header.update(ipv6=0, ip_src=int(IPv4Address(ip.src)), ip_dst=int(IPv4Address(ip.dst)),
                      tclass=ip.tos, flow_label=0, hop_limit=ip.ttl)
    header["trimmed"] = int(header["tclass"] >> 2 == config.trim_dscp)
    header["udp_sport"] = udp.sport

    bth = pkt[pk.BTH]
    header["bth"] = _fields(bth, L.BTH)
    kind = header["kind"] = opcode_kind(bth.opcode)
    payload = b""
    if kind == PacketKind.DATA:
        header["meth"] = _fields(pkt[pk.METH], L.METH)
        if bth.ts:
            header["tseth"] = _fields(pkt[pk.TSETH], L.TSETH)
        header["reth"] = _fields(pkt[pk.RETH], L.RETH)
        if bth.opcode in P.IMMEDIATE_OPCODES:
            header["immdt"] = _fields(pkt[pk.ImmDt], L.IMMDT)
        payload = pk.transport_payload(pkt)
    elif kind == PacketKind.AETH:
        header["aeth"] = _fields(pkt[pk.AETH], L.AETH)
    else:
        header["ctl"] = _ctl(pkt, CONTROL_KINDS[bth.opcode][1])
    header["payload_len"] = len(payload)
    return header


def packet_from_header(header, payload, config):
    """The frame :class:`~hdl.packet.builder.HeaderBuilder` builds for ``header`` (a dict as
    from :func:`header_from_scapy`; missing fields are 0) and ``payload``, as a Scapy packet.

    The length fields follow ``header["payload_len"]`` (as in the builder), and the ICRC is
    Scapy's, over the bytes actually sent.
    """
    def get(name, default=0):
        return header.get(name, default)

    def sub(name):
        return header.get(name, {})

    payload = bytes(payload)
    kind = PacketKind(get("kind", PacketKind.DATA))
    opcode = sub("bth").get("opcode", 0)
    if kind == PacketKind.DATA:
        headers = L.data_headers(opcode, ts=sub("bth").get("ts", 0))
    else:
        headers = L.CONTROL_HEADERS[KIND_OPCODES[kind]]
    transport_bytes = L.headers_size(headers)
    udp_len = 8 + L.BTH.size + transport_bytes + get("payload_len") + P.ICRC_BYTES
    ip6 = bool(get("ipv6"))
    inner_len = udp_len + (40 if ip6 else 20)

    frame = Ether(dst=_mac_str(get("eth_dst")), src=_mac_str(get("eth_src")))
    if get("vlan_valid"):
        tci = get("vlan_tci")
        frame = frame / Dot1Q(prio=tci >> 13, dei=tci >> 12 & 1, vlan=tci & 0xFFF)
    inner_nh = P.IP_PROTO_IPV6 if ip6 else P.IP_PROTO_IPV4
    if get("srv6_valid"):
        srh = bool(get("srh_valid"))
        frame = frame / IPv6(src=str(IPv6Address(get("srv6_src"))),
                             dst=str(IPv6Address(get("srv6_dst"))), tc=0, fl=0,
                             hlim=SRV6_OUTER_HOP_LIMIT,
                             nh=P.IP_PROTO_ROUTING if srh else inner_nh,
                             plen=inner_len + (24 if srh else 0))
        if srh:
            frame = frame / IPv6ExtHdrSegmentRouting(
                nh=inner_nh, addresses=[str(IPv6Address(get("srh_segment")))], segleft=1,
                lastentry=0)
    if ip6:
        frame = frame / IPv6(src=str(IPv6Address(get("ip_src"))),
                             dst=str(IPv6Address(get("ip_dst"))), tc=get("tclass"),
                             fl=get("flow_label"), hlim=get("hop_limit"), plen=udp_len)
    else:
        mask = (1 << 32) - 1
        frame = frame / IP(src=str(IPv4Address(get("ip_src") & mask)),
                           dst=str(IPv4Address(get("ip_dst") & mask)), tos=get("tclass"),
                           ttl=get("hop_limit"), flags="DF", id=IPV4_IDENTIFICATION,
                           len=inner_len)
    frame = frame / UDP(sport=get("udp_sport"), dport=P.ROCEV2_UDP_PORT, len=udp_len, chksum=0)
    frame = frame / pk.BTH(**({f.name: 0 for f in L.BTH.fields} | sub("bth")))
    if kind == PacketKind.DATA:
        members = {L.METH: "meth", L.TSETH: "tseth", L.RETH: "reth", L.IMMDT: "immdt"}
        for h in headers:
            frame = frame / pk.LAYERS[h](**sub(members[h]))
        if payload:
            frame = frame / Raw(payload)
    elif kind == PacketKind.AETH:
        frame = frame / pk.AETH(**sub("aeth"))
    elif kind == PacketKind.SACK:
        sack = sub("ctl").get("sack", {})
        frame = frame / pk.SETH(**sack.get("seth", {})) / pk.CC_STATE(**sack.get("cc_state", {}))
    else:
        header_layout, = headers
        frame = frame / pk.LAYERS[header_layout](**sub("ctl").get(CTL_MEMBERS[kind], {}))
    return frame


# ---------------------------------------------------------------------------------------------
# Beats
# ---------------------------------------------------------------------------------------------

def payload_beats(payload, data_width):
    """``(data, keep, first, last)`` beats of a payload as the builder's input carries it:
    byte 0 in lane 0 of the first beat; no payload is one beat with ``keep == 0``."""
    lanes = data_width // 8
    payload = bytes(payload)
    chunks = [payload[i:i + lanes] for i in range(0, len(payload), lanes)] or [b""]
    return [(int.from_bytes(chunk, "little"), (1 << len(chunk)) - 1, n == 0,
             n == len(chunks) - 1) for n, chunk in enumerate(chunks)]


def frame_beats(frame, data_width):
    """A frame (bytes or packet) as network beats; a frame is never empty."""
    frame = bytes(frame) if isinstance(frame, (bytes, bytearray)) else raw(frame)
    if not frame:
        raise ValueError("A frame must not be empty")
    return payload_beats(frame, data_width)


def frame_from_beats(beats, data_width):
    """Concatenate the kept bytes of ``(data, keep, ...)`` beats (``keep`` runs from lane 0)."""
    lanes = data_width // 8
    out = bytearray()
    for data, keep, *_ in beats:
        count = bin(keep).count("1")
        if keep != (1 << count) - 1:
            raise ValueError(f"keep {keep:#x} is not a run of ones from lane 0")
        out += data.to_bytes(lanes, "little")[:count]
    return bytes(out)
