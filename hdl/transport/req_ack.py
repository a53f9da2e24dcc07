"""The requester's ACK processing (:class:`AckProcessor`)."""

from functools import partial
from types import SimpleNamespace

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import protocol as P
from ..interfaces import feedback_layout
from ..packet.headers import PacketKind, packet_beat_layout
from ..util import as_signal, validating
from .req_common import (
    PSN,
    ControlSignature,
    check_config,
    check_depth,
    check_observe,
    circular_span,
    clamp,
    events_layout,
    log2,
    ones,
    psn_ge,
    psn_gt,
    psn_sub,
    rotate_left,
)
from .req_completion import ack_trigger_layout
from .req_defs import (
    CC_DECREASE_SHIFT,
    CC_INCREASE_SHIFT,
    CC_MAX_STEPS,
    CC_MIN_WINDOW,
    CWND_BITS,
    NACK_COUNTERS,
    NAK_COUNTERS,
    PSN_CHUNK,
    bitmap_psns,
    chunk_map_slots,
    qp_error_layout,
)
from .req_infer import infer_request_layout
from .req_nscc import ACKED_BITS, nscc_event_layout
from .req_psnpool import chunk_map_lend_signature
from .req_retransmit import trim_layout
from .req_tables import table_access_signature

__all__ = ["ack_observation_layout", "AckProcessor"]


def ack_observation_layout(config):
    """What ``AckProcessor(observe=True)`` shows on ``obs``: the items in A1 and A2 (QP,
    retries exhausted rather than a packet), the entries A2 decides on (the ``ack`` entry,
    forwarded, and the next PSN read in A0) and the ``ack`` write of this cycle (A3's
    register: ``w_en``, its QP, una and error flag)."""
    qb = config.qpn_bits
    return data.StructLayout({"a1_valid": 1, "a1_qpn": qb, "a2_valid": 1, "a2_exceed": 1,
                              "a2_qpn": qb, "a2_una": PSN, "a2_error": 1, "a2_next": PSN,
                              "w_en": 1, "w_qpn": qb, "w_una": PSN, "w_error": 1})


