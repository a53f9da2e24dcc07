"""The requester's resend path: the walker (:class:`Walker`) turns PSN ranges into single
PSNs, the retransmitter (:class:`Retransmitter`) checks each and rebuilds its packet."""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import protocol as P
from ..interfaces import feedback_layout
from ..util import validating
from .req_common import (
    PSN,
    ControlSignature,
    check_config,
    data_opcode,
    events_layout,
    log2,
    psn_ge,
    psn_gt,
    psn_sub,
)
from .req_defs import (
    PSN_CHUNK,
    TIME_BITS,
    YOUNG_CAP_LOG2,
    WalkKind,
    bitmap_psns,
    chunk_map_slots,
    pool_index_bits,
    psn_chunk_bits,
    retx_layout,
    walk_layout,
)
from .req_send import send_item_layout
from .req_tables import table_access_signature

__all__ = ["trim_layout", "walk_step_layout", "Walker", "Retransmitter"]


def trim_layout(config):
    """A trimmed PSN to resend (ACK processing -> retransmitter)."""
    return data.StructLayout({"qpn": config.qpn_bits, "psn": PSN})


def walk_step_layout(config):
    """One PSN of a walk (walker -> retransmitter): ``first`` marks the walk's first PSN."""
    return data.StructLayout({"qpn": config.qpn_bits, "psn": PSN, "kind": WalkKind,
                              "first": 1})


class Walker(wiring.Component):
    """Hand the retransmitter a walk's PSNs, one per cycle, TIMEOUT walks first.

    A walk ``(qpn, psn, count, kind)`` becomes ``count`` PSNs from ``psn``. The next walk is
    taken in the cycle the last PSN of the current one is taken (no bubble). No table access;
    whether a PSN is still worth resending is the retransmitter's check.

    Members
    -------
    timeout : ``In(stream.Signature(walk_layout(config)))``
        TIMEOUT walks (timer scanner).
    infer : ``In(stream.Signature(walk_layout(config)))``
        INFER and REORDER walks (inference unit).
    o : ``Out(stream.Signature(walk_step_layout(config)))``
        Valid while a walk is under way.
    """

    def __init__(self, *, config):
        with validating(self):
            check_config(config)
        self._config = config
        super().__init__({
            "timeout": In(stream.Signature(walk_layout(config))),
            "infer": In(stream.Signature(walk_layout(config))),
            "o": Out(stream.Signature(walk_step_layout(config))),
        })

    def elaborate(self, platform):
        m = Module()
        w_valid = Signal()
        w = Signal(walk_layout(self._config))
        w_first = Signal()
        w_step = self.o.valid & self.o.ready
        w_done = w_step & (w.count == 1)
        w_load = ~w_valid | w_done
        w_take_timeout = w_load & self.timeout.valid
        w_take_infer = w_load & ~self.timeout.valid & self.infer.valid
        m.d.comb += [
            self.timeout.ready.eq(w_take_timeout), self.infer.ready.eq(w_take_infer),
            self.o.valid.eq(w_valid),
            self.o.payload.qpn.eq(w.qpn), self.o.payload.psn.eq(w.psn),
            self.o.payload.kind.eq(w.kind), self.o.payload.first.eq(w_first),
        ]
        with m.If(w_take_timeout | w_take_infer):
            m.d.sync += [
                w_valid.eq(1), w_first.eq(1),
                w.eq(Mux(w_take_timeout, self.timeout.payload, self.infer.payload)),
            ]
        with m.Elif(w_step):
            m.d.sync += [w.psn.eq(w.psn + 1), w.count.eq(w.count - 1), w_first.eq(0)]
            with m.If(w_done):
                m.d.sync += w_valid.eq(0)
        return m


