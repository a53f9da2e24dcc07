"""Requester reference model: one rule per test (segmentation, limits, SACK/NACK/NAK,
completion)."""

import pytest

from hdl import protocol as P
from hdl.config import NicConfig
from hdl.packet.headers import PacketKind
from hdl.transport.req_defs import RequesterCommand
from sim.model.requester import RequesterModel
from sim.model.responder import ResponderModel, full_header

O = P.Opcode
S = P.CompletionStatus
W = P.WrOpcode
CONFIG = NicConfig(qps=8, mpr_units=1, mtu=256, wr_slots=4, max_wimm=2, evs_per_profile=8)


def model(config=CONFIG, psn=0, mpr=1, max_wimm=2, qps=(0,)):
    m = RequesterModel(config)
    for qpn in qps:
        assert m.qp_write(qpn, psn=psn, mpr=mpr, max_wimm=max_wimm) == (P.Errno.OK, 0)
    return m


def wr(qpn=0, length=0, opcode=W.RDMA_WRITE, wr_id=1, **kw):
    return {"qpn": qpn, "opcode": opcode, "wr_id": wr_id, "length": length,
            "remote_addr": kw.get("remote_addr", 0x10000), "local_addr": 0x80000,
            "rkey": 0x55, "imm": kw.get("imm", 0xABCD)}


def ack(qpn, cum_psn, *, sack=0, psn=None, mark=P.SackMark.NONE, offset=1, pr=0, probe_id=0,
        seth_cack=None):
    """A SACK: cack_psn ``cum_psn``, triggered by ``psn`` (default: ``cum_psn``), bitmap bit i
    = PSN ``cum_psn + offset + i``."""
    trigger = cum_psn if psn is None else psn
    return {"kind": PacketKind.SACK, "bth": {"dqpn": qpn, "psn": cum_psn},
            "ctl": {"sack": {"seth": {
                "m": mark, "pr": pr,
                "ack_psn_offset": probe_id if pr else P.psn_diff(trigger, cum_psn),
                "cack_psn": cum_psn if seth_cack is None else seth_cack,
                "sack_psn_offset": offset, "sack_bitmap": sack}, "cc_state": {}}}}


def nack(qpn, reason, psn):
    return {"kind": PacketKind.NACK, "bth": {"dqpn": qpn, "psn": psn},
            "ctl": {"neth": {"nack_reason": reason, "nack_psn": psn}}}


def nak(qpn, code, psn):
    return {"kind": PacketKind.AETH, "bth": {"dqpn": qpn, "psn": psn},
            "aeth": {"syndrome": P.nak_syndrome(code), "msn": 0}}


def ctx(requests):
    return [r["context"] for r in requests]


@pytest.mark.parametrize("length, sizes", [
    (0, [0]), (1, [1]), (256, [256]), (257, [256, 1]), (512, [256, 256]),
    (1000, [256, 256, 256, 232]),
])
def test_segmentation_sizes(length, sizes):
    m = model()
    m.post(wr(length=length))
    assert [c["dma_len"] for c in ctx(m.pull_all())] == sizes


def test_each_packet_carries_its_own_addresses():
    m = model()
    m.post(wr(length=700, remote_addr=0x1000))
    packets = ctx(m.pull_all())
    assert [c["va"] for c in packets] == [0x1000, 0x1100, 0x1200]
    assert [c["local_addr"] for c in packets] == [0x80000, 0x80100, 0x80200]
    assert {c["rkey"] for c in packets} == {0x55}


@pytest.mark.parametrize("opcode, length, opcodes", [
    (W.RDMA_WRITE, 100, [O.RDMA_WRITE_ONLY]),
    (W.RDMA_WRITE_WITH_IMM, 0, [O.RDMA_WRITE_ONLY_WITH_IMMEDIATE]),
    (W.RDMA_WRITE, 768, [O.RDMA_WRITE_FIRST, O.RDMA_WRITE_MIDDLE, O.RDMA_WRITE_LAST]),
    (W.RDMA_WRITE_WITH_IMM, 600,
     [O.RDMA_WRITE_FIRST, O.RDMA_WRITE_MIDDLE, O.RDMA_WRITE_LAST_WITH_IMMEDIATE]),
])
def test_opcodes_by_position(opcode, length, opcodes):
    m = model()
    m.post(wr(length=length, opcode=opcode, imm=77))
    packets = ctx(m.pull_all())
    assert [c["opcode"] for c in packets] == opcodes
    immediate = opcode == W.RDMA_WRITE_WITH_IMM
    assert [c["imm"] for c in packets] == [0] * (len(opcodes) - 1) + [77 if immediate else 0]
    assert [c["ackreq"] for c in packets] == [0] * (len(opcodes) - 1) + [1]


def test_ackreq_every_n_packets():
    m = model()
    assert m.control(RequesterCommand.CONFIG, ackreq_every=2) == (P.Errno.OK, 0)
    m.post(wr(length=5 * 256))
    assert [c["ackreq"] for c in ctx(m.pull_all())] == [0, 1, 0, 1, 1]


@pytest.mark.parametrize("opcode", [W.SEND, W.SEND_WITH_IMM, W.RDMA_READ,
                                    W.ATOMIC_CMP_AND_SWP, W.ATOMIC_FETCH_AND_ADD])
def test_refused_opcode_completes_with_error_and_sends_nothing(opcode):
    m = model()
    m.post(wr(opcode=opcode, length=100, wr_id=9))
    assert m.pull_all() == []
    assert [(c["wr_id"], c["status"]) for c in m.completions] == [(9, S.LOC_QP_OP_ERR)]
    assert m.counters["wr_refused"] == 1


