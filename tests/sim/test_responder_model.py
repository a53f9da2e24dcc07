"""Responder reference model: one test per rule of docs/responder.md."""

import pytest
from scapy.compat import raw

from hdl import protocol as P
from hdl.config import NicConfig
from hdl.packet.headers import PacketKind
from hdl.transport.resp_defs import ResponderVerdict as V
from sim import packets as pk
from sim import rtlpackets
from sim.model.responder import ResponderModel

CONFIG = NicConfig(qps=4, mpr_units=1, mtu=256, max_wimm=4)
RKEY = 0x1234_5673          # slot 3 of 16
BASE = 0x1_0000_0000
W = CONFIG.window_psns
Op = P.Opcode


def make(config=CONFIG, *, psn=0, caps=P.QpCapability.TRIM_NACK, state=P.QpState.RTS, mpr=1,
         max_wimm=4, ack_every=1, ack_delay=1000, nak_interval=0):
    model = ResponderModel(config)
    assert model.qp_write(1, state=state, remote_qpn=0x77, pd=5, psn=psn, mpr=mpr, caps=caps,
                          max_wimm=max_wimm) == P.Errno.OK
    assert model.mr_write(RKEY % 16, valid=1, rkey=RKEY, pd=5, base=BASE, length=1 << 20) \
        == P.Errno.OK
    assert model.configure(ack_every=ack_every, ack_delay=ack_delay,
                           nak_interval=nak_interval) == P.Errno.OK
    return model


def header(opcode=Op.RDMA_WRITE_ONLY, *, psn, qpn=1, va=BASE, rkey=RKEY, length=16, imm=None,
           ackreq=0, ecn=0b10, trimmed=False, rtx=0, tx_ts=0x1111):
    h = {"kind": 0, "port": 2, "eth_src": 0xA, "eth_dst": 0xB, "ipv6": 1, "ip_src": 0x10,
         "ip_dst": 0x20, "tclass": (P.DEFAULT_TRIM_DSCP << 2 if trimmed else 0) | ecn,
         "trimmed": int(trimmed), "flow_label": 0x12345, "udp_sport": 0xC001, "hop_limit": 60,
         "payload_len": 0 if trimmed else length,
         "bth": {"opcode": opcode, "dqpn": qpn, "psn": psn, "ackreq": ackreq, "rtx": rtx,
                 "ts": 1},
         "tseth": {"tx_timestamp": tx_ts, "ftype": P.Ftype.TIMESTAMP},
         "reth": {"va": va, "rkey": rkey, "dma_len": length}}
    if imm is not None:
        h["immdt"] = {"imm": imm}
    return h


def send(model, h, payload=None, **kw):
    if payload is None:
        payload = b"" if h["trimmed"] else bytes(range(h["reth"]["dma_len"] % 256))[:h["reth"][
            "dma_len"]].ljust(h["reth"]["dma_len"], b"\x55")
    return model.receive(h, payload, **kw)


def only_reply(result):
    assert len(result.replies) == 1
    return result.replies[0]


def seth(reply):
    assert PacketKind(reply["kind"]) == PacketKind.SACK
    assert reply["bth"]["opcode"] == Op.RELIABILITY_SACK
    return reply["ctl"]["sack"]["seth"]


def cc_state(reply):
    return reply["ctl"]["sack"]["cc_state"]


def neth(reply):
    assert PacketKind(reply["kind"]) == PacketKind.NACK
    assert reply["bth"]["opcode"] == Op.RELIABILITY_NACK
    return reply["ctl"]["neth"]


def aeth(reply):
    assert PacketKind(reply["kind"]) == PacketKind.AETH and reply["bth"]["opcode"] == Op.ACKNOWLEDGE
    return reply["aeth"]


