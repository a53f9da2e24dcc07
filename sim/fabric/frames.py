"""Just enough frame parsing for the fabric: byte indexing, no Scapy objects (it runs per frame).

:func:`parse` finds the ECMP key (the fields a switch hashes), the IP header whose ECN bits
a congested queue marks (the inner one in SRv6) and the BTH. It never raises: a frame it
cannot read is forwarded as an opaque, non-RoCE frame hashed on its first bytes.
"""

from typing import NamedTuple

from hdl import protocol as P
from hdl.packet import layouts as L

__all__ = ["FrameInfo", "parse", "mark_ce", "ipv4_checksum", "roce_payload_bytes"]

_OPAQUE_KEY_BYTES = 64
# Sizes and offsets from the layout table, as plain ints (this runs per frame).
_ETH_BYTES = L.ETHERNET.size
_ETHERTYPE = L.ETHERNET.byte_offset("ethertype")
_DOT1Q_BYTES = L.DOT1Q.size
_DOT1Q_ETHERTYPE = L.DOT1Q.byte_offset("ethertype")
_IPV6_BYTES = L.IPV6.size
_IPV6_NEXT_HEADER = L.IPV6.byte_offset("next_header")
_IPV6_SRC = L.IPV6.byte_offset("src")
_IPV4_BYTES = L.IPV4.size
_IPV4_PROTOCOL = L.IPV4.byte_offset("protocol")
_IPV4_SRC = L.IPV4.byte_offset("src")
_UDP_BYTES = L.UDP.size
_UDP_DPORT = L.UDP.byte_offset("dport")
_BTH_BYTES = L.BTH.size
_BTH_TS_BYTE = L.BTH.byte_offset("ts")
_BTH_TS_MASK = 0x80 >> (L.BTH.bit_offset("ts") % 8)
# Bytes of a data packet's headers after the BTH: (immediate, ts) -> METH [TSETH] RETH [ImmDt].
_DATA_HEADER_BYTES = {
    (imm, ts): L.headers_size(L.data_headers(
        P.Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE if imm else P.Opcode.RDMA_WRITE_ONLY, ts=ts))
    for imm in (False, True) for ts in (False, True)}
_DATA_OPCODES = frozenset(int(op) for op in P.DATA_OPCODES)
_IMMEDIATE_OPCODES = frozenset(int(op) for op in P.IMMEDIATE_OPCODES)


class FrameInfo(NamedTuple):
    ecmp_key: bytes     #: bytes hashed to choose the path
    ip_offset: int      #: offset of the (inner) IP header, -1 when there is none
    ip_version: int     #: 4 or 6 (0 when there is no IP header)
    bth_offset: int     #: offset of the BTH, -1 for a frame that is not RoCEv2
    opcode: int         #: BTH opcode, -1 for a frame that is not RoCEv2

    @property
    def is_data(self):
        return self.opcode in _DATA_OPCODES


def _opaque(frame):
    return FrameInfo(bytes(frame[:_OPAQUE_KEY_BYTES]), -1, 0, -1, -1)


