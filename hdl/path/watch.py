"""Port watch: finds a dead plane from the ACKs that stop coming back on it.

Every reply answers one data packet and leaves by the port (plane) that packet arrived on,
echoing its transmit time (MACKETH ``ts_echo``, ``docs/responder.md``). So the requester's
ACKs on port p tell which of its sends on p got through. :class:`PortWatch` keeps, per port,
the transmit times of the data packets sent on it that no ACK on the port has covered yet (a
FIFO), and the newest transmit time any ACK on any port has echoed (``newest``). When a
port's oldest uncovered send is more than ``window`` older than ``newest`` (a packet sent a
window later on another plane made the round trip, this one's plane answered nothing since),
and no ACK at all has come back on the port for ``quiet`` (a congested plane whose queue
makes its round trip longer than the others' still answers every few microseconds; a dead
one answers nothing), the port is reported *down* once: path selection sweeps it as port
fate sharing does (every GOOD EV of the port in a fate-sharing profile goes ASSUMED_BAD,
floor permitting, ``docs/path-select.md``), and probes bring it back. RACK's rule, applied
per plane and across all QPs instead of per QP, so a blackholed plane is found about one
round trip plus the window after it died, whatever K and the QPs' windows.
``docs/recovery.md``, "Port watch".

An ACK on port p covers every send on p up to its echo (a packet the responder skipped over
is lost by itself, which the SACK rules deal with, not a sign of a dead plane). After a report
the port's FIFO is emptied (its sends are written off) and watching starts again with the
next send, so a port that stays in use (the floor kept some EV on it) is reported again one
window later, not every cycle.

Times are ns modulo 2**32 (the :class:`~hdl.timebase.Timebase`'s ``ns``, the data packets'
``tx_ts``) compared as differences modulo 2**32, so they wrap safely as long as an ACK comes
within 2**31 ns (2.1 s). An echo from the future (later than ``now_ns``: not one of ours) is
ignored.
"""

from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..packet.headers import PORT_BITS
from ..util import validating
from .select import EV_PORT_BITS

__all__ = ["PortWatch", "WATCH_WINDOW_BITS", "WATCH_UNIT_SHIFT", "WATCH_DEPTH"]

#: Width of the ``window`` setting (units of 1.024 us; 0 turns the watch off).
WATCH_WINDOW_BITS = 6
#: One unit of ``window`` is 2**10 ns (1.024 us), the unit of the retransmit timers.
WATCH_UNIT_SHIFT = 10
#: Sends remembered per port by default (more are counted in ``overflows`` and not
#: remembered: the port then looks younger than it is, never older).
WATCH_DEPTH = 16


def _not_before(a, b):
    """``a`` is not earlier than ``b`` (32-bit times modulo 2**32)."""
    return ~(a - b)[31]