def test_qp_not_ready_refuses():
    m = model()
    m.post(wr(qpn=1, length=10))
    assert m.pull_all() == []
    assert m.completions[0]["status"] == S.LOC_QP_OP_ERR


def test_refused_wr_completes_after_earlier_wrs():
    m = model()
    m.post(wr(length=10, wr_id=1))
    m.post(wr(opcode=W.RDMA_READ, wr_id=2))
    m.pull_all()
    assert m.completions == []
    m.receive(ack(0, 0))
    assert [(c["wr_id"], c["status"]) for c in m.completions] == [(1, S.SUCCESS),
                                                                 (2, S.LOC_QP_OP_ERR)]


def test_window_limits_outstanding_psns():
    m = model()
    m.post(wr(length=140 * 256))
    assert len(m.pull_all()) == 128             # mpr 1: 128 PSNs outstanding at most
    m.receive(ack(0, 9))                        # PSNs 0..9 acknowledged
    more = ctx(m.pull_all())
    assert [c["psn"] for c in more] == list(range(128, 138))


def test_max_wimm_limits_write_imms_in_flight():
    m = model(max_wimm=1)
    m.post(wr(opcode=W.RDMA_WRITE_WITH_IMM, length=10, wr_id=1))
    m.post(wr(opcode=W.RDMA_WRITE_WITH_IMM, length=10, wr_id=2))
    assert len(m.pull_all()) == 1
    assert m.pending_wrs == 1
    m.receive(ack(0, 0))
    assert [c["context"]["psn"] for c in m.pull_all()] == [1]


def test_wr_slots_limit_outstanding_wrs():
    m = model()
    for i in range(6):
        m.post(wr(length=10, wr_id=i))
    assert len(m.pull_all()) == 4               # wr_slots = 4
    m.receive(ack(0, 1))
    assert [c["context"]["psn"] for c in m.pull_all()] == [4, 5]


def test_head_of_line_blocking_across_qps():
    m = model(qps=(0, 1), max_wimm=1)
    m.post(wr(0, opcode=W.RDMA_WRITE_WITH_IMM, wr_id=1))
    m.post(wr(0, opcode=W.RDMA_WRITE_WITH_IMM, wr_id=2))
    m.post(wr(1, wr_id=3))
    assert [r["qpn"] for r in m.pull_all()] == [0]   # QP 1 waits behind QP 0's second WR


def test_segmenter_contexts_let_other_qps_pass_a_full_window_and_keep_each_qps_order():
    """Two contexts: QP 0's WR fills its window and waits; QP 1's WRs go meanwhile, one after
    the other in the second context, the two contexts taking turns; QP 0's second WR waits
    for its first; QP 2's WR waits for a free context."""
    m = model(CONFIG.replace(segmenters=2), qps=(0, 1, 2))
    m.post(wr(0, length=130 * 256, wr_id=1))
    m.post(wr(1, length=2 * 256, wr_id=2))
    m.post(wr(1, length=256, wr_id=3))
    m.post(wr(0, length=256, wr_id=4))
    m.post(wr(2, length=256, wr_id=5))
    sent = [(r["qpn"], r["context"]["psn"]) for r in m.pull_all()]
    assert sent[:4] == [(0, 0), (1, 0), (0, 1), (1, 1)]           # turns
    assert [psn for qpn, psn in sent if qpn == 0] == list(range(128))  # window full
    assert [psn for qpn, psn in sent if qpn == 1] == [0, 1, 2]    # both WRs, in order
    assert [qpn for qpn, _ in sent if qpn == 2] == []             # WR 4 holds the queue
    m.receive(ack(1, 2))
    m.receive(ack(0, 127))                  # QP 0's first WR ends; its second follows it
    sent = [(r["qpn"], r["context"]["psn"]) for r in m.pull_all()]
    assert [psn for qpn, psn in sent if qpn == 0] == [128, 129, 130]
    assert [psn for qpn, psn in sent if qpn == 2] == [0]
    m.receive(ack(0, 130))
    m.receive(ack(2, 0))
    assert [c["wr_id"] for c in m.completions] == [2, 3, 1, 4, 5]


def test_cumulative_ack_advances_and_completes_in_order():
    m = model()
    for i in range(3):
        m.post(wr(length=512, wr_id=i))
    m.pull_all()
    m.receive(ack(0, 2))
    assert [c["wr_id"] for c in m.completions] == [0]
    m.receive(ack(0, 5))
    assert [c["wr_id"] for c in m.completions] == [0, 1, 2]
    assert all(c["byte_len"] == 512 and c["status"] == S.SUCCESS for c in m.completions)
    assert m.qp(0)["una"] == 6


def test_sack_merge_marks_psns_acked():
    m = model()
    m.post(wr(length=6 * 256))
    m.pull_all()
    m.receive(ack(0, 0, sack=0b1010))           # 0 acked; 2 and 4 SACKed (bit i: 1 + i)
    assert m.qp(0)["una"] == 1 and m.qp(0)["acked"] == [2, 4]
    m.receive(ack(0, 2))
    assert m.qp(0)["acked"] == [4]


def test_sack_bitmap_bits_beyond_next_psn_ignored():
    m = model()
    m.post(wr(length=2 * 256))
    m.pull_all()
    m.receive(ack(0, P.psn_add(0, -1), sack=0xFF))
    assert m.qp(0)["acked"] == [0, 1]


