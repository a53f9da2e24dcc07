"""Builders of MRC 1.0 packets, with the Scapy layers of :mod:`sim.packets`.

The NIC does not send these yet (it speaks the project's current format, see
``docs/wire-format.md``); they are here for the conformance test, the dissector test and
whoever checks an MRC 1.0 capture. Field names are the specification's; every builder takes
the underlay keywords of :func:`sim.packets.data_packet` (``ip_version``, ``src``, ``dst``,
``udp_sport``, ``flow_label``, ``dscp``, ``ecn``, ``hop_limit``, ``vlan``).
"""

from scapy.packet import Raw

from hdl import protocol as P

from .packets import (
    AETH,
    BTH,
    CC_STATE,
    EETH,
    ERTH,
    METH,
    NETH,
    PETH,
    RETH,
    SETH,
    TSETH,
    ImmDt,
    _common,
    _reject_unknown,
    _underlay,
    bth_resv7,
)

__all__ = [
    "data_packet", "ack_packet", "sack_packet", "nack_packet", "probe_packet",
    "endpoint_request", "endpoint_response", "sample_packets",
]


def _names(layer):
    return {f.name for f in layer.fields_desc}


def _bth(opcode, *, dqpn, psn, ackreq=0, rtx=False, ts=False):
    return BTH(opcode=int(opcode), dqpn=dqpn, psn=psn, ackreq=ackreq,
               resv7=bth_resv7(rtx=rtx, ts=ts))


def data_packet(opcode, *, dqpn, psn, va, rkey, payload=b"", dma_len=None, imm=None,
                rqmsn=0, msn=0, rtx=False, tseth=None, ackreq=0, **kw):
    """An MRC 1.0 RDMA WRITE: BTH / METH / [TSETH] / RETH / [ImmDt] / payload / ICRC.

    ``tseth``: a dict of TSETH fields (``tx_timestamp``, ``tsr``, ``ftype``); with it BTH.ts is
    set. ``rtx`` sets BTH.rtx.
    """
    opcode = P.Mrc10Opcode(opcode)
    if opcode not in P.MRC10_DATA_OPCODES:
        raise ValueError(f"{opcode.name} is not an MRC 1.0 data opcode")
    if (opcode in P.MRC10_IMMEDIATE_OPCODES) != (imm is not None):
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
    return (under / _bth(P.Mrc10Opcode.ACKNOWLEDGE, dqpn=dqpn, psn=psn)
            / AETH(syndrome=syndrome, msn=msn))


def sack_packet(*, dqpn, cack_psn, cc_state=None, **fields):
    """RELIABILITY_SACK: BTH (psn = cack_psn) / SETH / CC_STATE / ICRC.

    ``fields`` are SETH fields (and underlay keywords); ``cc_state`` a dict of CC_STATE fields.
    """
    seth = {f: fields.pop(f) for f in list(fields) if f in _names(SETH)}
    under = _underlay(**_common(fields))
    _reject_unknown(fields)
    return (under / _bth(P.Mrc10Opcode.RELIABILITY_SACK, dqpn=dqpn, psn=cack_psn)
            / SETH(cack_psn=cack_psn, **seth) / CC_STATE(**(cc_state or {})))


def nack_packet(*, dqpn, nack_psn, nack_reason, **fields):
    """RELIABILITY_NACK: BTH (psn = nack_psn) / NETH / ICRC."""
    neth = {f: fields.pop(f) for f in list(fields) if f in _names(NETH)}
    under = _underlay(**_common(fields))
    _reject_unknown(fields)
    return (under / _bth(P.Mrc10Opcode.RELIABILITY_NACK, dqpn=dqpn, psn=nack_psn)
            / NETH(nack_psn=nack_psn, nack_reason=int(P.Mrc10NackReason(nack_reason)), **neth))


def probe_packet(*, dqpn, psn, probe_id, **fields):
    """RELIABILITY_PROBE_REQUEST: BTH / PETH / ICRC (answered by a SACK with pr = 1)."""
    peth = {f: fields.pop(f) for f in list(fields) if f in _names(PETH)}
    under = _underlay(**_common(fields))
    _reject_unknown(fields)
    return (under / _bth(P.Mrc10Opcode.RELIABILITY_PROBE_REQUEST, dqpn=dqpn, psn=psn)
            / PETH(probe_id=probe_id, **peth))


