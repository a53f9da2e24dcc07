"""Port watch: finds a dead plane from the ACKs that stop coming back on it.

Every reply answers one data packet and leaves by the port (plane) that packet arrived on,
echoing its transmit time (the data packet's TSETH ``tx_timestamp`` comes back as the SACK's
CC_STATE ``tx_timestamp`` or the NACK's NETH ``tx_timestamp``, ``docs/responder.md``). So the
requester's ACKs on port p tell which of its sends on p got through. :class:`PortWatch`
keeps, per port, the transmit times of the data packets sent on it that no ACK on the port has
covered yet (a FIFO), and the newest transmit time any ACK on any port has echoed
(``newest``). When a port's oldest uncovered send is more than ``window`` older than
``newest`` (a packet sent a window later on another plane made the round trip, this one's
plane answered nothing since),
and no frame at all has come back on the port for ``quiet`` (a congested plane whose queue
makes its round trip longer than the others' still delivers every few microseconds; a dead
one delivers nothing), the port is reported *down* once: path selection sweeps it as port
fate sharing does (every GOOD EV of the port in a fate-sharing profile goes ASSUMED_BAD,
floor permitting, ``docs/path-select.md``), and probes bring it back. RACK's rule, applied
per plane and across all QPs instead of per QP, so a blackholed plane is found about one
round trip plus the window after it died, whatever K and the QPs' windows.
``docs/recovery.md``, "Port watch".

Why any frame, not only ACKs, makes a port not quiet: the responder coalesces its ACKs (one
for several data packets, ``docs/responder.md``), and an ACK leaves by the port of the one
packet it answers, so with ACKs coalesced a healthy port can go tens of microseconds without
an ACK on it while its packets are SACKed through other ports. The lag alone then says little;
the quiet rule is what tells a dead port from one whose ACKs were coalesced away, and the
frames of the other direction (the peer's data, its probes) arrive on a healthy port every few
microseconds while traffic flows both ways. With traffic one way only the ACKs are left, and
a port's gap between ACKs is longer than any useful quiet time; so a port is quiet only once,
besides the time, the other ports have received :func:`watch_quiet_frames` frames since its
last one (a live port rarely misses that many of the frames spread over the ports).

An ACK on port p covers every send on p up to its echo (a packet the responder skipped over
is lost by itself, which the SACK rules deal with, not a sign of a dead plane). After a report
the port's FIFO is emptied (its sends are written off) and watching starts again with the
next send, so a port that stays in use (the floor kept some EV on it) is reported again one
window later, not every cycle.

Times are kept as 16-bit *stamps* of 64 ns (bits 6-21 of the ns time: the transmit times
of the data packets, the echoes, ``newest``) and ACK arrivals as 16-bit counts of
1.024 us (bits 10-25), each compared as a difference modulo 2**16: lags up to 2**15 stamps
(2.1 ms) are told apart, and a port silent for 2**15 units (33.5 ms) or more counts as silent
until its count wraps (then it looks as if it had just heard for the next 33.5 ms; a dead port
is reported long before that). Full 32-bit ns times cost half as much logic again for nothing:
the window is a whole number of 1.024 us units. Two sends on one port within one stamp would
be covered together by an echo of the first (the port looks younger, never older); data
packets on one port are further apart than that. An echo is a 16-bit wire timestamp (8 ns
units, :func:`hdl.protocol.wire_timestamp`): it is turned back into a ns time as ``now_ns``
minus its :func:`~hdl.protocol.timestamp_age_ns`, the low three bits set (the latest ns the
timestamp stands for, so an echo never looks older than the send it answers: both fall in the
same 64 ns stamp). Echoes are trusted to be younger than the wire timestamp's wrap (524 us).

Stale times. ``newest`` is only a reference while it is recent: once it is 2**14 stamps
(1.05 ms) old (no ACK for that long: after reset, or a NIC idle for a while) it is marked stale,
nothing is reported, and the next ACK sets it whatever its old value. Without that, a modulo
comparison against an old ``newest`` makes fresh sends look late: after an idle spell of half
the range every port that sends would be reported down at once (with 32-bit ns times, after
2.1 s). Likewise a send into an empty FIFO first moves the port's ``covered`` to just before
it, so an old ``covered`` cannot cover (pop) fresh sends.
"""

from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..packet.headers import PORT_BITS
from ..protocol import TIMESTAMP_BITS, TIMESTAMP_SHIFT, timestamp_age_ns
from ..util import validating
from .select import EV_PORT_BITS