def test_in_order_packet_is_placed_and_acked():
    model = make()
    result = send(model, header(psn=0, length=8), b"abcdefgh")
    assert result.verdict == V.PLACED
    assert result.writes == [(BASE, b"abcdefgh")]
    assert model.memory.read(BASE, 8) == b"abcdefgh"
    ack = only_reply(result)
    sack = seth(ack)
    assert sack["cack_psn"] == 0 and sack["sack_bitmap"] == 0 and sack["sack_psn_offset"] == 1
    assert sack["ack_psn_offset"] == 0 and sack["m"] == P.SackMark.NONE and sack["pr"] == 0
    assert sack["mpr"] == 1 and sack["spdcid"] == sack["dpdcid"] == 0
    assert ack["bth"]["dqpn"] == 0x77 and ack["bth"]["psn"] == 0
    assert (ack["eth_dst"], ack["eth_src"], ack["ip_dst"], ack["ip_src"]) == (0xA, 0xB, 0x10, 0x20)
    # entropy: the trigger's UDP source port and its flow label's low 16 bits
    assert sack["entropy"] == 0x2345 << 16 | 0xC001
    assert cc_state(ack) == {"tx_timestamp": 0x1111, "reserved": 0, "ooo_count": 0,
                             "restore_cwnd": 0, "rcv_cwnd_pen": 0, "rcvd_bytes": 8}
    assert ack["port"] == 2 and ack["udp_sport"] == 0xC001 and ack["flow_label"] == 0x12345


def test_sack_is_the_frame_sim_packets_builds():
    model = make()
    h = rtlpackets.header_from_scapy(pk.data_packet(
        Op.RDMA_WRITE_ONLY, dqpn=1, psn=0, va=BASE, rkey=RKEY, payload=b"x" * 8, ecn=3,
        udp_sport=0xC009, tseth={"tx_timestamp": 42, "ftype": P.Ftype.TIMESTAMP}), CONFIG, port=1)
    ack = only_reply(model.receive(h, b"x" * 8))
    frame = rtlpackets.packet_from_header(ack, b"", CONFIG)
    want = pk.sack_packet(dqpn=0x77, cack_psn=0, m=P.SackMark.SKIP_ONCE, ack_psn_offset=0,
                          entropy=h["udp_sport"] | (h["flow_label"] & 0xFFFF) << 16, mpr=1,
                          sack_psn_offset=1, cc_state={"tx_timestamp": 42, "rcvd_bytes": 8},
                          udp_sport=0xC009, flow_label=h["flow_label"], src=_swap("dst"),
                          dst=_swap("src"))
    assert raw(frame) == raw(want)


def _swap(which):
    from sim import defaults
    return defaults.NIC_B if which == "dst" else defaults.NIC_A


def test_duplicate_below_cumulative_is_reacked_not_placed():
    model = make()
    send(model, header(psn=0))
    result = send(model, header(psn=0))
    assert result.verdict == V.DUPLICATE and result.writes == []
    assert seth(only_reply(result))["cack_psn"] == 0
    assert model.counters["duplicate"] == 1


def test_already_marked_duplicate_above_cumulative():
    model = make()
    send(model, header(psn=2))
    result = send(model, header(psn=2))
    assert result.verdict == V.DUPLICATE and result.writes == []
    ack = seth(only_reply(result))
    assert ack["cack_psn"] == P.psn_add(0, -1) and ack["sack_bitmap"] == 0b100


def test_out_of_window_nak_is_rate_limited():
    model = make(nak_interval=100)
    result = send(model, header(psn=W), now_cycles=10)
    assert result.verdict == V.OUT_OF_WINDOW and result.writes == []
    nack = only_reply(result)
    assert neth(nack)["nack_reason"] == P.NackReason.PSN_OOR_WINDOW
    assert neth(nack)["nack_psn"] == nack["bth"]["psn"] == W
    assert neth(nack)["tx_timestamp"] == 0x1111 and neth(nack)["entropy"] == 0x2345 << 16 | 0xC001
    suppressed = send(model, header(psn=W + 1), now_cycles=50)
    assert suppressed.replies == [] and suppressed.nak_suppressed
    assert len(send(model, header(psn=W + 2), now_cycles=110).replies) == 1
    assert model.counters["naks_suppressed"] == 1 and model.counters["out_of_window"] == 3


def test_qp_mpr_sets_the_window():
    model = make(NicConfig(qps=4, mpr_units=2, mtu=256, max_wimm=4), mpr=1)
    assert send(model, header(psn=127)).verdict == V.PLACED
    assert send(model, header(psn=128)).verdict == V.OUT_OF_WINDOW


