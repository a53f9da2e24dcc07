"""Scenarios of the main job (``mrc-nic sim``): one validated description of a run.

A :class:`Scenario` holds every parameter a run needs: the fabric, the traffic, the failure
schedule, the NIC's QP attributes and the backend. The command line, the named scenarios, the
benchmarks and the tests all build one, and ``report.json`` echoes it. A bad value raises
:class:`ScenarioError` naming the field and its allowed range.
"""

import dataclasses
from dataclasses import dataclass, field

from hdl import protocol as P
from hdl.config import NicConfig
from hdl.path.watch import WATCH_WINDOW_BITS
from hdl.transport.req_defs import INFER_K_BITS, REO_WND_BITS
from hdl.transport.resp_defs import GAP_DEPTH_BITS

__all__ = ["Scenario", "ScenarioError", "SCENARIOS", "scenario", "nic_config_for",
           "line_rate_gbps", "MAX_QPS", "MAX_EVS"]

#: The NIC build of the main job: the flagship 64-bit datapath and 125 MHz clock with one
#: port per plane; tables sized for a handful of QPs so two NICs compile in minutes.
MAX_QPS = 16
MAX_EVS = 64
MTUS = (256, 512, 1024, 2048, 4096)


class ScenarioError(ValueError):
    """A scenario parameter is out of range; ``field`` names it (as the command-line flag)."""

    def __init__(self, field_name, message):
        super().__init__(f"--{field_name.replace('_', '-')}: {message}")
        self.field = field_name


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """Every parameter of one run. Times in microseconds of simulated time, sizes in bytes.

    ``fail_at_us``/``recover_at_us`` of ``None`` mean "never". ``fail_all`` fails every plane
    alike (the retry-exhaustion case). ``fail_kind`` ``blackhole``
    drops every frame crossing the plane while it is down; ``flap`` alternates down and up
    every ``flap_period_us / 2``. ``baseline`` ``ecmp`` gives every QP one fixed EV (the
    profile in AUTO mode): the single-path baseline on the same fabric.
    """
    name: str = "default"
    planes: int = 8
    paths: int = 4
    qps: int = 4
    bytes: int = 192 * 1024
    msg_size: int = 16 * 1024
    mtu: int = 1024
    evs: int = 32
    both_ways: bool = True
    fail_plane: int | None = 3
    fail_at_us: float | None = 40.0
    recover_at_us: float | None = 140.0
    fail_kind: str = "blackhole"
    fail_all: bool = False
    flap_period_us: float = 20.0
    loss: float = 0.0
    duplicate: float = 0.0
    corrupt: float = 0.0
    trim_threshold: int = 0
    ecn_threshold: int = 4 * 1024
    queue_bytes: int = 16 * 1024
    latency_us: float = 1.0
    timeout: int = 7
    retry_linear: int = P.RETRY_LINEAR_MAX
    retry_exponential: int = P.RETRY_INFINITE
    infer_k: int = 8
    reo_wnd: int = 24
    port_wnd: int = 20
    port_quiet: int = 20
    fate: int = 1
    cc: int = 1
    ack_every: int = 4
    ack_delay: int = 128
    coalesce_gaps: int = 0
    gap_depth: int = 0
    seed: int = 1
    backend: str = "rtl"
    baseline: str | None = None
    sim: str = "verilator"
    waves: bool = False
    max_us: float = 5000.0
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        def check(name, ok, allowed):
            if not ok:
                raise ScenarioError(name, f"must be {allowed}, not {getattr(self, name)!r}")

        def integer(name, lo, hi):
            value = getattr(self, name)
            check(name, isinstance(value, int) and not isinstance(value, bool)
                  and lo <= value <= hi, f"an integer from {lo} to {hi}")

        def number(name, lo, hi):
            value = getattr(self, name)
            check(name, isinstance(value, int | float) and not isinstance(value, bool)
                  and lo <= value <= hi, f"a number from {lo} to {hi}")

        integer("planes", 1, 16)
        integer("paths", 1, 64)
        integer("qps", 1, MAX_QPS)
        integer("bytes", 1, 1 << 30)
        integer("msg_size", 0, 1 << 30)
        check("mtu", self.mtu in MTUS, f"one of {', '.join(map(str, MTUS))}")
        integer("evs", 1, MAX_EVS)
        if self.fail_plane is not None:
            integer("fail_plane", 0, self.planes - 1)
        for name in ("fail_at_us", "recover_at_us"):
            if getattr(self, name) is not None:
                number(name, 0, 1e9)
        if self.fail_at_us is not None and self.recover_at_us is not None:
            check("recover_at_us", self.recover_at_us > self.fail_at_us,
                  f"later than --fail-at ({self.fail_at_us} us)")
        check("fail_kind", self.fail_kind in ("blackhole", "flap"), "blackhole or flap")
        check("fail_all", isinstance(self.fail_all, bool), "true or false")
        number("flap_period_us", 0.01, 1e9)
        for name in ("loss", "duplicate", "corrupt"):
            number(name, 0.0, 0.5)
        integer("trim_threshold", 0, 1 << 30)
        integer("ecn_threshold", 0, 1 << 30)
        integer("queue_bytes", 1, 1 << 30)
        number("latency_us", 0.0, 1e6)
        integer("timeout", 0, P.LOCAL_ACK_TIMEOUT_MAX)
        integer("retry_linear", 0, P.RETRY_LINEAR_MAX)
        integer("retry_exponential", 0, P.RETRY_EXPONENTIAL_MAX)
        integer("infer_k", 0, (1 << INFER_K_BITS) - 1)
        integer("reo_wnd", 0, (1 << REO_WND_BITS) - 1)
        integer("port_wnd", 0, (1 << WATCH_WINDOW_BITS) - 1)
        integer("port_quiet", 0, (1 << WATCH_WINDOW_BITS) - 1)
        integer("fate", 0, 1)
        integer("cc", 0, 1)
        integer("ack_every", 1, 255)
        integer("ack_delay", 1, (1 << 32) - 1)
        integer("coalesce_gaps", 0, 1)
        integer("gap_depth", 0, (1 << GAP_DEPTH_BITS) - 1)
        integer("seed", 0, (1 << 31) - 1)
        check("backend", self.backend in ("rtl", "model"), "rtl or model")
        check("baseline", self.baseline in (None, "ecmp"), "ecmp (or absent)")
        check("sim", self.sim in ("verilator", "icarus"), "verilator or icarus")
        number("max_us", 1.0, 1e7)
        check("name", isinstance(self.name, str) and self.name.replace("-", "").replace(
            "_", "").isalnum(), "letters, digits, '-' and '_'")

    @property
    def failure(self):
        """The failure as a dict, or ``None`` when no plane fails."""
        if self.fail_plane is None or self.fail_at_us is None:
            return None
        return {"plane": self.fail_plane, "all_planes": self.fail_all,
                "kind": self.fail_kind, "at_us": self.fail_at_us,
                "recover_at_us": self.recover_at_us,
                "flap_period_us": self.flap_period_us if self.fail_kind == "flap" else None}

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values):
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(values) - names
        if unknown:
            raise ScenarioError(sorted(unknown)[0], f"unknown parameter (known: "
                                f"{', '.join(sorted(names))})")
        return cls(**values)