class AckProcessor(wiring.Component):
    """Apply one MRC 1.0 SACK, NACK or AETH NAK per cycle (A0 take and read, A1 register,
    A2 apply, A3 outputs).

    A0 addresses the tables; in A1 their data lands in registers, beside the decoded packet
    and its SACK bitmap rotated to the window positions; A2 decides two cycles after A0
    took the packet: cumulative
    advance (only a SACK moves una), the SACK bitmap merged into the ``acked`` bitmap (any
    ``sack_psn_offset``; bits outside ``[una, next_psn)`` are ignored), the ECN window
    (``cc``), the time una last advanced (``progress``, written in A2); the ``ack``,
    ``acked`` and ``cc`` entries are written from registers a cycle later, in A3, so the
    engines that track the ``ack`` write port see a register; a fatal NAK for an outstanding PSN
    fails the QP. A QP whose retries are exhausted (``exceed``, from the timer scanner)
    takes an rx beat's place and fails the QP with RETRY_EXC_ERR if it is still live. A
    packet for an unknown QP, a QP not live, of an unknown kind, acknowledging beyond
    ``next_psn``, a fatal NAK for a PSN not outstanding, or a malformed SACK is dropped and
    counted (``bad_acks``). One packet per cycle, back to back on one QP: A0's read sees
    every write up to its own cycle (the ports are transparent); the decision of the packet
    ahead, in A2 while this one is in A1, and the A3 write of the packet two ahead are
    forwarded into A1's registers (``ack``, ``cc``; ``trig_set``, written in A2, from its
    write port; for ``acked`` the selects and both written bitmaps are registered and A2
    picks: this engine is their only writer). A2's compares
    against una take registers directly, side by side, against both candidates for the new
    una (the stored one and the SACK's cumulative PSN + 1), and are picked after.
    ``trig_seen`` is read in A1, so an ACK that finds a trigger queued writes no later than
    the cycle the completion engine reads the QP for it.

    Outputs: from A2, two cycles after the packet was taken, a completion trigger when
    una advanced or the QP failed (at most one queued per QP: ``trig_set`` differs from
    ``trig_seen`` while one waits); registered at the end of A2 and offered from A3, three
    cycles after, with the counter events: the PSN of a NACK TRIMMED still outstanding
    (``trim``),
    the failed QP (``qp_error``), feedback for the EV the named PSN last went out on
    (``feedback``: ACKED, ECN, LOST for an ALWAYS_SKIP mark, TRIMMED; none for a probe
    answer or a PSN not outstanding before the packet applies, whose EV entry may no longer
    hold it: a PSN's chunk of the PSN pool goes back once una passes it; the EV is read
    through the QP's chunk map in A0 and A1; dropped and counted when not ready),
    and the SACK bits for the inference unit. With CONFIG ``cc_nscc``, A3 (the cycle after
    A2) offers NSCC's event for the packet (``nscc``: a SACK, not a probe answer, that
    acknowledges PSNs or echoes CE, with the PSNs it newly acknowledges, cumulatively and by
    SACK bits, and its CC_STATE echo; a NACK TRIMMED); the consumer takes one every cycle.

    Hazards: A0 waits (``rx`` and ``exceed`` not ready) while the control holds and while
    the trim or QP-error queue has no room for one more item beside those in A1 to A3; the
    trigger queue never fills. The control's QP reset and software flush go through this
    engine's write ports (``control.write``, ``control.flush``, the flush's trigger included:
    A1 to A3 are idle then).

    Parameters
    ----------
    config : NicConfig
    trim_depth, qp_error_depth : int
        Depths of the queues behind ``trim`` and ``qp_error`` (their levels come back on
        ``trim_level`` and ``qp_error_level``).

    Members
    -------
    tables : ``In(table_access_signature(config, "ack"))``
    control : ``In(ControlSignature(config))``
    now : ``In(32)``
        The time in 1.024 us units (kept per QP when una advances).
    rx : ``In(stream.Signature(packet_beat_layout(config)))``
    exceed : ``In(stream.Signature(config.qpn_bits))``
    trim_level, qp_error_level : ``In(range(depth + 1))``
    trim : ``Out(stream.Signature(trim_layout(config)))``
    map_lend : ``In(chunk_map_lend_signature(config))``
        The ``chunk_map`` read port, lent to the PSN pool in the cycles A0 takes no packet.
    trigger : ``Out(stream.Signature(ack_trigger_layout(config)))``
    qp_error : ``Out(stream.Signature(qp_error_layout(config)))``
    feedback : ``Out(stream.Signature(feedback_layout(config)))``
    infer : ``Out(stream.Signature(infer_request_layout(config), always_ready=True))``
    nscc : ``Out(stream.Signature(nscc_event_layout(config), always_ready=True))``
    busy : ``Out(1)``
        A1 or A2 holds a packet, or A3 an NSCC event.
    events : ``Out(events_layout(COUNTERS))``
        ``feedback_dropped`` counts this engine's part of that counter.
    obs : ``Out(ack_observation_layout(config))``
        Only with ``observe=True`` (the formal proofs); nothing else changes.
    """

    COUNTERS = ("acks", "duplicate_acks", "bad_acks", "retry_exceeded", "feedback_dropped",
                *NAK_COUNTERS.values(), *NACK_COUNTERS.values())

    def __init__(self, *, config, trim_depth, qp_error_depth, observe=False):
        with validating(self):
            check_config(config)
            check_depth("Trim queue depth", trim_depth)
            check_depth("QP error queue depth", qp_error_depth)
            check_observe(observe)
        self._config = config
        self._observe = observe
        self._trim_depth = trim_depth
        self._qp_error_depth = qp_error_depth
        super().__init__({
            "tables": In(table_access_signature(config, "ack")),
            "control": In(ControlSignature(config)),
            "now": In(32),
            "rx": In(stream.Signature(packet_beat_layout(config))),
            "exceed": In(stream.Signature(config.qpn_bits)),
            "trim_level": In(range(trim_depth + 1)),
            "qp_error_level": In(range(qp_error_depth + 1)),
            "trim": Out(stream.Signature(trim_layout(config))),
            "trigger": Out(stream.Signature(ack_trigger_layout(config))),
            "map_lend": In(chunk_map_lend_signature(config)),
            "qp_error": Out(stream.Signature(qp_error_layout(config))),
            "feedback": Out(stream.Signature(feedback_layout(config))),
            "infer": Out(stream.Signature(infer_request_layout(config), always_ready=True)),
            "nscc": Out(stream.Signature(nscc_event_layout(config), always_ready=True)),
            "busy": Out(1),
            "events": Out(events_layout(self.COUNTERS)),
            **({"obs": Out(ack_observation_layout(config))} if observe else {}),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        qb = cfg.qpn_bits
        window = bitmap_psns(cfg)
        wb = log2(window)
        bitmap_bits = P.SACK_BITMAP_BITS
        reads = self.tables.read

        # -- A0: take a packet (or an exhausted QP), read the QP ---------------------------
        rx_header = self.rx.payload.header
        rx_seth = rx_header.ctl.sack.seth
        rx_is_sack = rx_header.kind == PacketKind.SACK
        rx_is_nack = rx_header.kind == PacketKind.NACK
        rx_is_aeth = rx_header.kind == PacketKind.AETH
        # The PSN the packet is about: a SACK's ack_psn (cack_psn + ack_psn_offset; a probe
        # answer's offset is a probe id, so its own PSN is its cack_psn), a NACK's nack_psn,
        # a NAK's PSN. Its EV is the one the PSN last went out on (the `ev` table).
        rx_psn = Mux(rx_is_sack & ~rx_seth.pr,
                     (rx_header.bth.psn + rx_seth.ack_psn_offset.as_signed())[:PSN],
                     rx_header.bth.psn)
        rx_take = Signal()
        # A QP whose retries are exhausted takes the place of an rx beat. The items in A1 and
        # A2 may each push one, so A0 takes one only while each queue has room for them too.
        a1_valid = Signal()
        a2_valid = Signal()
        a3_trim = Signal()              # A3 pushes a trim / a QP error
        a3_qp_error = Signal()
        in_flight = a1_valid + a2_valid
        a0_room = (~self.control.hold
                   & (self.trim_level + in_flight + a3_trim < self._trim_depth)
                   & (self.qp_error_level + in_flight + a3_qp_error < self._qp_error_depth))
        x_take = self.exceed.valid & a0_room
        m.d.comb += [
            self.rx.ready.eq(a0_room & ~self.exceed.valid),
            rx_take.eq(self.rx.valid & self.rx.ready),
            self.exceed.ready.eq(x_take),
        ]
        for name in ("cfg", "next_psn", "ack", "acked", "trig_set", "cc"):
            port = getattr(reads, name)
            m.d.comb += [port.addr.eq(Mux(x_take, self.exceed.payload,
                                          rx_header.bth.dqpn[:qb])),
                         port.en.eq(rx_take | x_take)]
        # The PSN's EV is in the PSN pool: A0 reads the QP's chunk map, A1 the `ev` entry.
        cb = log2(PSN_CHUNK)
        slot_bits = log2(chunk_map_slots(cfg))
        # The PSN pool borrows the chunk map port in the cycles A0 takes no packet (A1 uses
        # the data only for a packet).
        lend = self.map_lend
        m.d.comb += [reads.chunk_map.addr.eq(Mux(rx_take, Cat(rx_psn[cb:cb + slot_bits],
                                                              rx_header.bth.dqpn[:qb]),
                                                 lend.addr)),
                     reads.chunk_map.en.eq(rx_take | lend.req),
                     lend.grant.eq(~rx_take), lend.data.eq(reads.chunk_map.data)]
        a1_exceed = Signal()            # retries exhausted for QP a1_qpn (not a packet)
        a1_known = Signal()             # a SACK/NACK/NAK for a QP that exists
        a1_qpn = Signal(qb)
        a1_kind = Signal(PacketKind)
        a1_syndrome = Signal(8)
        a1_reason = Signal(8)
        a1_psn = Signal(PSN)
        a1_pr = Signal()
        a1_mark = Signal(P.SackMark)
        a1_cum = Signal(PSN)
        a1_base = Signal(PSN)          # PSN of SACK bitmap bit 0
        a1_sack = Signal(bitmap_bits)
        a1_echo = Signal(P.TIMESTAMP_BITS)
        m.d.sync += [a1_valid.eq(rx_take | x_take), a1_exceed.eq(x_take)]
        with m.If(x_take):
            m.d.sync += [a1_known.eq(0), a1_qpn.eq(self.exceed.payload), a1_sack.eq(0)]
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
                a1_base.eq((rx_header.bth.psn + rx_seth.sack_psn_offset.as_signed())[:PSN]),
                a1_sack.eq(Mux(rx_is_sack, rx_seth.sack_bitmap, 0)),
                a1_echo.eq(rx_header.ctl.sack.cc_state.tx_timestamp),
            ]

        # -- A1: the tables' data lands; decode the packet; register both for A2 ----------
        # A2 of the item ahead writes this cycle what A1's read (a cycle earlier) could not
        # see: that write is forwarded from the write port (the read ports see every earlier
        # write). The forwarded entry is the only path from A2's decision back into A2.
        a2_exceed = Signal()
        a2_known = Signal()
        a2_qpn = Signal(qb)
        a2_kind = Signal(PacketKind)
        a2_syndrome = Signal(8)
        a2_reason = Signal(8)
        a2_psn = Signal(PSN)
        a2_pr = Signal()
        a2_mark = Signal(P.SackMark)
        a2_cum1 = Signal(PSN)          # the una a SACK asks for: its cumulative PSN + 1
        a2_base = Signal(PSN)
        a2_sack = Signal(bitmap_bits)
        a2_sack_rot = Signal(window)   # the SACK bits at their window positions, unmasked
        a2_echo = Signal(P.TIMESTAMP_BITS)
        a3_valid = Signal()            # an NSCC event in A3
        a3_item = Signal()             # A3 holds the outputs of an item A2 decided
        m.d.comb += self.busy.eq(a1_valid | a2_valid | a3_valid | a3_item)
        m.d.sync += [
            a2_valid.eq(a1_valid), a2_exceed.eq(a1_exceed), a2_known.eq(a1_known),
            a2_qpn.eq(a1_qpn), a2_kind.eq(a1_kind), a2_syndrome.eq(a1_syndrome),
            a2_reason.eq(a1_reason), a2_psn.eq(a1_psn), a2_pr.eq(a1_pr), a2_mark.eq(a1_mark),
            a2_cum1.eq((a1_cum + 1)[:PSN]), a2_base.eq(a1_base), a2_sack.eq(a1_sack),
            a2_echo.eq(a1_echo),
            a2_sack_rot.eq(rotate_left(Cat(a1_sack, C(0, window - bitmap_bits)),
                                       a1_base[:wb], window)),
        ]
        writes = self.tables.write
        # The ``ack`` entry, the ``acked`` bitmap and the ECN window A2 decides are written
        # from registers in A3, so only A2's own forwarding waits on its arithmetic: the
        # tables' other readers, which track the ``ack`` write port (the segmenter's
        # contexts, the hand-off register, the intake), see a registered write. A1 forwards
        # A2's decision (the item ahead) and A3's write (the item two ahead: the read
        # addressed in A0 could not see it).
        nexts = {}
        for name in ("ack", "acked", "cc"):
            nexts[name] = SimpleNamespace(addr=Signal(qb, name=f"a2_{name}_addr"),
                                          en=Signal(name=f"a2_{name}_en"),
                                          data=Signal.like(getattr(reads, name).data,
                                                           name=f"a2_{name}_data"))
            wp = getattr(writes, name)
            m.d.sync += [wp.addr.eq(nexts[name].addr), wp.en.eq(nexts[name].en),
                         wp.data.eq(nexts[name].data)]

        def hits(port):
            """``port`` writes the QP in A1."""
            return port.en & (port.addr == a1_qpn)

        stored = {}
        forwards = {}                   # the item ahead (A2) / two ahead (A3) writes A1's QP
        for name in ("ack", "cc", "trig_set"):
            port, wp = getattr(reads, name), getattr(writes, name)
            stored[name] = Signal.like(port.data, name=f"a2_{name}")
            forward = Signal(name=f"a1_{name}_forward")
            m.d.comb += forward.eq(hits(wp))
            forwards[name] = forward
            entry = Mux(forward, wp.data, port.data)
            if name in nexts:
                ahead = Signal(name=f"a1_{name}_forward_a2")
                m.d.comb += ahead.eq(hits(nexts[name]))
                forwards[name + "_a2"] = ahead
                entry = Mux(ahead, nexts[name].data, entry)
            m.d.sync += stored[name].eq(entry)
        # The acked bitmap's forwarding is registered selects and the written bitmaps beside
        # the table's read: A2 picks, so the wide write data of the ACK ahead ends in a
        # register instead of running on through a multiplexer.
        acked_read = Signal.like(reads.acked.data, name="a2_acked_read")
        acked_a2 = Signal.like(reads.acked.data, name="a2_acked_prev")
        acked_a3 = Signal.like(reads.acked.data, name="a2_acked_prev2")
        from_a2 = Signal(name="a2_acked_from_prev")
        from_a3 = Signal(name="a2_acked_from_prev2")
        m.d.sync += [acked_read.eq(reads.acked.data), acked_a2.eq(nexts["acked"].data),
                     acked_a3.eq(writes.acked.data),
                     from_a2.eq(hits(nexts["acked"])), from_a3.eq(hits(writes.acked))]
        stored["acked"] = Mux(from_a2, acked_a2, Mux(from_a3, acked_a3, acked_read))
        for name in ("cfg", "next_psn"):
            stored[name] = Signal.like(getattr(reads, name).data, name=f"a2_{name}")
            m.d.sync += stored[name].eq(getattr(reads, name).data)
        m.d.comb += [reads.ev.addr.eq(Cat(a1_psn[:cb], reads.chunk_map.data)),
                     reads.ev.en.eq(1)]
        stored["ev"] = reads.ev.data
        # trig_seen (the completion engine's) is read a cycle later, in A1, so that A2 sees
        # a trigger the completion engine took up to the cycle before A2 writes: an ACK that
        # finds one still queued writes before the engine reads the QP for it.
        m.d.comb += [reads.trig_seen.addr.eq(a1_qpn), reads.trig_seen.en.eq(1)]

        # -- A2: decide --------------------------------------------------------------------
        a_ack = stored["ack"]
        a_next = stored["next_psn"]
        a_old_bitmap = stored["acked"]
        a_una = a_ack.una
        # Signals, not expressions: each is read in many places below.
        sig = partial(as_signal, m)
        is_ack = sig(a2_kind == PacketKind.SACK, "a_is_ack")
        is_nack = sig(a2_kind == PacketKind.NACK, "a_is_nack")
        is_nak = sig((a2_kind == PacketKind.AETH) & (a2_syndrome[5:7] == 3), "a_is_nak")
        code = a2_syndrome[:5]
        fatal = sig(is_nak & ((code == P.NakCode.INVALID_REQUEST)
                              | (code == P.NakCode.REMOTE_ACCESS)
                              | (code == P.NakCode.REMOTE_OPERATIONAL)), "a_fatal")
        trim = sig(is_nack & (a2_reason == P.NackReason.TRIMMED), "a_trim")
        out_of_window = sig(is_nack & (a2_reason == P.NackReason.PSN_OOR_WINDOW),
                            "a_out_of_window")
        # Only a SACK moves the cumulative PSN. Every compare takes registers directly, side
        # by side: those against the new una are made against both candidates and picked.
        advance = sig(is_ack & psn_gt(a2_cum1, a_una), "a_advance")
        beyond = sig(advance & ~psn_ge(a_next, a2_cum1), "a_beyond")
        new_una = sig(Mux(advance, a2_cum1, a_una), "a_new_una")
        outstanding = sig(Mux(advance, psn_ge(a2_psn, a2_cum1), psn_ge(a2_psn, a_una))
                          & psn_gt(a_next, a2_psn), "a_outstanding")
        # The PSN the packet names is outstanding (before this packet applies): its EV entry
        # holds it (a PSN's chunk goes back to the PSN pool once una passes it).
        psn_sent = sig(psn_gt(a_next, a2_psn) & psn_ge(a2_psn, a_una), "a_psn_sent")
        a_live = sig((stored["cfg"].state == P.QpState.RTS) & ~a_ack.error, "a_live")
        a_drop = sig(~a2_known | ~a_live | ~(is_ack | fatal | trim | out_of_window) | beyond
                     | (fatal & ~outstanding), "a_drop")
        a_apply = sig(a2_valid & ~a2_exceed & ~a_drop, "a_apply")
        # Exhausted retries: like a fatal NAK for the oldest PSN, if the QP is still live.
        x_apply = sig(a2_valid & a2_exceed & a_live, "x_apply")

        # SACK bit i is PSN base + i (any sack_psn_offset); keep the bits for PSNs in
        # [max(new una, base), next_psn): a bitmap that does not overlap the window adds
        # nothing. The bits kept form one run, [lo, hi), which lies at window positions
        # base + lo up to base + hi: the mask is made there, beside the bits rotated in A1.
        # The run's ends are made in A1 for both una candidates (the SACK's cumulative
        # PSN + 1, and the QP's una as A2 reads it) and registered; A2 decodes both masks
        # from them and picks one by `advance`. The stored bits of PSNs una passes are
        # cleared (`clear`: from una to the cumulative PSN + 1, both registers); PSNs in
        # [una, next_psn) span at most the window, so a kept bit never shares a position
        # with a cleared one.
        #
        # A1's una is the table's, the una A3 writes this cycle (the item two ahead's), or
        # the una A2 decides this cycle (the item ahead's, the only path from A2's decision
        # back into A2): the SACK's cumulative PSN + 1 when it advances, else the una it
        # read. Its distance from the base is made for A2's two candidates and the stored
        # una side by side, and picked. (A control write or flush never meets an item in
        # A1: the control decides with ACK processing idle.)
        def from_base(psn):
            """``psn``'s bit position in A1's SACK bitmap, clamped to ``[0, bitmap_bits]``."""
            return clamp(psn_sub(psn, a1_base), bitmap_bits)

        a1_hi = Signal(range(bitmap_bits + 1), name="a1_hi")
        m.d.comb += a1_hi.eq(from_base(reads.next_psn.data))
        a1_lo_una = Signal(range(bitmap_bits + 1), name="a1_lo_una")
        a1_stored_una = Mux(forwards["ack"], writes.ack.data.una, reads.ack.data.una)
        m.d.comb += a1_lo_una.eq(Mux(
            forwards["ack_a2"],
            Mux(advance & ~x_apply, from_base(a2_cum1), from_base(a_una)),
            from_base(a1_stored_una)))
        a1_lo_cum = Signal.like(a1_hi, name="a1_lo_cum")
        m.d.comb += a1_lo_cum.eq(from_base(a1_cum + 1))
        a2_hi = Signal.like(a1_hi, name="a2_hi")
        a2_end = Signal(wb, name="a2_run_end")          # window position base + hi
        m.d.sync += [a2_hi.eq(a1_hi), a2_end.eq((a1_base[:wb] + a1_hi)[:wb])]
        runs = {}
        for name, a1_lo in (("cum", a1_lo_cum), ("una", a1_lo_una)):
            lo_reg = Signal.like(a1_hi, name=f"a2_lo_{name}")
            start = Signal(wb, name=f"a2_run_start_{name}")
            kept = Signal(name=f"a2_run_kept_{name}")   # hi > lo: the run is not empty
            m.d.sync += [lo_reg.eq(a1_lo), start.eq((a1_base[:wb] + a1_lo)[:wb]),
                         kept.eq(a1_hi > a1_lo)]
            runs[name] = (lo_reg, Mux(kept, circular_span(start, a2_end, window), 0))
        lo = sig(Mux(advance, runs["cum"][0], runs["una"][0]), "a_lo")
        hi = a2_hi
        sack_rot = sig(a2_sack_rot & Mux(advance, runs["cum"][1], runs["una"][1]),
                       "a_sack_rot")
        clear_len = sig(Mux(advance, psn_sub(a2_cum1, a_una)[:wb + 1], 0), "a_clear_len")
        clear = sig(Mux(advance, circular_span(a_una[:wb], a2_cum1[:wb], window), 0),
                    "a_clear")
        new_bitmap = Signal(window)
        m.d.comb += new_bitmap.eq((a_old_bitmap & ~clear) | sack_rot)
        new_bits = (sack_rot & ~a_old_bitmap).any()
        # A NACK changes no bit: the bit the TRIM names is the stored one.
        trim_queued = (a_apply & trim & outstanding
                       & ~a_old_bitmap.bit_select(a2_psn[:wb], 1))
        err_status = Signal(P.CompletionStatus)
        with m.Switch(code):
            for nak_code, status in (
                    (P.NakCode.INVALID_REQUEST, P.CompletionStatus.REM_INV_REQ_ERR),
                    (P.NakCode.REMOTE_ACCESS, P.CompletionStatus.REM_ACCESS_ERR),
                    (P.NakCode.REMOTE_OPERATIONAL, P.CompletionStatus.REM_OP_ERR)):
                with m.Case(nak_code):
                    m.d.comb += err_status.eq(status)

        v = SimpleNamespace(**{name: value for name, value in locals().items()
                               if name not in ("self", "platform", "m")})
        self._write_tables(m, v)
        self._outputs(m, v)
        if self._observe:
            obs = self.obs
            m.d.comb += [obs.a1_valid.eq(a1_valid), obs.a1_qpn.eq(a1_qpn),
                         obs.a2_valid.eq(a2_valid), obs.a2_exceed.eq(a2_exceed),
                         obs.a2_qpn.eq(a2_qpn), obs.a2_una.eq(a_una),
                         obs.a2_error.eq(a_ack.error), obs.a2_next.eq(a_next),
                         obs.w_en.eq(writes.ack.en), obs.w_qpn.eq(writes.ack.addr),
                         obs.w_una.eq(writes.ack.data.una),
                         obs.w_error.eq(writes.ack.data.error)]
        self._nscc_event(m, v)
        return m

    def _nscc_event(self, m, v):
        """A3: NSCC's event for the packet A2 applied. The PSNs a SACK newly acknowledges
        (those una passes, and SACK bits for PSNs above the new una not acknowledged before:
        the model's count) are counted here, a cycle after A2, off its path."""
        window = len(v.new_bitmap)
        a3_valid = v.a3_valid
        a3_qpn = Signal.like(v.a2_qpn)
        a3_nack = Signal()
        a3_ecn = Signal()
        a3_echo = Signal(P.TIMESTAMP_BITS)
        a3_clear = Signal.like(v.clear_len)
        a3_new = Signal(window)
        marked = (v.a2_mark == P.SackMark.SKIP_ONCE) & ~v.a2_pr
        new = v.sack_rot & ~v.a_old_bitmap
        sack_event = v.is_ack & ~v.a2_pr & (v.advance | new.any() | marked)
        m.d.sync += [
            a3_valid.eq(self.control.cc_nscc & v.a_apply & (sack_event | v.trim)),
            a3_qpn.eq(v.a2_qpn), a3_nack.eq(v.trim), a3_ecn.eq(marked), a3_echo.eq(v.a2_echo),
            a3_clear.eq(Mux(v.trim, 0, v.clear_len)), a3_new.eq(Mux(v.trim, 0, new)),
        ]
        counts = [a3_new[i] for i in range(window)]
        while len(counts) > 1:          # an adder tree
            counts = [counts[i] + counts[i + 1] if i + 1 < len(counts) else counts[i]
                      for i in range(0, len(counts), 2)]
        acked = a3_clear + counts[0]
        event = self.nscc.payload
        m.d.comb += [
            self.nscc.valid.eq(a3_valid),
            event.qpn.eq(a3_qpn), event.nack.eq(a3_nack), event.ecn.eq(a3_ecn),
            event.echo.eq(a3_echo),
            event.acked.eq(Mux(acked >> ACKED_BITS != 0, (1 << ACKED_BITS) - 1, acked)),
        ]

    def _write_tables(self, m, v):
        """A2's decisions on the QP's ``ack``, ``acked`` and ``cc`` entries (each written
        from a register in A3), and the control's writes of them."""
        ctl = self.control
        wps = {name: v.nexts[name] for name in ("ack", "acked")}
        with m.If(ctl.write):
            m.d.comb += [
                wps["ack"].addr.eq(ctl.qpn), wps["ack"].en.eq(1),
                wps["ack"].data.eq(0), wps["ack"].data.una.eq(ctl.psn),
                wps["acked"].addr.eq(ctl.qpn), wps["acked"].en.eq(1), wps["acked"].data.eq(0),
            ]
        with m.Elif(ctl.flush):
            # Software ERROR: the v.fatal-NAK error with WR_FLUSH_ERR for the oldest PSN, so
            # the completion engine gives every outstanding WR WR_FLUSH_ERR.
            m.d.comb += [
                wps["ack"].addr.eq(ctl.qpn), wps["ack"].en.eq(1),
                wps["ack"].data.una.eq(ctl.flush_una), wps["ack"].data.error.eq(1),
                wps["ack"].data.err_status.eq(P.CompletionStatus.WR_FLUSH_ERR),
                wps["ack"].data.err_psn.eq(ctl.flush_una),
            ]
        with m.Elif(v.x_apply):
            m.d.comb += [
                wps["ack"].addr.eq(v.a2_qpn), wps["ack"].en.eq(1),
                wps["ack"].data.una.eq(v.a_una), wps["ack"].data.error.eq(1),
                wps["ack"].data.err_status.eq(P.CompletionStatus.RETRY_EXC_ERR),
                wps["ack"].data.err_psn.eq(v.a_una),
            ]
        with m.Else():
            m.d.comb += [
                wps["ack"].addr.eq(v.a2_qpn), wps["ack"].en.eq(v.a_apply),
                wps["ack"].data.una.eq(v.new_una),
                wps["ack"].data.error.eq(v.fatal),
                wps["ack"].data.err_status.eq(Mux(v.fatal, v.err_status, 0)),
                wps["ack"].data.err_psn.eq(Mux(v.fatal, v.a2_psn, 0)),
                wps["acked"].addr.eq(v.a2_qpn), wps["acked"].en.eq(v.a_apply),
                wps["acked"].data.eq(v.new_bitmap),
            ]

        # The ECN window: an ACK echoing CE for a PSN sent after the last decrease takes 1/8
        # (at least one) off the window the QP used (floor CC_MIN_WINDOW): the larger of the
        # PSNs in flight before it and the PSNs sent since the last decrease, at most cwnd; an
        # unmarked ACK counts the PSNs it acknowledges cumulatively (at least one), every
        # cwnd/4 counted add one PSN (byte counting, at most CC_MAX_STEPS per ACK), up to MPR.
        # Every candidate is made side by side from A2's registers and picked after, so the
        # chain from the entry A1 forwarded back to A1 is compares and multiplexers, not
        # subtractions, compares and sums in series: the decrease's base is one of the PSNs
        # in flight, the PSNs sent since the last decrease, or cwnd (a cut made for each);
        # the increase's byte count is made for both una candidates (the SACK's cumulative
        # PSN + 1, or una) and each step count's window and remainder are made for each.
        a_cc = v.stored["cc"]
        cc_max = Cat(C(0, 7), v.stored["cfg"].mpr)
        cc_flight = psn_sub(v.a_next, v.a_una)      # in flight when the marked ACK left
        cc_sent = psn_sub(v.a_next, a_cc.recover)   # sent since the last decrease

        def cc_cut(base):
            """The decreased window for this base (1/8 off, at least one; the floor)."""
            step = base >> CC_DECREASE_SHIFT
            cut = (base - Mux(step == 0, 1, step))[:CWND_BITS]
            return Mux(base <= CC_MIN_WINDOW, CC_MIN_WINDOW, cut)

        # base = min(max(sent, flight), cwnd): picked by compares made beside the cuts.
        cc_cuts = {name: Signal(CWND_BITS, name=f"a_cc_cut_{name}")
                   for name in ("flight", "sent", "cwnd")}
        m.d.comb += [cc_cuts["flight"].eq(cc_cut(cc_flight[:CWND_BITS])),
                     cc_cuts["sent"].eq(cc_cut(cc_sent[:CWND_BITS])),
                     cc_cuts["cwnd"].eq(cc_cut(a_cc.cwnd))]
        cc_decreased = Mux(cc_sent > cc_flight,
                           Mux(cc_sent < a_cc.cwnd, cc_cuts["sent"], cc_cuts["cwnd"]),
                           Mux(cc_flight < a_cc.cwnd, cc_cuts["flight"], cc_cuts["cwnd"]))
        # SETH m = SKIP_ONCE: the trigger arrived with CE (a probe answer carries no mark).
        cc_marked = (v.a2_mark == P.SackMark.SKIP_ONCE) & ~v.a2_pr
        cc_decrease = cc_marked & psn_ge(v.a2_psn, a_cc.recover)
        # The increase: the PSNs acknowledged cumulatively (at least one) added to acc; every
        # thr = cwnd/4 counted add one PSN, at most CC_MAX_STEPS, up to MPR x 128.
        cc_thr = Signal(CWND_BITS, name="a_cc_thr")
        m.d.comb += cc_thr.eq(Mux((a_cc.cwnd >> CC_INCREASE_SHIFT) == 0, 1,
                                  a_cc.cwnd >> CC_INCREASE_SHIFT))
        grown = []                      # cwnd after k steps, capped
        for k in range(CC_MAX_STEPS + 1):
            value = Signal(CWND_BITS, name=f"a_cc_grown_{k}")
            m.d.comb += value.eq(Mux(a_cc.cwnd + k < cc_max, a_cc.cwnd + k, cc_max))
            grown.append(value)
        wb1 = len(v.clear_len)
        cleared = psn_sub(v.a2_cum1, v.a_una)[:wb1]     # the clear length if una advances

        def cc_increase(count, name):
            """(cwnd, acc) after ``count`` more PSNs counted (any number of steps made side
            by side, the last threshold reached picked)."""
            total = Signal(CWND_BITS + 1, name=f"a_cc_sum_{name}")
            m.d.comb += total.eq(a_cc.acc + count)
            cwnd, acc = grown[0], Signal(CWND_BITS, name=f"a_cc_acc_{name}")
            left0 = total[:CWND_BITS + 1]
            m.d.comb += acc.eq(Mux(left0 < cc_thr, left0, cc_thr - 1))
            for k in range(1, CC_MAX_STEPS + 1):
                left = (total - cc_thr * k)[:CWND_BITS + 1]
                acc_k = Mux(left < cc_thr, left, cc_thr - 1)
                reached = total >= cc_thr * k
                cwnd = Mux(reached, grown[k], cwnd)
                acc = Mux(reached, acc_k, acc)
            return cwnd, acc

        up_adv = cc_increase(Mux(cleared == 0, 1, cleared), "advance")
        up_stay = cc_increase(C(1, 1), "stay")
        cc_write = Signal.like(a_cc)
        m.d.comb += cc_write.eq(a_cc)
        with m.If(cc_decrease):
            m.d.comb += [cc_write.cwnd.eq(cc_decreased), cc_write.acc.eq(0),
                         cc_write.recover.eq(v.a_next)]
        with m.Elif(~cc_marked):
            m.d.comb += [cc_write.cwnd.eq(Mux(v.advance, up_adv[0], up_stay[0])),
                         cc_write.acc.eq(Mux(v.advance, up_adv[1], up_stay[1]))]
        cc_wp = v.nexts["cc"]
        with m.If(ctl.write):
            m.d.comb += [cc_wp.addr.eq(ctl.qpn), cc_wp.en.eq(1),
                         cc_wp.data.cwnd.eq(Cat(C(0, 7), ctl.mpr)),
                         cc_wp.data.recover.eq(ctl.psn)]
        with m.Else():
            m.d.comb += [cc_wp.addr.eq(v.a2_qpn), cc_wp.en.eq(v.a_apply & v.is_ack),
                         cc_wp.data.eq(cc_write)]

    def _outputs(self, m, v):
        """A2's completion trigger and ``progress`` write; the other outputs (queue items,
        feedback, SACK bits for inference, events) are registered at the end of A2 and
        leave from A3, so A2's decision ends in registers."""
        ctl = self.control
        reads = self.tables.read
        events = self.events
        wps = {name: getattr(self.tables.write, name) for name in ("trig_set", "progress")}
        # Completion triggers: none while one is queued for the QP (the engine reads the QP
        # when it takes the trigger, so it sees this ACK's change too).
        # A software flush queues one the same way (ACK processing is idle while the control
        # decides, so the two never push in the same cycle).
        trigger_bit = ~reads.trig_seen.data
        trigger_push = (((v.a_apply & (v.advance | v.fatal)) | v.x_apply)
                        & (v.stored["trig_set"] == reads.trig_seen.data))
        trigger_qpn = Mux(ctl.flush, ctl.qpn, v.a2_qpn)
        trigger_value = Mux(ctl.flush, ctl.flush_trigger_bit, trigger_bit)
        m.d.comb += [
            self.trigger.payload.qpn.eq(trigger_qpn), self.trigger.payload.bit.eq(trigger_value),
            self.trigger.valid.eq(trigger_push | ctl.flush_trigger),
            wps["trig_set"].addr.eq(trigger_qpn), wps["trig_set"].data.eq(trigger_value),
            wps["trig_set"].en.eq(trigger_push | ctl.flush_trigger),
            # The timer restarts from the time una last advanced.
            wps["progress"].addr.eq(v.a2_qpn), wps["progress"].data.eq(self.now),
            wps["progress"].en.eq(v.a_apply & v.advance),
        ]

        # -- A3: the registered outputs ----------------------------------------------------
        m.d.sync += v.a3_item.eq(v.a2_valid)
        a3_qpn = Signal.like(v.a2_qpn, name="a3_qpn")
        a3_psn = Signal.like(v.a2_psn, name="a3_psn")
        m.d.sync += [a3_qpn.eq(v.a2_qpn), a3_psn.eq(v.a2_psn),
                     v.a3_trim.eq(v.trim_queued),
                     v.a3_qp_error.eq((v.a_apply & v.fatal) | v.x_apply)]
        a3_status = Signal(P.CompletionStatus, name="a3_status")
        m.d.sync += a3_status.eq(Mux(v.x_apply, P.CompletionStatus.RETRY_EXC_ERR,
                                     v.err_status))
        m.d.comb += [
            self.trim.payload.qpn.eq(a3_qpn), self.trim.payload.psn.eq(a3_psn),
            self.trim.valid.eq(v.a3_trim),
            self.qp_error.payload.qpn.eq(a3_qpn), self.qp_error.payload.status.eq(a3_status),
            self.qp_error.valid.eq(v.a3_qp_error),
        ]
        # Feedback for the EV the named PSN went out on: SACK m NONE -> ACKED, SKIP_ONCE -> ECN,
        # ALWAYS_SKIP -> LOST (a bad path); NACK TRIMMED -> TRIMMED. A probe answer (pr = 1)
        # gives none, nor a PSN whose EV entry no longer holds it.
        fb_kind = Signal(P.FeedbackKind)
        with m.If(v.trim):
            m.d.comb += fb_kind.eq(P.FeedbackKind.TRIMMED)
        with m.Elif(v.a2_mark == P.SackMark.SKIP_ONCE):
            m.d.comb += fb_kind.eq(P.FeedbackKind.ECN)
        with m.Elif(v.a2_mark == P.SackMark.ALWAYS_SKIP):
            m.d.comb += fb_kind.eq(P.FeedbackKind.LOST)
        with m.Else():
            m.d.comb += fb_kind.eq(P.FeedbackKind.ACKED)
        a3_feedback = Signal(name="a3_feedback")
        feedback_value = self.feedback.payload
        m.d.sync += [
            a3_feedback.eq(v.a_apply & v.psn_sent & ((v.is_ack & ~v.a2_pr) | v.trim)),
            feedback_value.qpn.eq(v.a2_qpn), feedback_value.ev.eq(v.stored["ev"]),
            feedback_value.kind.eq(fb_kind),
        ]
        m.d.comb += [self.feedback.valid.eq(a3_feedback),
                     events.feedback_dropped.eq(a3_feedback & ~self.feedback.ready)]
        a2_events = {
            "retry_exceeded": v.x_apply,
            "bad_acks": v.a2_valid & ~v.a2_exceed & v.a_drop,
            "acks": v.a_apply & v.is_ack,
            "duplicate_acks": v.a_apply & v.is_ack & ~v.advance & ~v.new_bits,
            **{name: v.a_apply & v.is_nak & (v.code == nak_code)
               for nak_code, name in NAK_COUNTERS.items()},
            **{name: v.a_apply & v.is_nack & (v.a2_reason == reason)
               for reason, name in NACK_COUNTERS.items()},
        }
        for name, value in a2_events.items():
            m.d.sync += events[name].eq(value)
        # SACK bits for the inference unit: masked in A3 from the registered window.
        request = self.infer.payload
        a3_infer = Signal(name="a3_infer")
        a3_hi = Signal.like(v.hi, name="a3_hi")
        a3_lo = Signal.like(v.lo, name="a3_lo")
        a3_sack = Signal.like(v.a2_sack, name="a3_sack")
        bitmap_bits = len(v.a2_sack)
        m.d.sync += [
            a3_infer.eq(v.a_apply & ~v.fatal & ((ctl.infer_k != 0) | (ctl.reo_wnd != 0))),
            a3_hi.eq(v.hi), a3_lo.eq(v.lo), a3_sack.eq(v.a2_sack),
            request.qpn.eq(v.a2_qpn), request.base.eq(v.a2_base), request.una.eq(v.new_una),
            request.next.eq(v.a_next),
        ]
        a_sack = a3_sack & ones(a3_hi, bitmap_bits) & ~ones(a3_lo, bitmap_bits)
        m.d.comb += [self.infer.valid.eq(a3_infer & (a_sack != 0)), request.sack.eq(a_sack)]