@pytest.mark.parametrize("change, verdict, code", [
    (dict(rkey=RKEY + 16), V.BAD_RKEY, P.NakCode.REMOTE_ACCESS),
    (dict(rkey=RKEY - 1), V.BAD_RKEY, P.NakCode.REMOTE_ACCESS),
    (dict(va=BASE - 1), V.OUT_OF_BOUNDS, P.NakCode.REMOTE_ACCESS),
    (dict(va=BASE + (1 << 20) - 15), V.OUT_OF_BOUNDS, P.NakCode.REMOTE_ACCESS),
    (dict(qpn=4), V.BAD_QP, P.NakCode.REMOTE_OPERATIONAL),
    (dict(qpn=0x10001), V.BAD_QP, P.NakCode.REMOTE_OPERATIONAL),
    (dict(qpn=2), V.BAD_STATE, P.NakCode.REMOTE_OPERATIONAL),
    (dict(opcode=Op.RDMA_WRITE_FIRST), V.BAD_SEQUENCE, P.NakCode.INVALID_REQUEST),
    (dict(opcode=Op.ACKNOWLEDGE), V.BAD_SEQUENCE, P.NakCode.INVALID_REQUEST),
    (dict(length=257), V.BAD_SEQUENCE, P.NakCode.INVALID_REQUEST),
])
def test_refused_packets_write_nothing_and_nak(change, verdict, code):
    model = make()
    result = send(model, header(psn=0, **change))
    assert result.verdict == verdict and result.writes == [] and len(model.memory) == 0
    nak = only_reply(result)
    assert aeth(nak)["syndrome"] == P.nak_syndrome(code) and nak["bth"]["psn"] == 0
    assert model.counters[verdict.name.lower()] == 1 and model.counters["naks"] == 1
    if verdict == V.BAD_QP:
        assert nak["bth"]["dqpn"] == change["qpn"] and nak["aeth"]["msn"] == 0


def test_wrong_protection_domain_is_a_remote_access_error():
    model = make()
    model.mr_write(RKEY % 16, valid=1, rkey=RKEY, pd=6, base=BASE, length=1 << 20)
    assert send(model, header(psn=0)).verdict == V.BAD_RKEY


def test_last_byte_of_region_is_writable():
    model = make()
    assert send(model, header(psn=0, va=BASE + (1 << 20) - 16)).verdict == V.PLACED


@pytest.mark.parametrize("state", [P.QpState.RESET, P.QpState.INIT, P.QpState.ERROR])
def test_qp_not_ready_is_refused(state):
    model = make(state=state)
    result = send(model, header(psn=0))
    assert result.verdict == V.BAD_STATE and result.writes == []
    assert aeth(only_reply(result))["syndrome"] == P.nak_syndrome(P.NakCode.REMOTE_OPERATIONAL)


def test_rtr_accepts():
    assert send(make(state=P.QpState.RTR), header(psn=0)).verdict == V.PLACED


def test_trimmed_packet_gets_a_trimmed_nack_and_nothing_is_written():
    model = make()
    result = send(model, header(psn=0, trimmed=True))
    assert result.verdict == V.TRIMMED and result.writes == []
    nak = only_reply(result)
    assert neth(nak)["nack_reason"] == P.NackReason.TRIMMED and neth(nak)["nack_psn"] == 0
    assert nak["bth"]["psn"] == 0 and nak["bth"]["dqpn"] == 0x77 and nak["tclass"] == 0b10
    # Not marked: the retransmission is placed.
    assert send(model, header(psn=0)).verdict == V.PLACED


def test_trimmed_packet_without_trim_nack_capability_is_dropped_silently():
    model = make(caps=0)
    result = send(model, header(psn=0, trimmed=True))
    assert result.verdict == V.TRIMMED and result.replies == []


def test_ackreq_forces_an_immediate_ack():
    model = make(ack_every=4)
    assert send(model, header(psn=0)).replies == []
    assert len(send(model, header(psn=1, ackreq=1)).replies) == 1


def test_ack_coalescing_every_n_packets():
    model = make(ack_every=3)
    acks = [len(send(model, header(psn=p)).replies) for p in range(9)]
    assert acks == [0, 0, 1] * 3


