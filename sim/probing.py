"""When the control-plane stand-in probes a suspect EV: a per-EV backoff.

An EV that goes ASSUMED_BAD is probed soon (``first_us`` after it was seen suspect), so an EV
taken out by a false loss (reordering read as loss) comes back within about one round trip.
Each probe that leaves the EV suspect (unanswered, or answered after the EV went bad again)
doubles the wait before the next one, up to ``cap_us``: a dead plane's EVs cost a probe every
``cap_us`` once the backoff has grown, not one every few microseconds. An EV seen GOOD again
(a probe answered brings it back through PROBE_OK) is forgotten; if it goes bad later its
backoff starts over. ``docs/probes.md``, "Probe backoff".

One :class:`ProbeBackoff` per NIC; the RTL benches (:func:`sim.tb.cocotb_fabric.control_plane`,
also used by the group bench) and the model runs (:mod:`sim.model.pair`,
:mod:`sim.model.multi`) use the same class with the same defaults.
"""

__all__ = ["ProbeBackoff", "PROBE_FIRST_US", "PROBE_CAP_US"]

#: First probe of a newly suspect EV, us after it was seen ASSUMED_BAD.
PROBE_FIRST_US = 4.0
#: Longest wait between two probes of one EV, us (the backoff doubles up to it).
PROBE_CAP_US = 64.0


class ProbeBackoff:
    """Per-EV probe schedule: first probe ``first_us`` after an EV is suspect, then waits
    doubling up to ``cap_us`` while it stays suspect.

    Parameters
    ----------
    first_us : float
        Wait before the first probe of a newly suspect EV, more than 0 and at most ``cap_us``.
    cap_us : float
        Longest wait between probes of one EV, at most 10,000 us.
    """

    def __init__(self, *, first_us=PROBE_FIRST_US, cap_us=PROBE_CAP_US):
        if not isinstance(cap_us, (int, float)) or not 0 < cap_us <= 10_000:
            raise ValueError(f"probe cap_us must be a number in (0, 10000], not {cap_us!r}")
        if not isinstance(first_us, (int, float)) or not 0 < first_us <= cap_us:
            raise ValueError(f"probe first_us must be a number in (0, cap_us = {cap_us}], "
                             f"not {first_us!r}")
        self.first_us = float(first_us)
        self.cap_us = float(cap_us)
        self._due = {}          # ev -> (time of its next probe, the wait that led to it)
        self.sent = 0           #: probes :meth:`due` has handed out

    def suspect(self, ev, now_us):
        """EV ``ev`` is ASSUMED_BAD at ``now_us`` (no effect if it already is)."""
        if ev not in self._due:
            self._due[ev] = (now_us + self.first_us, self.first_us)

    def clear(self, ev):
        """EV ``ev`` is usable again: forget its backoff."""
        self._due.pop(ev, None)

    def track(self, suspects, now_us):
        """Make the suspect set exactly ``suspects`` (EVs added now start their backoff)."""
        suspects = set(suspects)
        for ev in [ev for ev in self._due if ev not in suspects]:
            del self._due[ev]
        for ev in suspects:
            self.suspect(ev, now_us)

    def due(self, now_us):
        """The EVs to probe at ``now_us`` (sorted); each one's next probe waits twice as long
        as the last, at most ``cap_us``."""
        # A hair of slack: a caller that wakes at next_due_us() through a ns conversion.
        ready = sorted(ev for ev, (when, _) in self._due.items() if when <= now_us + 1e-6)
        for ev in ready:
            wait = min(2 * self._due[ev][1], self.cap_us)
            self._due[ev] = (now_us + wait, wait)
        self.sent += len(ready)
        return ready

    def next_due_us(self):
        """Time of the next probe of any suspect EV, or ``None`` with none suspect."""
        return min((when for when, _ in self._due.values()), default=None)

    @property
    def suspects(self):
        return set(self._due)