__all__ = ["PortWatch", "echo_time_ns", "watch_quiet_frames", "WATCH_WINDOW_BITS",
           "WATCH_UNIT_SHIFT", "WATCH_DEPTH", "WATCH_STAMP_SHIFT", "WATCH_STAMP_BITS",
           "WATCH_STALE_STAMPS", "WATCH_QUIET_FRAMES_PER_PORT"]

#: Width of the ``window`` setting (units of 1.024 us; 0 turns the watch off).
WATCH_WINDOW_BITS = 6
#: One unit of ``window`` is 2**10 ns (1.024 us), the unit of the retransmit timers.
WATCH_UNIT_SHIFT = 10
#: Sends remembered per port by default (more are counted in ``overflows`` and not
#: remembered: the port then looks younger than it is, never older).
WATCH_DEPTH = 16
#: Transmit times and echoes are kept as stamps of 2**6 ns (64 ns) ...
WATCH_STAMP_SHIFT = 6
#: ... and stamps, like ACK arrival times (in window units), as 16-bit counts.
WATCH_STAMP_BITS = 16
#: ``newest`` is stale (no lag is measured against it) once it is this many stamps old.
WATCH_STALE_STAMPS = 1 << (WATCH_STAMP_BITS - 2)
#: A port is quiet only once the other ports have received this many frames per port
#: (:func:`watch_quiet_frames`) since its own last frame.
WATCH_QUIET_FRAMES_PER_PORT = 4


def watch_quiet_frames(ports):
    """Frames the other ports must receive since port p's last frame before p can be quiet.

    Frames spread evenly over ``ports`` ports miss a live port M times in a row with
    probability (1 - 1/ports)**M, about exp(-M/ports): M = 4 x ports makes that about 2 %."""
    return WATCH_QUIET_FRAMES_PER_PORT * ports


def _not_before(a, b):
    """``a`` is not earlier than ``b`` (stamps or units modulo 2**WATCH_STAMP_BITS)."""
    return ~(a - b)[WATCH_STAMP_BITS - 1]


def echo_ns(now_ns, echo):
    """The ns time (32 bits) a wire timestamp ``echo`` received at ``now_ns`` stands for: ``now``
    minus its age, the low three bits set (:func:`echo_time_ns` as logic)."""
    units = now_ns[TIMESTAMP_SHIFT:]
    age = (units[:TIMESTAMP_BITS] - echo)[:TIMESTAMP_BITS]
    return Cat(C((1 << TIMESTAMP_SHIFT) - 1, TIMESTAMP_SHIFT), (units - age)[:32 - TIMESTAMP_SHIFT])


def echo_time_ns(now_ns, echo):
    """The ns time (modulo 2**32) wire timestamp ``echo`` received at ``now_ns`` stands for."""
    return ((now_ns - timestamp_age_ns(now_ns, echo)) | ((1 << TIMESTAMP_SHIFT) - 1)) \
        & 0xFFFF_FFFF


