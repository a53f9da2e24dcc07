"""Inductive invariants of the requester's send window (``hdl/transport/requester.py``).

:class:`RequesterInvariants` wraps a :class:`~hdl.transport.requester.Requester` built with
``observe=True`` (an asynchronous read of the ``cfg``, ``next_psn``, ``ack``, ``sq`` and
``cq`` entries of one QP, of its ``wr_ring`` entries at the segmenter's and the completion
engine's ring positions and of the ``wr_done`` entry of the segmenter's WR pool entry, and
the registers of the intake, the segmenter, ACK processing, the completion engine and the
control)
under the free inputs of :mod:`.requester_props`, and states properties strong enough for
k-induction: each holds in *every* state that satisfies the others, not only in the states
reachable within a bound. For one QP (any: ``watch_qpn`` is an ``AnyConst``), with ``N`` its
next PSN, ``U`` its una and ``M`` its MPR in the tables, checks:

``window``
    Outstanding PSNs never exceed the MPR window: ``N - U <= M x 128`` (24-bit serial
    arithmetic) in every cycle; and every new (not retransmitted) packet of the QP on
    ``send`` carries the PSN after the previous one (the last QP_WRITE's ``psn`` for the
    first after it: each accepted QP_WRITE restarts the property),
    so none is sent twice and none skipped, and lies inside the window,
    ``psn + 1 - U <= M x 128``, with ``U`` and ``M`` the requester's own state when it
    leaves (``M`` is the ``mpr`` of the last QP_WRITE). That is ``psn - U < M x 128`` unless
    ``U = psn + 1``: with no honest-ACK assumption, an ACK may cover a packet still waiting
    in the ``send`` register (the requester counts a packet as sent when the register takes
    it).
``window_mutant``
    The same on a requester whose ACK processing no longer forwards the write-back of the
    ACK ahead into A1 (its RTLIL patched so that A1 always takes the ``ack`` table's read):
    the proof must fail, which shows it can.
``cover``
    That environment reaches a new packet of the QP, an ACK moving ``U``, a new packet after
    that, an ACK of the QP right behind one that moved ``U`` (it decides on the
    write-back the mutant no longer forwards), a second QP_WRITE resetting the QP, and a new
    packet from the PSN it set. A full window (128 packets) lies beyond any
    depth a cover can search.

Assumptions, all of them:

- no reset during the check; inputs as in :mod:`.requester_props` (every field the requester
  decides on free, the ones it only stores and copies held at 0 or idle); no honest-ACK
  assumption: the property is stated on the requester's own ``una``, which ACK processing
  never moves beyond its own next PSN. Every command is free, ``QP_WRITE`` of the watched QP
  included, at any time: a re-initialisation (with any PSN and MPR) and a software ERROR
  are covered, as are fatal NAKs and exhausted retries.

Supporting invariants, asserted by every check (k-induction assumes them for k steps and
proves them in the next):

- *before the QP_WRITE*: the QP's ``cfg`` entry is all zero (state RESET, MPR 0),
  ``N = U``, and nothing of the QP is in the segmenter, the intake's forwarding register or
  ``send``;
- *configuration*: ``M`` is the MPR of the last QP_WRITE, at most ``config.mpr_units``;
- *send register*: a new packet of the QP in it carries ``N - 1``, the wrapper's next PSN;
  else the wrapper's next PSN is ``N``; the retransmitter's output is marked as a resend;
- *segmenter*: while it holds a WR of the QP, its next PSN is ``N``, its MPR ``M``, and the
  una its window check uses (``U`` of this cycle or of the hand-over) lies at or behind
  ``U``: ``U - una <= N - una <= M x 128``; the ``ack`` entry it tracks is the table's
  (``una`` and ``error``), and the checks it registered a cycle ahead are those of its PSN
  against the una it uses (window, MPR filled, oldest PSN, error), its last-packet flag
  that of the bytes left; unless the QP is in ERROR, the intake's
  forwarding register holds the QP with the WR's end PSN (``psn`` + the packets left);
- *WR ring and pool*: at most ``config.wr_slots`` WRs are outstanding (``sq.tail -
  cq.head``); unless the QP is in ERROR, the segmenter's WR is one of them (its ring
  position lies between ``cq.head`` and ``sq.tail``), its ring slot names its WR pool entry
  and that entry's ``wr_done`` holds its end PSN. So a QP_WRITE
  never resets the QP under a WR the segmenter holds: the control refuses one with WRs
  outstanding (EBUSY) or, for ERROR, flushes them without a reset; a QP in ERROR has the
  segmenter drop its WR in the cycle (the control decides a cycle after holding the
  engines, so the segmenter's ``ack`` read is fresh);
- *completion engine*: in RING or CHECK for the QP, the pool entry it reads is the one its
  ring slot names; the slot it checks is ``cq.head`` and the slots
  it may still complete are outstanding; its latched error implies the QP's; and when the
  segmenter's WR is among those slots (QP not in ERROR), the latched ``una`` lies before
  the WR's end PSN (so the engine never completes the WR the segmenter holds);
- *intake*: its forwarding register, holding the QP, has ``N`` as end PSN when the segmenter
  holds no WR of the QP and the QP is not in ERROR; the WR in S1 decides on its QP's
  entries as the tables hold them (read, or captured while it waits: ring tail and head for
  any QP, every observed entry for this one); the free FIFO's head register holds its oldest
  entry;
- *ACK processing*: A2, holding an item of the QP, decides on the ``ack`` entry of the table
  (``una`` and ``error``, forwarded), and on a next PSN between ``U`` and ``N``; the control's
  QP reset never finds A1 or A2 busy.
- *WR pool*: every entry is in one place only: not handed out yet (the intake's fresh counter
  and up), in the free FIFO (its storage, positions and fill observed), or in an outstanding
  slot of one QP's ring (every QP's ``sq.tail``, ``cq.head`` and ring slots observed); the
  completion engine, for any QP, reads that QP's oldest slot. So the intake never hands out
  an entry in use, the segmenter's in particular.
"""

