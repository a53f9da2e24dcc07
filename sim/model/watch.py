"""Reference model of :class:`hdl.path.watch.PortWatch`: a dead plane found from the ACKs
that stop coming back on it (``docs/recovery.md``, "Port watch")."""

from collections import deque

from hdl.path.watch import (
    WATCH_DEPTH,
    WATCH_STALE_STAMPS,
    WATCH_STAMP_BITS,
    WATCH_STAMP_SHIFT,
    WATCH_UNIT_SHIFT,
    echo_time_ns,
    watch_quiet_frames,
)

__all__ = ["PortWatchModel"]

_MASK = (1 << WATCH_STAMP_BITS) - 1
_SIGN = 1 << (WATCH_STAMP_BITS - 1)
#: One window unit in stamps.
_PER_UNIT = 1 << (WATCH_UNIT_SHIFT - WATCH_STAMP_SHIFT)


def _not_before(a, b):
    """``a`` is not earlier than ``b`` (stamps or units modulo 2**16)."""
    return not (a - b) & _SIGN


def _stamp(ns):
    """The gateware's 64 ns stamp of a time in ns."""
    return (int(ns) >> WATCH_STAMP_SHIFT) & _MASK


def _units(ns):
    """The gateware's 1.024 us count of a time in ns (ACK arrivals)."""
    return (int(ns) >> WATCH_UNIT_SHIFT) & _MASK


class PortWatchModel:
    """Per port, the transmit times of the data packets sent on it that no ACK on the port has
    covered, when a frame (any kind) last arrived on it and how many frames the other ports
    received since. A port whose oldest uncovered send lags the newest echo on any port by
    ``window`` units or more, while no frame arrived on it for ``quiet`` units and the other
    ports received :func:`~hdl.path.watch.watch_quiet_frames` frames meanwhile, is reported
    down (1-based, as EV entries number ports) and its sends are written off. Every frame,
    ACKs included, is told with :meth:`arrived`; :meth:`ack` counts none.

    The lag only grows with an ACK (``newest`` moves), the silence with time: :meth:`ack`
    checks at each ACK, :meth:`due` says when a lagging port's silence will be long enough
    and :meth:`poll` checks then. The gateware visits one port per cycle, so it reports up to
    ``ports`` + 2 cycles later than the model. Times are kept as the gateware keeps them: sends
    and echoes as 16-bit stamps of 64 ns, ACK arrivals as 16-bit counts of 1.024 us."""

    def __init__(self, ports, *, depth=WATCH_DEPTH, counters=None):
        self.ports = ports
        self.depth = depth
        self.window = 0
        self.quiet = 0
        self.sends = [deque() for _ in range(ports)]
        self.heard = [0] * ports        # 1.024 us units of the last frame on each port
        #: Frames the other ports received since each port's last frame (saturating).
        self.quiet_frames = watch_quiet_frames(ports)
        self.missed = [0] * ports
        self.newest = 0                 # stamp
        #: The stamp count (not wrapped) at which ``newest`` would read 0: it is fresh while
        #: less than WATCH_STALE_STAMPS older than now (``None``: no ACK yet).
        self._newest_base = None
        #: ``port_downs``, ``port_watch_overflows`` (the NIC's ``tx_counters`` when given)
        self.counters = {} if counters is None else counters
        for name in ("port_downs", "port_watch_overflows"):
            self.counters.setdefault(name, 0)

    def sent(self, port, tx_ts):
        """A data packet left by ``port`` (0-based) stamped ``tx_ts``."""
        if not 0 <= port < self.ports:
            return
        if len(self.sends[port]) >= self.depth:
            self.counters["port_watch_overflows"] += 1
            return
        self.sends[port].append(_stamp(tx_ts))

    def ack(self, port, echo, now_ns):
        """A SACK or NACK arrived on ``port`` (0-based) echoing the 16-bit wire timestamp
        ``echo``: the ports (1-based) now found down."""
        echo = _stamp(echo_time_ns(int(now_ns), echo))
        if not 0 <= port < self.ports or not _not_before(_stamp(now_ns), echo):
            return []
        self.heard[port] = _units(now_ns)
        if not self._fresh(now_ns) or not _not_before(self.newest, echo):
            self.newest = echo
            age = (_stamp(now_ns) - echo) & _MASK
            self._newest_base = (int(now_ns) >> WATCH_STAMP_SHIFT) - age
        sends = self.sends[port]
        while sends and _not_before(echo, sends[0]):
            sends.popleft()
        return self.poll(now_ns)

    def arrived(self, port, now_ns):
        """A frame of any kind arrived on ``port`` (0-based) at ``now_ns``: it is not quiet."""
        if 0 <= port < self.ports:
            self.heard[port] = _units(now_ns)
            self.missed = [min(n + 1, self.quiet_frames) for n in self.missed]
            self.missed[port] = 0

    def _fresh(self, now_ns):
        """``newest`` is recent enough to measure lags against (the gateware's ``fresh``)."""
        return (self._newest_base is not None
                and (int(now_ns) >> WATCH_STAMP_SHIFT) - self._newest_base < WATCH_STALE_STAMPS)

    def _lagging(self, now_ns):
        """Ports (0-based) whose oldest uncovered send lags ``newest`` by the window."""
        if not self.window or not self._fresh(now_ns):
            return []
        out = []
        for number, sends in enumerate(self.sends):
            if sends:
                lag = (self.newest - sends[0]) & _MASK
                if not lag & _SIGN and lag >= self.window * _PER_UNIT:
                    out.append(number)
        return out

    def _silence(self, port, now_ns):
        """Whole 1.024 us units since the port's last ACK, as the gateware counts them (more
        than ``quiet`` of them is more than ``quiet`` units of real time)."""
        return (_units(now_ns) - self.heard[port]) & _MASK

    def poll(self, now_ns):
        """The ports (1-based) found down at ``now_ns``; their sends are written off."""
        down = []
        for number in self._lagging(now_ns):
            silence = self._silence(number, now_ns)
            if not self.quiet or ((silence & _SIGN or silence > self.quiet)
                                  and self.missed[number] == self.quiet_frames):
                self.sends[number].clear()
                self.counters["port_downs"] += 1
                down.append(number + 1)
        return down

    def due(self, now_ns):
        """When the next lagging port's silence reaches ``quiet`` (ns, not before ``now_ns``),
        or ``None`` when no port lags. A port whose other ports have not yet received their
        frames needs no wake-up: the frame that completes the count comes with a call of
        :meth:`arrived`, and the next ``due`` sees it."""
        times = []
        unit = 1 << WATCH_UNIT_SHIFT
        for number in self._lagging(now_ns):
            if self.quiet and self.missed[number] < self.quiet_frames:
                continue            # only a frame can change that, and :meth:`arrived` is told
            silence = self._silence(number, now_ns)
            left = 0 if not self.quiet or silence & _SIGN else max(0, self.quiet + 1 - silence)
            # The silence count steps at each multiple of a unit: the step that reaches it.
            times.append(now_ns if not left else (int(now_ns) // unit + left) * unit)
        return min(times) if times else None
