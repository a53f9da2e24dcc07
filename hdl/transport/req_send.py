"""The requester's two merged outputs: the ``send`` register (:class:`SendRegister`, resends
before new packets) and the ``feedback`` register (:class:`FeedbackMerge`)."""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from .. import protocol as P
from ..interfaces import feedback_layout, path_request_layout
from ..util import validating
from .req_common import check_config, check_depth, events_layout, log2
from .req_defs import PSN_CHUNK, TIME_BITS, pool_index_bits, psn_chunk_bits, send_context_layout
from .req_tables import table_access_signature

__all__ = ["send_item_layout", "SendRegister", "FeedbackMerge"]


def send_item_layout(config):
    """A packet for the send register: the path request, the WR pool entry of its WR
    (``slot``), the PSN pool chunk holding its per-PSN state (``chunk``), and ``walk`` for a
    resend the walker asked for."""
    return data.StructLayout({
        "request": path_request_layout(config, context=send_context_layout(config)),
        "slot": pool_index_bits(config),
        "chunk": psn_chunk_bits(config),
        "walk": 1,
    })


class SendRegister(wiring.Component):
    """The output register of ``send``, and the only writer of the per-PSN metadata.

    A resend (``resend``) goes before a new packet (``new``): a new packet waits while a
    resend is offered, even one held back. A walker's resend is held while LOST feedback is
    still on its way out (``lost_pending``), so path selection applies the LOST (and any fate
    sweep) before it picks the resend's EV. The packet taken is registered (one cycle) and
    its PSN's ``meta`` entry written in the same cycle (WR pool entry, send time, resent or
    not), in the PSN pool chunk the item names.
    One packet per cycle.

    Members
    -------
    tables : ``In(table_access_signature(config, "send"))``
    now : ``In(32)``
        The time in 1.024 us units (the send time kept per PSN).
    resend : ``In(stream.Signature(send_item_layout(config)))``
    new : ``In(stream.Signature(send_item_layout(config)))``
    lost_pending : ``In(1)``
    o : ``Out(stream.Signature(path_request_layout(config, send_context_layout(config))))``
    events : ``Out(events_layout(COUNTERS))``
    """

    COUNTERS = ("packets", "retransmissions")

    def __init__(self, *, config):
        with validating(self):
            check_config(config)
        self._config = config
        super().__init__({
            "tables": In(table_access_signature(config, "send")),
            "now": In(32),
            "resend": In(stream.Signature(send_item_layout(config))),
            "new": In(stream.Signature(send_item_layout(config))),
            "lost_pending": In(1),
            "o": Out(stream.Signature(path_request_layout(
                config, context=send_context_layout(config)))),
            "events": Out(events_layout(self.COUNTERS)),
        })

    def elaborate(self, platform):
        m = Module()
        cb = log2(PSN_CHUNK)
        out = Signal(self.o.payload.shape())
        out_valid = Signal()
        out_load = Signal()
        m.d.comb += [
            self.o.valid.eq(out_valid),
            self.o.payload.eq(out),
            out_load.eq(~out_valid | self.o.ready),
            self.resend.ready.eq(out_load & ~(self.resend.payload.walk & self.lost_pending)),
            self.new.ready.eq(out_load & ~self.resend.valid),
        ]
        resend_emit = self.resend.valid & self.resend.ready
        new_emit = self.new.valid & self.new.ready
        meta_wp = self.tables.write.meta
        for emit, item in ((resend_emit, self.resend.payload), (new_emit, self.new.payload)):
            with m.If(emit):
                psn = item.request.context.psn
                m.d.sync += [out_valid.eq(1), out.eq(item.request)]
                m.d.comb += [meta_wp.addr.eq(Cat(psn[:cb], item.chunk)), meta_wp.en.eq(1),
                             meta_wp.data.slot.eq(item.slot),
                             meta_wp.data.time.eq(self.now[:TIME_BITS]),
                             meta_wp.data.retx.eq(item.request.context.retransmission)]
        with m.If(~resend_emit & ~new_emit & out_load):
            m.d.sync += out_valid.eq(0)
        m.d.comb += [self.events.packets.eq(new_emit), self.events.retransmissions.eq(resend_emit)]
        return m


class FeedbackMerge(wiring.Component):
    """Queue the ACK side's feedback and the retransmitter's LOST feedback, and merge them
    into the ``feedback`` output register, taking turns when both hold items.

    Each input is a FIFO write (ready = room); feedback that finds its FIFO full is dropped
    (the producer counts it). One item per cycle out; at least 2 cycles from an input to
    ``o``.

    Parameters
    ----------
    config : NicConfig
    feedback_depth, lost_depth : int
        Depths of the two FIFOs.

    Members
    -------
    ack : ``In(stream.Signature(feedback_layout(config)))``
    lost : ``In(stream.Signature(feedback_layout(config)))``
    o : ``Out(stream.Signature(feedback_layout(config)))``
    lost_pending : ``Out(1)``
        LOST feedback is queued or in the output register.
    """

    def __init__(self, *, config, feedback_depth, lost_depth):
        with validating(self):
            check_config(config)
            check_depth("Feedback queue depth", feedback_depth)
            check_depth("LOST queue depth", lost_depth)
        self._config = config
        self._feedback_depth = feedback_depth
        self._lost_depth = lost_depth
        layout = feedback_layout(config)
        super().__init__({
            "ack": In(stream.Signature(layout)),
            "lost": In(stream.Signature(layout)),
            "o": Out(stream.Signature(layout)),
            "lost_pending": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        fb_layout = feedback_layout(self._config)
        m.submodules.feedback_fifo = feedback_fifo = SyncFIFOBuffered(
            width=fb_layout.size, depth=self._feedback_depth)
        m.submodules.lost_fifo = lost_fifo = SyncFIFOBuffered(
            width=fb_layout.size, depth=self._lost_depth)
        for fifo, port in ((feedback_fifo, self.ack), (lost_fifo, self.lost)):
            m.d.comb += [fifo.w_data.eq(port.payload), fifo.w_en.eq(port.valid),
                         port.ready.eq(fifo.w_rdy)]
        fb_valid = Signal()
        fb_out = Signal(fb_layout)
        fb_lost_turn = Signal()
        fb_load = ~fb_valid | self.o.ready
        fb_pick_lost = lost_fifo.r_rdy & (~feedback_fifo.r_rdy | fb_lost_turn)
        m.d.comb += [
            self.o.valid.eq(fb_valid),
            self.o.payload.eq(fb_out),
            feedback_fifo.r_en.eq(fb_load & ~fb_pick_lost),
            lost_fifo.r_en.eq(fb_load & fb_pick_lost),
            self.lost_pending.eq((lost_fifo.level != 0)
                                 | (fb_valid & (fb_out.kind == P.FeedbackKind.LOST))),
        ]
        with m.If(fb_load):
            m.d.sync += fb_valid.eq(feedback_fifo.r_rdy | lost_fifo.r_rdy)
            with m.If(feedback_fifo.r_rdy | lost_fifo.r_rdy):
                m.d.sync += [
                    fb_out.eq(Mux(fb_pick_lost, lost_fifo.r_data, feedback_fifo.r_data)),
                    fb_lost_turn.eq(~fb_pick_lost),
                ]
        return m