def parse(frame):
    """The :class:`FrameInfo` of an Ethernet frame (bytes, without FCS)."""
    n = len(frame)
    if n < _ETH_BYTES:
        return _opaque(frame)
    ethertype = (frame[_ETHERTYPE] << 8) | frame[_ETHERTYPE + 1]
    off = _ETH_BYTES
    if ethertype == P.ETHERTYPE_VLAN:
        if n < _DOT1Q_BYTES:
            return _opaque(frame)
        ethertype = (frame[_DOT1Q_ETHERTYPE] << 8) | frame[_DOT1Q_ETHERTYPE + 1]
        off = _DOT1Q_BYTES
    encapsulated = False
    if ethertype == P.ETHERTYPE_IPV6:
        if n < off + _IPV6_BYTES:
            return _opaque(frame)
        # Flow label (20 bits) and both addresses: the SRv6 EV is the outer destination.
        key = (bytes((frame[off + 1] & 0x0F,)) + frame[off + 2:off + 4]
               + frame[off + _IPV6_SRC:off + _IPV6_BYTES])
        ip_offset, ip_version = off, 6
        next_header = frame[off + _IPV6_NEXT_HEADER]
        off += _IPV6_BYTES
        if next_header == P.IP_PROTO_ROUTING:
            if n < off + 8:
                return FrameInfo(key, ip_offset, ip_version, -1, -1)
            next_header = frame[off]
            off += (frame[off + 1] + 1) * 8
        if next_header == P.IP_PROTO_IPV6 and n >= off + _IPV6_BYTES:
            encapsulated = True
            ip_offset, ip_version = off, 6
            next_header = frame[off + _IPV6_NEXT_HEADER]
            off += _IPV6_BYTES
        elif next_header == P.IP_PROTO_IPV4 and n >= off + _IPV4_BYTES:
            encapsulated = True
            ip_offset, ip_version = off, 4
            next_header = frame[off + _IPV4_PROTOCOL]
            off += (frame[off] & 0x0F) * 4
    elif ethertype == P.ETHERTYPE_IPV4:
        if n < off + _IPV4_BYTES:
            return _opaque(frame)
        key = bytes(frame[off + _IPV4_SRC:off + _IPV4_BYTES])
        ip_offset, ip_version = off, 4
        next_header = frame[off + _IPV4_PROTOCOL]
        off += (frame[off] & 0x0F) * 4
    else:
        return _opaque(frame)
    if next_header != P.IP_PROTO_UDP or n < off + _UDP_BYTES:
        return FrameInfo(key, ip_offset, ip_version, -1, -1)
    if not encapsulated:
        key += frame[off:off + 4]           # UDP source port (the EV) and destination port
    dport = (frame[off + _UDP_DPORT] << 8) | frame[off + _UDP_DPORT + 1]
    bth = off + _UDP_BYTES
    if dport != P.ROCEV2_UDP_PORT or n < bth + _BTH_BYTES + P.ICRC_BYTES:
        return FrameInfo(key, ip_offset, ip_version, -1, -1)
    return FrameInfo(key, ip_offset, ip_version, bth, frame[bth])


def ipv4_checksum(header):
    """Internet checksum of an IPv4 header whose checksum field is zero."""
    total = 0
    for i in range(0, len(header), 2):
        total += (header[i] << 8) | header[i + 1]
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def mark_ce(buffer, info):
    """Set ECN CE in the (inner) IP header of ``buffer`` (a bytearray), in place.

    Returns False (and changes nothing) for a Not-ECT packet or one without IP: a switch
    only marks ECN-capable traffic. The ICRC masks the ECN bits, so it stays valid; the IPv4
    header checksum is recomputed.
    """
    off = info.ip_offset
    if info.ip_version == 6:
        if not (buffer[off + 1] >> 4) & 0b11:
            return False
        buffer[off + 1] |= P.ECN_CE << 4
        return True
    if info.ip_version == 4:
        if not buffer[off + 1] & 0b11:
            return False
        buffer[off + 1] |= P.ECN_CE
        length = (buffer[off] & 0x0F) * 4
        buffer[off + 10:off + 12] = b"\0\0"
        buffer[off + 10:off + 12] = ipv4_checksum(buffer[off:off + length]).to_bytes(2, "big")
        return True
    return False


def roce_payload_bytes(frame, info):
    """RDMA payload bytes a data packet carries (0 for any other frame, and when trimmed)."""
    if not info.is_data:
        return 0
    ts_at = info.bth_offset + _BTH_TS_BYTE
    ts = ts_at < len(frame) and bool(frame[ts_at] & _BTH_TS_MASK)
    headers = _BTH_BYTES + _DATA_HEADER_BYTES[info.opcode in _IMMEDIATE_OPCODES, ts]
    return max(0, len(frame) - info.bth_offset - headers - P.ICRC_BYTES)