@pytest.mark.parametrize("offset, sack, acked", [
    (65, 0b101, [64, 66]),              # the responder's 64-aligned block of a late trigger
    (10, 1 << 63 | 1, [9, 72]),                # any offset: every bit inside the window counts
    (-5, 0b111111111, [0, 1, 2]),       # below cack_psn + 1: only the bits at or above una
    (200, 0b1, []),                     # beyond next_psn: nothing
])
def test_sack_bitmap_placed_by_any_offset(offset, sack, acked):
    m = model()
    m.post(wr(length=100 * 256))
    m.pull_all()
    cum = P.psn_add(0, -1)
    m.receive(ack(0, cum, sack=sack, offset=offset))
    assert m.qp(0)["una"] == 0 and m.qp(0)["acked"] == acked


def test_duplicate_ack_counted_and_never_moves_back():
    m = model()
    m.post(wr(length=4 * 256))
    m.pull_all()
    m.receive(ack(0, 2))
    m.receive(ack(0, 1))
    m.receive(ack(0, 2))
    assert m.qp(0)["una"] == 3
    assert m.counters["duplicate_acks"] == 2


def test_ack_beyond_next_psn_dropped():
    m = model()
    m.post(wr(length=2 * 256))
    m.pull_all()
    assert m.receive(ack(0, 5)) == "dropped"
    assert m.qp(0)["una"] == 0 and m.counters["bad_acks"] == 1 and m.feedback == []


@pytest.mark.parametrize("qpn, state", [(9, None), (1, None), (0, "error")])
def test_ack_for_unknown_or_idle_qp_dropped(qpn, state):
    m = model()
    if state:
        m.control(RequesterCommand.QP_WRITE, qpn=0, state=P.QpState.ERROR, mpr=1, max_wimm=1)
    assert m.receive(ack(qpn, 0)) == "dropped"
    assert m.counters["bad_acks"] == 1


def test_feedback_names_the_ev_the_acked_psn_went_out_on():
    """The EV of a SACK is the one its ack_psn (cack_psn + ack_psn_offset) was last sent on;
    m SKIP_ONCE is ECN feedback, ALWAYS_SKIP a bad path (LOST); a probe answer (pr = 1)
    applies its cumulative PSN and bitmap and gives no feedback."""
    m = model()
    m.post(wr(length=4 * 256))
    for r in m.pull_all():
        m.sent(0, r["context"]["psn"], ev=r["context"]["psn"] + 4)
    m.receive(ack(0, 0))
    m.receive(ack(0, 0, psn=2, sack=0b10, mark=P.SackMark.SKIP_ONCE))
    m.receive(ack(0, 0, psn=1, mark=P.SackMark.ALWAYS_SKIP))
    m.receive(ack(0, 2, pr=1, probe_id=0x1234, sack=0b1))
    assert m.feedback == [{"qpn": 0, "ev": 4, "kind": P.FeedbackKind.ACKED},
                          {"qpn": 0, "ev": 6, "kind": P.FeedbackKind.ECN},
                          {"qpn": 0, "ev": 5, "kind": P.FeedbackKind.LOST}]
    assert m.qp(0)["una"] == 3 and m.qp(0)["acked"] == [3] and m.counters["acks"] == 4


def test_trimmed_nack_resends_that_psn_avoiding_its_ev():
    m = model()
    m.post(wr(length=10, wr_id=1, opcode=W.RDMA_WRITE_WITH_IMM))
    m.post(wr(length=3 * 256, remote_addr=0x4000))
    for r in m.pull_all():
        m.sent(0, r["context"]["psn"], ev=r["context"]["psn"] + 2)
    m.receive(nack(0, P.NackReason.TRIMMED, 2))
    assert m.feedback[-1] == {"qpn": 0, "ev": 4, "kind": P.FeedbackKind.TRIMMED}
    assert m.counters["nak_trimmed"] == 1
    (resend,) = m.pull_all()
    assert resend["avoid_ev_valid"] == 1 and resend["avoid_ev"] == 4
    # BTH.rtx (retransmission) and the METH of the second message: one message (a WRITE
    # WITH IMMEDIATE) started before it.
    assert resend["context"] | {} == {"psn": 2, "opcode": O.RDMA_WRITE_MIDDLE, "ackreq": 1,
                                      "va": 0x4100, "rkey": 0x55, "dma_len": 256, "imm": 0,
                                      "local_addr": 0x80100, "retransmission": 1,
                                      "msn": 1, "rqmsn": 1}


def test_trimmed_nack_for_acked_psn_not_resent():
    m = model()
    m.post(wr(length=3 * 256))
    m.pull_all()
    m.receive(ack(0, 0, sack=0b10))
    m.receive(nack(0, P.NackReason.TRIMMED, 2))
    assert m.pull_all() == []


def test_meth_numbers_count_messages_and_write_imm_messages():
    m = model()
    m.post(wr(length=300, wr_id=1))
    m.post(wr(length=10, wr_id=2, opcode=W.RDMA_WRITE_WITH_IMM))
    m.post(wr(length=10, wr_id=3, opcode=W.RDMA_READ))      # refused: no message
    m.post(wr(length=0, wr_id=4))
    assert [(c["msn"], c["rqmsn"]) for c in ctx(m.pull_all())] == [(0, 0), (0, 0), (1, 0),
                                                                   (2, 1)]


