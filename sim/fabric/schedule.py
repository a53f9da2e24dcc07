"""The failure schedule of the fabric: blackholes and flaps of a plane or one of its paths.

A :class:`Failure` says when a target (a whole plane, or one path of a plane; both
directions or one) is down. A frame is lost to a failure when its target is down at any
moment between its hand-over to the fabric and its arrival: frames in flight when a plane
dies are lost, as on a real link.
"""

import math
from dataclasses import dataclass

__all__ = ["Failure", "BLACKHOLE", "FLAP"]

BLACKHOLE = "blackhole"
FLAP = "flap"
_KINDS = (BLACKHOLE, FLAP)


def _number(owner, name, value, lo, hi=math.inf, *, lo_open=False):
    if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value) \
            or value < lo or (lo_open and value == lo) or value > hi:
        bound = f"greater than {lo}" if lo_open else f"at least {lo}"
        if hi != math.inf:
            bound = f"from {lo} to {hi}"
        raise ValueError(f"{owner}.{name} must be a number {bound}, not {value!r}")


@dataclass(frozen=True, kw_only=True)
class Failure:
    """One entry of the failure schedule.

    Parameters
    ----------
    kind : str
        ``"blackhole"``: the target is down from ``at_ns`` until ``recover_ns`` (or forever).
        ``"flap"``: between ``at_ns`` and ``recover_ns`` the target alternates down/up with
        period ``period_ns``; each period starts down and stays down for ``duty`` of it.
    plane : int
        Plane index (NIC port number, 0-based).
    path : int or None
        Path index inside the plane, or None for the whole plane.
    at_ns, recover_ns : float
        Start of the failure and its end (exclusive); ``recover_ns=None``: never recovers.
    direction : str or None
        Name of the sending endpoint whose frames are affected (``"a"`` means a -> b), or None
        for both directions.
    period_ns, duty : float
        Flap period (> 0) and the down fraction of each period (0 to 1); flaps only.
    """
    kind: str
    plane: int
    path: int | None = None
    at_ns: float = 0.0
    recover_ns: float | None = None
    direction: str | None = None
    period_ns: float = 0.0
    duty: float = 0.5

    def __post_init__(self):
        if self.kind not in _KINDS:
            raise ValueError(f"Failure.kind must be one of {', '.join(_KINDS)}, "
                             f"not {self.kind!r}")
        if not isinstance(self.plane, int) or isinstance(self.plane, bool) or self.plane < 0:
            raise ValueError(f"Failure.plane must be a plane index (an integer >= 0), "
                             f"not {self.plane!r}")
        if self.path is not None and (not isinstance(self.path, int)
                                      or isinstance(self.path, bool) or self.path < 0):
            raise ValueError(f"Failure.path must be None (whole plane) or a path index "
                             f"(an integer >= 0), not {self.path!r}")
        _number("Failure", "at_ns", self.at_ns, 0)
        if self.recover_ns is not None:
            _number("Failure", "recover_ns", self.recover_ns, self.at_ns, lo_open=True)
        if self.direction is not None and not isinstance(self.direction, str):
            raise ValueError(f"Failure.direction must be None (both) or an endpoint name, "
                             f"not {self.direction!r}")
        if self.kind == FLAP:
            _number("Failure", "period_ns", self.period_ns, 0, lo_open=True)
            _number("Failure", "duty", self.duty, 0, 1)

    @property
    def end_ns(self):
        return math.inf if self.recover_ns is None else self.recover_ns

    def applies(self, direction, plane, path):
        return (self.plane == plane and (self.path is None or self.path == path)
                and (self.direction is None or self.direction == direction))

    def down_during(self, start_ns, end_ns):
        """True when the target is down at some instant of [start_ns, end_ns]."""
        lo = max(start_ns, self.at_ns)
        hi = min(end_ns, self.end_ns)
        if lo > hi or lo >= self.end_ns:
            return False
        if self.kind == BLACKHOLE:
            return True
        period = self.period_ns
        cycle = math.floor((lo - self.at_ns) / period)
        cycle_start = self.at_ns + cycle * period
        if lo - cycle_start < self.duty * period:
            return True
        next_down = cycle_start + period
        return next_down <= hi and next_down < self.end_ns

    def down_windows(self, until_ns):
        """The (start, end) intervals during which the target is down, up to ``until_ns``
        (for plots)."""
        end = min(self.end_ns, until_ns)
        if self.kind == BLACKHOLE:
            return [(self.at_ns, end)] if self.at_ns < end else []
        windows = []
        start = self.at_ns
        while start < end and self.duty > 0:
            windows.append((start, min(start + self.duty * self.period_ns, end)))
            start += self.period_ns
        return windows