class Retransmitter(wiring.Component):
    """Resend single PSNs: a trimmed PSN first, then the walker's, then ``retx`` requests.

    R0 takes a PSN and reads the QP's chunk map entry for it; RM reads the QP's state and the
    PSN's metadata (in the PSN pool chunk the map names); R1 checks, from the tables' data,
    that the PSN is still outstanding (QP live, ``una <= psn < next_psn``, not SACKed) and
    how long ago it was sent, and registers the results; RC decides whether a walk's PSN is
    worth resending (a TIMEOUT walk skips PSNs after its first sent less than the base
    timeout ago; an INFER or REORDER walk skips PSNs already resent), gives LOST feedback
    where due, and reads the PSN's WR pool entry (``wr_send``, the entry its metadata
    names); R2 rebuilds the packet (offset, length, opcode from the entry and the PSN's
    index in the WR) into R3, the output register, which offers it to the send register (no
    logic between the entry's block RAM and ``o``). One PSN per cycle; 6 cycles
    from R0 to ``o``. A PSN that fails the check is dropped (``retx_ignored`` for a request,
    ``walk_skipped`` for a walk).

    Hazards: reads other engines' tables through transparent ports in RM; a write in R1's
    or RC's cycle (an ACK that acknowledges the PSN) is not seen, so a PSN acknowledged in
    those cycles may still be resent (harmless: a duplicate). ``retx`` waits while the control
    holds; the trim queue and walks are drained (the control waits for them).

    Members
    -------
    tables : ``In(table_access_signature(config, "retransmitter"))``
    control : ``In(ControlSignature(config))``
    now : ``In(32)``
        The time in 1.024 us units.
    trim : ``In(stream.Signature(trim_layout(config)))``
    walk : ``In(stream.Signature(walk_step_layout(config)))``
    retx : ``In(stream.Signature(retx_layout(config)))``
    lost : ``Out(stream.Signature(feedback_layout(config)))``
        LOST feedback for the EV a resent PSN last went out on; dropped when not ready.
    o : ``Out(stream.Signature(send_item_layout(config)))``
        Rebuilt packets (``walk`` set for a walker's), for the send register.
    busy : ``Out(1)``
        RM, R1, R2 or R3 holds a PSN.
    events : ``Out(events_layout(EVENTS))``
        The counters of :attr:`COUNTERS` and ``lost_dropped`` (LOST feedback dropped, a
        part of ``feedback_dropped``).
    """

    COUNTERS = ("retx_ignored", "walk_skipped", "lost_feedback", "timeout_retransmissions",
                "inferred_losses")
    EVENTS = (*COUNTERS, "lost_dropped")

    def __init__(self, *, config):
        with validating(self):
            check_config(config)
        self._config = config
        super().__init__({
            "tables": In(table_access_signature(config, "retransmitter")),
            "control": In(ControlSignature(config)),
            "now": In(32),
            "trim": In(stream.Signature(trim_layout(config))),
            "walk": In(stream.Signature(walk_step_layout(config))),
            "retx": In(stream.Signature(retx_layout(config))),
            "lost": Out(stream.Signature(feedback_layout(config))),
            "o": Out(stream.Signature(send_item_layout(config))),
            "busy": Out(1),
            "events": Out(events_layout(self.EVENTS)),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        qb = cfg.qpn_bits
        wb = log2(bitmap_psns(cfg))
        pb = pool_index_bits(cfg)
        mtu_bits = log2(cfg.mtu)
        hold = self.control.hold
        time_now = self.now[:TIME_BITS]
        trim, walk, retx = self.trim, self.walk, self.retx
        reads = self.tables.read
        events = self.events

        cb = log2(PSN_CHUNK)
        rm_valid = Signal()
        rm_qpn = Signal(qb)
        rm_psn = Signal(PSN)
        rm_walk = Signal()              # from the walker (else TRIM queue or `retx`)
        rm_kind = Signal(WalkKind)
        rm_first = Signal()
        r1_valid = Signal()
        r1_qpn = Signal(qb)
        r1_psn = Signal(PSN)
        r1_walk = Signal()
        r1_kind = Signal(WalkKind)
        r1_first = Signal()
        r1_chunk = Signal(psn_chunk_bits(cfg))
        r2_chunk = Signal(psn_chunk_bits(cfg))
        rc_valid = Signal()
        r2_valid = Signal()
        r2_qpn = Signal(qb)
        r2_psn = Signal(PSN)
        r2_slot = Signal(pb)
        r2_ev = Signal(cfg.ev_index_bits)
        r2_walk = Signal()
        r3_valid = Signal()
        r3_item = Signal(send_item_layout(cfg))
        # R2's packet moves to R3 (the output register) when R3 is empty or leaving.
        r2_emit = Signal()
        m.d.comb += r2_emit.eq(r2_valid & (~r3_valid | self.o.ready))
        r1_advance = Signal()
        r0_take = Signal()
        r2_load = Signal()
        rm_advance = Signal()
        m.d.comb += [rm_advance.eq(rm_valid & (~r1_valid | r1_advance)),
                     r0_take.eq(~rm_valid | rm_advance),
                     self.busy.eq(rm_valid | r1_valid | rc_valid | r2_valid | r3_valid)]

        # R0: take a PSN, read the QP's chunk map entry for it.
        from_trim = trim.valid
        from_walk = ~from_trim & walk.valid
        r0_qpn = Mux(from_trim, trim.payload.qpn, Mux(walk.valid, walk.payload.qpn,
                                                       retx.payload.qpn))
        r0_psn = Mux(from_trim, trim.payload.psn, Mux(walk.valid, walk.payload.psn,
                                                       retx.payload.psn))
        r0_accept = r0_take & (from_trim | walk.valid | (retx.valid & ~hold))
        # `retx` waits while a command holds the engines: a QP_WRITE lets the retransmissions
        # already queued leave first (control), and nothing new may join them.
        m.d.comb += [
            trim.ready.eq(r0_take),
            walk.ready.eq(r0_take & ~from_trim),
            retx.ready.eq(r0_take & ~from_trim & ~walk.valid & ~hold),
        ]
        slot_bits = log2(chunk_map_slots(cfg))
        m.d.comb += [reads.chunk_map.addr.eq(Cat(r0_psn[cb:cb + slot_bits], r0_qpn)),
                     reads.chunk_map.en.eq(r0_accept)]
        with m.If(r0_accept):
            m.d.sync += [rm_valid.eq(1), rm_qpn.eq(r0_qpn), rm_psn.eq(r0_psn),
                         rm_walk.eq(from_walk), rm_kind.eq(walk.payload.kind),
                         rm_first.eq(walk.payload.first)]
        with m.Elif(rm_advance):
            m.d.sync += rm_valid.eq(0)

        # RM: read the QP's state and the PSN's metadata, in the chunk the map names.
        rm_chunk = reads.chunk_map.data
        for name in ("cfg", "next_psn", "ack", "acked", "meta", "ev"):
            port = getattr(reads, name)
            addr = Cat(rm_psn[:cb], rm_chunk) if name in ("meta", "ev") else rm_qpn
            m.d.comb += [port.addr.eq(addr), port.en.eq(rm_advance)]
        with m.If(rm_advance):
            m.d.sync += [r1_valid.eq(1), r1_qpn.eq(rm_qpn), r1_psn.eq(rm_psn),
                         r1_walk.eq(rm_walk), r1_kind.eq(rm_kind), r1_first.eq(rm_first),
                         r1_chunk.eq(rm_chunk)]
        with m.Elif(r1_advance):
            m.d.sync += r1_valid.eq(0)

        # R1: the tables' data lands; the checks are made from it and registered (RC), so no
        # block RAM's data runs into the decision and the stages behind it.
        r1_ack = reads.ack.data
        r1_meta = reads.meta.data
        r1_ok = ((reads.cfg.data.state == P.QpState.RTS) & ~r1_ack.error
                 & psn_ge(r1_psn, r1_ack.una) & psn_gt(reads.next_psn.data, r1_psn)
                 & ~reads.acked.data.bit_select(r1_psn[:wb], 1))
        # A TIMEOUT walk resends PSNs after the oldest only if they were last sent at least
        # the base timeout ago (capped: the send time has 16 bits): the others may still be
        # in flight on good paths. An INFER walk leaves retransmitted PSNs to the timer.
        r1_timeout = reads.cfg.data.timeout
        r1_age = (time_now - r1_meta.time)[:TIME_BITS]
        r1_young = (r1_age >> Mux(r1_timeout > YOUNG_CAP_LOG2, YOUNG_CAP_LOG2, r1_timeout)) == 0
        rc_qpn = Signal(qb)
        rc_psn = Signal(PSN)
        rc_walk = Signal()
        rc_kind = Signal(WalkKind)
        rc_first = Signal()
        rc_chunk = Signal(psn_chunk_bits(cfg))
        rc_ok = Signal()                # outstanding: QP live, una <= psn < next_psn, not SACKed
        rc_young = Signal()
        rc_retx = Signal()              # the PSN was resent before
        rc_slot = Signal(pb)
        rc_ev = Signal(cfg.ev_index_bits)
        rc_advance = Signal()
        m.d.comb += r1_advance.eq(r1_valid & (~rc_valid | rc_advance))
        with m.If(r1_advance):
            m.d.sync += [rc_valid.eq(1), rc_qpn.eq(r1_qpn), rc_psn.eq(r1_psn),
                         rc_walk.eq(r1_walk), rc_kind.eq(r1_kind), rc_first.eq(r1_first),
                         rc_chunk.eq(r1_chunk), rc_ok.eq(r1_ok), rc_young.eq(r1_young),
                         rc_retx.eq(r1_meta.retx), rc_slot.eq(r1_meta.slot),
                         rc_ev.eq(reads.ev.data)]
        with m.Elif(rc_advance):
            m.d.sync += rc_valid.eq(0)

        # RC: decide, LOST feedback, read the WR pool entry.
        rc_walk_ok = (rc_ok & ~((rc_kind == WalkKind.TIMEOUT) & ~rc_first & rc_young)
                      & ~((rc_kind != WalkKind.TIMEOUT) & rc_retx))
        rc_go = Mux(rc_walk, rc_walk_ok, rc_ok)
        r2_can_load = ~r2_valid | r2_emit
        m.d.comb += [
            rc_advance.eq(rc_valid & (~rc_go | r2_can_load)),
            r2_load.eq(rc_valid & rc_go & r2_can_load),
        ]
        # LOST feedback for the EV a PSN last went out on: every PSN an INFER walk resends, and
        # the oldest PSN of a TIMEOUT walk (the one the timer is about) unless it was resent
        # less than the base timeout ago (by an INFER, REORDER or TRIM resend after the timer
        # last restarted: that copy has not had its time, and its EV is not the one that lost
        # the PSN; the walk still resends it). The older holes a
        # TIMEOUT walk also resends give none: after a long queueing delay they are mostly
        # late, not lost, and a LOST per hole would strike every plane at once. Nor do the
        # holes of a REORDER walk (the time rule alone): late by the reorder window is weaker
        # evidence than K later PSNs, and a false LOST costs a path (with fate sharing, a port).
        lost_push = r2_load & rc_walk & ((rc_kind == WalkKind.INFER)
                                         | ((rc_kind == WalkKind.TIMEOUT) & rc_first
                                            & ~rc_young))
        m.d.comb += [
            self.lost.payload.qpn.eq(rc_qpn), self.lost.payload.ev.eq(rc_ev),
            self.lost.payload.kind.eq(P.FeedbackKind.LOST),
            self.lost.valid.eq(lost_push),
        ]
        walk_resend = r2_load & rc_walk
        m.d.comb += [
            events.retx_ignored.eq(rc_valid & ~rc_walk & ~rc_ok),
            events.walk_skipped.eq(rc_valid & rc_walk & ~rc_walk_ok),
            events.lost_feedback.eq(lost_push & self.lost.ready),
            events.lost_dropped.eq(lost_push & ~self.lost.ready),
            events.timeout_retransmissions.eq(walk_resend & (rc_kind == WalkKind.TIMEOUT)),
            events.inferred_losses.eq(walk_resend & (rc_kind != WalkKind.TIMEOUT)),
        ]
        wr_send_port = reads.wr_send
        m.d.comb += [
            wr_send_port.addr.eq(rc_slot),
            wr_send_port.en.eq(r2_load),
        ]
        with m.If(r2_load):
            m.d.sync += [r2_valid.eq(1), r2_qpn.eq(rc_qpn), r2_psn.eq(rc_psn), r2_walk.eq(rc_walk),
                         r2_slot.eq(rc_slot), r2_ev.eq(rc_ev), r2_chunk.eq(rc_chunk)]
        with m.Elif(r2_emit):
            m.d.sync += r2_valid.eq(0)

        # R2: rebuild the packet from the WR pool entry (its data comes straight from the
        # block RAM) into R3, the output register.
        slot = wr_send_port.data
        r2_index = psn_sub(r2_psn, slot.first)
        r2_offset = Signal(PSN + mtu_bits)
        m.d.comb += r2_offset.eq(r2_index << mtu_bits)
        r2_remaining = (slot.length - r2_offset)[:32]
        r2_last = r2_remaining <= cfg.mtu
        r2_dma_len = Mux(r2_last, r2_remaining, cfg.mtu)
        r2_imm = slot.is_imm & r2_last
        item = Signal(send_item_layout(cfg))
        request, ctx = item.request, item.request.context
        m.d.comb += [
            item.slot.eq(r2_slot), item.chunk.eq(r2_chunk), item.walk.eq(r2_walk),
            request.qpn.eq(r2_qpn), request.avoid_ev_valid.eq(1), request.avoid_ev.eq(r2_ev),
            request.probe.eq(0), request.ev.eq(0),
            ctx.psn.eq(r2_psn), ctx.opcode.eq(data_opcode(r2_index == 0, r2_last, r2_imm)),
            ctx.ackreq.eq(1), ctx.va.eq(slot.va + r2_offset), ctx.rkey.eq(slot.rkey),
            ctx.dma_len.eq(r2_dma_len), ctx.imm.eq(Mux(r2_imm, slot.imm, 0)),
            ctx.local_addr.eq(slot.local + r2_offset), ctx.retransmission.eq(1),
            ctx.msn.eq(slot.msn), ctx.rqmsn.eq(slot.rqmsn),
        ]
        with m.If(r2_emit):
            m.d.sync += [r3_valid.eq(1), r3_item.eq(item)]
        with m.Elif(self.o.ready):
            m.d.sync += r3_valid.eq(0)
        m.d.comb += [self.o.valid.eq(r3_valid), self.o.payload.eq(r3_item)]
        return m