def test_every_retransmission_is_marked():
    """BTH.rtx: resends for a trim, a retransmit request, a timeout and an inferred loss all
    carry ``retransmission``; new packets never do."""
    m = model()
    m.control(RequesterCommand.QP_WRITE, qpn=0, state=P.QpState.RTS, mpr=1, max_wimm=1,
              retry_linear=3)
    m.post(wr(length=8 * 256))
    assert not any(c["retransmission"] for c in ctx(m.pull_all(now_units=0)))
    m.receive(nack(0, P.NackReason.TRIMMED, 1))
    m.retransmit(0, 2)
    m.receive(ack(0, P.psn_add(0, -1), sack=0b1111000))    # 3..6 SACKed: 0-2 inferred
    resends = ctx(m.pull_all())
    for now in (1, 1 << 12):                # arm, then expire: the timeout walk
        m.poll_timers(now_units=now)
        resends += ctx(m.pull_all())
    assert {c["psn"] for c in resends} >= {0, 1, 2, 7}
    assert m.counters["timeout_retransmissions"] and m.counters["inferred_losses"]
    assert all(c["retransmission"] for c in resends)


def test_retransmit_request_outside_window_ignored():
    m = model()
    m.post(wr(length=3 * 256))
    m.pull_all()
    m.receive(ack(0, 0))
    for psn in (0, 3, 100):
        m.retransmit(0, psn)
    m.retransmit(0, 2)
    assert [r["context"]["psn"] for r in m.pull_all()] == [2]
    assert m.counters["retx_ignored"] == 3


def test_psn_out_of_window_nack_counted_only():
    m = model()
    m.post(wr(length=2 * 256))
    m.pull_all()
    assert m.receive(nack(0, P.NackReason.PSN_OOR_WINDOW, 1)) == "applied"
    assert m.counters["nak_psn_out_of_window"] == 1 and m.pull_all() == []
    assert m.qp(0)["una"] == 0 and m.feedback == []


@pytest.mark.parametrize("header", [
    nack(0, P.NackReason.NO_BITMAP, 1),                 # a reason the requester does not act on
    ack(0, 0, seth_cack=1),                             # SETH cack_psn is not BTH.psn
    {"kind": PacketKind.AETH, "bth": {"dqpn": 0, "psn": 0},
     "aeth": {"syndrome": P.AETH_ACK, "msn": 1}},     # MRC acknowledges with SACKs
])
def test_malformed_or_unknown_acknowledgements_are_bad_acks(header):
    m = model()
    m.post(wr(length=2 * 256))
    m.pull_all()
    assert m.receive(header) == "dropped" and m.counters["bad_acks"] == 1


@pytest.mark.parametrize("code, status", [
    (P.NakCode.REMOTE_ACCESS, S.REM_ACCESS_ERR),
    (P.NakCode.INVALID_REQUEST, S.REM_INV_REQ_ERR),
    (P.NakCode.REMOTE_OPERATIONAL, S.REM_OP_ERR),
])
def test_fatal_nak_errors_qp_then_flushes(code, status):
    m = model()
    for i in range(4):
        m.post(wr(length=256, wr_id=i))
    m.pull_all()
    m.receive(ack(0, 0))
    m.receive(nak(0, code, psn=2))
    assert [(c["wr_id"], c["status"]) for c in m.completions] == [
        (0, S.SUCCESS), (1, S.WR_FLUSH_ERR), (2, status), (3, S.WR_FLUSH_ERR)]
    assert m.qp_errors == [{"qpn": 0, "status": status}]
    assert m.qp(0)["state"] == P.QpState.ERROR
    m.post(wr(length=10, wr_id=7))
    assert m.pull_all() == []
    assert m.completions[-1]["status"] == S.WR_FLUSH_ERR
    assert m.receive(ack(0, 3)) == "dropped"


def test_fatal_nak_for_psn_not_outstanding_dropped():
    m = model()
    m.post(wr(length=256))
    m.pull_all()
    assert m.receive(nak(0, P.NakCode.REMOTE_ACCESS, psn=5)) == "dropped"
    assert m.qp(0)["state"] == P.QpState.RTS


def test_psn_wraps_around():
    m = model(psn=0xFFFFF0)
    m.post(wr(length=40 * 256, wr_id=1))
    psns = [c["psn"] for c in ctx(m.pull_all())]
    assert psns == [(0xFFFFF0 + i) % (1 << 24) for i in range(40)]
    m.receive(ack(0, 0x000005, sack=1 << 3))
    assert m.qp(0)["una"] == 6 and m.qp(0)["acked"] == [9]
    m.receive(ack(0, 0xFFFFF8))                 # older: does not move una back
    assert m.qp(0)["una"] == 6
    m.receive(ack(0, 0x000017))
    assert [c["wr_id"] for c in m.completions] == [1]


@pytest.mark.parametrize("fields, errno", [
    ({"qpn": 8}, P.Errno.ENOENT),
    ({"qpn": 0, "state": 5, "mpr": 1, "max_wimm": 1}, P.Errno.EINVAL),
    ({"qpn": 0, "state": 3, "mpr": 2, "max_wimm": 1}, P.Errno.EINVAL),
    ({"qpn": 0, "state": 3, "mpr": 0, "max_wimm": 1}, P.Errno.EINVAL),
    ({"qpn": 0, "state": 3, "mpr": 1, "max_wimm": 3}, P.Errno.EINVAL),
])
def test_qp_write_errnos(fields, errno):
    m = model()
    assert m.control(RequesterCommand.QP_WRITE, **fields)[0] == errno


def test_qp_write_busy_with_outstanding_wrs_and_read_back():
    m = model(psn=100)
    m.post(wr(length=300, opcode=W.RDMA_WRITE_WITH_IMM))
    m.pull_all()
    assert m.qp_write(0, psn=5)[0] == P.Errno.EBUSY
    errno, page0 = m.control(RequesterCommand.QP_READ, qpn=0)
    assert page0 == P.QpState.RTS | 102 << 8 | 100 << 32
    errno, page1 = m.control(RequesterCommand.QP_READ, qpn=0, page=1)
    assert page1 == 1 | 1 << 8 | 1 << 16 | 2 << 24
    assert m.control(RequesterCommand.QP_READ, qpn=8)[0] == P.Errno.ENOENT
    assert m.control(3) == (P.Errno.EINVAL, 0)


