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


def _data(ip_version, name, opcode, psn, index, **kw):
    imm = 0x1000_0000 + psn if opcode in P.IMMEDIATE_OPCODES else None
    payload = sample_payload(psn & 0xFF)
    va = D.MR_BASE + index * SAMPLE_PAYLOAD_BYTES
    desc = (f"{P.Opcode(opcode).name}, psn {psn:#x}, va {va:#x}, {len(payload)} B"
            + (f", imm {imm:#x}" if imm is not None else ""))
    pkt = pk.data_packet(opcode, dqpn=D.QPN_B, psn=psn, va=va, rkey=D.MR_RKEY, payload=payload,
                         imm=imm, ev_index=index, tx_ts=1000 * (index + 1),
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
        for index, (name, opcode) in enumerate(zip(names, opcodes, strict=True)):
            samples.append(_data(ip_version, f"{name}_{v}", opcode, base + index, index))
        samples.append(Sample(
            f"ack_{v}", "ACK: cum_psn 0x104, SACK bits 1 and 3 (PSNs 0x106, 0x108), ECN echo, "
            "service time 250 ns",
            pk.ack_packet(dqpn=D.QPN_A, psn=0x108, cum_psn=0x104, sack=0b1010, msn=2,
                          ev_index=5, flags=P.AckFlags.ECN_ECHO | P.AckFlags.SERVICE_TIME,
                          ts_echo=6000, svc_time=250, src=D.NIC_B, dst=D.NIC_A,
                          ip_version=ip_version, udp_sport=0xC005)))
    for code in P.NakCode:
        samples.append(Sample(
            f"nack_{code.name.lower()}", f"NACK {code.name} (syndrome "
            f"{P.nak_syndrome(code):#04x}) for psn 0x105, cum_psn 0x104",
            pk.nack_packet(code, dqpn=D.QPN_A, psn=0x105, cum_psn=0x104, msn=2, ev_index=6,
                           ts_echo=7000, src=D.NIC_B, dst=D.NIC_A, udp_sport=0xC006)))
    samples.append(Sample(
        "probe_request", "probe id 0x77 on EV 9 from QP QPN_A, tx_ts 123456",
        pk.probe_packet(dqpn=D.QPN_B, probe_id=0x77, ev_index=9, src_qpn=D.QPN_A,
                        tx_ts=123456, udp_sport=0xC009)))
    samples.append(Sample(
        "probe_response", "response to probe 0x77, service time 300 ns",
        pk.probe_packet(response=True, dqpn=D.QPN_A, probe_id=0x77, ev_index=9,
                        src_qpn=D.QPN_A, tx_ts=123456, svc_time=300,
                        flags=P.ProbeFlags.SERVICE_TIME, src=D.NIC_B, dst=D.NIC_A,
                        udp_sport=0xC009)))
    write = _data(6, "", P.Opcode.RDMA_WRITE_ONLY, D.INITIAL_PSN + 0x10, 10)
    samples.append(Sample(
        "trimmed", f"WRITE ONLY psn {D.INITIAL_PSN + 0x10:#x} trimmed by a switch: DSCP "
        f"{P.DEFAULT_TRIM_DSCP}, payload gone, RETH.dma_len still 64",
        pk.trim(write.packet)))
    samples.append(Sample(
        "retransmission", f"WRITE ONLY psn {D.INITIAL_PSN + 0x10:#x} again, flag RETRANSMISSION, "
        "EV 11",
        pk.data_packet(P.Opcode.RDMA_WRITE_ONLY, dqpn=D.QPN_B, psn=D.INITIAL_PSN + 0x10,
                       va=D.MR_BASE + 10 * SAMPLE_PAYLOAD_BYTES, rkey=D.MR_RKEY,
                       payload=sample_payload(0x10), ev_index=11, tx_ts=20000,
                       flags=P.DataFlags.RETRANSMISSION, udp_sport=0xC00B)))
    samples.append(Sample(
        "ecn_ce", "WRITE ONLY psn 0x120 marked ECN CE by a switch",
        pk.data_packet(P.Opcode.RDMA_WRITE_ONLY, dqpn=D.QPN_B, psn=0x120,
                       va=D.MR_BASE, rkey=D.MR_RKEY, payload=sample_payload(0x20),
                       ecn=P.ECN_CE, ev_index=12, udp_sport=0xC00C)))
    samples.append(Sample(
        "stev", "WRITE ONLY psn 0x121 with an STEV EV: flow label 0xabcde, UDP source port 0xc123",
        pk.data_packet(P.Opcode.RDMA_WRITE_ONLY, dqpn=D.QPN_B, psn=0x121, va=D.MR_BASE,
                       rkey=D.MR_RKEY, payload=sample_payload(0x21), ev_index=13,
                       flow_label=0xABCDE, udp_sport=0xC123)))
    samples.append(Sample(
        "vlan", "WRITE ONLY psn 0x122 with an 802.1Q tag, VLAN 100",
        pk.data_packet(P.Opcode.RDMA_WRITE_ONLY, dqpn=D.QPN_B, psn=0x122, va=D.MR_BASE,
                       rkey=D.MR_RKEY, payload=sample_payload(0x22), ev_index=14, vlan=100)))
    inner = pk.data_packet(P.Opcode.RDMA_WRITE_ONLY, dqpn=D.QPN_B, psn=0x123, va=D.MR_BASE,
                           rkey=D.MR_RKEY, payload=sample_payload(0x23), ev_index=15)
    samples.append(Sample(
        "srv6", "WRITE ONLY psn 0x123 in SRv6: outer destination fc00:0:1:2:3:4:5:6",
        pk.srv6_encapsulate(inner, dst="fc00:0:1:2:3:4:5:6")))
    samples.append(Sample(
        "srv6_srh", "WRITE ONLY psn 0x123 in SRv6 with an SRH: destination fc00:0:1:2:3:4:5:6, "
        "segment fc00:0:7:8:9:a:b:c",
        pk.srv6_encapsulate(inner, dst="fc00:0:1:2:3:4:5:6", segment="fc00:0:7:8:9:a:b:c")))
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
