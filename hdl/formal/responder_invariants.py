"""Inductive invariants of the responder's tables and pipeline (``hdl/transport/responder.py``).

:class:`ResponderInvariants` wraps a :class:`~hdl.transport.responder.Responder` built with
``observe=True`` (an asynchronous read of its tables at one row, and S2's state) under the
same free inputs and assumptions as :mod:`.responder_props`, and states properties strong
enough for k-induction: each holds in *every* state that satisfies the others, not only in
the states reachable within a bound. For one QP (any: ``watch_qpn`` is an ``AnyConst``) the
wrapper keeps ``latest``, the row S2 last wrote back for it (all zeros before the first
write, like the tables after reset). Checks:

``cum_psn``
    The QP's cumulative PSN never moves backwards: every write-back of its row, except an
    accepted ``QP_WRITE`` with ``set_psn``, sets the expected PSN to ``epsn + a`` with
    ``0 <= a <= CHUNK`` (24-bit serial arithmetic), ``epsn`` being the latest one written.
``sack_cum_psn``
    The cumulative PSN of the QP's successive SACKs on ``ack`` never moves backwards (24-bit
    serial arithmetic), except across an accepted ``QP_WRITE set_psn``:
    :meth:`ResponderInvariants._sack_chain` lists its invariants.
``sack_cover``
    That environment reaches a SACK that moves the cumulative PSN on, one that repeats it,
    and two SACKs of the QP in S3 at once.
``placed_once``
    No PSN is placed twice: for one PSN (an ``AnyConst``), S2 gives the verdict PLACED at most
    once between two accepted ``QP_WRITE set_psn`` of the QP, unless the expected PSN has
    moved on by half the PSN space in between (then the PSN has come round again: it lies
    more than a window ahead, where nothing is placed, and its flag is dropped).
``placed_once_mutant``
    The same on a responder with one forwarding path removed (its RTLIL patched so that S1
    no longer takes the write-back of two cycles ago, ``prev2``): the proof must fail, which
    shows it can.
``region``
    No write lands outside a region: every beat on ``place`` lies inside [base, base +
    length) of the MR entry its packet was checked against, the MR table's entry at its rkey
    (written by ``MR_WRITE``), for payloads that fit their dma_len (the parser's contract).
    :meth:`ResponderInvariants._region` lists its ghost fields and invariants.
``region_cover``
    The region environment reaches a third placed beat, a partial last beat and a placement
    through the last MR slot.

Supporting invariants, asserted by every check (k-induction assumes them for k steps and
proves them in the next):

- *tables*: the tables' row of the QP equals ``latest``, except in the cycle after S2 wrote it
  (the write-back reaches the table from a register, a cycle later);
- *forwarding*: whenever S2 holds an operation of the QP, the row it decides on (``st``, the
  table's data with the two pending write-backs and S2's own forwarded) equals ``latest``,
  and where its packet's PSN lies against that row (``dist``, made in S1 against the row
  read or the row S2 writes back) is what S2 would compute from ``st``;
- *configuration*: the QP's MPR is at most ``config.mpr_units`` (``QP_WRITE`` refuses more);
- *placed* (``placed_once``): a placed PSN is recorded in ``latest``: below the expected PSN,
  or inside the window with its receive bit set, or more than a window ahead (come round).
"""

from amaranth import *
from amaranth.asserts import AnyConst, AnySeq
from amaranth.hdl import Assert, Assume, Cover

from .. import protocol as P
from ..packet.headers import PacketKind
from ..transport.responder import CHUNK, Responder
from ..util import validating
from .common import check_wrapper, drive_free, psn_ge
from .responder_props import drive_inputs

__all__ = ["ResponderInvariants", "CHECKS"]

CHECKS = ("cum_psn", "sack_cum_psn", "sack_cover", "placed_once", "placed_once_mutant",
          "region", "region_cover")

#: PSNs one SACK's cumulative PSN can lie beyond the one before it of the same QP: a window
#: (128 PSNs) for each placement the ACK count allows (at most 255); far below half the PSN
#: space, so the serial comparison of two successive SACKs is meaningful.
_SACK_LINK = 2**15 - 1

#: Offsets inside a packet: its bytes (dma_len, 32 bits) and one beat more.
_OFFSET_BITS = 34