# -- loss recovery -----------------------------------------------------------------------------

def timed_model(timeout=4, linear=0, exp=0, psn=0, infer_k=None):
    m = RequesterModel(CONFIG)
    assert m.qp_write(0, psn=psn, max_wimm=2, timeout=timeout, retry_linear=linear,
                      retry_exp=exp) == (P.Errno.OK, 0)
    if infer_k is not None:
        m.control(RequesterCommand.CONFIG, infer_k=infer_k)
    return m


@pytest.mark.parametrize("fields", [{"timeout": 25}, {"retry_exp": 26}])
def test_qp_write_refuses_bad_timer_fields(fields):
    m = RequesterModel(CONFIG)
    assert m.control(RequesterCommand.QP_WRITE, qpn=0, state=3, mpr=1, max_wimm=1,
                     **fields) == (P.Errno.EINVAL, 0)


def test_ideal_timer_follows_retry_schedule_then_errors_the_qp():
    m = timed_model(timeout=4, linear=1, exp=1)
    m.post(wr(length=2 * 256, wr_id=1))
    m.post(wr(length=256, wr_id=2))
    m.pull_all(now_units=100)
    assert m.control(RequesterCommand.QP_READ, qpn=0, page=2)[1] == 1 | 100 << 32
    assert m.poll_timers(115) == []
    assert m.poll_timers(116) == [(0, "timeout")]       # 16: the first send
    assert m.poll_timers(131) == []
    assert m.poll_timers(132) == [(0, "timeout")]       # 16: the linear retry
    assert m.poll_timers(163) == []
    assert m.poll_timers(164) == [(0, "exceeded")]      # 32: the exponential retry
    assert m.qp(0)["state"] == P.QpState.ERROR
    assert m.qp_errors == [{"qpn": 0, "status": S.RETRY_EXC_ERR}]
    assert [(c["wr_id"], c["status"]) for c in m.completions] == [
        (1, S.RETRY_EXC_ERR), (2, S.RETRY_EXC_ERR)]
    m.post(wr(length=1, wr_id=3))
    assert m.completions[-1]["status"] == S.WR_FLUSH_ERR
    assert m.counters["timeouts"] == 2 and m.counters["retry_exceeded"] == 1


def test_timeout_walk_resends_oldest_and_old_holes_lost_feedback_for_the_oldest():
    m = timed_model(timeout=4, exp=P.RETRY_INFINITE, infer_k=0)
    m.post(wr(length=4 * 256, wr_id=1))
    m.pull_all(now_units=0)
    for psn, ev in enumerate((1, 2, 3, 4)):
        m.sent(0, psn, ev)
    m.post(wr(length=256, wr_id=2))
    m.pull_all(now_units=10)                            # PSN 4: young at time 16
    m.receive(ack(0, -1 % (1 << 24), sack=0b100))       # PSN 2 SACKed
    m.now_units = 16
    assert m.expire(0) == "timeout"
    resent = m.pull_all()
    assert [r["context"]["psn"] for r in resent] == [0, 1, 3]
    assert [r["avoid_ev"] for r in resent] == [1, 2, 4]
    assert all(r["context"]["retransmission"] for r in resent)
    # LOST only for the oldest PSN (the one the timer is about): the older holes are resent
    # without striking their EVs.
    assert [f["ev"] for f in m.feedback if f["kind"] == P.FeedbackKind.LOST] == [1]
    assert m.counters["lost_feedback"] == 1
    assert m.counters["walk_skipped"] == 2 and m.counters["timeout_retransmissions"] == 3


def test_inference_needs_k_later_sacks_and_happens_once():
    m = timed_model(timeout=20, infer_k=3)
    m.post(wr(length=8 * 256))
    m.pull_all()
    m.receive(ack(0, -1 % (1 << 24), sack=0b0110))      # 1, 2 SACKed: 0 has 2 later
    assert m.pull_all() == []
    m.receive(ack(0, -1 % (1 << 24), sack=0b10110))     # 1, 2, 4: 0 has 3 later
    assert [r["context"]["psn"] for r in m.pull_all()] == [0]
    m.receive(ack(0, -1 % (1 << 24), sack=0b10110))
    assert m.pull_all() == []
    m.receive(ack(0, -1 % (1 << 24), sack=0b11110110))  # region [1, 5): 3
    assert [r["context"]["psn"] for r in m.pull_all()] == [3]
    assert m.counters["inferred_losses"] == 2


def test_a_bitmap_placed_above_the_holes_infers_nothing():
    """A SACK whose bitmap starts above the oldest PSN not yet inferred (the responder's block
    around a late trigger) says nothing about the PSNs below its base: they may have arrived.
    It is merged, but infers no loss and arms no reorder window; one from cack_psn + 1 does."""
    m = timed_model(timeout=20, infer_k=3)
    m.control(RequesterCommand.CONFIG, infer_k=3, reo_wnd=4)
    m.post(wr(length=100 * 256))
    m.pull_all()
    cum = -1 % (1 << 24)
    m.receive(ack(0, cum, sack=0b1111, offset=65))        # PSNs 64-67, base 64 > una 0
    assert m.pull_all() == [] and m.qp(0)["acked"] == [64, 65, 66, 67]
    m.poll_timers(now_units=m.now_units + 8)
    assert m.pull_all() == [] and m.counters["reorder_expiries"] == 0
    m.receive(ack(0, cum, sack=0b1110))                   # PSNs 1-3: 0 has 3 later
    assert [r["context"]["psn"] for r in m.pull_all()] == [0]


