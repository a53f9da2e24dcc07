"""Parameters of the fabric model: one frozen, validated dataclass.

A bad value raises :class:`ValueError` naming the field (``FabricConfig.<field>``) and its
allowed range. ``docs/fabric.md`` lists every parameter with its default and unit.
"""

import dataclasses
import math
from dataclasses import dataclass

from hdl import protocol as P
from hdl.config import NicConfig

from .schedule import Failure

__all__ = ["FabricConfig", "line_rate_gbps", "MAX_ENDPOINTS"]

#: Most endpoints a fabric joins (a switch per plane beyond two).
MAX_ENDPOINTS = 16


def line_rate_gbps(config):
    """The NIC engine's line rate in Gbit/s: datapath width x clock (one beat per cycle)."""
    return config.data_width * config.clock_hz / 1e9


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and not math.isnan(value)


def _check_number(name, value, lo, hi=math.inf, *, lo_open=False, integer=False):
    kind = "an integer" if integer else "a number"
    ok = (isinstance(value, int) and not isinstance(value, bool)) if integer \
        else _is_number(value)
    if ok:
        ok = (value > lo if lo_open else value >= lo) and value <= hi
    if not ok:
        if hi != math.inf:
            bound = f"from {lo} to {hi}"
        else:
            bound = f"greater than {lo}" if lo_open else f"at least {lo}"
        raise ValueError(f"FabricConfig.{name} must be {kind} {bound}, not {value!r}")


def _check_probability(name, value):
    _check_number(name, value, 0, 1)


