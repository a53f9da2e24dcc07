"""Port arbiter and port demultiplexer: P network ports in front of one packet engine.

The engine runs one beat per cycle; the P ports together must not offer more than that (the
planes' rates add up to the engine's line rate). Both blocks switch only between frames, so a
frame's beats stay together.
"""

from amaranth import *
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..util import validating
from .headers import PORT_BITS, net_beat_layout

__all__ = ["PortArbiter", "PortDemux"]


def _check_ports(ports):
    if not isinstance(ports, int) or not 1 <= ports <= (1 << PORT_BITS):
        raise ValueError(f"Port count must be an integer from 1 to {1 << PORT_BITS}, "
                         f"not {ports!r}")


class PortArbiter(wiring.Component):
    """Merge P frame streams into one, tagging each beat with its port. Round-robin per frame.

    A frame, once started, owns the output until its last beat. The grant moves to the next
    port with a frame waiting when the current frame ends, with no idle cycle in between: back
    to back frames from different ports pass at one beat per cycle.

    Parameters
    ----------
    data_width : int
    ports : int

    Members
    -------
    i : ``In(stream.Signature(net_beat_layout(data_width))).array(ports)``
    o : ``Out(stream.Signature(net_beat_layout(data_width, tagged=True)))``
    """

    def __init__(self, *, data_width, ports):
        with validating(self):
            _check_ports(ports)
        self._ports = ports
        super().__init__({
            "i": In(stream.Signature(net_beat_layout(data_width))).array(ports),
            "o": Out(stream.Signature(net_beat_layout(data_width, tagged=True))),
        })

    def elaborate(self, platform):
        m = Module()
        n = self._ports
        grant = Signal(range(n))        # port that owns the output
        busy = Signal()                 # inside a frame of `grant`

        # When idle, pick the first port with a valid beat after the last grant (round-robin).
        pick = Signal(range(n))
        any_valid = Signal()
        for offset in reversed(range(1, n + 1)):
            for g in range(n):
                port = (g + offset) % n
                with m.If((grant == g) & self.i[port].valid):
                    m.d.comb += [pick.eq(port), any_valid.eq(1)]
        current = Mux(busy, grant, pick)

        for port in range(n):
            with m.If(current == port):
                m.d.comb += [
                    self.o.valid.eq(self.i[port].valid),
                    self.o.p.data.eq(self.i[port].p.data),
                    self.o.p.keep.eq(self.i[port].p.keep),
                    self.o.p.first.eq(self.i[port].p.first),
                    self.o.p.last.eq(self.i[port].p.last),
                    self.o.p.port.eq(port),
                    self.i[port].ready.eq(self.o.ready),
                ]
        # Once a beat is offered the choice is locked until the frame's last beat moves, so the
        # offered payload never changes under a waiting consumer.
        ends = self.o.ready & self.o.p.last
        with m.If(~busy & any_valid):
            m.d.sync += [grant.eq(pick), busy.eq(~ends)]
        with m.Elif(busy & self.o.valid & ends):
            m.d.sync += busy.eq(0)
        return m


class PortDemux(wiring.Component):
    """Steer each tagged frame to the port its beats name. Combinational, no latency.

    Beats whose port number is at or above ``ports`` are dropped (accepted and discarded) and
    counted in ``bad_port``.

    Members
    -------
    i : ``In(stream.Signature(net_beat_layout(data_width, tagged=True)))``
    o : ``Out(stream.Signature(net_beat_layout(data_width))).array(ports)``
    bad_port : ``Out(32)``, frames discarded for a port number out of range
    """

    def __init__(self, *, data_width, ports):
        with validating(self):
            _check_ports(ports)
        self._ports = ports
        super().__init__({
            "i": In(stream.Signature(net_beat_layout(data_width, tagged=True))),
            "o": Out(stream.Signature(net_beat_layout(data_width))).array(ports),
            "bad_port": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        known = Signal()
        for port in range(self._ports):
            m.d.comb += [
                self.o[port].p.data.eq(self.i.p.data),
                self.o[port].p.keep.eq(self.i.p.keep),
                self.o[port].p.first.eq(self.i.p.first),
                self.o[port].p.last.eq(self.i.p.last),
            ]
            with m.If(self.i.p.port == port):
                m.d.comb += [
                    known.eq(1),
                    self.o[port].valid.eq(self.i.valid),
                    self.i.ready.eq(self.o[port].ready),
                ]
        with m.If(~known):
            m.d.comb += self.i.ready.eq(1)
            with m.If(self.i.valid & self.i.p.last):
                m.d.sync += self.bad_port.eq(self.bad_port + 1)
        return m
