"""Several segmenter contexts (:class:`SegmenterBank`): WRs of different QPs cut into packets
side by side, so a QP whose window is full holds none of the others."""

from amaranth import *
from amaranth.lib import data, wiring
from amaranth.lib.wiring import Out

from ..util import validating
from .req_common import check_config
from .req_defs import HANDOFF_ENTRIES, segmenter_contexts
from .req_intake import Segmenter, context_state_layout, segment_job_layout, segmenter_members
from .req_tables import with_write

__all__ = ["SegmenterBank"]


def lowest(bits):
    """The index of the lowest set bit of ``bits`` (0 when none is set)."""
    index = C(0, range(len(bits)))
    for position in reversed(range(len(bits))):
        index = Mux(bits[position], position, index)
    return index


class SegmenterBank(wiring.Component):
    """:func:`~.req_defs.segmenter_contexts` :class:`~.req_intake.Segmenter` contexts behind
    one WR input and one packet output, with the ports of one segmenter.

    A WR taken on ``i`` waits at least a cycle in a two-entry register (the hand-off, H), so
    the intake's table reads and next PSN end there and the contexts' checks of its first
    packet start from registers. While it waits, H keeps the WR's entries of its QP up to
    date from the tables' write ports (una and the error flag, the ECN and NSCC windows,
    ``pool_lo``, ``tail_chunk``), as the intake does for a WR in S1: they are what a
    transparent read addressed last cycle would give. The older entry is offered to the
    contexts; the younger takes the intake's next WR while the older waits, so ``i.ready``
    is a register (the younger entry is empty) and no context's ready reaches the intake.
    H takes the next WR in the cycle its older WR goes on, so WRs still pass one per cycle.

    From H a WR goes to the context that holds a WR of its QP (taken in the cycle that
    context offers its last packet, as one segmenter takes the next WR), else to the lowest
    context that is free or offers its last packet now: a QP's WRs are cut one after the
    other, in order, and WRs of other QPs wait for none of them. The WR intake keeps a QP's
    next PSN right for either case: its forwarding register holds the end PSN of the WR
    last handed over (H's younger entry, or its older when that is the only one), H tells it
    the QP and end PSN of its older entry (``handoff``), and each context its QP and its WR's
    end PSN (``contexts``). A context that continues its QP keeps its own chunk register; one that
    takes a QP another context may have worked on since takes H's ``tail_chunk`` (no
    context held the QP the cycle before, so H has every write).

    Packets: the contexts that offer one take turns (round robin from the one after the
    last taken), so a window-limited QP never paces the others. Only the context whose
    packet is taken writes its QP's ``next_psn``, chunk map and ``tail_chunk``, takes a PSN
    pool chunk and arms the timer, so those ports are the winner's. Throughput: one packet
    per cycle; a WR's first packet goes two cycles after it is taken (one with one
    segmenter: H is the cycle more).
    The events are OR-ed: ``psn_pool_waits`` counts the cycles in which some context starts
    waiting for a chunk.

    Members
    -------
    The members of :class:`~.req_intake.Segmenter` (without ``obs``: the formal proofs
    observe a single segmenter), and:

    contexts : ``Out(data.ArrayLayout(context_state_layout(config), contexts))``
        The WR each context holds, for the intake's next PSN.
    handoff : ``Out(context_state_layout(config))``
        The WR in H's older entry, for the intake's next PSN (newer than any context's).
    """

    COUNTERS = Segmenter.COUNTERS

    def __init__(self, *, config):
        with validating(self):
            check_config(config)
        self._config = config
        super().__init__({
            **segmenter_members(config),
            "contexts": Out(data.ArrayLayout(context_state_layout(config),
                                             segmenter_contexts(config))),
            "handoff": Out(context_state_layout(config)),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        count = segmenter_contexts(cfg)
        contexts = []
        for index in range(count):
            context = Segmenter(config=cfg, shared=True)
            m.submodules[f"context{index}"] = context
            contexts.append(context)
            # Shared inputs: the control, the time, the tracked write ports, the PSN pool's
            # free list (only the winner takes).
            m.d.comb += [
                context.now.eq(self.now),
                context.alloc.available.eq(self.alloc.available),
                context.alloc.chunk.eq(self.alloc.chunk),
                context.alloc.hold.eq(self.alloc.hold),
                context.alloc.hold_at.eq(self.alloc.hold_at),
                context.alloc.hold_psn.eq(self.alloc.hold_psn),
                context.alloc.hold_qpn.eq(self.alloc.hold_qpn),
                context.arm.ready.eq(self.arm.ready),
            ]
            for port in ("ack_write", "cc_write", "nscc_write", "pool_lo_write"):
                theirs, ours = getattr(context, port), getattr(self, port)
                m.d.comb += [theirs.addr.eq(ours.addr), theirs.data.eq(ours.data),
                             theirs.en.eq(ours.en)]

        wiring.connect(m, wiring.flipped(self.control), *(c.control for c in contexts))

        for index, context in enumerate(contexts):
            state = self.contexts[index]
            m.d.comb += [state.busy.eq(context.busy), state.qpn.eq(context.qpn),
                         state.end.eq(context.end)]

        # -- H: the hand-off register, two entries deep ------------------------------------
        # The older entry (h0) is offered to the contexts; the younger (h1) takes a WR from
        # the intake while h0 waits, so ``i.ready`` is a register (h1 empty) and the
        # contexts' ready chain ends at H.
        assert HANDOFF_ENTRIES == 2, "H is built with two entries"
        h0_valid, h1_valid = Signal(), Signal()
        h0 = Signal(segment_job_layout(cfg))
        h1 = Signal(segment_job_layout(cfg))
        h_taken = Signal()

        def tracked(source, name):
            """``source`` (a WR) with this cycle's writes to its QP's entries."""
            entry = Signal(segment_job_layout(cfg), name=name)
            qpn = source.qpn
            m.d.comb += [
                entry.eq(source),
                entry.una.eq(with_write(self.ack_write, qpn, source.una, "una")),
                entry.error.eq(with_write(self.ack_write, qpn, source.error, "error")),
                entry.cwnd.eq(with_write(self.cc_write, qpn, source.cwnd, "cwnd")),
                entry.nscc_window.eq(with_write(self.nscc_write, qpn, source.nscc_window)),
                entry.lo.eq(with_write(self.pool_lo_write, qpn, source.lo)),
                entry.chunk.eq(with_write(self.tables.write.tail_chunk, qpn, source.chunk)),
            ]
            return entry

        taken_in = Signal()
        m.d.comb += [self.i.ready.eq(~h1_valid), taken_in.eq(self.i.valid & ~h1_valid)]
        incoming = tracked(self.i.payload, "h_incoming")
        h0_tracked, h1_tracked = tracked(h0, "h0_tracked"), tracked(h1, "h1_tracked")
        with m.If(~h0_valid | h_taken):
            # h0 moves on (or is empty): h1, else the intake's WR, takes its place.
            with m.If(h1_valid):
                m.d.sync += [h0.eq(h1_tracked), h1_valid.eq(0)]
            with m.Else():
                m.d.sync += [h0.eq(incoming), h0_valid.eq(taken_in)]
        with m.Else():
            m.d.sync += h0.eq(h0_tracked)
            with m.If(h1_valid):
                m.d.sync += h1.eq(h1_tracked)
            with m.Else():
                m.d.sync += [h1.eq(incoming), h1_valid.eq(taken_in)]
        m.d.comb += [self.handoff.busy.eq(h0_valid), self.handoff.qpn.eq(h0.qpn),
                     self.handoff.end.eq(h0.end)]

        # -- WRs: to the context holding the QP, else the lowest free one -------------------
        hits = Cat(c.busy & (c.qpn == h0.qpn) for c in contexts)
        ready = Cat(c.i.ready for c in contexts)
        target = Signal(range(count))
        m.d.comb += target.eq(Mux(hits.any(), lowest(hits), lowest(ready)))
        m.d.comb += h_taken.eq(h0_valid & ready.bit_select(target, 1))
        for index, context in enumerate(contexts):
            m.d.comb += [context.i.payload.eq(h0),
                         context.i.valid.eq(h0_valid & (target == index)),
                         context.continues.eq(hits[index])]

        # -- packets: round robin over the contexts that offer one --------------------------
        valid = Cat(c.o.valid for c in contexts)
        turn = Signal(range(count))     # the context first in line this cycle
        from_turn = Signal(count)
        m.d.comb += from_turn.eq(valid & ~((C(1, count + 1) << turn) - 1)[:count])
        grant = Signal(range(count))
        m.d.comb += grant.eq(Mux(from_turn.any(), lowest(from_turn), lowest(valid)))
        taken = self.o.valid & self.o.ready
        with m.If(taken):
            m.d.sync += turn.eq(Mux(grant == count - 1, 0, grant + 1))
        m.d.comb += [self.o.valid.eq(valid.any()),
                     self.o.payload.eq(Array(c.o.payload for c in contexts)[grant])]
        for index, context in enumerate(contexts):
            m.d.comb += context.o.ready.eq(self.o.ready & (grant == index))

        # -- the winner's writes, chunk and arm event ---------------------------------------
        winner = Signal(range(count))   # the context whose packet is taken (else any)
        m.d.comb += winner.eq(grant)
        for name in ("next_psn", "chunk_map", "tail_chunk"):
            ours = getattr(self.tables.write, name)
            ports = Array(getattr(c.tables.write, name) for c in contexts)
            m.d.comb += [ours.addr.eq(ports[winner].addr), ours.data.eq(ports[winner].data),
                         ours.en.eq(ports[winner].en)]
        m.d.comb += [
            self.alloc.take.eq(Cat(c.alloc.take for c in contexts).any()),
            self.arm.valid.eq(Cat(c.arm.valid for c in contexts).any()),
            self.arm.payload.eq(Array(c.arm.payload for c in contexts)[winner]),
        ]
        for name in self.COUNTERS:
            m.d.comb += self.events[name].eq(Cat(c.events[name] for c in contexts).any())
        return m