@dataclass(frozen=True, kw_only=True)
class FabricConfig:
    """Every parameter of the fabric. Times in ns, rates in Gbit/s, sizes in bytes.

    Parameters
    ----------
    planes : int
        Network planes, 1 to 16; NIC port p is plane p.
    paths_per_plane : int
        Paths inside a plane (chosen per frame by the ECMP hash), 1 to 64.
    line_rate_gbps : float
        The NIC engine's line rate; the default plane rates add up to it.
        :meth:`for_nic` sets it from a :class:`hdl.config.NicConfig`.
    rate_gbps : None, float or tuple of float
        Rate of each plane's port link (serialization and its queue). None: line rate /
        planes; a number: every plane; a tuple: one per plane.
    path_rate_gbps : None or float
        Rate of each path's own link (a second serializer and queue after the port link), or
        None: paths only add latency.
    latency_ns : float or tuple of float
        Propagation latency of a path (one number, or one per path of a plane).
    path_skew_ns : float
        Extra latency per path index: path j adds ``j * path_skew_ns``.
    queue_bytes, ecn_threshold_bytes, trim_threshold_bytes : int
        FIFO capacity (tail drop beyond it), ECN CE marking threshold (0 = off), trimming
        threshold (0 = off); both thresholds at most ``queue_bytes``.
    wire_overhead_bytes : int
        Bytes added to every frame's serialization (preamble, FCS, gap: 24 on real Ethernet);
        default 0, as the engine's line rate counts frames without them.
    loss : float
        Probability that a frame is lost at random.
    burst_loss, burst_length : float
        Gilbert model: probability per frame of entering a loss burst, and the mean number
        of frames a burst loses (>= 1).
    duplicate : float
        Probability that a frame is delivered twice.
    reorder, reorder_delay_ns : float
        Probability that a frame gets an extra delay, uniform in [0, reorder_delay_ns] (the
        same bound spaces a duplicate from its original).
    corrupt : float
        Probability that one ICRC-covered byte of a frame is flipped.
    trim_dscp : int
        DSCP code point a trimmed packet carries, 0 to 63.
    failures : tuple of :class:`~sim.fabric.schedule.Failure`
        The failure schedule.
    endpoints : tuple of str
        Endpoint names, 2 to 16. Two: a frame sent by one arrives at the other. More: each
        plane is a switch that forwards a frame by its destination MAC (``macs``).
    macs : tuple of int
        The MAC of each endpoint (48-bit integers, distinct), in the order of ``endpoints``:
        needed with more than two endpoints, optional with two (unused).
    seed : int
        Seed of every random choice (and of the ECMP hash).
    bin_ns : float
        Width of a statistics time bin.
    capture : bool
        Record every frame (with its bytes) for :mod:`sim.fabric.capture`.
    """
    planes: int = 8
    paths_per_plane: int = 4
    line_rate_gbps: float = line_rate_gbps(NicConfig())
    rate_gbps: float | tuple | None = None
    path_rate_gbps: float | None = None
    latency_ns: float | tuple = 1000.0
    path_skew_ns: float = 0.0
    queue_bytes: int = 65536
    ecn_threshold_bytes: int = 16384
    trim_threshold_bytes: int = 0
    wire_overhead_bytes: int = 0
    loss: float = 0.0
    burst_loss: float = 0.0
    burst_length: float = 4.0
    duplicate: float = 0.0
    reorder: float = 0.0
    reorder_delay_ns: float = 2000.0
    corrupt: float = 0.0
    trim_dscp: int = P.DEFAULT_TRIM_DSCP
    failures: tuple = ()
    endpoints: tuple = ("a", "b")
    macs: tuple = ()
    seed: int = 1
    bin_ns: float = 10_000.0
    capture: bool = True

    def __post_init__(self):
        _check_number("planes", self.planes, 1, 16, integer=True)
        _check_number("paths_per_plane", self.paths_per_plane, 1, 64, integer=True)
        _check_number("line_rate_gbps", self.line_rate_gbps, 0, lo_open=True)
        if isinstance(self.rate_gbps, (tuple, list)):
            if len(self.rate_gbps) != self.planes:
                raise ValueError(f"FabricConfig.rate_gbps must have one rate per plane "
                                 f"({self.planes}), not {len(self.rate_gbps)}")
            for rate in self.rate_gbps:
                _check_number("rate_gbps", rate, 0, lo_open=True)
            object.__setattr__(self, "rate_gbps", tuple(self.rate_gbps))
        elif self.rate_gbps is not None:
            _check_number("rate_gbps", self.rate_gbps, 0, lo_open=True)
        if self.path_rate_gbps is not None:
            _check_number("path_rate_gbps", self.path_rate_gbps, 0, lo_open=True)
        if isinstance(self.latency_ns, (tuple, list)):
            if len(self.latency_ns) != self.paths_per_plane:
                raise ValueError(f"FabricConfig.latency_ns must have one latency per path "
                                 f"({self.paths_per_plane}), not {len(self.latency_ns)}")
            for latency in self.latency_ns:
                _check_number("latency_ns", latency, 0)
            object.__setattr__(self, "latency_ns", tuple(self.latency_ns))
        else:
            _check_number("latency_ns", self.latency_ns, 0)
        _check_number("path_skew_ns", self.path_skew_ns, 0)
        _check_number("queue_bytes", self.queue_bytes, 1, integer=True)
        _check_number("ecn_threshold_bytes", self.ecn_threshold_bytes, 0, self.queue_bytes,
                      integer=True)
        _check_number("trim_threshold_bytes", self.trim_threshold_bytes, 0, self.queue_bytes,
                      integer=True)
        _check_number("wire_overhead_bytes", self.wire_overhead_bytes, 0, 1000, integer=True)
        for name in ("loss", "burst_loss", "duplicate", "reorder", "corrupt"):
            _check_probability(name, getattr(self, name))
        _check_number("burst_length", self.burst_length, 1)
        _check_number("reorder_delay_ns", self.reorder_delay_ns, 0)
        _check_number("trim_dscp", self.trim_dscp, 0, 63, integer=True)
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValueError(f"FabricConfig.seed must be an integer, not {self.seed!r}")
        _check_number("bin_ns", self.bin_ns, 0, lo_open=True)
        if not isinstance(self.capture, bool):
            raise ValueError(f"FabricConfig.capture must be True or False, not "
                             f"{self.capture!r}")
        endpoints = tuple(self.endpoints) if isinstance(self.endpoints, (tuple, list)) else ()
        if not 2 <= len(endpoints) <= MAX_ENDPOINTS \
                or not all(isinstance(e, str) and e for e in endpoints) \
                or len(set(endpoints)) != len(endpoints):
            raise ValueError(f"FabricConfig.endpoints must be 2 to {MAX_ENDPOINTS} distinct "
                             f"names, not {self.endpoints!r}")
        object.__setattr__(self, "endpoints", endpoints)
        macs = tuple(self.macs) if isinstance(self.macs, (tuple, list)) else None
        needed = len(endpoints) > 2 or bool(macs)
        if macs is None or (needed and (
                len(macs) != len(endpoints) or len(set(macs)) != len(macs)
                or not all(isinstance(m, int) and not isinstance(m, bool)
                           and 0 <= m < 1 << 48 for m in macs))):
            raise ValueError(f"FabricConfig.macs must be {len(endpoints)} distinct 48-bit "
                             f"integers, one per endpoint"
                             f"{'' if len(endpoints) > 2 else ', or empty'}, "
                             f"not {self.macs!r}")
        object.__setattr__(self, "macs", macs)
        failures = tuple(self.failures) if isinstance(self.failures, (tuple, list)) else None
        if failures is None:
            raise ValueError(f"FabricConfig.failures must be a list of Failure, "
                             f"not {self.failures!r}")
        for index, failure in enumerate(failures):
            where = f"FabricConfig.failures[{index}]"
            if not isinstance(failure, Failure):
                raise ValueError(f"{where} must be a Failure, not {failure!r}")
            if failure.plane >= self.planes:
                raise ValueError(f"{where}.plane must be from 0 to {self.planes - 1}, "
                                 f"not {failure.plane!r}")
            if failure.path is not None and failure.path >= self.paths_per_plane:
                raise ValueError(f"{where}.path must be from 0 to {self.paths_per_plane - 1} "
                                 f"or None, not {failure.path!r}")
            if failure.direction is not None and failure.direction not in endpoints:
                raise ValueError(f"{where}.direction must be None or one of "
                                 f"{', '.join(endpoints)}, not {failure.direction!r}")
        object.__setattr__(self, "failures", failures)

    @classmethod
    def for_nic(cls, nic_config, **overrides):
        """A fabric matched to a NIC: one plane per port, plane rates adding up to its line
        rate."""
        if not isinstance(nic_config, NicConfig):
            raise ValueError(f"nic_config must be a NicConfig, not {nic_config!r}")
        values = {"planes": nic_config.ports, "line_rate_gbps": line_rate_gbps(nic_config),
                  "trim_dscp": nic_config.trim_dscp}
        values.update(overrides)
        return cls(**values)

    def replace(self, **changes):
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"FabricConfig.{sorted(unknown)[0]} is not a parameter")
        return dataclasses.replace(self, **changes)

    def to_dict(self):
        """JSON-ready: every field, failures as dicts."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        values["failures"] = [dataclasses.asdict(f) for f in self.failures]
        values["plane_rates_gbps"] = [self.plane_rate_gbps(p) for p in range(self.planes)]
        return values

    def plane_rate_gbps(self, plane):
        if self.rate_gbps is None:
            return self.line_rate_gbps / self.planes
        if isinstance(self.rate_gbps, tuple):
            return self.rate_gbps[plane]
        return self.rate_gbps

    def path_latency_ns(self, path):
        base = self.latency_ns[path] if isinstance(self.latency_ns, tuple) else self.latency_ns
        return base + path * self.path_skew_ns
