"""The requester's inference unit (:class:`InferenceUnit`): losses inferred from SACKs."""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import protocol as P
from ..util import validating
from .req_common import (
    PSN,
    ControlSignature,
    check_config,
    events_layout,
    kth_highest,
    log2,
    popcount,
    psn_ge,
    psn_gt,
    psn_sub,
)
from .req_defs import TIME_BITS, WalkKind, walk_layout
from .req_tables import table_access_signature
from .req_timer import poll_layout

__all__ = ["infer_request_layout", "InferenceUnit"]


def infer_request_layout(config):
    """An applied ACK with SACK bits (ACK processing -> inference unit): ``sack`` is the SACK
    bitmap masked to the QP's window, bit 0 the PSN ``base``; ``una`` the QP's new una,
    ``next`` its next PSN."""
    return data.StructLayout({"qpn": config.qpn_bits, "base": PSN, "una": PSN, "next": PSN,
                              "sack": P.SACK_BITMAP_BITS})


class InferenceUnit(wiring.Component):
    """Find the holes to resend in each applied ACK, and expire reorder windows.

    Count rule: the K-th highest SACKed PSN of an applied ACK (CONFIG ``infer_k`` = K) bounds
    the region whose holes have K later PSNs acknowledged. Time rule (CONFIG ``reo_wnd``):
    the holes below the PSN a QP's reorder window armed with, once it has run ``reo_wnd``
    units. The region is ``[max(to, una), the later of the two ends)``, asked of the walker
    as one INFER (or REORDER, the time rule alone) walk; the ``infer`` table keeps, per QP,
    ``to`` (PSNs before it were already inferred) and the reorder window.

    Five stages (I0 count, I1 group, I2 bit and table read, I3 entry registered, I4 apply
    and write), one ACK or poll per cycle, never stalls: 5 cycles from an ACK to its walk.
    A walk that finds its queue full is dropped (counted) and the entry stays, so a later
    ACK infers the same holes again.

    Hazards: the ``infer`` table is this unit's alone; I2 reads the entry through the
    transparent port, which sees every write up to that cycle; the write of the item ahead
    (in I4 while this one is in I3) is forwarded into I3's registers, so back-to-back ACKs
    of one QP see each other. ``una`` and ``next``
    come with the request (the values of the ACK's own cycle); ``to`` is trusted only inside
    ``[una, next]``. A QP_WRITE resets the QP's entry (``control.write``).

    Members
    -------
    tables : ``In(table_access_signature(config, "inference"))``
    control : ``In(ControlSignature(config))``
    now : ``In(32)``
        The time in 1.024 us units.
    ack : ``In(stream.Signature(infer_request_layout(config), always_ready=True))``
        Applied ACKs with SACK bits (when a rule is on).
    poll : ``In(stream.Signature(poll_layout(config), always_ready=True))``
        Reorder-window polls from the timer scanner; an ACK in the same cycle wins.
    walk : ``Out(stream.Signature(walk_layout(config)))``
        INFER and REORDER walks for the walker.
    busy : ``Out(1)``
        A stage holds an ACK or a poll.
    events : ``Out(events_layout(COUNTERS))``
    """

    COUNTERS = ("infer_dropped", "reorder_expiries")

    def __init__(self, *, config):
        with validating(self):
            check_config(config)
        self._config = config
        super().__init__({
            "tables": In(table_access_signature(config, "inference")),
            "control": In(ControlSignature(config)),
            "now": In(32),
            "ack": In(stream.Signature(infer_request_layout(config), always_ready=True)),
            "poll": In(stream.Signature(poll_layout(config), always_ready=True)),
            "walk": Out(stream.Signature(walk_layout(config))),
            "busy": Out(1),
            "events": Out(events_layout(self.COUNTERS)),
        })

    def elaborate(self, platform):
        m = Module()
        qb = self._config.qpn_bits
        bitmap_bits = P.SACK_BITMAP_BITS
        ctl = self.control
        infer_k, reo_wnd = ctl.infer_k, ctl.reo_wnd
        time_now = self.now[:TIME_BITS]
        groups = bitmap_bits // 8
        count_cap = 16                  # counts saturate: K is at most 15
        i0_valid, i1_valid, i2_valid, i3_valid, i4_valid = (Signal(name=f"i{n}_valid")
                                                             for n in range(5))

        def carried(stage):
            return {"qpn": Signal(qb, name=f"i{stage}_qpn"),
                    "cand": Signal(PSN, name=f"i{stage}_cand"),
                    "una": Signal(PSN, name=f"i{stage}_una"),
                    "next": Signal(PSN, name=f"i{stage}_next"),
                    "poll": Signal(name=f"i{stage}_poll")}

        i0, i1, i2, i3, i4 = (carried(n) for n in range(5))
        i0_sack = Signal(bitmap_bits)
        # An ACK and a poll in the same cycle: the ACK takes I0 and the poll is dropped (the
        # scanner comes back one scan period later).
        ack, poll = self.ack.payload, self.poll.payload
        m.d.sync += i0_valid.eq(self.ack.valid | self.poll.valid)
        with m.If(self.ack.valid):
            m.d.sync += [i0["qpn"].eq(ack.qpn), i0["cand"].eq(ack.base), i0["una"].eq(ack.una),
                         i0["next"].eq(ack.next), i0["poll"].eq(0), i0_sack.eq(ack.sack)]
        with m.Else():
            m.d.sync += [i0["qpn"].eq(poll.qpn), i0["cand"].eq(poll.una), i0["una"].eq(poll.una),
                         i0["next"].eq(poll.next), i0["poll"].eq(1), i0_sack.eq(0)]
        # I0: SACKed PSNs per 8-bit group and at or above each group (saturating).
        i1_sack = Signal(bitmap_bits)
        i1_above = [Signal(5, name=f"i1_above{g}") for g in range(groups + 1)]
        suffix = [Signal(5, name=f"i0_above{g}") for g in range(groups + 1)]
        # The saturating suffix sums as a parallel prefix (log2(groups) levels, each a
        # saturating add of two partial sums; a sum that saturates stays saturated, so the
        # order of the adds does not matter), not one add per group in series.
        def saturate(total):
            return Mux(total >= count_cap, count_cap, total)

        level = [popcount(i0_sack[8 * g:8 * g + 8]) for g in range(groups)]
        span = 1
        while span < groups:
            sums = []
            for g in range(groups):
                # A signal per step: an expression would grow at each level.
                value = Signal(5, name=f"i0_suffix{span}_{g}")
                m.d.comb += value.eq(saturate(level[g] + level[g + span])
                                     if g + span < groups else level[g])
                sums.append(value)
            level, span = sums, span * 2
        m.d.comb += [suffix[g].eq(saturate(level[g])) for g in range(groups)]
        m.d.sync += [i1_valid.eq(i0_valid), i1_sack.eq(i0_sack)]
        m.d.sync += [i1_above[g].eq(suffix[g]) for g in range(groups + 1)]
        m.d.sync += [i1[k].eq(i0[k]) for k in i0]

        # I1: the group holding the rank-th highest SACKed PSN, and its rank inside the
        # group: for the K-th (count rule) and the highest (time rule).
        def kth_group(k, name):
            byte, rank, group = C(0, 8), C(0, 4), C(0, max(1, log2(groups)))
            for g in range(groups):
                here = (i1_above[g] >= k) & (i1_above[g + 1] < k)
                byte = byte | Mux(here, i1_sack[8 * g:8 * g + 8], 0)
                rank = rank | Mux(here, (k - i1_above[g + 1])[:4], 0)
                group = group | Mux(here, g, 0)
            out = (Signal(8, name=f"i2_{name}_byte"), Signal(4, name=f"i2_{name}_rank"),
                   Signal(len(group), name=f"i2_{name}_group"))
            m.d.sync += [out[0].eq(byte), out[1].eq(rank), out[2].eq(group)]
            return out

        i2_byte, i2_rank, i2_group = kth_group(infer_k, "kth")
        i2_top_byte, _, i2_top_group = kth_group(1, "top")
        i2_found = Signal()
        m.d.sync += [i2_valid.eq(i1_valid),
                     i2_found.eq((infer_k != 0) & (i1_above[0] >= infer_k))]
        m.d.sync += [i2[k].eq(i1[k]) for k in i1]
        # I2: the bits inside the groups; read the QP's entry (written back in I3: the
        # transparent read port forwards it to the next ACK of the same QP).
        i3_end = Signal(PSN)
        i3_top = Signal(PSN)
        i3_found = Signal()
        i2_bit = Cat(kth_highest(i2_byte, i2_rank), i2_group)
        i2_top_bit = Cat(kth_highest(i2_top_byte, 1), i2_top_group)
        infer_port = self.tables.read.infer
        m.d.comb += [infer_port.addr.eq(i2["qpn"]), infer_port.en.eq(i2_valid)]
        m.d.sync += [i3_valid.eq(i2_valid), i3_found.eq(i2_found),
                     i3_end.eq((i2["cand"] + i2_bit)[:PSN]),
                     i3_top.eq((i2["cand"] + i2_top_bit + 1)[:PSN])]
        m.d.sync += [i3[k].eq(i2[k]) for k in i2]
        # I3: the entry lands in a register. The write of the item ahead, in I4 now, is the
        # one the read missed: its select and data are registered beside the read, I4 picks.
        infer_wp = self.tables.write.infer
        i4_end = Signal(PSN)
        i4_top = Signal(PSN)
        i4_found = Signal()
        entry_read = Signal.like(infer_port.data, name="i4_entry_read")
        entry_prev = Signal.like(infer_port.data, name="i4_entry_prev")
        entry_from_prev = Signal(name="i4_entry_from_prev")
        m.d.sync += [i4_valid.eq(i3_valid), i4_found.eq(i3_found), i4_end.eq(i3_end),
                     i4_top.eq(i3_top), entry_read.eq(infer_port.data),
                     entry_prev.eq(infer_wp.data),
                     entry_from_prev.eq(infer_wp.en & (infer_wp.addr == i3["qpn"]))]
        m.d.sync += [i4[k].eq(i3[k]) for k in i3]
        # I4: the region [lower, end); `to` is trusted only inside [una, next_psn]. Every
        # comparison takes table and stage values directly (one level of comparators, then
        # muxes): comparisons with `lower` are made against both `to` and `una` and picked.
        entry = Signal.like(infer_port.data, name="i4_entry")
        m.d.comb += entry.eq(Mux(entry_from_prev, entry_prev, entry_read))
        una4, next4 = i4["una"], i4["next"]
        use_to = Signal()
        m.d.comb += use_to.eq(psn_ge(entry.to, una4) & psn_ge(next4, entry.to))

        def above_lower(value):
            return Mux(use_to, psn_gt(value, entry.to), psn_gt(value, una4))

        i4_lower = Mux(use_to, entry.to, una4)
        # A SACK infers (and arms the reorder window) only when its bitmap starts at or below
        # `lower`: then every hole of the region is one the SACK itself reports. A bitmap
        # placed higher (the responder's block around a late trigger) says nothing about the
        # PSNs below its base, which may well have arrived.
        base_ok = Mux(use_to, psn_ge(entry.to, i4["cand"]), psn_ge(una4, i4["cand"]))
        found = Signal()
        m.d.comb += found.eq(i4_found & base_ok)
        reo_running = Signal()
        reo_expired = Signal()
        m.d.comb += [
            reo_running.eq((reo_wnd != 0) & entry.reo_armed & above_lower(entry.reo_end)
                           & psn_ge(next4, entry.reo_end)),
            reo_expired.eq(reo_running & ((time_now - entry.reo_at)[:TIME_BITS] >= reo_wnd)),
        ]
        # The time rule's end wins when it lies beyond the count rule's (or there is none).
        use_reo = Signal()
        m.d.comb += use_reo.eq(reo_expired & (~found | psn_gt(entry.reo_end, i4_end)))
        region_end = Signal(PSN)       # == lower when nothing is inferred
        m.d.comb += region_end.eq(Mux(use_reo, entry.reo_end, Mux(found, i4_end, i4_lower)))
        count_push = Signal()           # the count rule alone finds holes
        m.d.comb += count_push.eq(found & above_lower(i4_end))
        i4_push = use_reo | count_push
        # top > the region's end (== lower when nothing is pushed), picked the same way.
        top_above_end = Mux(use_reo, psn_gt(i4_top, entry.reo_end),
                            Mux(count_push, psn_gt(i4_top, i4_end), above_lower(i4_top)))
        reo_arm = ((reo_wnd != 0) & (reo_expired | ~reo_running) & top_above_end & base_ok
                   & ~i4["poll"])          # a poll has no SACKed PSN to arm with
        i4_write = i4_valid & (~i4_push | self.walk.ready)
        infer_walk = self.walk.payload
        m.d.comb += [
            infer_walk.qpn.eq(i4["qpn"]), infer_walk.psn.eq(i4_lower),
            infer_walk.count.eq(psn_sub(region_end, i4_lower)),
            infer_walk.kind.eq(Mux(use_reo & ~count_push, WalkKind.REORDER, WalkKind.INFER)),
            self.walk.valid.eq(i4_valid & i4_push),
        ]
        with m.If(ctl.write):
            m.d.comb += [infer_wp.addr.eq(ctl.qpn), infer_wp.en.eq(1),
                         infer_wp.data.to.eq(ctl.psn)]
        with m.Else():
            m.d.comb += [infer_wp.addr.eq(i4["qpn"]), infer_wp.en.eq(i4_write),
                         infer_wp.data.to.eq(Mux(i4_push, region_end, entry.to))]
            with m.If(reo_arm):
                m.d.comb += [infer_wp.data.reo_armed.eq(1), infer_wp.data.reo_end.eq(i4_top),
                             infer_wp.data.reo_at.eq(time_now)]
            with m.Else():
                m.d.comb += [infer_wp.data.reo_armed.eq(reo_running & ~reo_expired),
                             infer_wp.data.reo_end.eq(entry.reo_end),
                             infer_wp.data.reo_at.eq(entry.reo_at)]
        m.d.comb += [
            self.events.infer_dropped.eq(i4_valid & i4_push & ~self.walk.ready),
            self.events.reorder_expiries.eq(i4_write & reo_expired),
            self.busy.eq(i0_valid | i1_valid | i2_valid | i3_valid | i4_valid),
        ]
        return m