def _without_prev2(text):
    """The RTLIL of the responder with S1's forwarding of ``prev2`` cut: the select of the
    write-back of two cycles ago (``prev2.valid & (prev2.qpn == s1.qpn)``) tied to 0."""
    line = "    connect \\A \\prev2 [0]\n"
    if text.count(line) != 1:
        raise ValueError("Mutant: the select of prev2's forwarding is not found once in the "
                         "RTLIL; the responder's S1 has changed, update the mutant")
    return text.replace(line, "    connect \\A 1'0\n")


def _decided(row):
    """The fields of a row the properties read: expected PSN, MPR, ACK count and receive
    bitmap. (The whole row is forwarded alike; equality of all of it is as true but makes
    the solver's induction step many times slower.)"""
    return Cat(row.qp.epsn, row.qp.mpr, row.qp.ack_count, row.bm.rcv)


def _decided_mr(entry):
    """The fields of an MR entry a placement reads."""
    return Cat(entry.valid, entry.rkey, entry.pd, entry.base, entry.limit)


class ResponderInvariants(Elaboratable):
    """A :class:`Responder` (``observe=True``) with free inputs and the invariants of ``check``.

    Parameters
    ----------
    config : NicConfig
    check : str
        One of :data:`CHECKS`.
    mr_slots, timers, completions : int
        The responder's own parameters, smallest by default.
    """

    def __init__(self, *, config, check, mr_slots=1, timers=1, completions=2):
        with validating(self):
            check_wrapper(config, check, CHECKS)
        self.config = config
        self.check = check
        self.mr_slots = mr_slots
        self.dut = Responder(config=config, mr_slots=mr_slots, timers=timers,
                             completions=completions, observe=True)
        #: Applied by :func:`sim.formal.run_formal` to the RTLIL before the proof.
        self.rtlil_patch = _without_prev2 if check.endswith("_mutant") else None

    def elaborate(self, platform):
        m = Module()
        config = self.config
        window = config.window_psns
        m.submodules.dut = dut = self.dut
        check = self.check
        drive_inputs(m, dut)
        obs = dut.obs

        watch_qpn = Signal(config.qpn_bits)
        m.d.comb += [watch_qpn.eq(AnyConst(config.qpn_bits)), Assume(watch_qpn < config.qps),
                     dut.obs_qpn.eq(watch_qpn)]

        # `latest`: the row S2 last wrote back for the watched QP.
        latest = Signal.like(obs.new_state)
        mine = obs.e_row & (obs.e_qpn == watch_qpn)
        write = obs.table_write & (obs.e_qpn == watch_qpn)
        wrote = Signal()                # the write reaches the table at the end of this cycle
        m.d.sync += wrote.eq(write)
        with m.If(write):
            m.d.sync += latest.eq(obs.new_state)
        m.d.comb += [
            Assert(wrote | (_decided(obs.row) == _decided(latest)),
                   "the table's row is the latest write-back"),
            Assert(~mine | (_decided(obs.st) == _decided(latest)),
                   "S2 decides on the latest row"),
            Assert(~(obs.s1_row_op & (obs.s1_qpn == watch_qpn)) |
                   (_decided(obs.s1_older) == _decided(latest)),
                   "S1 starts from the latest row"),
            Assert(latest.qp.mpr <= config.mpr_units, "MPR within the configuration"),
            Assert(obs.checks_ok, "the checks registered for S2 are its packet's"),
            Assert(~mine | obs.dist_ok, "the distance registered for S2 is its packet's"),
        ]
        restart = write & obs.set_rx

        if check == "cum_psn":
            advance = (obs.new_state.qp.epsn - latest.qp.epsn)[:P.PSN_BITS]
            with m.If(write & ~restart):
                m.d.comb += Assert(psn_ge(obs.new_state.qp.epsn, latest.qp.epsn) &
                                   (advance <= CHUNK), "the cumulative PSN moved backwards")

        if check.startswith("sack"):
            self._sack_chain(m, dut, latest, mine, write, restart)

        if check.startswith("region"):
            self._region(m, dut)
        else:
            m.d.comb += dut.obs_slot.eq(0)

        if check.startswith("placed_once"):
            watch_psn = Signal(P.PSN_BITS)
            m.d.comb += watch_psn.eq(AnyConst(P.PSN_BITS))
            distance = Signal(P.PSN_BITS)           # watch_psn - epsn
            m.d.comb += distance.eq(watch_psn - latest.qp.epsn)
            below = distance[P.PSN_BITS - 1]
            far_ahead = ~below & (distance >= window)
            in_window = ~below & (distance < window)
            received = in_window & latest.bm.rcv.bit_select(distance[:(window - 1).bit_length()],
                                                           1)
            placed_flag = Signal()      # the watched PSN was placed since the last restart
            placed_now = mine & obs.e_fire & obs.placed & (obs.e_psn == watch_psn)
            m.d.comb += [
                Assert(~placed_now | ~placed_flag, "a PSN placed twice"),
                Assert(~placed_flag | below | received | far_ahead,
                       "a placed PSN is recorded in the row"),
            ]
            with m.If(placed_now):
                m.d.sync += placed_flag.eq(1)
            with m.If(restart | (far_ahead & ~placed_now)):
                m.d.sync += placed_flag.eq(0)
        return m

    def _region(self, m, dut):
        """No write lands outside a region: every beat on ``place`` lies inside the region
        [base, base + length) of the MR entry its packet was checked against, the entry the
        MR table held at the packet's rkey (written by an MR_WRITE). Environment: a packet's
        payload fits in its dma_len (the parser's contract, BAD_LENGTH); ``keep`` is a
        prefix of the lanes. To carry that contract down the pipeline with each beat, every
        beat has two ghost fields the responder does not decide on: its byte offset in the
        packet (``ip_dst``) and the packet's dma_len (``ip_src``)."""
        obs = dut.obs
        lanes = self.config.bytes_per_beat
        beat = dut.i.payload
        header = beat.header
        count = Signal(range(lanes + 1))
        m.d.comb += [count.eq(AnySeq(len(count))), Assume(count <= lanes),
                     beat.keep.eq((C(1, lanes + 1) << count) - 1)]

        def offset(b):
            return b.header.ip_dst[:_OFFSET_BITS]

        def length(b):
            return b.header.ip_src[:32]

        def bytes_of(keep):
            return sum(keep[k] for k in range(len(keep)))

        # The MR slot watched: any (the invariant below holds for the packets of each slot).
        slot_bits = max(1, (self.mr_slots - 1).bit_length())
        watch_slot = Signal(slot_bits)
        m.d.comb += [watch_slot.eq(AnyConst(slot_bits)), dut.obs_slot.eq(watch_slot)]
        if self.mr_slots == 1:
            m.d.comb += Assume(watch_slot == 0)

        def slot_of(b):
            return b.header.reth.rkey[:slot_bits] if self.mr_slots > 1 else C(0, 1)

        # Input: the ghost fields and the contract, from the running offset of the packet.
        in_next = Signal(_OFFSET_BITS)          # offset of the next beat of the packet
        in_len = Signal(32)
        first = ~obs.in_packet
        m.d.comb += [
            Assume(offset(beat) == Mux(first, 0, in_next)),
            Assume(length(beat) == Mux(first, header.reth.dma_len, in_len)),
            Assume(offset(beat) + bytes_of(beat.keep) <= length(beat)),
        ]
        drive_free(m, header.ip_dst[:_OFFSET_BITS], header.ip_src[:32])
        with m.If(dut.i.valid & dut.i.ready):
            m.d.sync += [in_next.eq(offset(beat) + lanes), in_len.eq(length(beat))]

        # S2: the packet being placed (va, dma_len, region) and the offset of its next beat.
        e, s1 = obs.e_beat, obs.s1_beat
        x_va = Signal(64)
        x_len = Signal(32)
        x_next = Signal(_OFFSET_BITS)
        x_base = Signal(64)
        x_limit = Signal(65)
        with m.If(obs.e_fire & obs.e_first):
            m.d.sync += [x_va.eq(e.header.reth.va), x_len.eq(e.header.reth.dma_len),
                         x_next.eq(lanes), x_base.eq(obs.mr.base), x_limit.eq(obs.mr.limit)]
        with m.Elif(obs.e_fire & obs.e_more):
            m.d.sync += x_next.eq(x_next + lanes)

        # The offset and length the next beat after the newest operation in S2 / S1 has.
        e_next_off = Mux(obs.e_first, lanes, Mux(obs.e_more, offset(e) + lanes, x_next))
        e_next_len = Mux(obs.e_first, e.header.reth.dma_len,
                         Mux(obs.e_more, length(e), x_len))
        s1_next_off = Mux(obs.s1_first, lanes, Mux(obs.s1_more, offset(s1) + lanes,
                                                    e_next_off))
        s1_next_len = Mux(obs.s1_first, s1.header.reth.dma_len,
                          Mux(obs.s1_more, length(s1), e_next_len))
        place = dut.place.payload
        place_off = (place.addr - x_va)[:64]
        place_bytes = bytes_of(place.keep)
        m.d.comb += [
            # The environment sends data packets only (the kind is held at DATA).
            Assert(~obs.s1_first | (s1.header.kind == PacketKind.DATA), "no probe in S1"),
            Assert(~obs.e_first | (e.header.kind == PacketKind.DATA), "no probe in S2"),
            Assert(~(obs.e_first & (slot_of(e) == watch_slot)) |
                   (_decided_mr(obs.mr) == _decided_mr(obs.mr_row)),
                   "S2 checks a packet against the MR table's entry at its rkey"),
            Assert(~(obs.s1_first & (slot_of(s1) == watch_slot)) |
                   (_decided_mr(obs.s1_mr_older) == _decided_mr(obs.mr_row)),
                   "S1 checks a packet against the MR table's entry at its rkey"),
            Assert(~obs.e_first | (obs.va_end == e.header.reth.va + e.header.reth.dma_len),
                   "va_end of the packet in S2"),
            Assert(obs.pkt_addr == (x_va + x_next)[:64], "address of the next beat"),
            Assert(~obs.e_more | ((offset(e) == x_next) & (length(e) == x_len)),
                   "the beat in S2 is the packet's next"),
            Assert(~obs.s1_more | ((offset(s1) == e_next_off) & (length(s1) == e_next_len)),
                   "the beat in S1 follows S2's"),
            Assert(~obs.in_packet | ((in_next == s1_next_off) & (in_len == s1_next_len)),
                   "the input's next beat follows S1's"),
            Assert(~obs.s1_more | (offset(s1) + bytes_of(s1.keep) <= length(s1)),
                   "the beat in S1 fits its packet"),
            Assert(~obs.s1_first | (bytes_of(s1.keep) <= s1.header.reth.dma_len),
                   "the first beat in S1 fits its packet"),
            Assert(~obs.e_more | (offset(e) + bytes_of(e.keep) <= length(e)),
                   "the beat in S2 fits its packet"),
            Assert(~obs.e_first | (bytes_of(e.keep) <= e.header.reth.dma_len),
                   "the first beat in S2 fits its packet"),
            Assert(~obs.pkt_place | ((x_va >= x_base) & (x_va + x_len <= x_limit)),
                   "the packet being placed lies in its region"),
            Assert(~dut.place.valid | obs.pkt_place, "a beat on place belongs to a placed packet"),
            Assert(~dut.place.valid | (place_off + place_bytes <= x_len),
                   "a beat on place lies in its packet"),
            # The property: [addr, addr + bytes) inside [base, limit), addresses modulo 2**64
            # like the region's own end (base + length may pass 2**64).
            Assert(~dut.place.valid | ((x_va + place_off >= x_base) &
                                       (x_va + place_off + place_bytes <= x_limit)),
                   "a write outside its region"),
        ]
        if self.check == "region_cover":
            m.d.comb += [
                Cover(dut.place.valid & (place_off == 2 * lanes) & (place_bytes != 0)),
                Cover(dut.place.valid & (place_off == lanes) & dut.place.payload.last &
                      (place_bytes != 0) & (place_bytes != lanes)),
            ]
            if self.mr_slots > 1:
                m.d.comb += Cover(obs.e_fire & obs.placed & (slot_of(e) == self.mr_slots - 1))

    def _sack_chain(self, m, dut, latest, mine, write, restart):
        """The cumulative PSN of the QP's successive SACKs on ``ack`` never moves backwards.

        The wrapper tags each SACK the QP's operations hand to S3 (a ghost flag that moves with
        it through S3's two registers) and keeps ``made``, the cumulative PSN of the newest
        one, and ``last``, that of the last one taken from ``ack``. Invariants: the SACKs in
        S3 and ``last`` form a chain, each at most ``_SACK_LINK`` PSNs beyond the one before;
        ``made`` is the newest of them; and the QP's expected PSN lies at most a window per
        counted placement (the row's ACK count) beyond ``made``: a SACK comes at the latest
        when the count reaches ``ack_every``, and a placement's advance, continued steps
        included, stays within one window (while one continues, the bitmap's top bits that
        the advance has shifted in are zero)."""
        obs = dut.obs
        window = self.config.window_psns

        def cum(beat):
            return beat.header.ctl.sack.seth.cack_psn

        def is_sack(beat):
            return beat.header.kind == PacketKind.SACK

        def ahead(a, b):            # a - b in 24-bit serial arithmetic
            return (a - b)[:P.PSN_BITS]

        # The ghost flags follow S3's own moves (ReplyStage: held <- i when i.ready; ack <-
        # held when held is valid and ack has room).
        ack = dut.ack
        ack_room = ~ack.valid | ack.ready
        flag_held = Signal()
        flag_ack = Signal()
        made_mine = obs.reply_taken & mine & is_sack(obs.reply)
        with m.If(obs.held_valid & ack_room):
            m.d.sync += flag_ack.eq(flag_held)
        with m.Elif(ack.ready):
            m.d.sync += flag_ack.eq(0)
        with m.If(~obs.held_valid | ack_room):
            m.d.sync += flag_held.eq(made_mine)
        fh = flag_held & obs.held_valid & is_sack(obs.held)
        fo = flag_ack & ack.valid & is_sack(ack.payload)

        have_made = Signal()
        made = Signal(P.PSN_BITS)
        have_last = Signal()
        last = Signal(P.PSN_BITS)
        with m.If(made_mine):
            m.d.sync += [have_made.eq(1), made.eq(cum(obs.reply))]
        with m.If(fo & ack.ready):
            m.d.sync += [have_last.eq(1), last.eq(cum(ack.payload))]
        with m.If(restart):
            m.d.sync += [have_made.eq(0), have_last.eq(0)]

        # A continued advance (S2 holds a CONT step of the QP): `start` is the expected PSN
        # before its first step; the bitmap's top `moved` bits are zero (shifted in), so the
        # whole advance stays within one window.
        cont = mine & obs.e_cont
        owed = cont & obs.ack_want
        start = Signal(P.PSN_BITS)
        with m.If(mine & obs.e_fire & ~obs.e_cont):
            m.d.sync += start.eq(latest.qp.epsn)
        moved = Signal(P.PSN_BITS)
        m.d.comb += moved.eq(ahead(latest.qp.epsn, start))
        gap = Signal(P.PSN_BITS)        # expected PSN - 1 beyond the newest SACK's
        m.d.comb += gap.eq(ahead(latest.qp.epsn - 1, made))
        per_ack = Cat(C(0, 7), latest.qp.ack_count)      # a window per counted placement
        m.d.comb += [
            Assert(~fo | ~have_last | psn_ge(cum(ack.payload), last),
                   "a SACK's cumulative PSN moved backwards"),
            Assert(~have_last | have_made, "a SACK taken was made"),
            Assert(~flag_held | obs.held_valid, "a tag without a reply in S3"),
            Assert(~flag_ack | ack.valid, "a tag without a reply on ack"),
            Assert(~fh | (have_made & (cum(obs.held) == made)), "the held SACK is the newest"),
            Assert(~(~fh & fo) | (have_made & (cum(ack.payload) == made)),
                   "the SACK on ack is the newest"),
            Assert(~(~fh & ~fo & have_made) | (have_last & (last == made)),
                   "the last SACK taken is the newest"),
            Assert(~(fo & have_last) | (ahead(cum(ack.payload), last) <= _SACK_LINK),
                   "link last -> ack"),
            Assert(~(fh & fo) | (ahead(cum(obs.held), cum(ack.payload)) <= _SACK_LINK),
                   "link ack -> held"),
            Assert(~(fh & ~fo & have_last) | (ahead(cum(obs.held), last) <= _SACK_LINK),
                   "link last -> held"),
            Assert(obs.s1_issued, "S1 holds no continued step"),
            Assert(~cont | (moved <= window), "a continued advance within one window"),
            Assert(~cont | ((latest.bm.rcv >> (window - moved)[:8]) == 0),
                   "a continued advance's bitmap top is clear"),
            Assert(~have_made | cont | (gap <= per_ack),
                   "the expected PSN lies close beyond the newest SACK"),
            Assert(~(have_made & cont) |
                   (gap + Mux(owed, 0, window) <= Mux(owed, 254 * window, per_ack) + moved),
                   "the expected PSN lies close beyond the newest SACK (continued)"),
            Assert(latest.qp.ack_count <= 254, "ACK count below 255"),
            Assert(obs.ack_every != 0, "ack_every is not 0"),
            Assert(~obs.e_restart | (~obs.held_valid & ~ack.valid), "a restart with S3 empty"),
            Assert(~obs.s1_restart | (~obs.e_restart & ~obs.held_valid & ~ack.valid &
                                      ~obs.e_row & ~obs.e_more),
                   "a restart in S1 with S2 and S3 empty"),
        ]
        if self.check == "sack_cover":
            m.d.comb += [
                Cover(fo & ack.ready & have_last & (cum(ack.payload) != last)),
                Cover(fo & ack.ready & have_last & (cum(ack.payload) == last) & obs.e_fire),
                Cover(fh & fo),
            ]