def test_gap_and_ce_ack_at_once():
    model = make(ack_every=8)
    gap = send(model, header(psn=1))
    assert seth(only_reply(gap))["sack_bitmap"] == 0b10
    assert cc_state(only_reply(gap))["ooo_count"] == 1
    fill = seth(only_reply(send(model, header(psn=0))))
    assert fill["cack_psn"] == 1 and fill["sack_bitmap"] == 0
    ce = seth(only_reply(send(model, header(psn=2, ecn=3))))
    assert ce["m"] == P.SackMark.SKIP_ONCE


def test_ack_delay_timer():
    model = make(ack_every=8, ack_delay=100)
    assert send(model, header(psn=0), now_cycles=5).replies == []
    assert send(model, header(psn=1), now_cycles=6).replies == []
    assert model.expire(104) == []
    (ack,) = model.expire(105)
    # The trigger is the packet that started the timer: PSN 0, one below cack_psn.
    assert seth(ack)["cack_psn"] == 1 and ack["bth"]["psn"] == 1
    assert seth(ack)["ack_psn_offset"] == -1
    assert model.expire(1000) == []


def test_cc_state_counts_bytes_and_packets_held_out_of_order():
    model = make(ack_every=8)
    send(model, header(psn=0, length=100))
    send(model, header(psn=2, length=10))
    ack = only_reply(send(model, header(psn=3, length=20)))
    assert cc_state(ack)["rcvd_bytes"] == 130 and cc_state(ack)["ooo_count"] == 2
    # a retransmission (BTH.rtx) is acknowledged like any packet
    ack = only_reply(send(model, header(psn=1, length=1, rtx=1, tx_ts=0xBEEF)))
    assert cc_state(ack)["ooo_count"] == 0 and cc_state(ack)["tx_timestamp"] == 0xBEEF
    assert cc_state(ack)["rcvd_bytes"] == 131


def test_bitmap_of_a_trigger_far_above_cack_is_its_64_aligned_block():
    """A trigger more than 64 PSNs above cack_psn: the bitmap starts at its 64-aligned block
    (sack_psn_offset above 1), so the SACK shows the holes around it."""
    model = make(ack_every=1)
    for psn in (70, 100):
        send(model, header(psn=psn))
    ack = seth(only_reply(send(model, header(psn=120))))
    cack = P.psn_add(0, -1)
    assert ack["cack_psn"] == cack and ack["ack_psn_offset"] == 121
    assert ack["sack_psn_offset"] == 64 + 1       # base PSN 64 = cack + 65
    assert ack["sack_bitmap"] == 1 << 6 | 1 << 36 | 1 << 56
    # 64 PSNs above cack_psn is still "within 64": the bitmap starts at cack_psn + 1.
    ack = seth(only_reply(send(model, header(psn=63))))
    assert ack["sack_psn_offset"] == 1 and ack["sack_bitmap"] == 1 << 63
    # 65 above: PSN 64's block, holding 64, 70 and 100.
    ack = seth(only_reply(send(model, header(psn=64))))
    assert ack["sack_psn_offset"] == 65
    assert ack["sack_bitmap"] == 1 << 0 | 1 << 6 | 1 << 36 | 1 << 56


def test_reliability_probe_is_answered_by_a_pr_sack():
    model = make(ack_every=8)
    send(model, header(psn=0))
    send(model, header(psn=2))
    probe = {"kind": PacketKind.RPROBE, "port": 3, "eth_src": 0xA, "eth_dst": 0xB, "ipv6": 1,
             "ip_src": 0x10, "ip_dst": 0x20, "flow_label": 0x54321, "udp_sport": 0xC00F,
             "bth": {"opcode": Op.RELIABILITY_PROBE_REQUEST, "dqpn": 1, "psn": 77},
             "ctl": {"peth": {"probe_id": 0xFFFE, "tx_timestamp": 0x4242}}}
    acks = model.counters["acks"]
    ack = model.probe(probe)
    sack = seth(ack)
    assert sack["pr"] == 1 and sack["ack_psn_offset"] == -2      # probe id 0xFFFE
    assert sack["m"] == P.SackMark.NONE and sack["cack_psn"] == 0 == ack["bth"]["psn"]
    assert sack["sack_psn_offset"] == 1 and sack["sack_bitmap"] == 0b10
    assert sack["entropy"] == 0x4321 << 16 | 0xC00F
    assert cc_state(ack)["tx_timestamp"] == 0x4242 and ack["port"] == 3
    assert model.counters["probes"] == 1 and model.counters["acks"] == acks
    # A probe consumes no PSN: PSN 1 is still the hole.
    assert send(model, header(psn=1)).verdict == V.PLACED
    probe["bth"]["dqpn"] = 2                # a QP in RESET: dropped, counted
    assert model.probe(probe) is None and model.counters["probes_dropped"] == 1
