"""Reference model of :class:`hdl.path.watch.PortWatch`: a dead plane found from the ACKs
that stop coming back on it (``docs/recovery.md``, "Port watch")."""

from collections import deque

from hdl.path.watch import WATCH_DEPTH, WATCH_UNIT_SHIFT

__all__ = ["PortWatchModel"]

_MASK = 0xFFFF_FFFF
_SIGN = 0x8000_0000


def _not_before(a, b):
    """``a`` is not earlier than ``b`` (32-bit ns modulo 2**32)."""
    return not (a - b) & _SIGN


class PortWatchModel:
    """Per port, the transmit times of the data packets sent on it that no ACK on the port has
    covered, and when an ACK last arrived on it. A port whose oldest uncovered send lags the
    newest echo on any port by ``window`` units or more, while no ACK arrived on it for
    ``quiet`` units, is reported down (1-based, as EV entries number ports) and its sends are
    written off.

    The lag only grows with an ACK (``newest`` moves), the silence with time: :meth:`ack`
    checks at each ACK, :meth:`due` says when a lagging port's silence will be long enough
    and :meth:`poll` checks then. The gateware visits one port per cycle, so it reports up to
    ``ports`` + 2 cycles later than the model."""

    def __init__(self, ports, *, depth=WATCH_DEPTH, counters=None):
        self.ports = ports
        self.depth = depth
        self.window = 0
        self.quiet = 0
        self.sends = [deque() for _ in range(ports)]
        self.heard = [0] * ports        # ns of the last ACK on each port
        self.newest = 0
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
        self.sends[port].append(tx_ts & _MASK)

    def ack(self, port, echo, now_ns):
        """An ACK or NAK arrived on ``port`` (0-based) echoing ``echo``: the ports (1-based)
        now found down."""
        echo &= _MASK
        now = int(now_ns) & _MASK
        if not 0 <= port < self.ports or not _not_before(now, echo):
            return []
        self.heard[port] = now
        if not _not_before(self.newest, echo):
            self.newest = echo
        sends = self.sends[port]
        while sends and _not_before(echo, sends[0]):
            sends.popleft()
        return self.poll(now_ns)

    def _lagging(self):
        """Ports (0-based) whose oldest uncovered send lags ``newest`` by the window."""
        if not self.window:
            return []
        out = []
        for number, sends in enumerate(self.sends):
            if sends:
                lag = (self.newest - sends[0]) & _MASK
                if not lag & _SIGN and lag >= self.window << WATCH_UNIT_SHIFT:
                    out.append(number)
        return out

    def _silence(self, port, now_ns):
        return (int(now_ns) - self.heard[port]) & _MASK

    def poll(self, now_ns):
        """The ports (1-based) found down at ``now_ns``; their sends are written off."""
        down = []
        for number in self._lagging():
            silence = self._silence(number, now_ns)
            if silence & _SIGN or silence >= self.quiet << WATCH_UNIT_SHIFT:
                self.sends[number].clear()
                self.counters["port_downs"] += 1
                down.append(number + 1)
        return down

    def due(self, now_ns):
        """When the next lagging port's silence reaches ``quiet`` (ns, not before ``now_ns``),
        or ``None`` when no port lags."""
        times = []
        for number in self._lagging():
            silence = self._silence(number, now_ns)
            left = 0 if silence & _SIGN else max(0, (self.quiet << WATCH_UNIT_SHIFT) - silence)
            times.append(now_ns + left)
        return min(times) if times else None