def endpoint_request(*, request_id, op, dqpn=P.MRC10_ENDPOINT_QPN, **fields):
    """ENDPOINT_REQUEST: BTH (psn[15:0] = ``request_id``) / ERTH / ICRC."""
    erth = {f: fields.pop(f) for f in list(fields) if f in _names(ERTH)}
    under = _underlay(**_common(fields))
    _reject_unknown(fields)
    return (under / _bth(P.Mrc10Opcode.ENDPOINT_REQUEST, dqpn=dqpn, psn=request_id & 0xFFFF)
            / ERTH(op=int(P.Mrc10EndpointOp(op)), **erth))


def endpoint_response(*, dqpn, request_id, op, **fields):
    """ENDPOINT_RESPONSE: BTH (psn[15:0] echoes ``request_id``) / EETH / ICRC."""
    eeth = {f: fields.pop(f) for f in list(fields) if f in _names(EETH)}
    under = _underlay(**_common(fields))
    _reject_unknown(fields)
    return (under / _bth(P.Mrc10Opcode.ENDPOINT_RESPONSE, dqpn=dqpn, psn=request_id & 0xFFFF)
            / EETH(op=int(P.Mrc10EndpointOp(op)), **eeth))


def sample_packets():
    """One packet of every MRC 1.0 type, ``(name, packet)`` pairs, every field non-zero
    where it is not reserved."""
    payload = bytes(range(48))
    common = dict(dqpn=0x22, va=0x1_0000_0000, rkey=0xBEEF, payload=payload)
    out = []
    for n, opcode in enumerate(sorted(P.MRC10_DATA_OPCODES)):
        imm = 0x1000_0000 + n if opcode in P.MRC10_IMMEDIATE_OPCODES else None
        tseth = (dict(tx_timestamp=0x1234 + n, tsr=1, ftype=int(P.Mrc10Ftype.TIMESTAMP))
                 if n % 2 else None)
        out.append((f"mrc10_{opcode.name.lower()}", data_packet(
            opcode, psn=0x300 + n, imm=imm, rqmsn=0x10 + n, msn=0x20 + n, rtx=n == 3,
            tseth=tseth, ackreq=int(n == 5), **common)))
    out.append(("mrc10_acknowledge", ack_packet(dqpn=0x11, psn=0x305, msn=3)))
    out.append(("mrc10_sack", sack_packet(
        dqpn=0x11, cack_psn=0x302, m=int(P.Mrc10SackMark.SKIP_ONCE), ack_psn_offset=-2 + 5,
        entropy=0xC003_0000, spdcid=0x0101, dpdcid=0x0202, cc_type=3, cc_flags=5, mpr=4,
        sack_psn_offset=1, sack_bitmap=0b1011,
        cc_state=dict(tx_timestamp=0x1235, ooo_count=3, restore_cwnd=1, rcv_cwnd_pen=9,
                      rcvd_bytes=0x1_2345))))
    out.append(("mrc10_sack_probe_answer", sack_packet(
        dqpn=0x11, cack_psn=0x305, pr=1, ack_psn_offset=0x0777)))
    out.append(("mrc10_nack", nack_packet(
        dqpn=0x11, nack_psn=0x304, nack_reason=P.Mrc10NackReason.TRIMMED, vendor_info=0x5A,
        entropy=0xC004, spdcid=0x0101, dpdcid=0x0202, cc_type=2, cc_flags=1,
        tx_timestamp=0x1238)))
    out.append(("mrc10_probe", probe_packet(
        dqpn=0x22, psn=0x306, probe_id=0x0777, vendor_info=0x3C, spdcid=0x0101,
        dpdcid=0x0202, tx_timestamp=0x4321, tsr=1, ftype=int(P.Mrc10Ftype.TIMESTAMP))))
    out.append(("mrc10_endpoint_request", endpoint_request(
        request_id=0xABCD, op=P.Mrc10EndpointOp.EV_PROBE, vendor_info=0x11,
        port_status_mask=0x0000_00FF, tx_timestamp=0x5555, tsr=1,
        ftype=int(P.Mrc10Ftype.TIMESTAMP))))
    out.append(("mrc10_endpoint_response", endpoint_response(
        dqpn=0x11, request_id=0xABCD, op=P.Mrc10EndpointOp.EV_PROBE, tx_timestamp=0x5555)))
    return out
