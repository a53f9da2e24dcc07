"""One packet of every type this NIC sends or accepts, with documented field values.

``mrc-nic pcap-sample OUT.pcap`` writes :func:`sample_packets` in this order; the table in
``docs/wire-format.md`` ("Sample capture") is :func:`sample_table`, and a test keeps the two
equal. Packets are addressed to the default set-up (:mod:`sim.defaults`): NIC A's QP
``QPN_A`` writes into NIC B's memory region (``MR_RKEY`` at ``MR_BASE``) through QP ``QPN_B``.
"""

from dataclasses import dataclass

from hdl import protocol as P

from . import defaults as D
from . import packets as pk

SAMPLE_PAYLOAD_BYTES = 64


def sample_payload(seed, length=SAMPLE_PAYLOAD_BYTES):
    """A recognizable payload: bytes ``seed, seed+1, ...`` modulo 256."""
    return bytes((seed + i) % 256 for i in range(length))


@dataclass(frozen=True)
class Sample:
    name: str
    description: str
    packet: object


def _tseth(tx_timestamp):
    """The TSETH every data packet of this NIC carries."""
    return dict(tx_timestamp=tx_timestamp, tsr=0, ftype=int(P.Ftype.TIMESTAMP))


def _data(ip_version, name, opcode, psn, index, msn=0, rqmsn=0, **kw):
    imm = 0x1000_0000 + psn if opcode in P.IMMEDIATE_OPCODES else None
    payload = sample_payload(psn & 0xFF)
    va = D.MR_BASE + index * SAMPLE_PAYLOAD_BYTES
    desc = (f"{P.Opcode(opcode).name}, psn {psn:#x}, msn {msn}, rqmsn {rqmsn}, va {va:#x}, "
            f"{len(payload)} B" + (f", imm {imm:#x}" if imm is not None else ""))
    pkt = pk.data_packet(opcode, dqpn=D.QPN_B, psn=psn, va=va, rkey=D.MR_RKEY, payload=payload,
                         imm=imm, msn=msn, rqmsn=rqmsn, tseth=_tseth(125 * (index + 1)),
                         udp_sport=0xC000 + index, ip_version=ip_version, **kw)
    return Sample(name, desc, pkt)


