"""Port arbiter and port demultiplexer: P network ports in front of one packet engine.

The engine runs one beat per cycle; the P ports together must not offer more than that (the
planes' rates add up to the engine's line rate). Both blocks switch only between frames, so a
frame's beats stay together.
"""

from amaranth import *
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..util import any_of, onehot_select, validating
from .headers import PORT_BITS, net_beat_layout

__all__ = ["PortArbiter", "PortDemux"]


def _check_ports(ports):
    if not isinstance(ports, int) or not 1 <= ports <= (1 << PORT_BITS):
        raise ValueError(f"Port count must be an integer from 1 to {1 << PORT_BITS}, "
                         f"not {ports!r}")


class PortArbiter(wiring.Component):
    """Merge P frame streams into one, tagging each beat with its port. Round-robin per frame.

    A frame, once started, owns the output until its last beat. The next frame is chosen one
    cycle ahead (from the ports waiting in the cycle before), so the output multiplexer's
    select comes from registers only; back to back frames from different ports still pass at
    one beat per cycle with no idle cycle in between. An idle arbiter offers a newly waiting
    frame one cycle after its first beat appears.

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
        # Round-robin as a masked priority encoder on one-hot vectors: `above` (the ports after
        # the last grant, searched first) is a register, so the pick is two find-first-set
        # circuits and a 2:1 select, and the beat multiplexer an AND-OR over one-hot selects.
        # The chained compare-and-select of a binary grant was the packet engine's critical
        # path on ECP5; with the one-hot form it became input `valid` -> pick -> grant -> beat
        # multiplexer -> the receive slice (docs/boards.md). So the pick is
        # registered (`ahead`): it is computed in every
        # cycle from the waiting ports and used in the next, so the multiplexer's select is
        # `grant` or `ahead`, both registers. A port stays valid until its beat is taken, so a
        # port picked a cycle early is still waiting when its turn comes. (A one-beat frame
        # ends in the cycle `above` moves past it, so the pick made then may choose its port
        # once more: at most two one-beat frames in a row from a port; if that port has
        # nothing more, the output idles one cycle.)
        m = Module()
        n = self._ports
        grant = Signal(n, init=1)                       # one-hot: owns (owned) the output
        ahead = Signal(n)                               # one-hot: the next frame's port
        above = Signal(n, init=((1 << n) - 1) & ~1)     # ports after `grant`
        busy = Signal()                                 # inside a frame of `grant`
        req = Signal(n)
        m.d.comb += req.eq(Cat(self.i[p].valid for p in range(n)))

        def first_set(bits, name):
            out = Signal(n, name=name)                  # one-hot of the lowest set bit
            m.d.comb += out.eq(bits & (~bits + 1))
            return out

        masked = Signal(n)
        m.d.comb += masked.eq(req & above)
        pick_hi = first_set(masked, "pick_hi")
        pick_lo = first_set(req, "pick_lo")
        m.d.sync += ahead.eq(Mux(masked.any(), pick_hi, pick_lo))
        current = Signal(n)
        m.d.comb += current.eq(Mux(busy, grant, ahead))

        payload = self.o.p
        m.d.comb += [
            self.o.valid.eq((current & req).any()),
            payload.data.eq(onehot_select(current, [self.i[p].p.data for p in range(n)])),
            payload.keep.eq(onehot_select(current, [self.i[p].p.keep for p in range(n)])),
            payload.first.eq(any_of([current[p] & self.i[p].p.first for p in range(n)])),
            payload.last.eq(any_of([current[p] & self.i[p].p.last for p in range(n)])),
            payload.port.eq(onehot_select(current, list(range(n)))),
        ]
        for p in range(n):
            m.d.comb += self.i[p].ready.eq(current[p] & self.o.ready)
        # Once a beat is offered the choice is locked until the frame's last beat moves, so the
        # offered payload never changes under a waiting consumer.
        ends = self.o.ready & payload.last
        with m.If(~busy & self.o.valid):
            m.d.sync += [grant.eq(ahead), busy.eq(~ends),
                         above.eq(~(ahead.as_unsigned() - 1)[:n] & ~ahead)]
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
