"""Hostile frames for ``mrc-nic fuzz``: every MRC packet type, forged and mutated, fast.

:class:`FrameKit` builds frames from templates that the Scapy layers of :mod:`sim.packets`
make once per packet shape; each frame is then a copy of its template with fields written at
the offsets of :mod:`hdl.packet.layouts` (the one table of every header layout), its IP and
UDP lengths refitted and its ICRC recomputed (:func:`icrc`, checked against Scapy's in the
tests). A frame costs microseconds instead of Scapy's milliseconds, so a run can forge a
million of them.

:class:`Mutator` is the hostile source: it picks a mutant (:data:`MUTANTS`), its target and
its fields from a seeded generator and a :class:`View` of the run (which PSNs each QP has
sent and had acknowledged, recent legitimate frames to replay), and returns the frames with
the NIC they go to. Which mutants may hit which QP is the fuzzer's contract
(``docs/fuzz.md``): RoCE has no authentication, so a forged packet inside a live QP's window
is indistinguishable from the real one. Mutants that may legitimately hurt a QP (in-window
PSNs, rkey and bounds violations, forged in-window SACK/NACK/NAK, wrong opcodes) target only
the *victim* QPs; live QPs get only frames a correct NIC must drop or answer harmlessly:
header-invalid frames, duplicates, PSNs below the cumulative PSN or beyond the window,
unknown and wrong-state QPNs, stale acknowledgements and probes.

Every payload the fuzzer forges (and every byte the victims' own traffic writes) is a
repetition of a 16-byte :func:`signature`: 8 magic bytes, the rkey and the QPN the packet
carried. A placement that starts with the magic names the MR and the QP it may land in; the
bench checks every placed packet against it.
"""

import ipaddress
import random
import zlib
from collections import deque
from dataclasses import dataclass, field

from scapy.compat import raw

from hdl import protocol as P
from hdl.packet import layouts as L
from hdl.packet.crc import icrc_bytes

from . import defaults
from . import packets as pk

__all__ = ["FrameKit", "Mutator", "View", "QpView", "MUTANTS", "PARSER_MUTANTS", "MAGIC",
           "signature", "add_vlan", "srv6_encapsulate",
           "read_signature", "icrc", "psn_add", "psn_diff"]

PSN_MASK = (1 << 24) - 1
#: PSNs a live QP may still send between a frame's forging and its arrival at the receive
#: path (a fabric latency and the receive backlog, tens of microseconds: some tens of PSNs at
#: line rate). A live-QP PSN "beyond" is beyond this margin too, so that the QP never reaches
#: it while the frame is on its way.
LIVE_MARGIN = 2048
#: The first bytes of every payload the fuzzer writes.
MAGIC = b"\xf0zzMRC\x0f\xee"
SIGNATURE_BYTES = 16


def psn_add(psn, n):
    return (psn + n) & PSN_MASK


def psn_diff(a, b):
    """``a - b`` in 24-bit serial arithmetic, from -2**23 to 2**23 - 1."""
    d = (a - b) & PSN_MASK
    return d - (1 << 24) if d >= 1 << 23 else d


def signature(rkey, qpn):
    """The 16-byte unit of a fuzzer payload: :data:`MAGIC`, the rkey and the QPN."""
    return MAGIC + rkey.to_bytes(4, "big") + qpn.to_bytes(4, "big")