def nic_config_for(scn):
    """The NIC build a scenario runs on (both NICs alike). Only ``planes`` and ``mtu`` change
    the build; QP and EV counts are table sizes chosen to cover every allowed value."""
    return NicConfig(ports=scn.planes, qps=MAX_QPS, mpr_units=1, ev_profiles=1,
                     evs_per_profile=MAX_EVS, max_wimm=4, wr_slots=4, mtu=scn.mtu)


def line_rate_gbps(config):
    """The NIC engine's line rate: one datapath beat per cycle."""
    return config.data_width * config.clock_hz / 1e9


#: How often the control plane probes every ASSUMED_BAD EV (RTL bench and model run).
PROBE_INTERVAL_US = 10.0


#: Named scenarios (``--scenario NAME``); flags given with them override their values.
SCENARIOS = {
    "default": Scenario(),
    "clean": Scenario(name="clean", fail_plane=None, fail_at_us=None, recover_at_us=None),
    "plane-failure": Scenario(name="plane-failure", recover_at_us=None),
    "timeout-only": Scenario(name="timeout-only", recover_at_us=None, infer_k=0, reo_wnd=0,
                             port_wnd=0),
    "flap": Scenario(name="flap", fail_kind="flap", fail_at_us=30.0, recover_at_us=150.0,
                     flap_period_us=30.0),
    "loss1": Scenario(name="loss1", fail_plane=None, fail_at_us=None, recover_at_us=None,
                      loss=0.01),
    "ecmp": Scenario(name="ecmp", baseline="ecmp", qps=8, fail_plane=None, fail_at_us=None,
                     recover_at_us=None),
    "mrc-8qp": Scenario(name="mrc-8qp", qps=8, fail_plane=None, fail_at_us=None,
                        recover_at_us=None),
    "congestion": Scenario(name="congestion", fail_plane=None, fail_at_us=None,
                           recover_at_us=None, trim_threshold=8 * 1024,
                           ecn_threshold=2 * 1024),
}


def scenario(name="default", **overrides):
    """The named scenario with ``overrides`` applied (``None`` values are ignored)."""
    if name not in SCENARIOS:
        raise ScenarioError("scenario", f"one of {', '.join(SCENARIOS)}, not {name!r}")
    changes = {k: v for k, v in overrides.items() if v is not None}
    return SCENARIOS[name].replace(**changes)