def test_time_rule_alone_resends_without_lost_feedback_with_the_count_rule_with_lost():
    """A reorder window that expires with no count-rule region (at an ACK or at the
    scanner's poll) resends its holes as a REORDER walk: no LOST feedback. When the count
    rule finds holes in the same ACK, the whole region is an INFER walk: LOST for each."""
    m = timed_model(timeout=20, infer_k=3)
    m.control(RequesterCommand.CONFIG, infer_k=3, reo_wnd=4)
    m.post(wr(length=16 * 256))
    m.pull_all(now_units=0)
    for psn in range(16):
        m.sent(0, psn, psn % 8)
    lost = lambda: [f["ev"] for f in m.feedback if f["kind"] == P.FeedbackKind.LOST]  # noqa: E731
    m.receive(ack(0, -1 % (1 << 24), sack=0b10), now_units=10)     # 1: arms for [0, 2)
    assert not m.poll_reorder(0) and m.pull_all(now_units=13) == []
    m.now_units = 14
    assert m.poll_reorder(0)                            # 4 units: expired by the poll
    assert [r["context"]["psn"] for r in m.pull_all()] == [0]
    assert lost() == [] and m.counters["reorder_expiries"] == 1
    assert not m.poll_reorder(0)                        # stopped: nothing more
    m.receive(ack(0, -1 % (1 << 24), sack=0b1000110), now_units=20)   # 2, 6: arms [2, 7)
    # 7 and 8 too, 4 units later: the count rule's region [2, 6) (K = 3) and the expired
    # window's [2, 7) make one INFER walk, LOST for each hole: 3, 4, 5.
    m.receive(ack(0, -1 % (1 << 24), sack=0b111000110), now_units=24)
    assert [r["context"]["psn"] for r in m.pull_all()] == [3, 4, 5]
    assert lost() == [3, 4, 5]
    assert m.counters["inferred_losses"] == 4 and m.counters["lost_feedback"] == 3


# -- every QP fails cleanly, and works again -----------------------------------------------------

class Peer:
    """A responder QP (:class:`ResponderModel`) answering a requester's send requests packet by
    packet: every placed packet is SACKed at once (``ack_every`` 1), out-of-window ones NACKed
    at most once per ``nak_interval`` cycles. Shared by the RTL benches."""

    RKEY = 0x55                     # MR slot 5 of 16 (as :func:`wr` and the RTL benches use)
    PD = 1
    BASE = 0x10000

    def __init__(self, config, *, qpn=2, requester_qpn=0, psn=0, mpr=1, max_wimm=2,
                 nak_interval=0):
        self.config, self.qpn, self.requester_qpn = config, qpn, requester_qpn
        self.mpr, self.max_wimm = mpr, max_wimm
        self.responder = ResponderModel(config)
        assert self.responder.configure(ack_every=1, ack_delay=1 << 20,
                                        nak_interval=nak_interval) == P.Errno.OK
        assert self.responder.mr_write(self.RKEY % 16, valid=1, rkey=self.RKEY, pd=self.PD,
                                       base=self.BASE, length=1 << 24) == P.Errno.OK
        self.restart(psn)

    def restart(self, psn):
        """Re-initialise the QP: RTS, expecting ``psn`` next, nothing received."""
        assert self.responder.qp_write(
            self.qpn, state=P.QpState.RTS, remote_qpn=self.requester_qpn, pd=self.PD, psn=psn,
            set_psn=True, mpr=self.mpr, caps=P.QpCapability.TRIM_NACK,
            max_wimm=self.max_wimm) == P.Errno.OK

    @staticmethod
    def payload(local_addr, length):
        return bytes((local_addr + i) % 251 for i in range(length))

    def deliver(self, request, *, now_cycles=0):
        """The data packet of one send request arrives; returns the replies (header dicts)."""
        c = request["context"]
        header = full_header({
            "kind": PacketKind.DATA, "payload_len": c["dma_len"],
            "bth": {"opcode": c["opcode"], "dqpn": self.qpn, "psn": c["psn"],
                    "ackreq": c["ackreq"], "rtx": c["retransmission"], "ts": 1},
            "meth": {"msn": c["msn"], "rqmsn": c["rqmsn"]},
            "reth": {"va": c["va"], "rkey": c["rkey"], "dma_len": c["dma_len"]},
            "immdt": {"imm": c["imm"]},
        }, self.config)
        result = self.responder.receive(header, self.payload(c["local_addr"], c["dma_len"]),
                                        now_cycles=now_cycles)
        return result.replies

    def holds(self, wr):
        """The peer's memory holds WR ``wr``'s payload at its remote address."""
        return (self.responder.memory.read(wr["remote_addr"], wr["length"])
                == self.payload(wr["local_addr"], wr["length"]))


def exchange(m, peer, *, deliver=True, now_cycles=0, rounds=50):
    """Send what ``m`` can send to ``peer`` (or lose it), apply the answers, until nothing more
    goes out. Returns every send request."""
    sent = []
    for _ in range(rounds):
        sends = m.pull_all()
        if not sends:
            return sent
        sent += sends
        replies = [h for r in sends for h in (peer.deliver(r, now_cycles=now_cycles)
                                              if deliver else [])]
        for header in replies:
            m.receive(header)
    raise AssertionError(f"still sending after {rounds} rounds")


def status_of(m, qpn=0):
    return [(c["wr_id"], c["status"]) for c in m.completions if c["qpn"] == qpn]


