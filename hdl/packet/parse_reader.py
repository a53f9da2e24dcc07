"""The receive parser's reader: accepted frames' payloads out of the packet FIFO, realigned
to lane 0, with their headers (:class:`ParseReader`)."""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..util import REPLICA_TAG, chunks, validating
from .headers import packet_beat_layout, packet_header_layout
from .parse_defs import ParserGeometry, queue_entry_layout

__all__ = ["ParseReader"]

#: Header bits per copy of the registers that steer the header banks (their enables and the
#: output's bank select): each copy reaches that many flip-flops or multiplexers only.
REPLICA_BITS = 128


class ParseReader(wiring.Component):
    """Stream each accepted frame's payload out of the packet FIFO, realigned to lane 0, with
    its header on every beat; skip the frames that were dropped.

    A frame starts when the reader is idle and ``entry`` is valid: the entry is taken and
    copied (its header into one of two banks, which follows the queue's head while the reader
    is idle) and the reader seeks to the payload, or past the frame when it has none; when
    idle with the header queue empty, it seeks to ``verdict_end``, releasing every frame that
    has had its verdict. Only registers decide
    this, so ``o.ready`` reaches no wide enable and no pointer adder. The realignment joins
    the previous and the current FIFO beat and shifts by the payload's start lane. ``o.header``
    selects the bank of the beat in the output register, so a frame can start while the
    previous frame's last beat waits for ``o.ready``.

    Latency: the first ``o`` beat comes 2 cycles after ``entry`` is taken for a packet without
    payload; for one with payload, 2 more with the packet FIFO's registered read (W = 64 and
    128), 1 more with its direct read (W = 256). Throughput: one output beat per cycle within
    a frame; the next frame starts the cycle after a frame's last beat is emitted. Hazards:
    ``entry.seek_ptr`` and ``verdict_end`` must lie between the FIFO's release point and its
    last commit.

    Parameters
    ----------
    config : :class:`~hdl.config.NicConfig`

    Members
    -------
    entry : ``In(stream.Signature(queue_entry_layout(config, geometry)))``
        The header queue's head.
    queue_empty : ``In(1)``
        No accepted frame is waiting (not even one being written).
    verdict_end : ``In(ptr_bits)``
    fifo_r : ``In(stream.Signature(data_width))``
        The packet FIFO's committed beats.
    r_seek, r_seek_ptr : ``Out``
        The packet FIFO's reader seek.
    o : ``Out(stream.Signature(packet_beat_layout(config)))``
    """

    def __init__(self, *, config):
        with validating(self):
            g = self._geometry = ParserGeometry.of(config)
        self._config = config
        super().__init__({
            "entry": In(stream.Signature(queue_entry_layout(config, g))),
            "queue_empty": In(1),
            "verdict_end": In(g.ptr_bits),
            "fifo_r": In(stream.Signature(g.data_width)),
            "r_seek": Out(1),
            "r_seek_ptr": Out(g.ptr_bits),
            "o": Out(stream.Signature(packet_beat_layout(config))),
        })

    def elaborate(self, platform):
        m = Module()
        g = self._geometry
        W, lanes = g.data_width, g.lanes
        header_layout = packet_header_layout(self._config)
        cur = self.entry.payload
        fifo_r = self.fifo_r
        active = Signal()
        has_payload = Signal()
        have_prev = Signal()
        prev_beat = Signal(W)
        in_left = Signal(g.beat_bits)   # FIFO beats of the payload still to take
        in_more = Signal()              # in_left != 0
        out_left = Signal(g.beat_bits)  # output beats still to give
        out_last = Signal()             # out_left == 1
        out_first = Signal()
        lane = Signal(g.lane_bits)
        last_keep = Signal(lanes)
        bank = Signal()                 # header bank of the frame being read
        banks = [Signal(header_layout, name=f"header_bank{k}") for k in range(2)]

        start = Signal()
        m.d.comb += [
            self.entry.ready.eq(~active),
            start.eq(~active & self.entry.valid),
            # At a frame's start, go to its payload (or past it); when idle with nothing
            # accepted waiting, release every frame that has had its verdict.
            self.r_seek.eq(~active & (self.entry.valid | self.queue_empty)),
            self.r_seek_ptr.eq(Mux(self.entry.valid, cur.seek_ptr, self.verdict_end)),
        ]
        # The next values of `active` and `bank`: the banks' enables are registered from them.
        active_next = Signal()
        bank_next = Signal()
        m.d.comb += [active_next.eq(active), bank_next.eq(bank)]
        m.d.sync += [active.eq(active_next), bank.eq(bank_next)]
        with m.If(start):
            m.d.comb += [active_next.eq(1), bank_next.eq(~bank)]
            m.d.sync += [
                has_payload.eq(cur.has_payload),
                have_prev.eq(0),
                in_left.eq(cur.in_beats),
                in_more.eq(cur.in_beats != 0),
                out_left.eq(cur.out_beats),
                out_last.eq(cur.out_beats == 1),
                out_first.eq(1),
                lane.eq(cur.pay_lane),
                last_keep.eq(cur.last_keep),
            ]
        # While idle, the bank the next frame will use follows the queue's head, so it holds
        # that frame's header once it starts: its enable comes from registers alone, not from
        # the queue's level (the head is read straight from the queue's RAM). The other bank
        # keeps the header of a beat still waiting in ``o``. Each chunk of REPLICA_BITS header
        # bits has its own copy of both enables, registered from the next `active` and `bank`
        # (named with ``REPLICA_TAG``: the board builds keep such copies apart), so no enable
        # net fans out to every header bit.
        cur_header = Value.cast(cur.header)
        bank_bits = [Value.cast(bank_k) for bank_k in banks]
        o_header = Value.cast(self.o.payload.header)
        o_bank_copies = []
        for n, (lo, hi) in enumerate(chunks(len(cur_header), REPLICA_BITS)):
            # After reset the reader is idle on bank 0: bank 1 follows the queue's head.
            load = [Signal(name=f"bank{k}_load{REPLICA_TAG}{n}", init=k) for k in range(2)]
            # The header bank of the beat in the output register.
            o_bank_copy = Signal(name=f"o_bank{REPLICA_TAG}{n}")
            o_bank_copies.append(o_bank_copy)
            m.d.sync += [load[0].eq(~active_next & bank_next),
                         load[1].eq(~active_next & ~bank_next)]
            for k in range(2):
                with m.If(load[k]):
                    m.d.sync += bank_bits[k][lo:hi].eq(cur_header[lo:hi])
            m.d.comb += o_header[lo:hi].eq(Mux(o_bank_copy, bank_bits[1][lo:hi],
                                               bank_bits[0][lo:hi]))

        o_free = Signal()
        emit = Signal()
        consume = Signal()
        m.d.comb += o_free.eq(~self.o.valid | self.o.ready)
        with m.If(active):
            with m.If(~has_payload):
                m.d.comb += emit.eq(o_free)
            with m.Elif(~have_prev):
                m.d.comb += consume.eq(fifo_r.valid)
            with m.Elif(in_more):
                m.d.comb += [emit.eq(o_free & fifo_r.valid), consume.eq(o_free & fifo_r.valid)]
            with m.Else():
                m.d.comb += emit.eq(o_free)
        m.d.comb += fifo_r.ready.eq(consume)

        with m.If(consume):
            m.d.sync += [prev_beat.eq(fifo_r.payload), have_prev.eq(1),
                         in_left.eq(in_left - 1), in_more.eq(in_left != 1)]
        with m.If(self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        with m.If(emit):
            joined = Cat(prev_beat, Mux(in_more, fifo_r.payload, 0))
            keep = Mux(out_last, last_keep, (1 << lanes) - 1) & has_payload.replicate(lanes)
            kept = Cat(keep[k].replicate(8) for k in range(lanes))
            m.d.sync += [
                out_left.eq(out_left - 1),
                out_last.eq(out_left == 2),
                out_first.eq(0),
                Cat(o_bank_copies).eq(bank.replicate(len(o_bank_copies))),
                self.o.valid.eq(1),
                self.o.payload.data.eq(joined.bit_select(Cat(Const(0, 3), lane), W) & kept),
                self.o.payload.keep.eq(keep),
                self.o.payload.first.eq(out_first),
                self.o.payload.last.eq(out_last),
            ]
            with m.If(out_last):
                m.d.comb += active_next.eq(0)
        return m