def fill(rkey, qpn, length):
    """``length`` bytes of :func:`signature` units."""
    unit = signature(rkey, qpn)
    return (unit * (length // SIGNATURE_BYTES + 1))[:length]


def read_signature(head):
    """``(rkey, qpn)`` of a payload that starts with a signature, else ``None``."""
    if len(head) < SIGNATURE_BYTES or head[:8] != MAGIC:
        return None
    return int.from_bytes(head[8:12], "big"), int.from_bytes(head[12:16], "big")


# -- frames -----------------------------------------------------------------------------------

_ETH = L.ETHERNET.size


def _icrc_head_mask(ip_header):
    """The ICRC's masks over the IP, UDP and BTH headers of a frame, as one integer over
    those bytes (``hdl.packet.layouts.ICRC_MASKED_FIELDS``)."""
    mask = L.icrc_byte_mask(ip_header) + L.icrc_byte_mask(L.UDP) + L.icrc_byte_mask(L.BTH)
    return len(mask), int.from_bytes(mask, "big")


_HEAD_MASK = {6: _icrc_head_mask(L.IPV6), 4: _icrc_head_mask(L.IPV4)}


def icrc(frame):
    """The ICRC (4 wire bytes) of an untagged Ethernet / IPv4 or IPv6 / UDP / BTH ... frame
    whose last 4 bytes are its ICRC field: RoCEv2's CRC-32 over the pseudo-LRH and the packet
    with the variant fields masked (``hdl.packet.layouts.ICRC_MASKED_FIELDS``)."""
    size, mask = _HEAD_MASK[6 if frame[_ETH] >> 4 == 6 else 4]
    head = (int.from_bytes(frame[_ETH:_ETH + size], "big") | mask).to_bytes(size, "big")
    crc = zlib.crc32(bytes(frame[_ETH + size:-4]), zlib.crc32(L.ICRC_INIT_BYTES + head))
    return icrc_bytes(crc & 0xFFFFFFFF)


def _ipv4_checksum(header):
    total = sum(int.from_bytes(header[i:i + 2], "big") for i in range(0, len(header), 2))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


_FIELDS = {}
_SIZES = {}


def _size(header):
    """``header.size``, cached (the layout computes it from its fields)."""
    size = _SIZES.get(header.name)
    if size is None:
        size = _SIZES[header.name] = header.size
    return size


def _field(header, name):
    """``(shift, mask, field)`` of field ``name`` in ``header`` read as one big-endian
    integer (cached)."""
    key = (header.name, name)
    spec = _FIELDS.get(key)
    if spec is None:
        found = header.field(name)
        shift = header.bits - header.bit_offset(name) - found.bits
        spec = _FIELDS[key] = (shift, ((1 << found.bits) - 1) << shift, found)
    return spec


def _set(buffer, at, header, **values):
    """Write fields of ``header`` (at byte ``at`` of ``buffer``) by name."""
    size = _size(header)
    word = int.from_bytes(buffer[at:at + size], "big")
    for name, value in values.items():
        shift, mask, spec = _field(header, name)
        word = (word & ~mask) | ((spec.to_raw(value) << shift) & mask)
    buffer[at:at + size] = word.to_bytes(size, "big")


def _get(buffer, at, header, name):
    shift, mask, spec = _field(header, name)
    return spec.from_raw((int.from_bytes(buffer[at:at + _size(header)], "big") & mask) >> shift)


class FrameKit:
    """Forges the frames one endpoint sends another: ``src`` and ``dst``
    (:class:`sim.defaults.Endpoint`) over IPv4 or IPv6, untagged, no SRv6 (the NIC's own
    underlay). Templates come from :mod:`sim.packets`; fields are written by name from
    :mod:`hdl.packet.layouts`.
    """

    def __init__(self, *, ip_version=6, src=defaults.NIC_A, dst=defaults.NIC_B):
        if ip_version not in (4, 6):
            raise ValueError(f"ip_version must be 4 or 6, not {ip_version!r}")
        self.ip_version = ip_version
        self.src, self.dst = src, dst
        self.ip_header = L.IPV6 if ip_version == 6 else L.IPV4
        self.udp_at = _ETH + _size(self.ip_header)
        self.bth_at = self.udp_at + L.UDP.size
        self._templates = {}
        self._offsets = {}

    def _template(self, key, build):
        template = self._templates.get(key)
        if template is None:
            template = self._templates[key] = raw(build())
        return bytearray(template)

    def _underlay(self):
        return dict(ip_version=self.ip_version, src=self.src, dst=self.dst)

    # -- lengths and checksums ----------------------------------------------------------------

    def finish(self, buffer, *, lengths=True, crc=True):
        """Refit the IP and UDP lengths to the frame (and the IPv4 checksum), then the ICRC;
        either can be left as it is. Returns bytes."""
        if lengths:
            ip_bytes = len(buffer) - _ETH
            if self.ip_version == 6:
                _set(buffer, _ETH, L.IPV6, payload_length=ip_bytes - _size(L.IPV6))
            else:
                _set(buffer, _ETH, L.IPV4, total_length=ip_bytes, checksum=0)
            _set(buffer, self.udp_at, L.UDP, length=ip_bytes - _size(self.ip_header))
        if self.ip_version == 4:
            _set(buffer, _ETH, L.IPV4, checksum=0)
            header = bytes(buffer[_ETH:_ETH + _size(L.IPV4)])
            _set(buffer, _ETH, L.IPV4, checksum=_ipv4_checksum(header))
        if crc:
            buffer[-4:] = icrc(buffer)
        return bytes(buffer)

    def _ev(self, buffer, udp_sport, flow_label, tclass):
        _set(buffer, self.udp_at, L.UDP, sport=udp_sport)
        if self.ip_version == 6:
            _set(buffer, _ETH, L.IPV6, flow_label=flow_label, tclass=tclass)
        else:
            _set(buffer, _ETH, L.IPV4, tos=tclass)

    # -- packets ------------------------------------------------------------------------------

    def data_offsets(self, opcode, ts):
        """Byte offsets of the headers after the BTH of a data packet, by header, and of its
        payload."""
        key = (opcode, bool(ts))
        offsets = self._offsets.get(key)
        if offsets is None:
            at = self.bth_at + _size(L.BTH)
            out = {}
            for header in L.data_headers(opcode, ts=ts):
                out[header.name] = at
                at += header.size
            offsets = self._offsets[key] = (out, at)
        return offsets

    def data(self, opcode, *, dqpn, psn, va, rkey, payload=b"", dma_len=None, imm=None,
             tx_timestamp=None, ackreq=0, rtx=0, msn=0, rqmsn=0, udp_sport=0xC000,
             flow_label=0, tclass=0b10):
        """An RDMA WRITE packet (:func:`sim.packets.data_packet`): BTH / METH / [TSETH] /
        RETH / [ImmDt] / payload / ICRC, ``dma_len`` defaulting to the payload's length."""
        opcode = int(opcode)
        ts = tx_timestamp is not None
        has_imm = opcode in P.IMMEDIATE_OPCODES
        buffer = self._template(("data", opcode, ts), lambda: pk.data_packet(
            opcode, dqpn=0, psn=0, va=0, rkey=0, imm=0 if has_imm else None,
            tseth={"tx_timestamp": 0} if ts else None, **self._underlay()))
        offsets, end = self.data_offsets(opcode, ts)
        buffer[end:] = bytes(payload) + bytes(4)
        _set(buffer, self.bth_at, L.BTH, dqpn=dqpn, psn=psn, ackreq=ackreq, rtx=rtx)
        _set(buffer, offsets[L.METH.name], L.METH, msn=msn & 0xFFFF, rqmsn=rqmsn & 0xFFFF)
        if ts:
            _set(buffer, offsets[L.TSETH.name], L.TSETH, tx_timestamp=tx_timestamp & 0xFFFF)
        _set(buffer, offsets[L.RETH.name], L.RETH, va=va, rkey=rkey,
             dma_len=len(payload) if dma_len is None else dma_len)
        if has_imm:
            _set(buffer, offsets[L.IMMDT.name], L.IMMDT, imm=imm or 0)
        self._ev(buffer, udp_sport, flow_label, tclass)
        return self.finish(buffer)

    def sack(self, *, dqpn, cack_psn, bth_psn=None, udp_sport=0xC000, flow_label=0,
             tclass=0b10, cc_state=None, **seth):
        """RELIABILITY_SACK (:func:`sim.packets.sack_packet`); ``bth_psn`` other than
        ``cack_psn`` makes the malformed SACK whose two cumulative PSNs differ."""
        buffer = self._template(("sack",), lambda: pk.sack_packet(
            dqpn=0, cack_psn=0, **self._underlay()))
        seth_at = self.bth_at + _size(L.BTH)
        _set(buffer, self.bth_at, L.BTH, dqpn=dqpn,
             psn=cack_psn if bth_psn is None else bth_psn)
        _set(buffer, seth_at, L.SETH, cack_psn=cack_psn, **seth)
        if cc_state:
            _set(buffer, seth_at + _size(L.SETH), L.CC_STATE, **cc_state)
        self._ev(buffer, udp_sport, flow_label, tclass)
        return self.finish(buffer)

    def nack(self, *, dqpn, nack_psn, nack_reason, bth_psn=None, udp_sport=0xC000,
             flow_label=0, tclass=0b10, **neth):
        """RELIABILITY_NACK (:func:`sim.packets.nack_packet`)."""
        buffer = self._template(("nack",), lambda: pk.nack_packet(
            dqpn=0, nack_psn=0, nack_reason=P.NackReason.TRIMMED, **self._underlay()))
        _set(buffer, self.bth_at, L.BTH, dqpn=dqpn,
             psn=nack_psn if bth_psn is None else bth_psn)
        _set(buffer, self.bth_at + _size(L.BTH), L.NETH, nack_psn=nack_psn,
             nack_reason=int(nack_reason), **neth)
        self._ev(buffer, udp_sport, flow_label, tclass)
        return self.finish(buffer)

    def aeth(self, *, dqpn, psn, syndrome, msn=0, udp_sport=0xC000, flow_label=0,
             tclass=0b10):
        """ACKNOWLEDGE with an AETH (:func:`sim.packets.ack_packet`): a fatal NAK for
        ``syndrome`` 0x60 | code."""
        buffer = self._template(("aeth",), lambda: pk.ack_packet(
            dqpn=0, psn=0, **self._underlay()))
        _set(buffer, self.bth_at, L.BTH, dqpn=dqpn, psn=psn)
        _set(buffer, self.bth_at + _size(L.BTH), L.AETH, syndrome=syndrome, msn=msn)
        self._ev(buffer, udp_sport, flow_label, tclass)
        return self.finish(buffer)

    def probe(self, *, dqpn, psn, probe_id, tx_timestamp=0, udp_sport=0xC000, flow_label=0,
              tclass=0b10):
        """RELIABILITY_PROBE_REQUEST (:func:`sim.packets.probe_packet`)."""
        buffer = self._template(("probe",), lambda: pk.probe_packet(
            dqpn=0, psn=0, probe_id=0, **self._underlay()))
        _set(buffer, self.bth_at, L.BTH, dqpn=dqpn, psn=psn)
        _set(buffer, self.bth_at + _size(L.BTH), L.PETH, probe_id=probe_id,
             tx_timestamp=tx_timestamp)
        self._ev(buffer, udp_sport, flow_label, tclass)
        return self.finish(buffer)

    def endpoint(self, opcode, *, request_id, op, dqpn=P.ENDPOINT_QPN, udp_sport=0xC000,
                 flow_label=0, tclass=0b10, **fields):
        """ENDPOINT_REQUEST (ERTH) or ENDPOINT_RESPONSE (EETH), ``request_id`` in the BTH PSN
        (:func:`sim.packets.endpoint_request`, :func:`~sim.packets.endpoint_response`)."""
        request = opcode == P.Opcode.ENDPOINT_REQUEST
        build = pk.endpoint_request if request else pk.endpoint_response
        buffer = self._template((int(opcode),), lambda: build(
            request_id=0, op=P.EndpointOp.EV_PROBE, **self._underlay()))
        _set(buffer, self.bth_at, L.BTH, dqpn=dqpn, psn=request_id)
        _set(buffer, self.bth_at + _size(L.BTH), L.ERTH if request else L.EETH, op=op,
             **fields)
        self._ev(buffer, udp_sport, flow_label, tclass)
        return self.finish(buffer)

    # -- reading and rewriting a frame ---------------------------------------------------------

    def bth(self, frame):
        """The BTH fields of ``frame`` (an untagged frame of this kit's IP version)."""
        return L.BTH.unpack(bytes(frame[self.bth_at:self.bth_at + _size(L.BTH)]))

    def header(self, frame, header):
        """The fields of the first transport header ``header`` of a control frame, or of a
        data frame's METH/TSETH/RETH/ImmDt."""
        opcode = frame[self.bth_at]
        if opcode in P.DATA_OPCODES:
            ts = self.bth(frame)["ts"]
            at = self.data_offsets(opcode, ts)[0][header.name]
        else:
            at = self.bth_at + _size(L.BTH)
            for h in L.CONTROL_HEADERS[P.Opcode(opcode)]:
                if h is header:
                    break
                at += _size(h)
        return header.unpack(bytes(frame[at:at + header.size]))

    def rewrite(self, frame, header, at=None, *, lengths=False, crc=True, **values):
        """``frame`` with fields of ``header`` rewritten (the BTH, the IP header, UDP, or a
        transport header found as :meth:`header` finds it), then the ICRC recomputed unless
        ``crc`` is False."""
        buffer = bytearray(frame)
        if at is None:
            if header is L.BTH:
                at = self.bth_at
            elif header is self.ip_header:
                at = _ETH
            elif header is L.UDP:
                at = self.udp_at
            elif header is L.ETHERNET:
                at = 0
            else:
                opcode = buffer[self.bth_at]
                if opcode in P.DATA_OPCODES:
                    at = self.data_offsets(opcode, self.bth(buffer)["ts"])[0][header.name]
                else:
                    at = self.bth_at + _size(L.BTH)
                    for h in L.CONTROL_HEADERS[P.Opcode(opcode)]:
                        if h is header:
                            break
                        at += _size(h)
        _set(buffer, at, header, **values)
        return self.finish(buffer, lengths=lengths, crc=crc)

    def refit(self, buffer):
        """Lengths and ICRC refitted to a frame whose body changed size."""
        return self.finish(bytearray(buffer))


def add_vlan(frame, tci):
    """``frame`` with an 802.1Q tag (the ICRC does not cover the Ethernet header)."""
    return frame[:12] + P.ETHERTYPE_VLAN.to_bytes(2, "big") + tci.to_bytes(2, "big") + frame[12:]


def srv6_encapsulate(frame, *, dst, segment=None):
    """``frame``'s IP packet inside an outer IPv6 header to ``dst`` (16 bytes), with an SRH of
    one ``segment`` when given (:func:`sim.packets.srv6_encapsulate` on bytes; the ICRC covers
    the inner packet only, so it stands)."""
    inner = frame[_ETH:]
    inner_nh = P.IP_PROTO_IPV6 if inner[0] >> 4 == 6 else P.IP_PROTO_IPV4
    srh = b""
    if segment is not None:
        buffer = bytearray(_size(L.SRH))
        _set(buffer, 0, L.SRH, next_header=inner_nh, hdr_ext_len=2, routing_type=4,
             segments_left=1, last_entry=0,
             segment=int.from_bytes(segment, "big"))
        srh = bytes(buffer)
    outer = bytearray(_size(L.IPV6))
    _set(outer, 0, L.IPV6, version=6, payload_length=len(srh) + len(inner),
         next_header=P.IP_PROTO_ROUTING if srh else inner_nh, hop_limit=64,
         src=(int.from_bytes(bytes(inner[8:24]), "big") if inner_nh == P.IP_PROTO_IPV6
              else int(ipaddress.IPv6Address(defaults.NIC_A.ipv6))),
         dst=int.from_bytes(dst, "big"))
    return (frame[:12] + P.ETHERTYPE_IPV6.to_bytes(2, "big") + bytes(outer) + srh
            + bytes(inner))


# -- the run as the mutator sees it -----------------------------------------------------------

@dataclass
class QpView:
    """One QP pair's PSN space as the bench knows it, conservatively: the requester has
    assigned every PSN below ``posted_end`` to posted work (none at or above it has been sent)
    and every PSN below ``acked_end`` has been acknowledged (the responder's expected PSN is
    at least that). ``rkey``: the MR the traffic writes; ``va``/``length``: its span."""
    qpn: int
    remote_qpn: int
    rkey: int
    va: int
    length: int
    acked_end: int = 0
    posted_end: int = 0
    window: int = 128


@dataclass
class View:
    """What :class:`Mutator` needs from the bench: the QPs by role, the MRs, and recent
    legitimate frames to replay (sent at least ``stale_ns`` before their reuse)."""
    legit: list
    victims: list
    wrong_state: tuple          #: QP indices in RESET or INIT on both NICs
    qps: int                    #: QP table size: any QPN at or above it is unknown
    qpn_bits: int
    mtu: int
    foreign_rkeys: tuple        #: valid MRs of a PD no QP has, and never-registered keys
    legit_rkey: int             #: the responder's MR the live QPs write
    data_frames: deque = field(default_factory=lambda: deque(maxlen=256))
    ack_frames: deque = field(default_factory=lambda: deque(maxlen=256))


# -- the mutants ------------------------------------------------------------------------------

#: Every mutant: name -> (weight, NIC it goes to, what it is). ``b`` gets data and probes,
#: ``a`` acknowledgements (its requesters send to ``b``).
MUTANTS = {
    # frames a parser must drop, built on live-QP frames (never inside their windows)
    "bit_flip": (6, "ab", "1-3 random bits flipped in the ICRC-covered bytes, ICRC kept"),
    "bad_icrc": (4, "ab", "a valid frame with one ICRC byte changed"),
    "truncated": (4, "ab", "cut short anywhere, lengths and ICRC kept"),
    "truncated_refit": (3, "ab", "cut short, IP/UDP lengths and ICRC refitted"),
    "extended": (3, "ab", "random bytes appended, lengths and ICRC kept"),
    "extended_refit": (3, "ab", "bytes inserted before the ICRC, lengths and ICRC refitted"),
    "ip_length": (2, "ab", "IP length off by a few bytes (ICRC recomputed)"),
    "udp_length": (2, "ab", "UDP length off by a few bytes (ICRC recomputed)"),
    "dma_len": (2, "b", "RETH dma_len differs from the payload (ICRC recomputed)"),
    "oversize": (1, "b", "payload over the MTU, every length consistent"),
    "bad_header": (3, "ab", "ethertype, IP version or protocol, UDP port, BTH version or pad "
                            "count wrong (ICRC recomputed)"),
    "unsupported_opcode": (2, "ab", "an opcode MRC does not have (SEND, READ, ATOMIC, RC ...)"),
    "junk": (1, "ab", "random bytes: empty, shorter than an Ethernet header, around the "
                      "Ethernet minimum, around the longest legal frame"),
    # live QPs: what a correct responder or requester drops or answers harmlessly
    "replay_data": (4, "b", "a legitimate data frame sent earlier, again"),
    "duplicate_flood": (0.3, "b", "one legitimate data frame 8 to 32 times"),
    "psn_below": (4, "b", "data for a live QP just below its cumulative PSN (any rkey)"),
    "psn_beyond": (4, "b", "data for a live QP beyond its window (and a margin)"),
    "unknown_qp": (4, "ab", "a QPN at or above the QP table (or its low bits a live QP's)"),
    "wrong_state_qp": (4, "ab", "a QP in RESET or INIT"),
    "probe": (3, "b", "reliability probes (stale ids and timestamps) for live, unknown, "
                      "wrong-state and victim QPs"),
    "stale_ack": (4, "a", "a legitimate SACK or NACK sent earlier, again"),
    "ack_flood": (0.3, "a", "one legitimate SACK 8 to 32 times"),
    "sack_below": (3, "a", "a SACK for a live QP below its cumulative PSN, bitmap below it"),
    "sack_beyond": (3, "a", "a SACK for a live QP beyond the PSNs it sent"),
    "sack_malformed": (2, "a", "a SACK whose BTH PSN and SETH cack_psn differ"),
    "nack_stale": (2, "a", "a NACK (trimmed, out of window, unknown reason) for a PSN a live "
                           "QP does not have outstanding"),
    "nak_stale": (2, "a", "an AETH NAK (any syndrome: fatal codes, others, RNR) or an AETH "
                          "ACK for a PSN a live QP does not have outstanding"),
    "endpoint": (2, "ab", "endpoint requests (EV probes, port status) and responses with "
                          "random ids, ops, masks and timestamps, to the endpoint QP or not"),
    # victim QPs: anything
    "victim_in_window": (5, "b", "data inside a victim's window, valid rkey, in bounds"),
    "victim_bad_rkey": (4, "b", "in-window data with an unregistered rkey, another PD's, or "
                                "a valid rkey of the wrong slot"),
    "victim_out_of_bounds": (4, "b", "in-window data below, across the end of, or far from "
                                     "the victim's MR (up to the top of the address space)"),
    "victim_bad_sequence": (3, "b", "wrong opcodes mid-message: FIRST or MIDDLE not one MTU, "
                                    "a trimmed packet whose dma_len is over the MTU"),
    "victim_wimm_flood": (0.5, "b", "WRITE WITH IMMEDIATE packets above a hole, past max_wimm"),
    "victim_trimmed": (2, "b", "trimmed (trim DSCP) in-window data"),
    "victim_flood": (0.3, "b", "one forged in-window packet 8 to 32 times"),
    "victim_sack": (4, "a", "a forged in-window SACK for a victim (any mark, any bitmap)"),
    "victim_nack": (2, "a", "a forged in-window NACK for a victim"),
    "victim_nak": (2, "a", "a forged in-window fatal NAK for a victim"),
}

#: The mutants a correct parser drops (built on live-QP frames, never inside a window).
PARSER_MUTANTS = frozenset({
    "bit_flip", "bad_icrc", "truncated", "truncated_refit", "extended", "extended_refit",
    "ip_length", "udp_length", "dma_len", "oversize", "bad_header", "unsupported_opcode",
    "junk"})

_DATA = tuple(P.DATA_OPCODES)
_UNSUPPORTED = (0x00, 0x04, 0x06, 0x0A, 0x0C, 0x10, 0x11, 0x12, 0x13, 0x64, 0x81, 0xC0, 0xCC,
                0xD0, 0xDB, 0xDF, 0xFF)


class Mutator:
    """The hostile source: :meth:`next` forges one mutant, ``(name, [(dst, frame), ...])``.

    Parameters
    ----------
    view : View
    seed : int
    ip_version : 4 or 6
    trim_dscp : int
        The DSCP code point that marks trimmed packets.
    wrap : float
        How often a frame the transport should see gets another underlay: an 802.1Q tag, or
        an SRv6 outer header (with or without an SRH).
    """

    def __init__(self, view, *, seed, ip_version=6, trim_dscp=P.DEFAULT_TRIM_DSCP, wrap=0.06):
        self.view = view
        self.wrap = wrap
        self.rng = random.Random(f"mrc-fuzz/{seed}")
        self.to_b = FrameKit(ip_version=ip_version, src=defaults.NIC_A, dst=defaults.NIC_B)
        self.to_a = FrameKit(ip_version=ip_version, src=defaults.NIC_B, dst=defaults.NIC_A)
        self.trim_dscp = trim_dscp
        self.names = list(MUTANTS)
        self.weights = [MUTANTS[name][0] for name in self.names]
        self.counts = dict.fromkeys(self.names, 0)

    # -- helpers ------------------------------------------------------------------------------

    def _ev(self):
        rng = self.rng
        return dict(udp_sport=rng.randrange(0xC000, 0x10000),
                    flow_label=rng.randrange(1 << 20) if self.to_b.ip_version == 6 else 0)

    def _payload(self, rkey, qpn, lo=16, hi=None):
        hi = hi or self.view.mtu
        length = self.rng.choice((0, self.rng.randrange(lo, hi + 1),
                                  self.rng.randrange(lo, min(hi, 256) + 1)))
        return fill(rkey, qpn, length)

    def _forge_data(self, qpn, psn, *, rkey, va, payload, opcode=None, **kw):
        rng = self.rng
        if opcode is None:
            opcode = rng.choice((P.Opcode.RDMA_WRITE_ONLY, P.Opcode.RDMA_WRITE_LAST,
                                 P.Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE,
                                 P.Opcode.RDMA_WRITE_LAST_WITH_IMMEDIATE))
        imm = rng.getrandbits(32) if opcode in P.IMMEDIATE_OPCODES else None
        tx = rng.getrandbits(16) if rng.random() < 0.5 else None
        return self.to_b.data(opcode, dqpn=qpn, psn=psn, va=va, rkey=rkey, payload=payload,
                              imm=imm, tx_timestamp=tx, ackreq=rng.randrange(2),
                              rtx=rng.randrange(2), msn=rng.getrandbits(16),
                              rqmsn=rng.getrandbits(16), **self._ev(), **kw)

    def _live(self):
        return self.rng.choice(self.view.legit)

    def _victim(self):
        return self.rng.choice(self.view.victims)

    def _below(self, qp):
        """A PSN the responder of ``qp`` has certainly passed: just below, or far below."""
        back = 1 + (self.rng.randrange(64) if self.rng.random() < 0.7
                    else self.rng.randrange(1 << 22))
        return psn_add(qp.acked_end, -back)

    def _beyond(self, qp):
        """A PSN a window and :data:`LIVE_MARGIN` beyond anything ``qp``'s requester was given:
        just, or far."""
        ahead = (self.rng.randrange(64) if self.rng.random() < 0.7
                 else self.rng.randrange(1 << 21))
        return psn_add(qp.posted_end, qp.window + LIVE_MARGIN + ahead)

    def _in_window(self, qp):
        """A PSN from just below the victim's acknowledged PSNs to just beyond its window's
        end (both edges included)."""
        span = max(1, psn_diff(qp.posted_end, qp.acked_end)) + qp.window
        return psn_add(qp.acked_end, self.rng.randrange(-4, span + 4))

    def _unknown_qpn(self):
        v = self.view
        if self.rng.random() < 0.5:
            base = self.rng.choice([q.qpn for q in v.legit + v.victims])
            return base | (self.rng.randrange(1, 1 << (24 - v.qpn_bits)) << v.qpn_bits)
        return self.rng.randrange(v.qps, 1 << 24)

    def _live_frame_b(self):
        """A data frame for a live QP that no window can take: a replay, or a forged PSN
        below or beyond, with a signature payload."""
        v = self.view
        if v.data_frames and self.rng.random() < 0.5:
            return self.rng.choice(v.data_frames)
        qp = self._live()
        psn = self._below(qp) if self.rng.random() < 0.5 else self._beyond(qp)
        payload = self._payload(qp.rkey, qp.qpn)
        return self._forge_data(qp.qpn, psn, rkey=qp.rkey, va=qp.va, payload=payload)

    def _live_frame_a(self):
        """An acknowledgement for a live QP that a correct requester ignores."""
        v = self.view
        if v.ack_frames and self.rng.random() < 0.5:
            return self.rng.choice(v.ack_frames)
        return self._sack_below()

    def _base_frame(self, dst):
        return (dst, self._live_frame_b() if dst == "b" else self._live_frame_a())

    def _kit(self, dst):
        return self.to_b if dst == "b" else self.to_a

    def _dst(self, name):
        return self.rng.choice(MUTANTS[name][1])

    # -- parser-level mutants -----------------------------------------------------------------

    def _m_bit_flip(self, dst):
        dst, frame = self._base_frame(dst)
        kit = self._kit(dst)
        buffer = bytearray(frame)
        masked = kit.bth_at + L.BTH.byte_offset("fecn")
        for _ in range(self.rng.randrange(1, 4)):
            # Bytes the ICRC covers and does not mask, from the UDP header on: a correct
            # parser cannot accept the result.
            at = self.rng.randrange(kit.udp_at, len(buffer))
            if at == masked or kit.udp_at + 6 <= at < kit.udp_at + 8:
                at = kit.bth_at
            buffer[at] ^= 1 << self.rng.randrange(8)
        return [(dst, bytes(buffer))]

    def _m_bad_icrc(self, dst):
        dst, frame = self._base_frame(dst)
        buffer = bytearray(frame)
        buffer[-1 - self.rng.randrange(4)] ^= self.rng.randrange(1, 256)
        return [(dst, bytes(buffer))]

    def _m_truncated(self, dst):
        dst, frame = self._base_frame(dst)
        return [(dst, frame[:self.rng.randrange(1, len(frame))])]

    def _m_truncated_refit(self, dst):
        dst, frame = self._base_frame(dst)
        kit = self._kit(dst)
        cut = self.rng.randrange(kit.bth_at + 1, len(frame) - 4)
        return [(dst, kit.refit(frame[:cut] + bytes(4)))]

    def _m_extended(self, dst):
        dst, frame = self._base_frame(dst)
        return [(dst, frame + self.rng.randbytes(self.rng.randrange(1, 64)))]

    def _m_extended_refit(self, dst):
        dst, frame = self._base_frame(dst)
        kit = self._kit(dst)
        extra = self.rng.randbytes(self.rng.randrange(1, 64))
        return [(dst, kit.refit(frame[:-4] + extra + bytes(4)))]

    def _m_ip_length(self, dst):
        dst, frame = self._base_frame(dst)
        kit = self._kit(dst)
        delta = self.rng.choice((-64, -8, -2, -1, 1, 2, 8, 64))
        name = "payload_length" if kit.ip_version == 6 else "total_length"
        length = _get(frame, _ETH, kit.ip_header, name)
        return [(dst, kit.rewrite(frame, kit.ip_header, **{name: (length + delta) & 0xFFFF}))]

    def _m_udp_length(self, dst):
        dst, frame = self._base_frame(dst)
        kit = self._kit(dst)
        delta = self.rng.choice((-64, -8, -2, -1, 1, 2, 8, 64))
        length = _get(frame, kit.udp_at, L.UDP, "length")
        return [(dst, kit.rewrite(frame, L.UDP, length=(length + delta) & 0xFFFF))]

    def _m_dma_len(self, dst):
        frame = self._live_frame_b()
        dma_len = self.to_b.header(frame, L.RETH)["dma_len"]
        wrong = self.rng.choice((dma_len + 1, dma_len - 1, 0, dma_len + 16, 1 << 31,
                                 self.rng.getrandbits(32))) & 0xFFFFFFFF
        if wrong == dma_len:
            wrong ^= 1
        return [("b", self.to_b.rewrite(frame, L.RETH, dma_len=wrong))]

    def _m_oversize(self, dst):
        qp = self._live()
        psn = self._below(qp)
        payload = fill(qp.rkey, qp.qpn, self.view.mtu + self.rng.choice((1, 4, 64, 100)))
        return [("b", self._forge_data(qp.qpn, psn, rkey=qp.rkey, va=qp.va, payload=payload))]

    def _m_bad_header(self, dst):
        dst, frame = self._base_frame(dst)
        kit = self._kit(dst)
        rng = self.rng
        choice = rng.randrange(6)
        if choice == 0:
            ethertype = rng.choice((0x0806, 0x88CC, 0x8847, 0x9000, P.ETHERTYPE_IPV4
                                    if kit.ip_version == 6 else P.ETHERTYPE_IPV6))
            return [(dst, kit.rewrite(frame, L.ETHERNET, ethertype=ethertype))]
        if choice == 1:
            version = rng.choice([v for v in range(16) if v != kit.ip_version])
            return [(dst, kit.rewrite(frame, kit.ip_header, version=version))]
        if choice == 2:
            proto = rng.choice((6, 1, 58, 0, 255))
            name = "next_header" if kit.ip_version == 6 else "protocol"
            return [(dst, kit.rewrite(frame, kit.ip_header, **{name: proto}))]
        if choice == 3:
            port = rng.choice((4790, 4792, 0, 53, 0xFFFF))
            return [(dst, kit.rewrite(frame, L.UDP, dport=port))]
        if choice == 4:
            return [(dst, kit.rewrite(frame, L.BTH, version=rng.randrange(1, 16)))]
        return [(dst, kit.rewrite(frame, L.BTH, padcount=rng.randrange(1, 4)))]

    def _m_junk(self, dst):
        rng = self.rng
        longest = 174 + self.view.mtu
        length = rng.choice((0, rng.randrange(1, 14), rng.randrange(14, 100), 60,
                             rng.randrange(longest - 8, longest + 64), 2 * longest))
        frame = bytearray(rng.randbytes(length))
        if length >= 14 and rng.random() < 0.5:
            # Most past the ethertype check, so the later checks see random headers.
            frame[12:14] = rng.choice((P.ETHERTYPE_IPV6, P.ETHERTYPE_IPV4,
                                       P.ETHERTYPE_VLAN)).to_bytes(2, "big")
        return [(self._dst("junk"), bytes(frame))]

    def _m_unsupported_opcode(self, dst):
        dst, frame = self._base_frame(dst)
        kit = self._kit(dst)
        return [(dst, kit.rewrite(frame, L.BTH, opcode=self.rng.choice(_UNSUPPORTED)))]

    # -- live QPs -----------------------------------------------------------------------------

    def _m_replay_data(self, dst):
        if not self.view.data_frames:
            return self._m_psn_below(dst)
        return [("b", self.rng.choice(self.view.data_frames))]

    def _m_duplicate_flood(self, dst):
        frame = (self.rng.choice(self.view.data_frames) if self.view.data_frames
                 else self._m_psn_below(dst)[0][1])
        return [("b", frame)] * self.rng.randrange(8, 33)

    def _m_psn_below(self, dst):
        qp = self._live()
        rkey = self.rng.choice((qp.rkey, qp.rkey, *self.view.foreign_rkeys))
        va = qp.va if self.rng.random() < 0.7 else self.rng.getrandbits(64)
        opcode = self.rng.choice(_DATA)
        payload = (fill(rkey, qp.qpn, self.view.mtu)
                   if opcode in (P.Opcode.RDMA_WRITE_FIRST, P.Opcode.RDMA_WRITE_MIDDLE)
                   else self._payload(rkey, qp.qpn))
        return [("b", self._forge_data(qp.qpn, self._below(qp), rkey=rkey, va=va,
                                       payload=payload, opcode=opcode))]

    def _m_psn_beyond(self, dst):
        qp = self._live()
        rkey = self.rng.choice((qp.rkey, qp.rkey, *self.view.foreign_rkeys))
        return [("b", self._forge_data(qp.qpn, self._beyond(qp), rkey=rkey, va=qp.va,
                                       payload=self._payload(rkey, qp.qpn)))]

    def _m_unknown_qp(self, dst):
        return self._odd_qp(self._dst("unknown_qp"), self._unknown_qpn())

    def _m_wrong_state_qp(self, dst):
        return self._odd_qp(self._dst("wrong_state_qp"), self.rng.choice(self.view.wrong_state))

    def _odd_qp(self, dst, qpn):
        rng = self.rng
        psn = rng.getrandbits(24)
        if dst == "b":
            rkey = rng.choice((self.view.legit_rkey, *self.view.foreign_rkeys))
            return [("b", self._forge_data(qpn, psn, rkey=rkey, va=rng.getrandbits(64),
                                           payload=self._payload(rkey, qpn)))]
        kind = rng.randrange(3)
        if kind == 0:
            frame = self.to_a.sack(dqpn=qpn, cack_psn=psn, sack_psn_offset=1,
                                   sack_bitmap=rng.getrandbits(64), **self._ev())
        elif kind == 1:
            frame = self.to_a.nack(dqpn=qpn, nack_psn=psn,
                                   nack_reason=rng.choice(list(P.NackReason)), **self._ev())
        else:
            frame = self.to_a.aeth(dqpn=qpn, psn=psn, syndrome=self._syndrome(), **self._ev())
        return [("a", frame)]

    def _m_probe(self, dst):
        v = self.view
        rng = self.rng
        qpn = rng.choice((self._live().qpn, self._victim().qpn, self._unknown_qpn(),
                          rng.choice(v.wrong_state)))
        return [("b", self.to_b.probe(dqpn=qpn, psn=rng.getrandbits(24),
                                      probe_id=rng.getrandbits(16),
                                      tx_timestamp=rng.getrandbits(16), **self._ev()))]

    def _m_endpoint(self, dst):
        rng = self.rng
        dst = self._dst("endpoint")
        kit = self._kit(dst)
        dqpn = P.ENDPOINT_QPN if rng.random() < 0.8 else rng.getrandbits(24)
        op = rng.randrange(4)
        if rng.random() < 0.5:
            frame = kit.endpoint(P.Opcode.ENDPOINT_REQUEST, request_id=rng.getrandbits(16),
                                 op=op, dqpn=dqpn, port_status_mask=rng.getrandbits(32),
                                 tx_timestamp=rng.getrandbits(16), tsr=rng.randrange(2),
                                 ftype=rng.randrange(16), **self._ev())
        else:
            frame = kit.endpoint(P.Opcode.ENDPOINT_RESPONSE, request_id=rng.getrandbits(16),
                                 op=op, dqpn=dqpn, tx_timestamp=rng.getrandbits(16),
                                 **self._ev())
        return [(dst, frame)]

    def _m_stale_ack(self, dst):
        if not self.view.ack_frames:
            return [("a", self._sack_below())]
        return [("a", self.rng.choice(self.view.ack_frames))]

    def _m_ack_flood(self, dst):
        frame = (self.rng.choice(self.view.ack_frames) if self.view.ack_frames
                 else self._sack_below())
        return [("a", frame)] * self.rng.randrange(8, 33)

    def _sack_below(self):
        qp = self._live()
        rng = self.rng
        cack = self._below(qp)
        offset = rng.choice((1, 1, rng.randrange(-64, 65), -rng.randrange(1 << 15)))
        base = psn_add(cack, offset)
        bitmap = rng.getrandbits(64)
        # Only bits for PSNs already acknowledged: the SACK must not tell anything new.
        for bit in range(64):
            if psn_diff(psn_add(base, bit), qp.acked_end) >= 0:
                bitmap &= ~(1 << bit)
        return self.to_a.sack(dqpn=qp.remote_qpn, cack_psn=cack,
                              ack_psn_offset=rng.randrange(-(1 << 15), 1 << 15),
                              sack_psn_offset=offset, sack_bitmap=bitmap,
                              pr=rng.randrange(2), mpr=rng.randrange(256),
                              entropy=rng.getrandbits(32),
                              cc_state={"tx_timestamp": rng.getrandbits(16),
                                        "ooo_count": rng.getrandbits(15),
                                        "rcvd_bytes": rng.getrandbits(24)}, **self._ev())

    def _m_sack_below(self, dst):
        return [("a", self._sack_below())]

    def _m_sack_beyond(self, dst):
        qp = self._live()
        rng = self.rng
        return [("a", self.to_a.sack(dqpn=qp.remote_qpn, cack_psn=self._beyond(qp),
                                     sack_psn_offset=1, sack_bitmap=rng.getrandbits(64),
                                     ack_psn_offset=rng.randrange(-64, 64), **self._ev()))]

    def _m_sack_malformed(self, dst):
        qp = self._live()
        rng = self.rng
        cack = psn_add(qp.acked_end, rng.randrange(-8, qp.window))
        bth_psn = psn_add(cack, rng.choice((1, -1, 2, 1 << 12)))
        return [("a", self.to_a.sack(dqpn=qp.remote_qpn, cack_psn=cack, bth_psn=bth_psn,
                                     sack_psn_offset=1, sack_bitmap=rng.getrandbits(64),
                                     **self._ev()))]

    def _not_outstanding(self, qp):
        return self._below(qp) if self.rng.random() < 0.5 else self._beyond(qp)

    def _m_nack_stale(self, dst):
        qp = self._live()
        reason = self.rng.choice((P.NackReason.TRIMMED, P.NackReason.PSN_OOR_WINDOW,
                                  *list(P.NackReason), 0x55))
        return [("a", self.to_a.nack(dqpn=qp.remote_qpn, nack_psn=self._not_outstanding(qp),
                                     nack_reason=int(reason), **self._ev()))]

    def _syndrome(self):
        rng = self.rng
        return rng.choice((P.AETH_ACK, P.nak_syndrome(rng.choice(list(P.NakCode))),
                           P.AETH_NAK_BASE | rng.randrange(32), 0x20 | rng.randrange(32),
                           rng.randrange(256)))

    def _m_nak_stale(self, dst):
        qp = self._live()
        rng = self.rng
        syndrome = self._syndrome()
        return [("a", self.to_a.aeth(dqpn=qp.remote_qpn, psn=self._not_outstanding(qp),
                                     syndrome=syndrome, msn=rng.getrandbits(24),
                                     **self._ev()))]

    # -- victims ------------------------------------------------------------------------------

    def _victim_data(self, qp, *, rkey=None, va=None, opcode=None, payload=None, **kw):
        rng = self.rng
        rkey = qp.rkey if rkey is None else rkey
        if payload is None:
            payload = self._payload(rkey, qp.qpn, hi=min(self.view.mtu, qp.length))
        if va is None:
            va = qp.va + rng.randrange(0, max(1, qp.length - len(payload) + 1))
        return self._forge_data(qp.qpn, self._in_window(qp), rkey=rkey, va=va,
                                payload=payload, opcode=opcode, **kw)

    def _m_victim_in_window(self, dst):
        return [("b", self._victim_data(self._victim()))]

    def _m_victim_bad_rkey(self, dst):
        qp = self._victim()
        rng = self.rng
        rkey = rng.choice((*self.view.foreign_rkeys, self.view.legit_rkey,
                           qp.rkey ^ (1 << rng.randrange(4, 32)), qp.rkey ^ 1,
                           rng.getrandbits(32)))
        if rkey == qp.rkey:
            rkey ^= 1 << 31
        return [("b", self._victim_data(qp, rkey=rkey))]

    def _m_victim_out_of_bounds(self, dst):
        qp = self._victim()
        rng = self.rng
        payload = fill(qp.rkey, qp.qpn, rng.randrange(16, self.view.mtu + 1))
        n = len(payload)
        va = rng.choice((qp.va - rng.randrange(1, 4096),              # below the base
                         qp.va - rng.randrange(1, n),                  # straddling the base
                         qp.va + qp.length - n + rng.randrange(1, n),  # across the end
                         qp.va + qp.length,                            # just past it
                         (1 << 64) - rng.randrange(1, n),              # wrapping 2**64
                         rng.getrandbits(64))) & ((1 << 64) - 1)
        if qp.va <= va and va + n <= qp.va + qp.length:
            va = qp.va + qp.length
        return [("b", self._victim_data(qp, va=va, payload=payload))]

    def _m_victim_bad_sequence(self, dst):
        qp = self._victim()
        rng = self.rng
        mtu = self.view.mtu
        if rng.random() < 0.3:
            # A trimmed packet keeps its original dma_len and carries no payload: only the
            # responder's length rule can refuse one claiming more than the MTU.
            frame = self._victim_data(qp, opcode=P.Opcode.RDMA_WRITE_MIDDLE, payload=b"")
            frame = self.to_b.rewrite(frame, L.RETH, dma_len=mtu + rng.randrange(1, 1 << 16))
            return [("b", self._trim(frame))]
        opcode = rng.choice((P.Opcode.RDMA_WRITE_FIRST, P.Opcode.RDMA_WRITE_MIDDLE))
        length = rng.choice((0, 16, mtu - 16, rng.randrange(16, mtu)))
        return [("b", self._victim_data(qp, opcode=opcode,
                                        payload=fill(qp.rkey, qp.qpn, length)))]

    def _m_victim_wimm_flood(self, dst):
        qp = self._victim()
        start = psn_add(self._in_window(qp), 2)
        frames = []
        for k in range(self.rng.randrange(4, 12)):
            payload = fill(qp.rkey, qp.qpn, 16)
            frames.append(("b", self._forge_data(
                qp.qpn, psn_add(start, k), rkey=qp.rkey, va=qp.va, payload=payload,
                opcode=P.Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE)))
        return frames

    def _trim(self, frame):
        """What a trimming switch makes of ``frame``: headers only, trim DSCP, lengths
        refitted, ICRC field zero (:func:`sim.packets.trim`, done on bytes)."""
        kit = self.to_b
        opcode = frame[kit.bth_at]
        _, end = kit.data_offsets(opcode, kit.bth(frame)["ts"])
        buffer = bytearray(frame[:end] + bytes(4))
        tclass = (self.trim_dscp << 2) | 0b10
        if kit.ip_version == 6:
            _set(buffer, _ETH, L.IPV6, tclass=tclass)
        else:
            _set(buffer, _ETH, L.IPV4, tos=tclass)
        return kit.finish(buffer, crc=False)

    def _m_victim_trimmed(self, dst):
        return [("b", self._trim(self._victim_data(self._victim())))]

    def _m_victim_flood(self, dst):
        frame = self._victim_data(self._victim())
        return [("b", frame)] * self.rng.randrange(8, 33)

    def _m_victim_sack(self, dst):
        qp = self._victim()
        rng = self.rng
        return [("a", self.to_a.sack(
            dqpn=qp.remote_qpn, cack_psn=self._in_window(qp),
            sack_psn_offset=rng.choice((1, 1, rng.randrange(-128, 129))),
            sack_bitmap=rng.getrandbits(64), ack_psn_offset=rng.randrange(-64, 64),
            m=rng.choice((0, 0, 0, 1, 2, 3)), pr=int(rng.random() < 0.2), **self._ev()))]

    def _m_victim_nack(self, dst):
        qp = self._victim()
        reason = self.rng.choice((P.NackReason.TRIMMED, P.NackReason.PSN_OOR_WINDOW))
        return [("a", self.to_a.nack(dqpn=qp.remote_qpn, nack_psn=self._in_window(qp),
                                     nack_reason=int(reason), **self._ev()))]

    def _m_victim_nak(self, dst):
        qp = self._victim()
        syndrome = (P.nak_syndrome(self.rng.choice(list(P.NakCode)))
                    if self.rng.random() < 0.7 else self._syndrome())
        return [("a", self.to_a.aeth(dqpn=qp.remote_qpn, psn=self._in_window(qp),
                                     syndrome=syndrome, **self._ev()))]

    # -- the source ---------------------------------------------------------------------------

    def _wrap(self, frame):
        """Now and then a frame's underlay as another sender may build it: an 802.1Q tag,
        or the IP packet inside an SRv6 outer header (with an SRH or not). Neither changes
        what the frame means to the transport."""
        rng = self.rng
        roll = rng.random()
        if roll < self.wrap / 2:
            return add_vlan(frame, rng.getrandbits(16))
        if roll < self.wrap:
            segment = rng.randbytes(16) if rng.random() < 0.5 else None
            return srv6_encapsulate(frame, dst=rng.randbytes(16), segment=segment)
        return frame

    def next(self, name=None):
        """One mutant: ``(name, [(dst, frame), ...])``; ``name`` forces the kind."""
        if name is None:
            name = self.rng.choices(self.names, self.weights)[0]
        frames = getattr(self, f"_m_{name}")(self._dst(name))
        if frames and name not in PARSER_MUTANTS:
            wrapped = self._wrap(frames[0][1])
            if wrapped is not frames[0][1]:
                frames = [(dst, wrapped) for dst, _ in frames]
        self.counts[name] += len(frames)
        return name, frames