class PortWatch(wiring.Component):
    """Per-port liveness from ACK echoes.

    Parameters
    ----------
    ports : int
        Network ports (planes), 1 to 16.
    depth : int
        Uncovered sends remembered per port (a FIFO each; default :data:`WATCH_DEPTH`).

    Members
    -------
    now_ns : ``In(32)``
        Current time (ns).
    window : ``In(WATCH_WINDOW_BITS)``
        How far (1.024 us units) a port's oldest uncovered send may lag the newest echo before
        the port is reported down; 0 turns the watch off (nothing reported, sends still kept).
    quiet : ``In(WATCH_WINDOW_BITS)``
        And how long (1.024 us units) no ACK may have arrived on the port; 0: no such
        condition (the lag alone decides).
    sent_valid, sent_port, sent_ts : ``In``
        A data packet left for port ``sent_port`` (0-based) stamped ``sent_ts``.
    ack_valid, ack_port, ack_echo : ``In``
        An ACK or NAK arrived on port ``ack_port`` (0-based) echoing ``ack_echo``.
    down_valid, down_port : ``Out``
        One-cycle report: port ``down_port`` (1..P, as EV entries number ports) is down.
    downs : ``Out(32)``
        Ports reported down (counter).
    overflows : ``Out(32)``
        Sends not remembered because their port's FIFO was full (counter).
    """

    def __init__(self, *, ports, depth=WATCH_DEPTH):
        with validating(self):
            if not isinstance(ports, int) or not 1 <= ports <= 1 << PORT_BITS:
                raise ValueError(f"ports must be an integer in 1..{1 << PORT_BITS}, "
                                 f"not {ports!r}")
            if not isinstance(depth, int) or not 2 <= depth <= 1024:
                raise ValueError(f"depth must be an integer in 2..1024, not {depth!r}")
        self._ports = ports
        self._depth = depth
        super().__init__({
            "now_ns": In(32),
            "window": In(WATCH_WINDOW_BITS),
            "quiet": In(WATCH_WINDOW_BITS),
            "sent_valid": In(1),
            "sent_port": In(PORT_BITS),
            "sent_ts": In(32),
            "ack_valid": In(1),
            "ack_port": In(PORT_BITS),
            "ack_echo": In(32),
            "down_valid": Out(1),
            "down_port": Out(EV_PORT_BITS),
            "downs": Out(32),
            "overflows": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        P = self._ports

        newest = Signal(32)             # newest echo of any ACK on any port
        covered = [Signal(32, name=f"covered{p}") for p in range(P)]
        heard = [Signal(32, name=f"heard{p}") for p in range(P)]     # last ACK's arrival
        last_sent = [Signal(32, name=f"last_sent{p}") for p in range(P)]
        fifos = []
        pops = []
        pushes = []
        for p in range(P):
            fifo = SyncFIFOBuffered(width=32, depth=self._depth)
            m.submodules[f"fifo{p}"] = fifo
            fifos.append(fifo)
            push = Signal(name=f"push{p}")
            m.d.comb += push.eq(self.sent_valid & (self.sent_port == p))
            pushes.append(push)
            m.d.comb += [fifo.w_data.eq(self.sent_ts), fifo.w_en.eq(push)]
            with m.If(push):
                m.d.sync += last_sent[p].eq(self.sent_ts)
            # Pop every send the port's ACKs (or a report) have covered, one per cycle.
            pop = Signal(name=f"pop{p}")
            m.d.comb += [pop.eq(fifo.r_rdy & _not_before(covered[p], fifo.r_data)),
                         fifo.r_en.eq(pop)]
            pops.append(pop)
        full = Signal()
        m.d.comb += full.eq(Array(f.w_rdy for f in fifos)[self.sent_port] == 0)
        with m.If(self.sent_valid & (self.sent_port < P) & full):
            m.d.sync += self.overflows.eq(self.overflows + 1)

        # An ACK covers its port's sends up to its echo and may advance ``newest``.
        ours = Signal()
        m.d.comb += ours.eq(self.ack_valid & (self.ack_port < P)
                            & _not_before(self.now_ns, self.ack_echo))
        with m.If(ours & ~_not_before(newest, self.ack_echo)):
            m.d.sync += newest.eq(self.ack_echo)
        for p in range(P):
            with m.If(ours & (self.ack_port == p)):
                m.d.sync += heard[p].eq(self.now_ns)

        # The check visits one port per cycle: A registers its oldest uncovered send's lag,
        # B reports it if that send is still the port's oldest (no ACK popped it meanwhile).
        scan = Signal(range(P))
        m.d.sync += scan.eq(Mux(scan == P - 1, 0, scan + 1))
        heads = Array(f.r_data for f in fifos)
        live = Array(f.r_rdy & ~pop for f, pop in zip(fifos, pops, strict=True))
        a_valid = Signal()
        a_port = Signal(range(P))
        a_head = Signal(32)
        lag = Signal(32)
        silence = Signal(32)
        m.d.comb += [lag.eq(newest - heads[scan]),
                     silence.eq(self.now_ns - Array(heard)[scan])]
        m.d.sync += [
            a_valid.eq((self.window != 0) & live[scan] & ~lag[31]
                       & (lag >= (self.window << WATCH_UNIT_SHIFT))
                       & (silence[31] | (silence >= (self.quiet << WATCH_UNIT_SHIFT)))),
            a_port.eq(scan),
            a_head.eq(heads[scan]),
        ]
        fire = Signal()
        m.d.comb += fire.eq(a_valid & live[a_port] & (heads[a_port] == a_head))
        m.d.sync += [self.down_valid.eq(fire), self.down_port.eq(a_port + 1)]
        with m.If(fire):
            m.d.sync += self.downs.eq(self.downs + 1)

        for p in range(P):
            with m.If(fire & (a_port == p)):
                # Write the port's sends off: they pop over the next cycles.
                m.d.sync += covered[p].eq(Mux(pushes[p], self.sent_ts, last_sent[p]))
            with m.Elif(ours & (self.ack_port == p) & ~_not_before(covered[p], self.ack_echo)):
                m.d.sync += covered[p].eq(self.ack_echo)
        return m
