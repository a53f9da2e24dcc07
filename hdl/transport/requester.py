"""The requester: work requests in, data-packet send requests out, SACK/NACK/NAK in, completions
out. Per-QP send state, per-PSN metadata and WR slots live in block RAM.

Five engines share the tables, each the only writer of its own ones, so every table has one
write port and the engines run at the same time without arbitration:

* **WR intake** (S1) reads the QP's state, refuses bad WRs (an error completion through the
  WR ring, so completions stay in order) and claims a WR slot;
* **segmenter** (S2) cuts the WR into MTU packets, one per cycle, each checked against the
  window (``next_psn - una < mpr * 128``) and its metadata written per PSN;
* **retransmitter** (R0-R2) rebuilds a PSN's packet from its metadata and WR slot; it has
  priority over new packets on ``send``;
* **ACK processing** (A1) applies one MRC 1.0 SACK, NACK or AETH NAK per cycle: cumulative
  advance, SACK bitmap merge (any ``sack_psn_offset``) into the acked bitmap, feedback for the
  EV the named PSN went out on, NACK TRIMMED -> retransmit queue, fatal NAK -> QP ERROR;
* **completion engine** walks a QP's WR ring from the oldest slot and completes WRs in order;
* **timer scanner** visits one QP per cycle and expires its retransmit timer
  (``docs/recovery.md``);
* **walker** feeds the retransmitter PSN ranges (timeout and SACK-inferred losses);
* **inference unit** (I0-I3) finds the holes with K later PSNs SACKed in each applied ACK.

Every read port is transparent for its table's write port, so a read sees every write of the
same cycle and earlier: back-to-back operations on one QP need no other forwarding, except
the segmenter's next PSN (a register: the WR being segmented has not written it yet).
"""

from functools import partial

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from .. import protocol as P
from ..config import NicConfig
from ..interfaces import (
    completion_layout,
    feedback_layout,
    path_request_layout,
    work_request_layout,
)
from ..packet.headers import PacketKind, packet_beat_layout
from ..util import as_signal, validating
from .req_completion import CompletionEngine
from .req_defs import (
    ACKREQ_EVERY_BITS,
    CC_DECREASE_SHIFT,
    CC_INCREASE_SHIFT,
    CC_MAX_STEPS,
    CC_MIN_WINDOW,
    CWND_BITS,
    INFER_K_BITS,
    INFER_K_DEFAULT,
    NACK_COUNTERS,
    NAK_COUNTERS,
    REO_WND_BITS,
    REQUESTER_COUNTERS,
    RequesterCommand,
    bitmap_psns,
    cc_page,
    qp_error_layout,
    requester_command_layout,
    requester_response_layout,
    retx_layout,
    send_context_layout,
    sent_layout,
    slot_depth,
    timer_page,
    walk_layout,
)
from .req_infer import InferenceUnit
from .req_intake import Segmenter, WrIntake
from .req_retransmit import Retransmitter, Walker
from .req_send import FeedbackMerge, SendRegister
from .req_tables import TABLE_ACCESS, RequesterTables, block_ram_bits, requester_tables
from .req_timer import TimerScanner, retry_expiry_gateware

__all__ = ["Requester", "send_context_layout", "requester_tables", "block_ram_bits",
           "retry_expiry_gateware"]

_PSN = P.PSN_BITS
_WIMM_BITS = 9          # WRITE_IMM counters: in flight = started - done (mod 512) <= 255


def _log2(n):
    return (n - 1).bit_length()


def _psn_sub(a, b):
    """``a - b`` modulo 2**24 (serial-number distance, non-negative view)."""
    return (a - b)[:_PSN]


def _psn_ge(a, b):
    """``psn_diff(a, b) >= 0``."""
    return ~_psn_sub(a, b)[_PSN - 1]


def _psn_gt(a, b):
    """``psn_diff(a, b) > 0``."""
    return _psn_ge(a, b) & (a != b)


def _clamp(distance, limit):
    """A 24-bit serial distance clamped to ``[0, limit]`` (negative -> 0)."""
    bits = limit.bit_length()
    return Mux(distance[_PSN - 1], 0, Mux(distance >= limit, limit, distance[:bits]))


def _ones(count, width):
    """``count`` low bits set, ``count`` from 0 to ``width``."""
    return ((Const(1, 1) << count) - 1)[:width]


def _rotate_left(value, amount, width):
    return (Cat(value, value) << amount)[width:2 * width]


def _popcount(value):
    return sum((value[i] for i in range(len(value))), C(0, 1))


def _kth_highest(byte, rank):
    """Position (0-7) of the ``rank``-th highest set bit of an 8-bit ``byte``."""
    position = C(0, 3)
    for i in range(8):
        above = _popcount(byte[i:])
        position = Mux(byte[i] & (above == rank), i, position)
    return position