def test_software_error_flushes_outstanding_wrs_in_order_and_stops_the_qp():
    """QP_WRITE ERROR on a QP with outstanding WRs: at once, nothing more is sent or resent for
    it (the rest of a half-sent WR, trims, retx, timer, inference), every outstanding WR
    completes in order with WR_FLUSH_ERR (a refused one with its own status), later WRs are
    flushed, later ACKs dropped, no qp_error event; the head-of-line WR of another QP goes
    (one segmenter context: with more it would go at once, beside QP 0's)."""
    m = model(CONFIG.replace(segmenters=1), psn=0xFFFFF0, qps=(0, 1))
    m.qp_write(0, psn=0xFFFFF0, max_wimm=2, timeout=2, retry_exp=P.RETRY_INFINITE)
    m.post(wr(length=2 * 256, wr_id=0))
    m.post(wr(length=3 * 256, wr_id=1))
    m.post(wr(opcode=W.RDMA_READ, wr_id=2))
    m.post(wr(length=200 * 256, wr_id=3))                 # waits for the window
    m.post(wr(qpn=1, length=10, wr_id=9))                 # behind it
    sent = m.pull_all(now_units=100)
    assert len(sent) == 128
    m.receive(ack(0, P.psn_add(0xFFFFF0, 2)))             # WR 0 and 1 PSN of WR 1
    assert status_of(m) == [(0, S.SUCCESS)]
    assert m.qp_write(0, state=P.QpState.RTS, psn=7)[0] == P.Errno.EBUSY
    m.receive(nack(0, P.NackReason.TRIMMED, P.psn_add(0xFFFFF0, 4)))   # queued before
    assert m.qp_write(0, state=P.QpState.ERROR, psn=7, max_wimm=2) == (P.Errno.OK, 0)
    assert status_of(m) == [(0, S.SUCCESS), (1, S.WR_FLUSH_ERR), (2, S.LOC_QP_OP_ERR),
                            (3, S.WR_FLUSH_ERR)]
    assert m.counters["error_completions"] == 3
    # The trim decided before the write still goes; then only the other QP's WR.
    after = m.pull_all()
    assert [(r["qpn"], r["context"]["psn"], r["context"]["retransmission"])
            for r in after] == [(0, P.psn_add(0xFFFFF0, 4), 1), (1, 0xFFFFF0, 0)]
    m.receive(ack(1, 0xFFFFF0))
    m.retransmit(0, P.psn_add(0xFFFFF0, 5))
    assert m.poll_timers(now_units=1 << 20) == []
    assert m.pull_all() == []
    assert m.receive(ack(0, P.psn_add(0xFFFFF0, 9), sack=0b111)) == "dropped"
    assert m.counters["retx_ignored"] == 1 and m.counters["timeouts"] == 0
    m.post(wr(length=10, wr_id=4))
    assert status_of(m)[-1] == (4, S.WR_FLUSH_ERR) and m.pull_all() == []
    assert m.qp_errors == []
    una = P.psn_add(0xFFFFF0, 3)
    assert m.control(RequesterCommand.QP_READ, qpn=0)[1] == (
        P.QpState.ERROR | P.psn_add(0xFFFFF0, 128) << 8 | una << 32)
    assert m.control(RequesterCommand.QP_READ, qpn=0, page=1)[1] >> 32 == (
        S.WR_FLUSH_ERR | una << 8)


@pytest.mark.parametrize("state", [P.QpState.RESET, P.QpState.INIT, P.QpState.RTR,
                                   P.QpState.RTS])
def test_qp_write_to_another_state_with_outstanding_wrs_is_busy_and_changes_nothing(state):
    m = model(psn=40)
    m.post(wr(length=2 * 256, wr_id=1))
    m.pull_all()
    before = m.qp(0)
    assert m.qp_write(0, state=state, psn=5)[0] == P.Errno.EBUSY
    assert m.qp(0) == before and m.completions == []
    m.receive(ack(0, 41))
    assert status_of(m, 0) == [(1, S.SUCCESS)]


def test_software_error_of_a_qp_already_in_error_keeps_its_statuses():
    """A QP the retries failed, written ERROR again (no WR outstanding any more): it stays in
    ERROR; its completions keep RETRY_EXC_ERR."""
    m = timed_model(timeout=1, linear=0, exp=0)
    m.post(wr(length=256, wr_id=1))
    m.pull_all(now_units=0)
    assert m.poll_timers(now_units=2) == [(0, "exceeded")]
    assert m.qp_write(0, state=P.QpState.ERROR, psn=0)[0] == P.Errno.OK
    assert status_of(m) == [(1, S.RETRY_EXC_ERR)]
    assert m.qp(0)["state"] == P.QpState.ERROR


FAILURES = ["fatal_nak", "retry_exhausted", "software_error"]


def fail_qp(m, peer, failure):
    """Make QP 0 (two WRs outstanding, ids 10 and 11) fail in one of three ways; returns the
    statuses its WRs must complete with."""
    if failure == "fatal_nak":                  # a bad rkey: REMOTE_ACCESS on its first PSN
        m.post(wr(length=2 * 256, wr_id=10, remote_addr=Peer.BASE) | {"rkey": 0x66})
        m.post(wr(length=256, wr_id=11, remote_addr=Peer.BASE + 0x1000))
        exchange(m, peer)
        return [(10, S.REM_ACCESS_ERR), (11, S.WR_FLUSH_ERR)]
    m.post(wr(length=2 * 256, wr_id=10, remote_addr=Peer.BASE))
    m.post(wr(length=256, wr_id=11, remote_addr=Peer.BASE + 0x1000))
    exchange(m, peer, deliver=False)            # lost on the way
    if failure == "software_error":
        assert m.qp_write(0, state=P.QpState.ERROR, max_wimm=2) == (P.Errno.OK, 0)
        return [(10, S.WR_FLUSH_ERR), (11, S.WR_FLUSH_ERR)]
    verdicts = []
    for now in range(m.now_units, m.now_units + 64):
        verdicts += [v for _, v in m.poll_timers(now_units=now)]
        exchange(m, peer, deliver=False)
    assert verdicts == ["timeout", "exceeded"]
    return [(10, S.RETRY_EXC_ERR), (11, S.RETRY_EXC_ERR)]