from amaranth import *
from amaranth.asserts import AnyConst
from amaranth.hdl import Assert, Assume, Cover

from .. import protocol as P
from ..transport.req_common import log2
from ..transport.req_defs import pool_entries, slot_depth
from ..transport.requester import Requester
from ..util import validating
from .common import check_wrapper
from .requester_props import drive_inputs

__all__ = ["RequesterInvariants", "CHECKS"]

CHECKS = ("window", "window_mutant", "cover")


def _psn_distance(a, b):
    """``a - b`` modulo 2**24."""
    return (a - b)[:P.PSN_BITS]


def _without_ack_forwarding(text):
    """The RTLIL of the requester with A1's forwarding of the ACK ahead's ``ack`` decision
    cut: A2's ``ack`` entry is never the una the ACK ahead decided (only the table's read,
    or the write of the ACK two ahead)."""
    # The enable in the select of `Mux(next.en & (next.addr == a1_qpn), next.data, ...)`.
    line = "    connect \\A \\a2_ack_en [0]\n"
    if text.count(line) != 1:
        raise ValueError("Mutant: the select of A1's ack forwarding is not found once in the "
                         "RTLIL; ACK processing's A1 has changed, update the mutant")
    return text.replace(line, "    connect \\A 1'0\n")


class RequesterInvariants(Elaboratable):
    """A :class:`Requester` (``observe=True``) with free inputs and the invariants of ``check``.

    Parameters
    ----------
    config : NicConfig
    check : str
        One of :data:`CHECKS`.
    """

    def __init__(self, *, config, check):
        with validating(self):
            check_wrapper(config, check, CHECKS)
        self.config = config
        self.check = check
        self.dut = Requester(config=config, observe=True)
        #: Applied by :func:`sim.formal.run_formal` to the RTLIL before the proof.
        self.rtlil_patch = _without_ack_forwarding if check.endswith("_mutant") else None

    def elaborate(self, platform):
        m = Module()
        config = self.config
        m.submodules.dut = dut = self.dut
        drive_inputs(m, dut)
        obs = dut.obs

        watch_qpn = Signal(config.qpn_bits)
        m.d.comb += [watch_qpn.eq(AnyConst(config.qpn_bits)), Assume(watch_qpn < config.qps),
                     dut.obs_qpn.eq(watch_qpn)]

        row = obs.row
        next_psn, una, error, mpr = row.next_psn, row.ack.una, row.ack.error, row.cfg.mpr
        window = Cat(C(0, 7), mpr)

        # The control's QP reset (an accepted QP_WRITE of the QP; any may come at any time).
        control = obs.control
        reset = control.write & (control.qpn == watch_qpn)
        written = Signal()              # the QP was reset by a QP_WRITE
        ghost_mpr = Signal(4)           # ... with this MPR, the last time
        with m.If(reset):
            m.d.sync += [written.eq(1), ghost_mpr.eq(control.mpr)]

        # New packets of the QP on `send`; the wrapper's next PSN.
        send = dut.send
        ctx = send.payload.context
        send_new = send.valid & (send.payload.qpn == watch_qpn) & ~ctx.retransmission
        ghost_next = Signal(P.PSN_BITS)
        with m.If(reset):
            m.d.sync += ghost_next.eq(control.psn)
        with m.Elif(send_new & send.ready):
            m.d.sync += ghost_next.eq(ctx.psn + 1)

        # The segmenter, the intake's forwarding register, ACK processing.
        seg, intake, ack = obs.segmenter, obs.intake, obs.ack
        seg_mine = seg.active & (seg.qpn == watch_qpn)
        mtu_bits = log2(config.mtu)
        packets_left = Mux(seg.remaining == 0, 1, ((seg.remaining - 1) >> mtu_bits) + 1)
        seg_end = (seg.psn + packets_left)[:P.PSN_BITS]
        seg_ahead_psns = _psn_distance(seg.psn, seg.una)
        seg_limit = Cat(C(0, 7), seg.mpr)
        fwd_mine = intake.fwd_valid & (intake.fwd_qpn == watch_qpn)
        a2_mine = ack.a2_valid & (ack.a2_qpn == watch_qpn)
        # The QP's ack entry with ACK processing's write of this cycle (A3's register: the
        # decision of the cycle before).
        w_mine = ack.w_en & (ack.w_qpn == watch_qpn)
        una_w = Mux(w_mine, ack.w_una, una)
        error_w = Mux(w_mine, ack.w_error, error)
        reset_last = Signal()           # the QP_WRITE's una is written this cycle
        m.d.sync += reset_last.eq(reset)

        # The QP's WR ring (slots from `cq.head` up to `sq.tail`, each naming a WR pool
        # entry) and the completion engine (RING, then CHECK, for the QP).
        sb = log2(slot_depth(config))
        outstanding = (row.sq.tail - row.cq.head)[:sb + 1]
        seg_in_ring = (seg.pos - row.cq.head)[:sb] < outstanding
        comp = obs.completion
        comp_mine = (comp.ring | comp.check) & (comp.qpn == watch_qpn)
        comp_left = (comp.tail - comp.head)[:sb + 1]      # slots CHECK may still complete
        seg_ahead = (seg.pos - comp.head)[:sb] < comp_left
        seg_left = _psn_distance(seg_end, comp.una)

        # The WR pool: every entry is in at most one place. The places: never handed out
        # (`fresh` and up), the free FIFO (`free_count` from `free_rd`), an outstanding slot
        # of a QP's ring; the completion engine, in RING or CHECK for any QP, reads its
        # QP's oldest outstanding slot.
        pool = pool_entries(config)
        places = []
        for qpn in range(config.qps):
            ring = row.rings[qpn]
            ring_outstanding = (ring.tail - ring.head)[:sb + 1]
            m.d.comb += Assert(ring_outstanding <= config.wr_slots,
                               "every QP has at most wr_slots WRs outstanding")
            for position in range(slot_depth(config)):
                places.append(((C(position, sb) - ring.head)[:sb] < ring_outstanding,
                               ring.slots[position]))
            comp_here = (comp.ring | comp.check) & (comp.qpn == qpn)
            ring_head = Signal.like(ring.slots[0], name=f"ring_head_{qpn}")
            with m.Switch(comp.head[:sb]):
                for position in range(slot_depth(config)):
                    with m.Case(position):
                        m.d.comb += ring_head.eq(ring.slots[position])
            m.d.comb += [
                Assert(~comp_here | ((comp.head == ring.head) & (comp_left != 0)
                                     & (comp_left <= ring_outstanding)),
                       "the completion engine checks its QP's oldest outstanding WRs"),
                Assert(~comp_here | (Mux(comp.ring, comp.ring_read, comp.entry) == ring_head),
                       "the completion engine reads its QP's oldest pool entry"),
            ]
        free = intake
        for index in range(pool):
            age = Mux(index >= free.free_rd, index - free.free_rd, index + pool - free.free_rd)
            places.append((age < free.free_count, free.free_entries[index]))
        free_end = free.free_rd + free.free_count
        # The WR in S1 decides on its QP's entries as the tables hold them (captured while
        # it waits); the free FIFO's oldest entry is in its head register.
        s1_ring = row.rings[intake.s1_qpn]
        s1_mine = intake.s1_valid & (intake.s1_qpn == watch_qpn)
        m.d.comb += [
            Assert(~intake.s1_valid | ((intake.s1_sq.tail == s1_ring.tail)
                                       & (intake.s1_cq.head == s1_ring.head)),
                   "the intake's WR sees its QP's ring"),
            Assert(~s1_mine | ((Value.cast(intake.s1_cfg) == Value.cast(row.cfg))
                               & (Value.cast(intake.s1_sq) == Value.cast(row.sq))
                               & (Value.cast(intake.s1_ack) == Value.cast(row.ack))
                               & (Value.cast(intake.s1_cq) == Value.cast(row.cq))
                               & (intake.s1_next_psn == next_psn)),
                   "the intake's WR sees its QP's entries"),
            Assert((free.free_count == 0) | (free.free_head == free.free_entries[free.free_rd]),
                   "the free FIFO's head register holds its oldest entry"),
        ]
        m.d.comb += [
            Assert(free.fresh <= pool, "the fresh counter within the pool"),
            Assert((free.free_count <= pool) & (free.free_rd < pool) & (free.free_wr < pool)
                   & (free.free_wr == Mux(free_end >= pool, free_end - pool, free_end)),
                   "the free FIFO's positions"),
        ]
        for i, (valid_i, entry_i) in enumerate(places):
            m.d.comb += Assert(~valid_i | (entry_i < free.fresh),
                               "a pool entry in a ring or the free FIFO was handed out")
            for valid_j, entry_j in places[i + 1:]:
                m.d.comb += Assert(~(valid_i & valid_j) | (entry_i != entry_j),
                                   "a pool entry is in one place only")

        m.d.comb += [
            # The property (ACK processing writes una from a register the cycle after its
            # decision; a QP_WRITE writes next_psn in its cycle, una in the next).
            Assert(_psn_distance(next_psn, una_w) <= window,
                   "outstanding PSNs exceed the window"),
            Assert(reset_last | (_psn_distance(next_psn, una) <= window),
                   "the table's una lies in the window (but as a QP_WRITE's is written)"),
            Assert(~reset_last | (w_mine & (ack.w_una == next_psn) & ~ack.w_error),
                   "a QP_WRITE's una is written the cycle after"),
            Assert(~w_mine | reset_last
                   | (_psn_distance(ack.w_una, una) <= _psn_distance(next_psn, una)),
                   "ACK processing's write moves una towards the next PSN"),
            Assert(~(send_new & send.ready) | (ctx.psn == ghost_next),
                   "new PSNs not consecutive"),
            Assert(~(send_new & send.ready) | (_psn_distance(ctx.psn + 1, una) <= window),
                   "a new packet outside the window"),
            # Before the QP_WRITE.
            Assert(written | ((Value.cast(row.cfg) == 0) & (next_psn == una) & ~seg_mine
                              & ~fwd_mine & ~send_new),
                   "nothing of the QP before its QP_WRITE"),
            # Configuration.
            Assert(mpr == ghost_mpr, "the MPR is the QP_WRITE's"),
            Assert(ghost_mpr <= config.mpr_units, "MPR within the configuration"),
            # Send register.
            Assert(Mux(send_new, (ctx.psn == ghost_next)
                       & (next_psn == (ghost_next + 1)[:P.PSN_BITS]),
                       next_psn == ghost_next),
                   "the send register and the next PSN"),
            Assert(~obs.resend.valid | obs.resend.retransmission,
                   "the retransmitter's output is marked as a resend"),
            # Segmenter.
            Assert(~seg_mine | (written & (seg.psn == next_psn) & (seg.mpr == mpr)),
                   "the segmenter's WR continues from the next PSN"),
            Assert(~seg_mine | ((_psn_distance(una, seg.una) <= _psn_distance(next_psn, seg.una))
                                & (_psn_distance(next_psn, seg.una) <= window)),
                   "the segmenter's una lies behind the QP's"),
            Assert(~seg_mine | error | (fwd_mine & (intake.fwd_end == seg_end)),
                   "the intake forwards the segmenter's end PSN"),
            # The segmenter's tracked ack entry is the table's; its registered checks are
            # those of this cycle's PSN against the una it uses.
            Assert(~seg_mine | ((seg.una_seen == una) & (seg.error_seen == error)),
                   "the segmenter tracks the QP's ack entry"),
            Assert(~seg_mine | ((seg.check.window_ok == (seg_ahead_psns < seg_limit))
                                & (seg.check.closes_mpr == (seg_ahead_psns + 1 >= seg_limit))
                                & (seg.check.at_una == (seg.psn == seg.una))
                                & (seg.check.error == seg.error_seen)),
                   "the segmenter's checks are this cycle's"),
            Assert(~seg.active | (seg.last == (seg.remaining <= config.mtu)),
                   "the segmenter's last packet flag"),
            # The WR ring: the segmenter's WR is outstanding, so no QP_WRITE resets the QP
            # under it (the control refuses one with WRs outstanding, EBUSY, or flushes them,
            # which fails the QP; a QP in ERROR stops the segmenter's WR in the cycle).
            Assert(outstanding <= config.wr_slots, "at most wr_slots WRs outstanding"),
            Assert(~seg_mine | error | seg_in_ring, "the segmenter's WR is outstanding"),
            Assert(~seg_mine | error | (row.wr_ring == seg.slot),
                   "the segmenter's ring slot names its WR pool entry"),
            Assert(~seg_mine | error | (row.wr_done.end == seg_end),
                   "the segmenter's WR pool entry holds its end PSN"),
            # The completion engine, in CHECK for the QP.
            Assert(~comp_mine | ((comp.head == row.cq.head) & (comp_left != 0)
                                 & (comp_left <= outstanding)),
                   "the completion engine checks the QP's oldest outstanding WRs"),
            Assert(~comp_mine | ~comp.error | error, "the completion engine's error is the QP's"),
            Assert(~comp_mine | (Mux(comp.ring, comp.ring_read, comp.entry) == row.wr_ring_head),
                   "the completion engine reads the pool entry its ring slot names"),
            Assert(~(comp_mine & seg_mine & ~error & seg_ahead)
                   | ((seg_left != 0) & ~seg_left[P.PSN_BITS - 1]),
                   "the completion engine's una lies before the segmenter's end PSN"),
            # Intake.
            Assert(~fwd_mine | seg_mine | error | (intake.fwd_end == next_psn),
                   "the intake forwards the next PSN"),
            # ACK processing.
            Assert(~a2_mine | ((ack.a2_una == una_w) & (ack.a2_error == error_w)),
                   "A2 decides on the QP's ack entry"),
            Assert(~a2_mine | (_psn_distance(ack.a2_next, una_w)
                               <= _psn_distance(next_psn, una_w)),
                   "A2's next PSN lies between una and the next PSN"),
            Assert(~control.write | (~ack.a1_valid & ~ack.a2_valid),
                   "a QP reset with A1 and A2 idle"),
        ]

        if self.check == "cover":
            # una moved by ACK processing (not by the QP_WRITE, which sets it: its una is
            # written the cycle after, and seen in the table the cycle after that).
            una_before = Signal(P.PSN_BITS)
            reset_before = Signal()
            m.d.sync += [una_before.eq(una), reset_before.eq(reset_last)]
            una_moves = written & ~reset_before & (una != una_before)
            # ACK processing's write of this cycle moves una (the ACK right behind the one
            # that decided it is in A2 now).
            write_moves = written & w_mine & ~reset_last & (ack.w_una != una)
            moved = Signal()
            with m.If(una_moves):
                m.d.sync += moved.eq(1)
            rewritten = Signal()        # a second QP_WRITE has reset the QP
            with m.If(reset & written):
                m.d.sync += rewritten.eq(1)
            m.d.comb += [
                Cover(send_new & send.ready),
                Cover(una_moves),
                Cover(moved & send_new & send.ready),
                # The ACK right behind one that moved una decides on its decision.
                Cover(write_moves & a2_mine & ~ack.a2_exceed),
                # A QP_WRITE resets the QP again; a new packet from its new PSN.
                Cover(reset & written),
                Cover(rewritten & send_new & send.ready),
            ]
        return m