class Requester(wiring.Component):
    """The MRC requester. One send request and one ACK per cycle (II = 1), also back to back
    on one QP.

    Latencies: a WR's first send request leaves 3 cycles after the WR is taken (intake, then
    the segmenter, then the output register); an ACK updates the QP 1 cycle after it is
    taken; a retransmit request leaves 3 cycles after it is taken; a completion leaves a few
    cycles after the ACK that allows it (3 cycles per QP the completion engine visits), then
    one per cycle for the same QP.

    Bad input never hangs the block: a WR it will not send completes with an error status
    (after a QP fails, by a fatal NAK, exhausted retries or software, every outstanding WR
    completes, in order, and nothing is sent or resent for it beyond what was already under
    way);
    a SACK/NACK/NAK it cannot apply is dropped and counted in ``bad_acks``; a retransmit request
    for a PSN no longer outstanding is dropped and counted in ``retx_ignored``; feedback that
    finds its output full is dropped and counted in ``feedback_dropped``. ``docs/requester.md``
    has every rule.

    Loss recovery (``docs/recovery.md``): a per-QP retransmit timer, kept in block
    RAM and visited by a scanner one QP per cycle (accurate to one scan period, ``qps``
    cycles plus arm events), resends the oldest unacknowledged PSN and the old holes after it
    on expiry, with the retry policy of :func:`~hdl.transport.req_defs.retry_expiry`; when
    the retries are exhausted the QP goes to ERROR and every outstanding WR completes with
    RETRY_EXC_ERR. A hole with ``infer_k`` later PSNs SACKed is resent at once. Each PSN
    resent for a timeout or an inferred loss gives LOST feedback for the EV it went out on.

    Parameters
    ----------
    config : NicConfig

    Members
    -------
    wr : ``In(stream.Signature(work_request_layout(config)))``
        Work requests. Taken in order over all QPs (a WR that must wait blocks the ones
        behind it).
    send : ``Out(stream.Signature(path_request_layout(config, send_context_layout(config))))``
        One request per data packet, to path selection. Retransmissions go first.
    sent : ``In(stream.Signature(sent_layout(config)))``
        The EV each PSN went out on. Always ready.
    rx : ``In(stream.Signature(packet_beat_layout(config)))``
        Received SACKs, NACKs and AETH NAKs (single beats).
    feedback : ``Out(stream.Signature(feedback_layout(config)))``
        Path feedback per applied SACK (ACKED, ECN for SKIP_ONCE, LOST for ALWAYS_SKIP; none for a
        probe answer), NACK TRIMMED (TRIMMED) and PSN resent for a
        timeout or an inferred loss (LOST); dropped, not stalled, when full.
    retx : ``In(stream.Signature(retx_layout(config)))``
        Requests to retransmit a PSN (the retransmit timer).
    completion : ``Out(stream.Signature(completion_layout(config)))``
        Requester completions, in WR order per QP. Never dropped.
    qp_error : ``Out(stream.Signature(qp_error_layout(config)))``
        A QP moved to ERROR by a fatal NAK or by exhausted retries (RETRY_EXC_ERR); a
        software ERROR gives none.
    ctl : ``In(stream.Signature(requester_command_layout(config)))``
        Control commands, one at a time. QP_WRITE ERROR on a QP with WRs outstanding fails it
        at once and flushes them (WR_FLUSH_ERR); any other state then is EBUSY. A QP_WRITE
        answers only after every send request already decided (queued resends, the QP's
        packet in the ``send`` register) has left.
    ctl_resp : ``Out(stream.Signature(requester_response_layout(config)))``
    now_ns : ``In(32)``
        Unused (the time is ``now_units``); kept so the NIC's wiring holds.
    now_units : ``In(32)``
        The time in 1.024 us units (:attr:`Timebase.units <hdl.timebase.Timebase.units>`):
        the retransmit timers and the per-PSN send time.
    counters : ``Out(data.StructLayout({name: 32 for name in REQUESTER_COUNTERS}))``
    """

    TRIM_QUEUE_DEPTH = 16
    FEEDBACK_DEPTH = 4
    QP_ERROR_DEPTH = 4
    ARM_DEPTH = 4           #: segmenter -> scanner: "the oldest PSN was just sent"
    WALK_DEPTH = 4          #: per walk kind, scanner/inference -> walker
    EXCEED_DEPTH = 4        #: scanner -> ACK processing: retries exhausted
    LOST_DEPTH = 4          #: walker -> feedback merge

    def __init__(self, *, config):
        with validating(self):
            if not isinstance(config, NicConfig):
                raise TypeError(f"Configuration must be a NicConfig, not {config!r}")
        self._config = config
        super().__init__({
            "wr": In(stream.Signature(work_request_layout(config))),
            "send": Out(stream.Signature(path_request_layout(
                config, context=send_context_layout(config)))),
            "sent": In(stream.Signature(sent_layout(config))),
            "rx": In(stream.Signature(packet_beat_layout(config))),
            "feedback": Out(stream.Signature(feedback_layout(config))),
            "retx": In(stream.Signature(retx_layout(config))),
            "completion": Out(stream.Signature(completion_layout(config))),
            "qp_error": Out(stream.Signature(qp_error_layout(config))),
            "ctl": In(stream.Signature(requester_command_layout(config))),
            "ctl_resp": Out(stream.Signature(requester_response_layout(config))),
            "now_ns": In(32),
            "now_units": In(32),
            "counters": Out(data.StructLayout({name: 32 for name in REQUESTER_COUNTERS})),
        })

    @property
    def config(self):
        return self._config

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        qb = cfg.qpn_bits
        window = bitmap_psns(cfg)
        wb = _log2(window)
        slots = slot_depth(cfg)
        sb = _log2(slots)
        bitmap_bits = P.SACK_BITMAP_BITS

        # -- tables ------------------------------------------------------------------------
        m.submodules.tables = table_block = RequesterTables(config=cfg)

        def reads(engine):
            access = getattr(table_block, engine).read
            return {name: getattr(access, name) for name in TABLE_ACCESS[engine][0]}

        wps = {}
        for engine, (_reads, writes) in TABLE_ACCESS.items():
            for name in writes:
                wps[name] = getattr(getattr(table_block, engine).write, name)

        def psn_addr(qpn, psn):
            return Cat(psn[:wb], qpn)

        def slot_addr(qpn, slot):
            return Cat(slot[:sb], qpn)

        counters = {name: Signal(32, name=f"count_{name}") for name in REQUESTER_COUNTERS}
        for name, counter in counters.items():
            m.d.comb += self.counters[name].eq(counter)

        def count(name, enable=1):
            m.d.sync += counters[name].eq(counters[name] + enable)

        def count_events(engine):
            for name in engine.COUNTERS:
                count(name, engine.events[name])

        def fifo_in(fifo, port):
            """A producer's stream into ``fifo``."""
            m.d.comb += [fifo.w_data.eq(port.payload), fifo.w_en.eq(port.valid),
                         port.ready.eq(fifo.w_rdy)]

        def fifo_out(fifo, port):
            """``fifo`` into a consumer's stream."""
            m.d.comb += [port.payload.eq(fifo.r_data), port.valid.eq(fifo.r_rdy),
                         fifo.r_en.eq(port.ready)]

        def control_to(engine):
            c = engine.control
            m.d.comb += [c.hold.eq(hold), c.write.eq(ctl_write), c.flush.eq(ctl_flush),
                         c.qpn.eq(ctl_qpn), c.psn.eq(ctl_req.psn), c.mpr.eq(ctl_req.mpr),
                         c.ackreq_every.eq(ackreq_every), c.infer_k.eq(infer_k),
                         c.reo_wnd.eq(reo_wnd), c.cc_on.eq(cc_on)]

        # -- control ------------------------------------------------------------------------
        CTL_IDLE, CTL_HOLD, CTL_DECIDE, CTL_RESP = range(4)
        ctl_state = Signal(2)
        ctl_req = Signal(requester_command_layout(cfg))
        ctl_errno = Signal(P.Errno)
        ctl_data = Signal(64)
        ackreq_every = Signal(ACKREQ_EVERY_BITS)
        infer_k = Signal(INFER_K_BITS, init=INFER_K_DEFAULT)
        reo_wnd = Signal(REO_WND_BITS)
        cc_on = Signal()
        hold = Signal()                 # pipelines may not write the QP tables
        ctl_write = Signal()            # this cycle: QP_WRITE writes every QP table
        # This cycle: QP_WRITE ERROR on a QP with outstanding WRs moves it to ERROR and wakes
        # the completion engine, which flushes them (the fatal-NAK flush, WR_FLUSH_ERR).
        ctl_flush = Signal()
        m.d.comb += hold.eq((ctl_state == CTL_HOLD) | (ctl_state == CTL_DECIDE))
        ctl_qpn = ctl_req.qpn[:qb]
        ctl_ports = reads("control")
        for port in ctl_ports.values():
            m.d.comb += port.addr.eq(ctl_qpn)

        # -- FIFOs between the engines ------------------------------------------------------
        m.submodules.trim_queue = trim_queue = SyncFIFOBuffered(
            width=qb + _PSN, depth=self.TRIM_QUEUE_DEPTH)
        # At most one trigger per QP is queued, so this queue never fills: ACK processing
        # never waits for the completion engine.
        m.submodules.ack_triggers = ack_triggers = SyncFIFOBuffered(
            width=qb + 1, depth=max(2, cfg.qps))
        m.submodules.wr_triggers = wr_triggers = SyncFIFOBuffered(width=qb, depth=4)
        fb_layout = feedback_layout(cfg)
        qe_layout = qp_error_layout(cfg)
        m.submodules.qp_error_fifo = qp_error_fifo = SyncFIFOBuffered(
            width=qe_layout.size, depth=self.QP_ERROR_DEPTH)
        # Loss recovery: arm events (segmenter -> scanner), walk requests per kind (scanner,
        # inference unit -> walker), retry-exceeded QPs (scanner -> ACK processing), LOST
        # feedback (walker), merged with the ACK side's into `feedback`.
        wl = walk_layout(cfg)
        m.submodules.arm_fifo = arm_fifo = SyncFIFOBuffered(width=qb + 32,
                                                            depth=self.ARM_DEPTH)
        m.submodules.timeout_walks = timeout_walks = SyncFIFOBuffered(
            width=wl.size, depth=self.WALK_DEPTH)
        m.submodules.infer_walks = infer_walks = SyncFIFOBuffered(
            width=wl.size, depth=self.WALK_DEPTH)
        m.submodules.exceed_fifo = exceed_fifo = SyncFIFOBuffered(width=qb,
                                                                  depth=self.EXCEED_DEPTH)
        m.submodules.feedback = feedback = FeedbackMerge(
            config=cfg, feedback_depth=self.FEEDBACK_DEPTH, lost_depth=self.LOST_DEPTH)
        wiring.connect(m, feedback.o, wiring.flipped(self.feedback))
        m.d.comb += [
            self.qp_error.valid.eq(qp_error_fifo.r_rdy),
            self.qp_error.payload.eq(qp_error_fifo.r_data),
            qp_error_fifo.r_en.eq(self.qp_error.ready),
        ]

        now = self.now_units

        # == new packets: WR intake (S1), segmenter (S2) ===================================
        m.submodules.intake = intake = WrIntake(config=cfg)
        wiring.connect(m, table_block.intake, intake.tables)
        control_to(intake)
        wiring.connect(m, wiring.flipped(self.wr), intake.wr)
        fifo_in(wr_triggers, intake.wr_trigger)
        count_events(intake)
        m.submodules.segmenter = segmenter = Segmenter(config=cfg)
        wiring.connect(m, table_block.segmenter, segmenter.tables)
        control_to(segmenter)
        m.d.comb += segmenter.now.eq(now)
        wiring.connect(m, intake.o, segmenter.i)
        fifo_in(arm_fifo, segmenter.arm)
        count_events(segmenter)

        # == resends: walker, retransmitter (R0-R2) ========================================
        m.submodules.walker = walker = Walker(config=cfg)
        fifo_out(timeout_walks, walker.timeout)
        fifo_out(infer_walks, walker.infer)
        m.submodules.retransmitter = retransmitter = Retransmitter(config=cfg)
        wiring.connect(m, table_block.retransmitter, retransmitter.tables)
        control_to(retransmitter)
        m.d.comb += retransmitter.now.eq(now)
        fifo_out(trim_queue, retransmitter.trim)
        wiring.connect(m, walker.o, retransmitter.walk)
        wiring.connect(m, wiring.flipped(self.retx), retransmitter.retx)
        wiring.connect(m, retransmitter.lost, feedback.lost)
        count_events(retransmitter)

        # == send register: retransmissions first ==========================================
        m.submodules.sender = sender = SendRegister(config=cfg)
        wiring.connect(m, table_block.send, sender.tables)
        m.d.comb += [sender.now.eq(now), sender.lost_pending.eq(feedback.lost_pending)]
        wiring.connect(m, retransmitter.o, sender.resend)
        wiring.connect(m, segmenter.o, sender.new)
        wiring.connect(m, sender.o, wiring.flipped(self.send))
        count_events(sender)

        # == EV reports =====================================================================
        m.d.comb += [
            self.sent.ready.eq(1),
            wps["ev"].addr.eq(psn_addr(self.sent.payload.qpn, self.sent.payload.psn)),
            wps["ev"].data.eq(self.sent.payload.ev),
            wps["ev"].en.eq(self.sent.valid),
        ]

        # == ACK processing (A0 take, A1 apply) =============================================
        def room(fifo, depth):
            return fifo.level <= depth - 2      # one more may be in A1 already

        rx_header = self.rx.payload.header
        rx_seth = rx_header.ctl.sack.seth
        rx_is_sack = rx_header.kind == PacketKind.SACK
        rx_is_nack = rx_header.kind == PacketKind.NACK
        rx_is_aeth = rx_header.kind == PacketKind.AETH
        # The PSN the packet is about: a SACK's ack_psn (cack_psn + ack_psn_offset; a probe
        # answer's offset is a probe id, so its own PSN is its cack_psn), a NACK's nack_psn,
        # a NAK's PSN. Its EV is the one the PSN last went out on (the `ev` table).
        rx_psn = Mux(rx_is_sack & ~rx_seth.pr,
                     (rx_header.bth.psn + rx_seth.ack_psn_offset.as_signed())[:_PSN],
                     rx_header.bth.psn)
        rx_take = Signal()
        # A QP whose retries are exhausted takes the place of an rx beat.
        a0_room = (~hold & room(trim_queue, self.TRIM_QUEUE_DEPTH)
                   & room(qp_error_fifo, self.QP_ERROR_DEPTH))
        x_take = exceed_fifo.r_rdy & a0_room
        m.d.comb += [
            self.rx.ready.eq(a0_room & ~exceed_fifo.r_rdy),
            rx_take.eq(self.rx.valid & self.rx.ready),
            exceed_fifo.r_en.eq(x_take),
        ]
        a_ports = reads("ack")
        for name, port in a_ports.items():
            if name == "ev":
                continue
            m.d.comb += [port.addr.eq(Mux(x_take, exceed_fifo.r_data, rx_header.bth.dqpn[:qb])),
                         port.en.eq(rx_take | x_take)]
        a_ev_port = a_ports["ev"]
        m.d.comb += [a_ev_port.addr.eq(psn_addr(rx_header.bth.dqpn[:qb], rx_psn)),
                     a_ev_port.en.eq(rx_take)]
        a1_valid = Signal()
        a1_exceed = Signal()            # retries exhausted for QP a1_qpn (not a packet)
        a1_known = Signal()             # a SACK/NACK/NAK for a QP that exists
        a1_qpn = Signal(qb)
        a1_kind = Signal(PacketKind)
        a1_syndrome = Signal(8)
        a1_reason = Signal(8)
        a1_psn = Signal(_PSN)
        a1_pr = Signal()
        a1_mark = Signal(P.SackMark)
        a1_cum = Signal(_PSN)
        a1_base = Signal(_PSN)          # PSN of SACK bitmap bit 0
        a1_sack = Signal(bitmap_bits)
        m.d.sync += [a1_valid.eq(rx_take | x_take), a1_exceed.eq(x_take)]
        with m.If(x_take):
            m.d.sync += [a1_known.eq(0), a1_qpn.eq(exceed_fifo.r_data), a1_sack.eq(0)]
        with m.Elif(rx_take):
            m.d.sync += [
                # A SACK whose SETH cack_psn is not its BTH PSN is malformed: a bad ACK.
                a1_known.eq((rx_is_sack & (rx_seth.cack_psn == rx_header.bth.psn)
                             | rx_is_nack | rx_is_aeth) & (rx_header.bth.dqpn < cfg.qps)),
                a1_qpn.eq(rx_header.bth.dqpn[:qb]),
                a1_kind.eq(rx_header.kind),
                a1_syndrome.eq(rx_header.aeth.syndrome),
                a1_reason.eq(rx_header.ctl.neth.nack_reason),
                a1_psn.eq(rx_psn),
                a1_pr.eq(rx_seth.pr),
                a1_mark.eq(rx_seth.m),
                a1_cum.eq(rx_header.bth.psn),
                a1_base.eq((rx_header.bth.psn + rx_seth.sack_psn_offset.as_signed())[:_PSN]),
                a1_sack.eq(Mux(rx_is_sack, rx_seth.sack_bitmap, 0)),
            ]
        a_ack = a_ports["ack"].data
        a_next = a_ports["next_psn"].data
        a_old_bitmap = a_ports["acked"].data
        a_una = a_ack.una
        a1_ev = a_ev_port.data
        # Signals, not expressions: each is read in many places below.
        sig = partial(as_signal, m)
        is_ack = sig(a1_kind == PacketKind.SACK, "a_is_ack")
        is_nack = sig(a1_kind == PacketKind.NACK, "a_is_nack")
        is_nak = sig((a1_kind == PacketKind.AETH) & (a1_syndrome[5:7] == 3), "a_is_nak")
        code = a1_syndrome[:5]
        fatal = sig(is_nak & ((code == P.NakCode.INVALID_REQUEST)
                              | (code == P.NakCode.REMOTE_ACCESS)
                              | (code == P.NakCode.REMOTE_OPERATIONAL)), "a_fatal")
        trim = sig(is_nack & (a1_reason == P.NackReason.TRIMMED), "a_trim")
        out_of_window = sig(is_nack & (a1_reason == P.NackReason.PSN_OOR_WINDOW),
                            "a_out_of_window")
        # Only a SACK moves the cumulative PSN.
        cand = sig(Mux(is_ack, (a1_cum + 1)[:_PSN], a_una), "a_cand")
        advance = sig(_psn_gt(cand, a_una), "a_advance")
        beyond = sig(advance & ~_psn_ge(a_next, cand), "a_beyond")
        new_una = sig(Mux(advance, cand, a_una), "a_new_una")
        outstanding = sig(_psn_ge(a1_psn, new_una) & _psn_gt(a_next, a1_psn), "a_outstanding")
        # The PSN the packet names was sent and its EV entry still holds it.
        psn_sent = sig(_psn_gt(a_next, a1_psn) & (_psn_sub(a_next, a1_psn) <= window),
                       "a_psn_sent")
        a_live = sig((a_ports["cfg"].data.state == P.QpState.RTS) & ~a_ack.error, "a_live")
        a_drop = sig(~a1_known | ~a_live | ~(is_ack | fatal | trim | out_of_window) | beyond
                     | (fatal & ~outstanding), "a_drop")
        a_apply = sig(a1_valid & ~a1_exceed & ~a_drop, "a_apply")
        # Exhausted retries: like a fatal NAK for the oldest PSN, if the QP is still live.
        x_apply = sig(a1_valid & a1_exceed & a_live, "x_apply")

        # SACK bit i is PSN base + i (any sack_psn_offset); keep the bits for PSNs in
        # [max(una, base), next_psn): a bitmap that does not overlap the window adds nothing.
        lo = _clamp(_psn_sub(new_una, a1_base), bitmap_bits)
        hi = _clamp(_psn_sub(a_next, a1_base), bitmap_bits)
        sack_mask = _ones(hi, bitmap_bits) & ~_ones(lo, bitmap_bits)
        sack_rot = _rotate_left(Cat(a1_sack & sack_mask, C(0, window - bitmap_bits)),
                                a1_base[:wb], window)
        clear_len = Mux(advance, _psn_sub(cand, a_una)[:wb + 1], 0)
        clear = _rotate_left(_ones(clear_len, window), a_una[:wb], window)
        new_bitmap = Signal(window)
        m.d.comb += new_bitmap.eq((a_old_bitmap & ~clear) | sack_rot)
        new_bits = (sack_rot & ~a_old_bitmap).any()
        trim_queued = (a_apply & trim & outstanding
                       & ~new_bitmap.bit_select(a1_psn[:wb], 1))
        err_status = Signal(P.CompletionStatus)
        with m.Switch(code):
            for nak_code, status in (
                    (P.NakCode.INVALID_REQUEST, P.CompletionStatus.REM_INV_REQ_ERR),
                    (P.NakCode.REMOTE_ACCESS, P.CompletionStatus.REM_ACCESS_ERR),
                    (P.NakCode.REMOTE_OPERATIONAL, P.CompletionStatus.REM_OP_ERR)):
                with m.Case(nak_code):
                    m.d.comb += err_status.eq(status)

        c_ack = ctl_ports["ack"].data
        with m.If(ctl_write):
            m.d.comb += [
                wps["ack"].addr.eq(ctl_qpn), wps["ack"].en.eq(1),
                wps["ack"].data.eq(0), wps["ack"].data.una.eq(ctl_req.psn),
                wps["acked"].addr.eq(ctl_qpn), wps["acked"].en.eq(1), wps["acked"].data.eq(0),
            ]
        with m.Elif(ctl_flush):
            # Software ERROR: the fatal-NAK error with WR_FLUSH_ERR for the oldest PSN, so
            # the completion engine gives every outstanding WR WR_FLUSH_ERR.
            m.d.comb += [
                wps["ack"].addr.eq(ctl_qpn), wps["ack"].en.eq(1),
                wps["ack"].data.una.eq(c_ack.una), wps["ack"].data.error.eq(1),
                wps["ack"].data.err_status.eq(P.CompletionStatus.WR_FLUSH_ERR),
                wps["ack"].data.err_psn.eq(c_ack.una),
            ]
        with m.Elif(x_apply):
            m.d.comb += [
                wps["ack"].addr.eq(a1_qpn), wps["ack"].en.eq(1),
                wps["ack"].data.una.eq(a_una), wps["ack"].data.error.eq(1),
                wps["ack"].data.err_status.eq(P.CompletionStatus.RETRY_EXC_ERR),
                wps["ack"].data.err_psn.eq(a_una),
            ]
        with m.Else():
            m.d.comb += [
                wps["ack"].addr.eq(a1_qpn), wps["ack"].en.eq(a_apply),
                wps["ack"].data.una.eq(new_una),
                wps["ack"].data.error.eq(fatal),
                wps["ack"].data.err_status.eq(Mux(fatal, err_status, 0)),
                wps["ack"].data.err_psn.eq(Mux(fatal, a1_psn, 0)),
                wps["acked"].addr.eq(a1_qpn), wps["acked"].en.eq(a_apply),
                wps["acked"].data.eq(new_bitmap),
            ]

        # The ECN window: an ACK echoing CE for a PSN sent after the last decrease takes 1/8
        # (at least one) off the window the QP used (floor CC_MIN_WINDOW): the larger of the
        # PSNs in flight before it and the PSNs sent since the last decrease, at most cwnd; an
        # unmarked ACK counts the PSNs it acknowledges cumulatively (at least one), every
        # cwnd/4 counted add one PSN (byte counting, at most CC_MAX_STEPS per ACK), up to MPR.
        a_cc = a_ports["cc"].data
        cc_max = Cat(C(0, 7), a_ports["cfg"].data.mpr)
        cc_flight = _psn_sub(a_next, a_una)        # in flight when the marked ACK left
        cc_sent = _psn_sub(a_next, a_cc.recover)   # sent since the last decrease
        cc_window = Mux(cc_sent > cc_flight, cc_sent, cc_flight)
        cc_base = Mux(cc_window < a_cc.cwnd, cc_window[:CWND_BITS], a_cc.cwnd)
        cc_step = cc_base >> CC_DECREASE_SHIFT
        cc_cut = (cc_base - Mux(cc_step == 0, 1, cc_step))[:CWND_BITS]
        # SETH m = SKIP_ONCE: the trigger arrived with CE (a probe answer carries no mark).
        cc_marked = (a1_mark == P.SackMark.SKIP_ONCE) & ~a1_pr
        cc_decrease = cc_marked & _psn_ge(a1_psn, a_cc.recover)
        cc_write = Signal.like(a_cc)
        m.d.comb += cc_write.eq(a_cc)
        with m.If(cc_decrease):
            # (base - max(base/8, 1) >= CC_MIN_WINDOW for every base above the floor; a mark
            # with nothing in flight, base 0, gives the floor, not a wrapped cut)
            m.d.comb += [cc_write.cwnd.eq(Mux(cc_base <= CC_MIN_WINDOW, CC_MIN_WINDOW, cc_cut)),
                         cc_write.acc.eq(0), cc_write.recover.eq(a_next)]
        with m.Elif(~cc_marked):
            cc_thr = Signal(CWND_BITS)
            cc_sum = Signal(CWND_BITS + 1)
            m.d.comb += [cc_thr.eq(Mux((a_cc.cwnd >> CC_INCREASE_SHIFT) == 0, 1,
                                       a_cc.cwnd >> CC_INCREASE_SHIFT)),
                         cc_sum.eq(a_cc.acc + Mux(clear_len == 0, 1, clear_len))]
            cc_steps = Signal(range(CC_MAX_STEPS + 1))
            cc_used = Signal(CWND_BITS + 3)
            for k in range(1, CC_MAX_STEPS + 1):    # the last true condition wins
                with m.If(cc_sum >= cc_thr * k):
                    m.d.comb += [cc_steps.eq(k), cc_used.eq(cc_thr * k)]
            cc_left = (cc_sum - cc_used)[:CWND_BITS + 1]
            cc_grown = a_cc.cwnd + cc_steps
            m.d.comb += [cc_write.cwnd.eq(Mux(cc_grown < cc_max, cc_grown, cc_max)),
                         cc_write.acc.eq(Mux(cc_left < cc_thr, cc_left, cc_thr - 1))]
        with m.If(ctl_write):
            m.d.comb += [wps["cc"].addr.eq(ctl_qpn), wps["cc"].en.eq(1),
                         wps["cc"].data.cwnd.eq(Cat(C(0, 7), ctl_req.mpr)),
                         wps["cc"].data.recover.eq(ctl_req.psn)]
        with m.Else():
            m.d.comb += [wps["cc"].addr.eq(a1_qpn), wps["cc"].en.eq(a_apply & is_ack),
                         wps["cc"].data.eq(cc_write)]

        # Completion triggers: none while one is queued for the QP (the engine reads the QP
        # when it takes the trigger, so it sees this ACK's change too).
        # A software flush queues one the same way (ACK processing is idle while the control
        # decides, so the two never push in the same cycle).
        trigger_bit = ~a_ports["trig_seen"].data
        trigger_push = (((a_apply & (advance | fatal)) | x_apply)
                        & (a_ports["trig_set"].data == a_ports["trig_seen"].data))
        ctl_trigger_bit = ~ctl_ports["trig_seen"].data
        ctl_trigger_push = ctl_flush & (ctl_ports["trig_set"].data
                                        == ctl_ports["trig_seen"].data)
        trigger_qpn = Mux(ctl_flush, ctl_qpn, a1_qpn)
        trigger_value = Mux(ctl_flush, ctl_trigger_bit, trigger_bit)
        m.d.comb += [
            ack_triggers.w_data.eq(Cat(trigger_qpn, trigger_value)),
            ack_triggers.w_en.eq(trigger_push | ctl_trigger_push),
            wps["trig_set"].addr.eq(trigger_qpn), wps["trig_set"].data.eq(trigger_value),
            wps["trig_set"].en.eq(trigger_push | ctl_trigger_push),
            trim_queue.w_data.eq(Cat(a1_qpn, a1_psn)),
            trim_queue.w_en.eq(trim_queued),
        ]
        qp_error_value = Signal(qe_layout)
        m.d.comb += [
            qp_error_value.qpn.eq(a1_qpn),
            qp_error_value.status.eq(Mux(x_apply, P.CompletionStatus.RETRY_EXC_ERR, err_status)),
            qp_error_fifo.w_data.eq(qp_error_value),
            qp_error_fifo.w_en.eq((a_apply & fatal) | x_apply),
            # The timer restarts from the time una last advanced.
            wps["progress"].addr.eq(a1_qpn), wps["progress"].data.eq(now),
            wps["progress"].en.eq(a_apply & advance),
        ]
        count("retry_exceeded", x_apply)
        feedback_value = Signal(fb_layout)
        # Feedback for the EV the named PSN went out on: SACK m NONE -> ACKED, SKIP_ONCE -> ECN,
        # ALWAYS_SKIP -> LOST (a bad path); NACK TRIMMED -> TRIMMED. A probe answer (pr = 1)
        # gives none, nor a PSN whose EV entry no longer holds it.
        feedback_push = a_apply & psn_sent & ((is_ack & ~a1_pr) | trim)
        fb_kind = Signal(P.FeedbackKind)
        with m.If(trim):
            m.d.comb += fb_kind.eq(P.FeedbackKind.TRIMMED)
        with m.Elif(a1_mark == P.SackMark.SKIP_ONCE):
            m.d.comb += fb_kind.eq(P.FeedbackKind.ECN)
        with m.Elif(a1_mark == P.SackMark.ALWAYS_SKIP):
            m.d.comb += fb_kind.eq(P.FeedbackKind.LOST)
        with m.Else():
            m.d.comb += fb_kind.eq(P.FeedbackKind.ACKED)
        m.d.comb += [
            feedback_value.qpn.eq(a1_qpn), feedback_value.ev.eq(a1_ev),
            feedback_value.kind.eq(fb_kind),
            feedback.ack.payload.eq(feedback_value),
            feedback.ack.valid.eq(feedback_push),
        ]
        count("feedback_dropped", (feedback_push & ~feedback.ack.ready)
              + retransmitter.events.lost_dropped)
        count("bad_acks", a1_valid & ~a1_exceed & a_drop)
        count("acks", a_apply & is_ack)
        count("duplicate_acks", a_apply & is_ack & ~advance & ~new_bits)
        for nak_code, name in NAK_COUNTERS.items():
            count(name, a_apply & is_nak & (code == nak_code))
        for reason, name in NACK_COUNTERS.items():
            count(name, a_apply & is_nack & (a1_reason == reason))

        # == inference unit ==================================================================
        m.submodules.inference = inference = InferenceUnit(config=cfg)
        wiring.connect(m, table_block.inference, inference.tables)
        control_to(inference)
        fifo_in(infer_walks, inference.walk)
        a_sack = a1_sack & sack_mask
        infer_req = inference.ack.payload
        m.d.comb += [
            inference.now.eq(now),
            inference.ack.valid.eq(a_apply & ~fatal & ((infer_k != 0) | (reo_wnd != 0))
                                   & (a_sack != 0)),
            infer_req.qpn.eq(a1_qpn), infer_req.base.eq(a1_base), infer_req.una.eq(new_una),
            infer_req.next.eq(a_next), infer_req.sack.eq(a_sack),
        ]
        count_events(inference)
        # == retransmit timer scanner =======================================================
        m.submodules.scanner = scanner = TimerScanner(config=cfg)
        wiring.connect(m, table_block.scanner, scanner.tables)
        control_to(scanner)
        m.d.comb += scanner.now.eq(now)
        fifo_out(arm_fifo, scanner.arm)
        fifo_in(timeout_walks, scanner.timeout)
        fifo_in(exceed_fifo, scanner.exceed)
        wiring.connect(m, scanner.poll, inference.poll)
        count_events(scanner)

        # == completion engine ==============================================================
        m.submodules.completion = completion = CompletionEngine(config=cfg)
        wiring.connect(m, table_block.completion, completion.tables)
        control_to(completion)
        fifo_out(ack_triggers, completion.ack_trigger)
        fifo_out(wr_triggers, completion.wr_trigger)
        wiring.connect(m, completion.completion, wiring.flipped(self.completion))
        count_events(completion)

        # == control FSM ====================================================================
        c_cfg, c_sq, c_cq = (ctl_ports[n].data for n in ("cfg", "sq", "cq"))
        c_next = ctl_ports["next_psn"].data
        state_ok = Signal()
        with m.Switch(ctl_req.state):
            with m.Case(*(int(s) for s in P.QpState)):
                m.d.comb += state_ok.eq(1)
        bad_qp_write = (~state_ok | (ctl_req.mpr == 0) | (ctl_req.mpr > cfg.mpr_units)
                        | (ctl_req.max_wimm == 0) | (ctl_req.max_wimm > cfg.max_wimm)
                        | (ctl_req.timeout > P.LOCAL_ACK_TIMEOUT_MAX)
                        | (ctl_req.retry_exp > P.RETRY_EXPONENTIAL_MAX))
        c_outstanding = (c_sq.tail - c_cq.head)[:sb + 1]
        # A QP_WRITE first lets every send request already decided leave: the TRIM and walk
        # queues, the walker and R1/R2 run dry (nothing refills them while the engines are
        # held and `retx` waits) and the `send` register holds no packet of the QP. Nothing
        # decided under the QP's old state leaves `send` after the response, neither after an
        # ERROR nor after a re-initialisation with a new PSN.
        retx_pending = ((trim_queue.level != 0) | (timeout_walks.level != 0)
                        | (infer_walks.level != 0) | walker.o.valid | retransmitter.busy)
        ctl_drain_wait = Signal()
        m.d.comb += ctl_drain_wait.eq(
            (ctl_req.cmd == RequesterCommand.QP_WRITE)
            & (retx_pending | (self.send.valid & (self.send.payload.qpn == ctl_qpn))))
        m.d.comb += [
            self.ctl.ready.eq(ctl_state == CTL_IDLE),
            self.ctl_resp.valid.eq(ctl_state == CTL_RESP),
            self.ctl_resp.payload.errno.eq(ctl_errno),
            self.ctl_resp.payload.data.eq(ctl_data),
        ]
        with m.If(ctl_write):
            m.d.comb += [
                wps["cfg"].addr.eq(ctl_qpn), wps["cfg"].en.eq(1),
                wps["cfg"].data.state.eq(ctl_req.state), wps["cfg"].data.mpr.eq(ctl_req.mpr),
                wps["cfg"].data.max_wimm.eq(ctl_req.max_wimm),
                wps["cfg"].data.timeout.eq(ctl_req.timeout),
                wps["cfg"].data.retry_linear.eq(ctl_req.retry_linear),
                wps["cfg"].data.retry_exp.eq(ctl_req.retry_exp),
            ]
        with m.Switch(ctl_state):
            with m.Case(CTL_IDLE):
                with m.If(self.ctl.valid):
                    m.d.sync += [ctl_req.eq(self.ctl.payload), ctl_state.eq(CTL_HOLD)]
            with m.Case(CTL_HOLD):
                with m.If(~a1_valid & ~completion.busy & ~inference.busy & ~scanner.busy
                          & ~ctl_drain_wait):
                    m.d.sync += ctl_state.eq(CTL_DECIDE)
            with m.Case(CTL_DECIDE):
                m.d.sync += [ctl_state.eq(CTL_RESP), ctl_errno.eq(P.Errno.OK), ctl_data.eq(0)]
                with m.Switch(ctl_req.cmd):
                    with m.Case(RequesterCommand.CONFIG):
                        m.d.sync += [ackreq_every.eq(ctl_req.ackreq_every),
                                     infer_k.eq(ctl_req.infer_k), cc_on.eq(ctl_req.cc),
                                     reo_wnd.eq(ctl_req.reo_wnd)]
                    with m.Case(RequesterCommand.QP_READ):
                        with m.If(ctl_req.qpn >= cfg.qps):
                            m.d.sync += ctl_errno.eq(P.Errno.ENOENT)
                        with m.Elif(ctl_req.page == 0):
                            m.d.sync += ctl_data.eq(Cat(
                                Mux(c_ack.error, int(P.QpState.ERROR), c_cfg.state)[:3],
                                C(0, 5), c_next, c_ack.una))
                        with m.Elif(ctl_req.page == 1):
                            m.d.sync += ctl_data.eq(Cat(
                                c_outstanding, C(0, 7 - sb),
                                (c_sq.wimm - c_cq.wimm)[:8], c_cfg.mpr, C(0, 4),
                                c_cfg.max_wimm, Value.cast(c_ack.err_status),
                                C(0, 3), c_ack.err_psn))
                        with m.Elif(ctl_req.page == 2):
                            c_tmr = ctl_ports["tmr"].data
                            m.d.sync += ctl_data.eq(timer_page(
                                armed=c_tmr.armed, retries=c_tmr.retries, start=c_tmr.start))
                        with m.Else():
                            c_cc = ctl_ports["cc"].data
                            m.d.sync += ctl_data.eq(cc_page(
                                cwnd=c_cc.cwnd, acc=c_cc.acc, recover=c_cc.recover))
                    with m.Case(RequesterCommand.QP_WRITE):
                        with m.If(ctl_req.qpn >= cfg.qps):
                            m.d.sync += ctl_errno.eq(P.Errno.ENOENT)
                        with m.Elif(bad_qp_write):
                            m.d.sync += ctl_errno.eq(P.Errno.EINVAL)
                        with m.Elif(c_outstanding != 0):
                            # ERROR flushes the outstanding WRs (a QP already in ERROR keeps
                            # its flush and statuses); any other state waits for them.
                            with m.If(ctl_req.state == P.QpState.ERROR):
                                m.d.comb += ctl_flush.eq(~c_ack.error)
                            with m.Else():
                                m.d.sync += ctl_errno.eq(P.Errno.EBUSY)
                        with m.Else():
                            m.d.comb += ctl_write.eq(1)
                    with m.Default():
                        m.d.sync += ctl_errno.eq(P.Errno.EINVAL)
            with m.Case(CTL_RESP):
                with m.If(self.ctl_resp.ready):
                    m.d.sync += ctl_state.eq(CTL_IDLE)
        return m
