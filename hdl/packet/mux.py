"""Packet-level stream arbiter and demultiplexer for any beat layout with a ``last`` field.

Inside the NIC several blocks produce packets for the one header builder (data packets, ACKs,
probe requests and responses) and the parser's output goes to several consumers by packet
kind. Both blocks switch only between packets, so a packet's beats stay together.
"""

from amaranth import *
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..util import validating

__all__ = ["PacketArbiter", "PacketDemux", "StreamMerge"]


def _check(layout, count, what):
    try:
        layout["last"]
    except (KeyError, TypeError):
        raise TypeError(f"Beat layout must have a 'last' field, not {layout!r}") from None
    if not isinstance(count, int) or not 1 <= count <= 16:
        raise ValueError(f"{what} count must be an integer from 1 to 16, not {count!r}")


class PacketArbiter(wiring.Component):
    """Merge ``count`` packet streams into one; input 0 has priority, the rest round-robin.

    A packet, once its first beat is offered, owns the output until its last beat moves; the
    next packet follows with no idle cycle. Input 0 is for short, urgent packets (ACKs): it
    wins every free choice, so the others can starve only while input 0 offers a packet in
    every cycle, which the NIC's ACK rate never does.

    Parameters
    ----------
    layout : data.StructLayout
        The beat layout; must have a ``last`` field.
    count : int
        Inputs, 1 to 16.

    Members
    -------
    i : ``In(stream.Signature(layout)).array(count)``
    o : ``Out(stream.Signature(layout))``
    """

    def __init__(self, *, layout, count):
        with validating(self):
            _check(layout, count, "Input")
        self._count = count
        super().__init__({
            "i": In(stream.Signature(layout)).array(count),
            "o": Out(stream.Signature(layout)),
        })

    def elaborate(self, platform):
        m = Module()
        n = self._count
        grant = Signal(range(n))
        busy = Signal()
        last_rr = Signal(range(n))      # last non-priority grant, for the round-robin

        pick = Signal(range(n))
        any_valid = Signal()
        for offset in reversed(range(1, n + 1)):
            for g in range(n):
                port = (g + offset) % n
                with m.If((last_rr == g) & self.i[port].valid):
                    m.d.comb += [pick.eq(port), any_valid.eq(1)]
        with m.If(self.i[0].valid):
            m.d.comb += [pick.eq(0), any_valid.eq(1)]
        current = Mux(busy, grant, pick)

        for port in range(n):
            with m.If(current == port):
                m.d.comb += [
                    self.o.valid.eq(self.i[port].valid),
                    self.o.payload.eq(self.i[port].payload),
                    self.i[port].ready.eq(self.o.ready),
                ]
        ends = self.o.ready & self.o.payload.last
        with m.If(~busy & any_valid):
            m.d.sync += [grant.eq(pick), busy.eq(~ends)]
            with m.If(pick != 0):
                m.d.sync += last_rr.eq(pick)
        with m.Elif(busy & self.o.valid & ends):
            m.d.sync += busy.eq(0)
        return m


class PacketDemux(wiring.Component):
    """Steer each packet to output ``select``. Combinational, no latency.

    The parent drives ``select`` from the input payload (it must be stable for every beat of a
    packet, as a header field is). ``select`` at or above ``count`` discards the packet and
    counts it in ``dropped``.

    Members
    -------
    i : ``In(stream.Signature(layout))``
    o : ``Out(stream.Signature(layout)).array(count)``
    select : ``In(range(count + 1))``
    dropped : ``Out(32)``, packets discarded
    """

    def __init__(self, *, layout, count):
        with validating(self):
            _check(layout, count, "Output")
        self._count = count
        super().__init__({
            "i": In(stream.Signature(layout)),
            "o": Out(stream.Signature(layout)).array(count),
            "select": In(range(count + 1)),
            "dropped": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        known = Signal()
        for port in range(self._count):
            m.d.comb += self.o[port].payload.eq(self.i.payload)
            with m.If(self.select == port):
                m.d.comb += [
                    known.eq(1),
                    self.o[port].valid.eq(self.i.valid),
                    self.i.ready.eq(self.o[port].ready),
                ]
        with m.If(~known):
            m.d.comb += self.i.ready.eq(1)
            with m.If(self.i.valid & self.i.payload.last):
                m.d.sync += self.dropped.eq(self.dropped + 1)
        return m


class StreamMerge(wiring.Component):
    """Merge ``count`` streams of single transfers (no packets) into one, round-robin.

    Combinational: the output offers the first valid input after the last one served. Used for
    completions, feedback and requests where each transfer stands alone.

    Members
    -------
    i : ``In(stream.Signature(layout)).array(count)``
    o : ``Out(stream.Signature(layout))``
    """

    def __init__(self, *, layout, count):
        with validating(self):
            if not isinstance(count, int) or not 1 <= count <= 16:
                raise ValueError(f"Input count must be an integer from 1 to 16, not {count!r}")
        self._count = count
        super().__init__({
            "i": In(stream.Signature(layout)).array(count),
            "o": Out(stream.Signature(layout)),
        })

    def elaborate(self, platform):
        m = Module()
        n = self._count
        last = Signal(range(n))
        pick = Signal(range(n))
        for offset in reversed(range(1, n + 1)):
            for g in range(n):
                port = (g + offset) % n
                with m.If((last == g) & self.i[port].valid):
                    m.d.comb += pick.eq(port)
        # Once offered, a transfer stays offered until taken: hold the choice while waiting.
        held = Signal()
        held_port = Signal(range(n))
        current = Mux(held, held_port, pick)
        for port in range(n):
            with m.If(current == port):
                m.d.comb += [
                    self.o.valid.eq(self.i[port].valid),
                    self.o.payload.eq(self.i[port].payload),
                    self.i[port].ready.eq(self.o.ready),
                ]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += [last.eq(current), held.eq(0)]
        with m.Elif(self.o.valid):
            m.d.sync += [held.eq(1), held_port.eq(current)]
        return m