def test_write_imm_completes_only_after_all_earlier_psns():
    model = make(ack_every=8)
    mtu = CONFIG.mtu
    assert send(model, header(Op.RDMA_WRITE_LAST_WITH_IMMEDIATE, psn=1, imm=0xAB)).completions \
        == []
    first = send(model, header(Op.RDMA_WRITE_FIRST, psn=0, length=mtu))
    (completion,) = first.completions
    assert completion["imm"] == 0xAB and completion["wr_id"] == 1 and completion["qpn"] == 1
    assert seth(only_reply(first))["cack_psn"] == 1


def test_completions_leave_in_message_order_with_msn():
    model = make(ack_every=8)
    for psn, imm in [(3, 3), (1, 1), (2, 2)]:
        assert send(model, header(Op.RDMA_WRITE_ONLY_WITH_IMMEDIATE, psn=psn,
                                  imm=imm)).completions == []
    result = send(model, header(psn=0))
    assert [(c["imm"], c["wr_id"]) for c in result.completions] == [(1, 2), (2, 3), (3, 4)]
    assert seth(only_reply(result))["cack_psn"] == 3
    assert model.qp_read(1) == (P.Errno.OK, P.QpState.RTS | 4 << 8 | 4 << 32)


def test_more_write_imms_than_max_wimm_are_refused():
    model = make(max_wimm=2)
    for psn in (1, 2):
        send(model, header(Op.RDMA_WRITE_ONLY_WITH_IMMEDIATE, psn=psn, imm=psn))
    result = send(model, header(Op.RDMA_WRITE_ONLY_WITH_IMMEDIATE, psn=3, imm=3))
    assert result.verdict == V.WIMM_OVERFLOW and result.writes == []


def test_psn_wraparound():
    start = P.PSN_MODULUS - 3
    model = make(psn=start, ack_every=8)
    for p in (1, 2):
        send(model, header(psn=P.psn_add(start, p)))
    send(model, header(Op.RDMA_WRITE_ONLY_WITH_IMMEDIATE, psn=P.psn_add(start, 4), imm=7))
    result = send(model, header(psn=start))
    assert seth(only_reply(result))["cack_psn"] == P.PSN_MODULUS - 1
    assert seth(only_reply(result))["sack_bitmap"] == 0b10
    result = send(model, header(psn=0))
    assert seth(only_reply(result))["cack_psn"] == 1
    assert [c["imm"] for c in result.completions] == [7]
    assert send(model, header(psn=start)).verdict == V.DUPLICATE


def test_commands_validate():
    model = ResponderModel(CONFIG)
    assert model.qp_write(4, state=P.QpState.RTS) == P.Errno.ENOENT
    assert model.qp_write(0, state=5) == P.Errno.EINVAL
    assert model.qp_write(0, state=P.QpState.RTS, mpr=2) == P.Errno.EINVAL
    assert model.qp_write(0, state=P.QpState.RTS, max_wimm=5) == P.Errno.EINVAL
    assert model.qp_read(9) == (P.Errno.ENOENT, 0)
    assert model.mr_write(16, valid=1) == P.Errno.ENOENT
    assert model.mr_write(2, valid=1, rkey=3) == P.Errno.EINVAL
    assert model.configure(ack_every=0, ack_delay=1, nak_interval=1) == P.Errno.EINVAL


def test_qp_write_without_set_psn_keeps_receive_state():
    model = make(ack_every=8)
    send(model, header(psn=0))
    send(model, header(psn=2))
    model.qp_write(1, state=P.QpState.RTS, remote_qpn=0x77, pd=5, psn=99, set_psn=False,
                   mpr=1, max_wimm=4)
    assert model.qp_read(1)[1] >> 8 & 0xFFFFFF == 1
    assert send(model, header(psn=2)).verdict == V.DUPLICATE