def _stamp(ns):
    """The 64 ns stamp of a 32-bit ns time."""
    return ns[WATCH_STAMP_SHIFT:WATCH_STAMP_SHIFT + WATCH_STAMP_BITS]


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
        And for more than how many whole 1.024 us units (counted as arrivals are kept, so at
        least that much real time) no frame at all may have arrived on the port, while the
        other ports received :func:`watch_quiet_frames` frames; 0: no such condition (the lag
        alone decides).
    sent_valid, sent_port, sent_ts : ``In``
        A data packet left for port ``sent_port`` (0-based) stamped ``sent_ts``.
    ack_valid, ack_port, ack_echo : ``In``
        A SACK or NACK arrived on port ``ack_port`` (0-based) echoing the 16-bit wire timestamp
        ``ack_echo``.
    rx_valid, rx_port : ``In``
        A frame of any kind (data, acknowledgement, probe) arrived on port ``rx_port``
        (0-based): the port is not quiet, and the other ports have missed one more frame.
        Every frame, ACKs included, must come in here (at most one a cycle): the ``ack_*``
        strobe does not count frames.
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
            "ack_echo": In(TIMESTAMP_BITS),
            "rx_valid": In(1),
            "rx_port": In(PORT_BITS),
            "down_valid": Out(1),
            "down_port": Out(EV_PORT_BITS),
            "downs": Out(32),
            "overflows": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        P = self._ports
        bits = WATCH_STAMP_BITS
        per_unit = WATCH_UNIT_SHIFT - WATCH_STAMP_SHIFT     # a window unit in stamps (log2)

        now = Signal(bits)              # the current time as a stamp ...
        now_units = Signal(bits)        # ... and in window units
        sent = Signal(bits)
        echo = Signal(bits)
        m.d.comb += [now.eq(_stamp(self.now_ns)),
                     now_units.eq(self.now_ns[WATCH_UNIT_SHIFT:WATCH_UNIT_SHIFT + bits]),
                     sent.eq(_stamp(self.sent_ts)),
                     echo.eq(_stamp(echo_ns(self.now_ns, self.ack_echo)))]

        newest = Signal(bits)           # newest echo of any ACK on any port ...
        fresh = Signal()                # ... while it is recent (module docstring)
        covered = [Signal(bits, name=f"covered{p}") for p in range(P)]
        heard = [Signal(bits, name=f"heard{p}") for p in range(P)]   # last ACK's arrival
        last_sent = [Signal(bits, name=f"last_sent{p}") for p in range(P)]
        fifos = []
        pops = []
        pushes = []
        firsts = []                     # a send into an empty FIFO
        for p in range(P):
            fifo = SyncFIFOBuffered(width=bits, depth=self._depth)
            m.submodules[f"fifo{p}"] = fifo
            fifos.append(fifo)
            push = Signal(name=f"push{p}")
            m.d.comb += push.eq(self.sent_valid & (self.sent_port == p))
            pushes.append(push)
            firsts.append(push & (fifo.level == 0))
            m.d.comb += [fifo.w_data.eq(sent), fifo.w_en.eq(push)]
            with m.If(push):
                m.d.sync += last_sent[p].eq(sent)
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
        m.d.comb += ours.eq(self.ack_valid & (self.ack_port < P) & _not_before(now, echo))
        with m.If(ours & (~fresh | ~_not_before(newest, echo))):
            m.d.sync += [newest.eq(echo), fresh.eq(1)]
        with m.Elif((now - newest) >= WATCH_STALE_STAMPS):
            m.d.sync += fresh.eq(0)
        for p in range(P):
            with m.If((ours & (self.ack_port == p)) | (self.rx_valid & (self.rx_port == p))):
                m.d.sync += heard[p].eq(now_units)
        # Frames the other ports received since each port's last frame (saturating; at most
        # one frame a cycle comes in through ``rx_*``); from reset, as ``heard``, as if every
        # port had just received one.
        quiet_frames = watch_quiet_frames(P)
        missed = [Signal(range(quiet_frames + 1), name=f"missed{p}")
                  for p in range(P)]
        for p in range(P):
            with m.If(self.rx_valid & (self.rx_port == p)):
                m.d.sync += missed[p].eq(0)
            with m.Elif(self.rx_valid & (self.rx_port < P) & (missed[p] != quiet_frames)):
                m.d.sync += missed[p].eq(missed[p] + 1)

        # The check visits one port per cycle: A registers its oldest uncovered send's lag,
        # B reports it if that send is still the port's oldest (no ACK popped it meanwhile).
        scan = Signal(range(P))
        m.d.sync += scan.eq(Mux(scan == P - 1, 0, scan + 1))
        heads = Array(f.r_data for f in fifos)
        live = Array(f.r_rdy & ~pop for f, pop in zip(fifos, pops, strict=True))
        a_valid = Signal()
        a_port = Signal(range(P))
        a_head = Signal(bits)
        lag = Signal(bits)
        silence = Signal(bits)
        quiet_done = Signal()
        m.d.comb += [lag.eq(newest - heads[scan]),
                     silence.eq(now_units - Array(heard)[scan]),
                     # Whole units since the last ACK: more than ``quiet`` of them is more
                     # than ``quiet`` units of real time (``quiet`` of them may be less).
                     # ... while the other ports received ``quiet_frames`` frames.
                     quiet_done.eq((self.quiet == 0)
                                   | ((silence[-1] | (silence > self.quiet))
                                      & (Array(missed)[scan] == quiet_frames)))]
        m.d.sync += [
            a_valid.eq((self.window != 0) & fresh & live[scan] & ~lag[-1]
                       & (lag >= (self.window << per_unit))
                       & quiet_done),
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
                m.d.sync += covered[p].eq(Mux(pushes[p], sent, last_sent[p]))
            with m.Elif(firsts[p]):
                # Nothing outstanding: every earlier send is covered, this one is not.
                m.d.sync += covered[p].eq(sent - 1)
            with m.Elif(ours & (self.ack_port == p) & ~_not_before(covered[p], echo)):
                m.d.sync += covered[p].eq(echo)
        return m