def sample_packets():
    """Every sample, in capture order."""
    samples = []
    message = [P.Opcode.RDMA_WRITE_FIRST, P.Opcode.RDMA_WRITE_MIDDLE,
               P.Opcode.RDMA_WRITE_LAST]
    for ip_version in (6, 4):
        v = f"ipv{ip_version}"
        base = D.INITIAL_PSN + (0 if ip_version == 6 else 0x100)
        opcodes = [P.Opcode.RDMA_WRITE_ONLY, P.Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE,
                   *message, P.Opcode.RDMA_WRITE_FIRST, P.Opcode.RDMA_WRITE_LAST_WITH_IMMEDIATE]
        names = ["write_only", "write_only_imm", "write_first", "write_middle", "write_last",
                 "write_first_2", "write_last_imm"]
        # Messages: 0 (only), 1 (only, imm), 2 (first/middle/last), 3 (first/last imm).
        msns = [0, 1, 2, 2, 2, 3, 3]
        rqmsns = [0, 0, 1, 1, 1, 1, 1]
        for index, (name, opcode) in enumerate(zip(names, opcodes, strict=True)):
            samples.append(_data(ip_version, f"{name}_{v}", opcode, base + index, index,
                                 msn=msns[index], rqmsn=rqmsns[index]))
        samples.append(Sample(
            f"sack_{v}", "SACK: cack_psn 0x104, triggered by psn 0x108 (ack_psn_offset 4), "
            "bitmap from 0x105: PSNs 0x106 and 0x108, m SKIP_ONCE (CE), CC_STATE echoes "
            "tx_timestamp 750, 6144 bytes received, 2 held out of order",
            pk.sack_packet(dqpn=D.QPN_A, cack_psn=0x104, m=int(P.SackMark.SKIP_ONCE),
                           ack_psn_offset=4, entropy=0xC005, mpr=2, sack_psn_offset=1,
                           sack_bitmap=0b1010,
                           cc_state=dict(tx_timestamp=750, ooo_count=2, rcvd_bytes=6144),
                           src=D.NIC_B, dst=D.NIC_A, ip_version=ip_version,
                           udp_sport=0xC005)))
    samples.append(Sample(
        "sack_block", "SACK: cack_psn 0x104, bitmap of the 64-aligned block from 0x140 "
        "(sack_psn_offset 0x3c): PSN 0x141",
        pk.sack_packet(dqpn=D.QPN_A, cack_psn=0x104, ack_psn_offset=0x3D, entropy=0xC007,
                       mpr=2, sack_psn_offset=0x3C, sack_bitmap=0b10,
                       cc_state=dict(tx_timestamp=875, ooo_count=3, rcvd_bytes=6208),
                       src=D.NIC_B, dst=D.NIC_A, udp_sport=0xC007)))
    samples.append(Sample(
        "sack_probe_answer", "SACK with pr = 1 answering reliability probe 0x77: cack_psn "
        "0x104, CC_STATE echoes the PETH tx_timestamp 1000",
        pk.sack_packet(dqpn=D.QPN_A, cack_psn=0x104, pr=1, ack_psn_offset=0x77,
                       entropy=0xC009, mpr=2, sack_psn_offset=1,
                       cc_state=dict(tx_timestamp=1000, rcvd_bytes=6208),
                       src=D.NIC_B, dst=D.NIC_A, udp_sport=0xC009)))
    for reason in (P.NackReason.TRIMMED, P.NackReason.PSN_OOR_WINDOW):
        samples.append(Sample(
            f"nack_{reason.name.lower()}", f"NACK {reason.name} for psn 0x105",
            pk.nack_packet(dqpn=D.QPN_A, nack_psn=0x105, nack_reason=reason, entropy=0xC006,
                           tx_timestamp=875, src=D.NIC_B, dst=D.NIC_A, udp_sport=0xC006)))
    for code in P.NakCode:
        samples.append(Sample(
            f"nak_{code.name.lower()}", f"AETH NAK {code.name} (syndrome "
            f"{P.nak_syndrome(code):#04x}) for psn 0x105, msn 2",
            pk.nak_packet(code, dqpn=D.QPN_A, psn=0x105, msn=2, src=D.NIC_B, dst=D.NIC_A,
                          udp_sport=0xC006)))
    samples.append(Sample(
        "reliability_probe", "reliability probe 0x77 from QP QPN_A (consumes no PSN), "
        "tx_timestamp 1000",
        pk.probe_packet(dqpn=D.QPN_B, psn=0x105, probe_id=0x77, tx_timestamp=1000,
                        ftype=int(P.Ftype.TIMESTAMP), udp_sport=0xC009)))
    samples.append(Sample(
        "ev_probe_request", "EV probe 0x77 to the endpoint QP, tx_timestamp 1000",
        pk.endpoint_request(request_id=0x77, op=P.EndpointOp.EV_PROBE, tx_timestamp=1000,
                            ftype=int(P.Ftype.TIMESTAMP), udp_sport=0xC009)))
    samples.append(Sample(
        "ev_probe_response", "answer to EV probe 0x77, tx_timestamp 1000 echoed",
        pk.endpoint_response(request_id=0x77, op=P.EndpointOp.EV_PROBE, tx_timestamp=1000,
                             src=D.NIC_B, dst=D.NIC_A, udp_sport=0xC009)))
    write = _data(6, "", P.Opcode.RDMA_WRITE_ONLY, D.INITIAL_PSN + 0x10, 10)
    samples.append(Sample(
        "trimmed", f"WRITE ONLY psn {D.INITIAL_PSN + 0x10:#x} trimmed by a switch: DSCP "
        f"{P.DEFAULT_TRIM_DSCP}, payload gone, RETH.dma_len still 64",
        pk.trim(write.packet)))
    samples.append(Sample(
        "retransmission", f"WRITE ONLY psn {D.INITIAL_PSN + 0x10:#x} again, BTH.rtx set",
        pk.data_packet(P.Opcode.RDMA_WRITE_ONLY, dqpn=D.QPN_B, psn=D.INITIAL_PSN + 0x10,
                       va=D.MR_BASE + 10 * SAMPLE_PAYLOAD_BYTES, rkey=D.MR_RKEY,
                       payload=sample_payload(0x10), tseth=_tseth(2500), rtx=True,
                       udp_sport=0xC00B)))
    samples.append(Sample(
        "ecn_ce", "WRITE ONLY psn 0x120 marked ECN CE by a switch",
        pk.data_packet(P.Opcode.RDMA_WRITE_ONLY, dqpn=D.QPN_B, psn=0x120,
                       va=D.MR_BASE, rkey=D.MR_RKEY, payload=sample_payload(0x20),
                       ecn=P.ECN_CE, tseth=_tseth(1500), udp_sport=0xC00C)))
    samples.append(Sample(
        "stev", "WRITE ONLY psn 0x121 with an STEV EV: flow label 0xabcde, UDP source port 0xc123",
        pk.data_packet(P.Opcode.RDMA_WRITE_ONLY, dqpn=D.QPN_B, psn=0x121, va=D.MR_BASE,
                       rkey=D.MR_RKEY, payload=sample_payload(0x21), tseth=_tseth(1625),
                       flow_label=0xABCDE, udp_sport=0xC123)))
    samples.append(Sample(
        "vlan", "WRITE ONLY psn 0x122 with an 802.1Q tag, VLAN 100",
        pk.data_packet(P.Opcode.RDMA_WRITE_ONLY, dqpn=D.QPN_B, psn=0x122, va=D.MR_BASE,
                       rkey=D.MR_RKEY, payload=sample_payload(0x22), tseth=_tseth(1750),
                       vlan=100)))
    inner = pk.data_packet(P.Opcode.RDMA_WRITE_ONLY, dqpn=D.QPN_B, psn=0x123, va=D.MR_BASE,
                           rkey=D.MR_RKEY, payload=sample_payload(0x23), tseth=_tseth(1875))
    samples.append(Sample(
        "srv6", "WRITE ONLY psn 0x123 in SRv6: outer destination fc00:0:1:2:3:4:5:6",
        pk.srv6_encapsulate(inner, dst="fc00:0:1:2:3:4:5:6")))
    samples.append(Sample(
        "srv6_srh", "WRITE ONLY psn 0x123 in SRv6 with an SRH: destination fc00:0:1:2:3:4:5:6, "
        "segment fc00:0:7:8:9:a:b:c",
        pk.srv6_encapsulate(inner, dst="fc00:0:1:2:3:4:5:6", segment="fc00:0:7:8:9:a:b:c")))
    samples.append(Sample(
        "no_tseth", "WRITE ONLY psn 0x124 without a TSETH (BTH.ts = 0): accepted, though this "
        "NIC always sends one",
        pk.data_packet(P.Opcode.RDMA_WRITE_ONLY, dqpn=D.QPN_B, psn=0x124, va=D.MR_BASE,
                       rkey=D.MR_RKEY, payload=sample_payload(0x24), udp_sport=0xC00D)))
    return samples


def sample_table():
    """The Markdown table of the sample capture, as ``docs/wire-format.md`` shows it."""
    lines = ["| frame | name | what it is |", "| --- | --- | --- |"]
    for number, sample in enumerate(sample_packets(), 1):
        lines.append(f"| {number} | `{sample.name}` | {sample.description} |")
    return "\n".join(lines)


def write_sample_pcap(path):
    samples = sample_packets()
    pk.write_pcap(path, [s.packet for s in samples])
    return samples