@pytest.mark.parametrize("via_reset", [True, False], ids=["via_reset", "straight_to_rts"])
@pytest.mark.parametrize("failure", FAILURES)
def test_qp_carries_traffic_again_after_each_failure(failure, via_reset):
    """Retry exhaustion, a fatal NAK or software ERROR; once the flush completions are out,
    QP_WRITE (RESET then RTS, or RTS at once) with a new PSN, the peer re-initialised with it:
    the QP moves data again, every WR succeeds and lands in the peer's memory."""
    m = timed_model(timeout=1, linear=0, exp=1, psn=0x10)
    peer = Peer(CONFIG, psn=0x10)
    first = wr(length=3 * 256 - 5, wr_id=1, remote_addr=Peer.BASE + 0x8000)
    m.post(first)
    exchange(m, peer)
    assert status_of(m) == [(1, S.SUCCESS)] and peer.holds(first)
    expected = fail_qp(m, peer, failure)
    assert status_of(m)[1:] == expected
    assert m.qp(0)["state"] == P.QpState.ERROR and m.qp(0)["outstanding_wrs"] == 0
    psn = 0xFFFFFC                                  # the new incarnation wraps the PSN space
    if via_reset:
        assert m.qp_write(0, state=P.QpState.RESET, psn=0)[0] == P.Errno.OK
        assert m.qp(0)["state"] == P.QpState.RESET
    assert m.qp_write(0, state=P.QpState.RTS, psn=psn, max_wimm=2, timeout=1,
                      retry_exp=1)[0] == P.Errno.OK
    peer.restart(psn)
    wrs = [wr(length=5 * 256, wr_id=20, remote_addr=Peer.BASE + 0x20000),
           wr(length=300, wr_id=21, opcode=W.RDMA_WRITE_WITH_IMM, imm=0x77,
              remote_addr=Peer.BASE + 0x30000)]
    for w in wrs:
        m.post(w | {"local_addr": 0x90000 + w["wr_id"] * 0x1000})
    sent = exchange(m, peer)
    assert [r["context"]["psn"] for r in sent] == [P.psn_add(psn, i) for i in range(7)]
    assert status_of(m)[-2:] == [(20, S.SUCCESS), (21, S.SUCCESS)]
    assert all(peer.holds(w | {"local_addr": 0x90000 + w["wr_id"] * 0x1000}) for w in wrs)
    assert m.qp(0)["state"] == P.QpState.RTS and m.qp(0)["outstanding_wrs"] == 0
    assert peer.responder.counters["completions"] == 1      # the WRITE_IMM


@pytest.mark.parametrize("distance", [1 << 22, -(1 << 22)], ids=["peer_ahead", "peer_behind"])
def test_a_peer_restarted_far_away_is_refused_and_the_qp_fails_cleanly(distance):
    """The peer's QP re-initialised 2**22 PSNs away from the requester. Ahead of it: every
    packet is a duplicate there, answered by a SACK whose cumulative PSN lies beyond anything
    sent (a bad ACK here). Behind it: every packet is beyond the peer's window, NACKed
    PSN_OOR_WINDOW at most once per nak_interval (counted here). Nothing is placed; the
    retransmit timer runs out and the QP goes to ERROR with every WR RETRY_EXC_ERR."""
    m = timed_model(timeout=2, linear=1, exp=1, psn=0x100)
    peer = Peer(CONFIG, psn=P.psn_add(0x100, distance), nak_interval=1000)
    m.post(wr(length=2 * 256, wr_id=1))
    m.post(wr(length=256, wr_id=2))
    transmissions = len(exchange(m, peer, now_cycles=0))
    verdicts = []
    for now in range(1, 64):
        verdicts += [v for _, v in m.poll_timers(now_units=now)]
        transmissions += len(exchange(m, peer, now_cycles=now * 1024))
        if m.qp(0)["state"] == P.QpState.ERROR:
            break
    assert verdicts == ["timeout", "timeout", "exceeded"]        # 1 + L + E sends of 0x100
    assert status_of(m) == [(1, S.RETRY_EXC_ERR), (2, S.RETRY_EXC_ERR)]
    assert m.qp_errors == [{"qpn": 0, "status": S.RETRY_EXC_ERR}]
    r = peer.responder.counters
    assert r["placed"] == 0 and m.counters["acks"] == 0 and m.qp(0)["una"] == 0x100
    if distance > 0:
        assert r["duplicate"] == r["acks"] == transmissions
        assert m.counters["bad_acks"] == transmissions
    else:
        assert r["out_of_window"] == transmissions
        # One NACK per round of sends (the first, then a walk per timeout, each within one
        # nak_interval), the rest suppressed.
        assert transmissions == 9
        assert r["naks"] == 3 and r["naks_suppressed"] == 6
        assert m.counters["nak_psn_out_of_window"] == r["naks"]
    assert m.pull_all(now_units=1 << 12) == []
