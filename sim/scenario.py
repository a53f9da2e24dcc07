"""Scenarios of the main job (``mrc-nic sim``): one validated description of a run.

A :class:`Scenario` holds every parameter a run needs: the fabric, the traffic, the failure
schedule, the NIC's QP attributes and the backend. The command line, the benchmarks and the
tests all build one, and ``report.json`` echoes it.

Named scenarios are TOML files in ``sim/scenarios/`` (``default.toml`` gives every field
that has a value);
:func:`load` reads a named scenario or any scenario file, puts the overrides (the command
line's flags) on top and validates the result. This module is the one loader. A bad value
raises :class:`ScenarioError` naming the field, where its value came from (a flag, a named
scenario, a scenario file) and the allowed range.

A scenario file holds scenario fields (``planes = 4``) and optionally ``description`` (one
line, for ``mrc-nic sim --list``) and ``base`` (the named scenario it starts from;
``default`` when absent). ``fail_plane = -1`` means no failure, ``recover_at_us = -1`` no
recovery and ``baseline = "none"`` no baseline, as the flags spell it; ``[extra]`` and
``[nic_config]`` are tables.
"""

import dataclasses
import difflib
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from hdl import protocol as P
from hdl.config import ConfigError, NicConfig
from hdl.path.watch import WATCH_WINDOW_BITS
from hdl.transport.req_defs import INFER_K_BITS, REO_WND_BITS
from hdl.transport.resp_defs import (
    DEFAULT_ACK_DELAY,
    DEFAULT_ACK_EVERY,
    DEFAULT_ACK_NEW_HOLES,
    DEFAULT_COALESCE_GAPS,
    DEFAULT_GAP_DEPTH,
    GAP_DEPTH_BITS,
)

# The requester's congestion window when ``cc`` is 1: ``nscc`` (the default) or ``ecn``.
from sim.model.nscc import CC_ALGORITHMS

__all__ = ["Scenario", "ScenarioError", "SCENARIOS", "SCENARIO_DIR", "scenario", "load",
           "scenario_names", "describe_scenarios", "allowed", "nic_config_for",
           "line_rate_gbps", "MAX_QPS", "MAX_EVS", "MAX_NICS", "PATTERNS", "CC_ALGORITHMS",
           "qps_per_nic"]

#: The NIC build of the main job without ``nic_config``: the flagship 64-bit datapath and
#: 125 MHz clock with one port per plane; tables sized for a handful of QPs so two NICs
#: compile in minutes.
MAX_QPS = 16
MAX_EVS = 64
MTUS = (256, 512, 1024, 2048, 4096)
#: NICs a fabric joins (a switch per plane beyond two; ``sim/fabric/fabric.py``).
MAX_NICS = 16
#: Who sends to whom (``sim/model/multi.py``): NIC 2k and NIC 2k + 1 (each way unless
#: ``both_ways`` is false); every other NIC to NIC 0; every NIC to every other.
PATTERNS = ("pairs", "incast", "all-to-all")

#: Where the named scenarios live, one TOML file each.
SCENARIO_DIR = Path(__file__).parent / "scenarios"


class ScenarioError(ValueError):
    """A scenario value is out of range or unknown.

    ``field`` is the scenario field; ``message`` says what is wrong and may name other fields
    as ``{field}``. ``labels`` says how to name each field: the flag that set it
    (``--planes``), the scenario file (``run.toml: planes``) or the named scenario
    (``planes (set by scenario 'default')``); a field without a label is named as is.
    """

    def __init__(self, field_name, message, *, labels=None):
        self.field = field_name
        self.message = message
        self.labels = dict(labels or {})
        super().__init__(f"{self.where}: {self.what}")

    def label(self, name):
        return self.labels.get(name, name)

    @property
    def where(self):
        """The field, named by where its value came from."""
        return self.label(self.field)

    @property
    def what(self):
        """What is wrong, with the other fields it mentions named by where they came from."""
        text = self.message
        for name in {*self.labels, *_FIELD_NAMES}:
            label = self.label(name)
            if label.endswith(f": {name}"):          # "run.toml: planes" inside a sentence
                label = f"{name} in {label.removesuffix(f': {name}')}"
            text = text.replace(f"{{{name}}}", label)
        return text

    def relabel(self, labels):
        """The same error, naming fields with ``labels`` (over the ones it has)."""
        return ScenarioError(self.field, self.message, labels={**self.labels, **labels})


# -- the rules: one place for the allowed values, used by the checks and by --help -----------

def _int(lo, hi):
    return ("integer", lo, hi)


def _number(lo, hi):
    return ("number", lo, hi)


def _choice(*values):
    return ("choice", values)


_BOOL = ("bool",)

#: Allowed values per field, in the order they are checked. ``None`` as a bound is computed
#: from the other fields (see :meth:`Scenario._bounds`).
_RULES = {
    "nic_config": ("config",),
    "planes": _int(1, 16),
    "paths": _int(1, 64),
    "nics": _int(2, MAX_NICS),
    "pattern": _choice(*PATTERNS),
    "qps": _int(1, MAX_QPS),
    "bytes": _int(1, 1 << 30),
    "msg_size": _int(0, 1 << 30),
    "mtu": _choice(*MTUS),
    "evs": _int(1, MAX_EVS),
    "both_ways": _BOOL,
    "fail_plane": _int(0, None),
    "fail_at_us": _number(0, 10**9),
    "recover_at_us": _number(0, 10**9),
    "fail_kind": _choice("blackhole", "flap"),
    "fail_all": _BOOL,
    "flap_period_us": _number(0.01, 10**9),
    "loss": _number(0.0, 0.5),
    "duplicate": _number(0.0, 0.5),
    "corrupt": _number(0.0, 0.5),
    "trim_threshold": _int(0, 1 << 30),
    "ecn_threshold": _int(0, 1 << 30),
    "queue_bytes": _int(1, 1 << 30),
    "latency_us": _number(0.0, 10**6),
    "timeout": _int(0, P.LOCAL_ACK_TIMEOUT_MAX),
    "retry_linear": _int(0, P.RETRY_LINEAR_MAX),
    "retry_exponential": _int(0, P.RETRY_EXPONENTIAL_MAX),
    "infer_k": _int(0, (1 << INFER_K_BITS) - 1),
    "reo_wnd": _int(0, (1 << REO_WND_BITS) - 1),
    "port_wnd": _int(0, (1 << WATCH_WINDOW_BITS) - 1),
    "port_quiet": _int(0, (1 << WATCH_WINDOW_BITS) - 1),
    "fate": _int(0, 1),
    "cc": _int(0, 1),
    "cc_algorithm": _choice(*CC_ALGORITHMS),
    "ack_every": _int(1, 255),
    "ack_delay": _int(1, (1 << 32) - 1),
    "coalesce_gaps": _int(0, 1),
    "gap_depth": _int(0, (1 << GAP_DEPTH_BITS) - 1),
    "ack_new_holes": _int(0, 1),
    "seed": _int(0, (1 << 31) - 1),
    "backend": _choice("rtl", "model"),
    "baseline": _choice("ecmp", None),
    "sim": _choice("verilator", "icarus"),
    "waves": _BOOL,
    "waves_from_us": _number(0, 1e7),
    "waves_to_us": _number(0, 1e7),
    "max_us": _number(1.0, 10**7),
    "extra": ("table",),
}

#: Fields whose ``None`` means "none"/"never" (spelled -1 or "none" on the command line and in
#: scenario files).
_NULLABLE = {"fail_plane", "fail_at_us", "recover_at_us", "baseline", "nic_config",
             "waves_from_us", "waves_to_us"}


def _spell(value):
    return "none" if value is None else str(value)


def _allowed_text(rule):
    kind = rule[0]
    if kind in ("integer", "number"):
        return f"{'an integer' if kind == 'integer' else 'a number'} from {rule[1]} to {rule[2]}"
    if kind == "choice":
        values = [_spell(v) for v in rule[1]]
        if len(values) == 2:
            return f"{values[0]} or {values[1]}"
        return f"one of {', '.join(values)}"
    if kind == "bool":
        return "true or false"
    if kind == "table":
        return "a table"
    return "a NicConfig table"


def allowed(name):
    """The allowed values of a field, as ``--help`` shows them."""
    special = {
        "qps": f"an integer from 1 to {MAX_QPS}, or to the qps (and evs_per_profile) of "
               f"--config",
        "evs": f"an integer from 1 to {MAX_EVS}, or to the evs_per_profile of --config",
        "planes": "an integer from 1 to 16; with --config, its ports",
        "nics": f"an integer from 2 to {MAX_NICS}, even with --pattern pairs",
        "mtu": f"one of {', '.join(map(str, MTUS))}; with --config, its mtu",
        "fail_plane": "an integer from 0 to planes - 1, or -1 for no failure",
        "fail_at_us": f"a number from 0 to {10**9}",
        "recover_at_us": f"a number after the failure time, up to {10**9}, or -1 for never",
    }
    return special.get(name) or _allowed_text(_RULES[name])


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """Every parameter of one run. Times in microseconds of simulated time, sizes in bytes.

    ``fail_at_us``/``recover_at_us`` of ``None`` mean "never". ``fail_all`` fails every plane
    alike (the retry-exhaustion case). ``fail_kind`` ``blackhole``
    drops every frame crossing the plane while it is down; ``flap`` alternates down and up
    every ``flap_period_us / 2``. ``baseline`` ``ecmp`` gives every QP one fixed EV (the
    profile in AUTO mode): the single-path baseline on the same fabric. ``nic_config`` (a
    :class:`NicConfig` as a dict) is the NIC build; ``None`` is the main job's build
    (:func:`nic_config_for`). The defaults are ``sim/scenarios/default.toml``'s.
    """
    name: str = "default"
    planes: int = 8
    paths: int = 4
    nics: int = 2
    pattern: str = "pairs"
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
    reo_wnd: int = 48
    port_wnd: int = 20
    port_quiet: int = 40
    fate: int = 1
    cc: int = 1
    cc_algorithm: str = "nscc"
    ack_every: int = DEFAULT_ACK_EVERY
    ack_delay: int = DEFAULT_ACK_DELAY
    coalesce_gaps: int = DEFAULT_COALESCE_GAPS
    gap_depth: int = DEFAULT_GAP_DEPTH
    ack_new_holes: int = DEFAULT_ACK_NEW_HOLES
    seed: int = 1
    backend: str = "rtl"
    baseline: str | None = None
    sim: str = "verilator"
    waves: bool = False
    waves_from_us: float | None = None    # the waves' window, us from the simulation's start
    waves_to_us: float | None = None      # (None: open); docs/sim.md, "Waveforms"
    max_us: float = 5000.0
    extra: dict = field(default_factory=dict)
    nic_config: dict | None = None

    def __post_init__(self):
        config = None
        for name, rule in _RULES.items():
            value = getattr(self, name)
            if value is None and name in _NULLABLE:
                continue
            kind = rule[0]
            if kind == "config":
                config = self._check_config(value)
            elif kind in ("integer", "number"):
                self._check_range(name, kind, *self._bounds(name, rule, config))
            elif kind == "choice":
                if value not in rule[1]:
                    self._fail(name, _allowed_text(rule))
            elif kind == "bool":
                if not isinstance(value, bool):
                    self._fail(name, "true or false")
            elif not isinstance(value, dict):
                self._fail(name, "a table")
            if name == "recover_at_us" and self.fail_at_us is not None \
                    and not value > self.fail_at_us:
                raise ScenarioError(name, f"must be later than {self.fail_at_us} us, the "
                                          f"failure time {{fail_at_us}}, not {value!r}")
            if name == "waves_to_us" and self.waves_from_us is not None \
                    and not value > self.waves_from_us:
                raise ScenarioError(name, f"must be later than {self.waves_from_us} us, the "
                                          f"start of the waves {{waves_from_us}}, not {value!r}")
        if config is not None:
            for name, built in (("planes", "ports"), ("mtu", "mtu")):
                if getattr(self, name) != getattr(config, built):
                    raise ScenarioError(name, f"must be {getattr(config, built)} (the {built} "
                                              f"of {{nic_config}}), not "
                                              f"{getattr(self, name)!r}")
        if self.pattern == "pairs" and self.nics % 2:
            raise ScenarioError("nics", f"must be even when {{pattern}} is pairs (NIC 2k "
                                        f"talks to NIC 2k + 1), not {self.nics!r}")
        if not (isinstance(self.name, str) and self.name
                and self.name.replace("-", "").replace("_", "").isalnum()):
            self._fail("name", "letters, digits, '-' and '_'")

    def _fail(self, name, allowed_text):
        raise ScenarioError(name, f"must be {allowed_text}, not {getattr(self, name)!r}")

    def _bounds(self, name, rule, config):
        """(lo, hi, what sets hi or None): a rule's bounds with those from other fields."""
        _, lo, hi = rule
        if name == "fail_plane":
            return lo, self.planes - 1, "one less than {planes}"
        if config is not None and name == "qps":
            # QP n starts at EV n of the profile (sim/model/pair.py, sim/tb/cocotb_fabric.py).
            if config.evs_per_profile < config.qps:
                return lo, config.evs_per_profile, ("the evs_per_profile of {nic_config}: QP n "
                                                    "starts at EV n")
            return lo, config.qps, "the qps of {nic_config}"
        if config is not None and name == "evs":
            return lo, config.evs_per_profile, "the evs_per_profile of {nic_config}"
        return lo, hi, None

    def _check_range(self, name, kind, lo, hi, why):
        value = getattr(self, name)
        types = int if kind == "integer" else int | float
        if isinstance(value, types) and not isinstance(value, bool) and lo <= value <= hi:
            return
        text = f"{'an integer' if kind == 'integer' else 'a number'} from {lo} to {hi}"
        if why:
            text += f" ({why})"
        raise ScenarioError(name, f"must be {text}, not {value!r}")

    @staticmethod
    def _check_config(value):
        if not isinstance(value, dict):
            raise ScenarioError("nic_config", f"must be a NicConfig table, not {value!r}")
        try:
            return NicConfig.from_dict(value)
        except ConfigError as e:
            raise ScenarioError("nic_config", f"{e.field}: "
                                f"{str(e).removeprefix(f'NicConfig.{e.field} ')}") from None

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
        unknown = set(values) - _FIELD_NAMES
        if unknown:
            raise ScenarioError(sorted(unknown)[0], _unknown(sorted(unknown)[0]))
        return cls(**values)


_FIELD_NAMES = {f.name for f in dataclasses.fields(Scenario)}


def _unknown(name):
    close = difflib.get_close_matches(name, sorted(_FIELD_NAMES), n=1)
    hint = f"did you mean {close[0]!r}?" if close else \
        "sim/scenarios/default.toml lists every field"
    return f"not a scenario field ({hint})"


def nic_config_for(scn):
    """The NIC build a scenario runs on (both NICs alike): its ``nic_config`` when it has one,
    else the main job's build, where only ``planes`` and ``mtu`` change the build and QP and
    EV counts are table sizes chosen to cover every allowed value."""
    if scn.nic_config is not None:
        return NicConfig.from_dict(scn.nic_config)
    qps = MAX_QPS
    while qps < qps_per_nic(scn):           # more NICs: one block of QPs per peer
        qps *= 2
    return NicConfig(ports=scn.planes, qps=qps, mpr_units=1, ev_profiles=1,
                     evs_per_profile=MAX_EVS, max_wimm=4, wr_slots=4, mtu=scn.mtu)


def qps_per_nic(scn):
    """QPs the busiest NIC of a scenario uses: ``qps`` per peer it talks to."""
    peers = 1 if scn.pattern == "pairs" else scn.nics - 1
    return scn.qps * peers


def line_rate_gbps(config):
    """The NIC engine's line rate: one datapath beat per cycle."""
    return config.data_width * config.clock_hz / 1e9


#: How often the fuzz bench's control plane probes every ASSUMED_BAD EV (the fabric benches
#: and the model runs probe on a per-EV backoff: sim.probing).
PROBE_INTERVAL_US = 10.0


# -- scenario files ---------------------------------------------------------------------------

#: Keys of a scenario file that are not scenario fields.
_FILE_KEYS = {"description", "base"}


def scenario_names():
    """The named scenarios (``sim/scenarios/*.toml``), ``default`` first."""
    names = sorted(path.stem for path in SCENARIO_DIR.glob("*.toml"))
    return sorted(names, key=lambda name: name != "default")


def _normalize(values):
    """The flags' and the files' spellings of "none": -1 for ``fail_plane`` (no failure: no
    failure time either) and ``recover_at_us``, ``"none"`` for ``baseline``."""
    values = dict(values)
    plane = values.get("fail_plane")
    if isinstance(plane, int) and not isinstance(plane, bool) and plane < 0:
        values.update(fail_plane=None, fail_at_us=None, recover_at_us=None)
    recover = values.get("recover_at_us")
    if isinstance(recover, int | float) and not isinstance(recover, bool) and recover < 0:
        values["recover_at_us"] = None
    if values.get("baseline") == "none":
        values["baseline"] = None
    return values


def _locate(spec):
    """(path, name) of a named scenario (name) or a scenario file (name None)."""
    spec = str(spec)
    if spec in scenario_names():
        return SCENARIO_DIR / f"{spec}.toml", spec
    path = Path(spec)
    if spec.endswith(".toml") or path.exists() or "/" in spec:
        return path, None
    raise ScenarioError("scenario", f"must be a named scenario ({', '.join(scenario_names())}) "
                                    f"or a .toml file, not {spec!r}")


def _read(path, name, seen=()):
    """(values, labels, description) of a scenario file, merged over its base."""
    def label(key):
        return f"{key} (set by scenario '{name}')" if name else f"{path}: {key}"

    try:
        document = tomllib.loads(path.read_text())
    except OSError as e:
        raise ScenarioError("scenario", f"{path}: cannot read: {e.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ScenarioError(str(path), f"not a valid TOML file: {e}") from None
    for key in document:
        if key not in _FIELD_NAMES | _FILE_KEYS:
            raise ScenarioError(key, _unknown(key), labels={key: label(key)})
    description = document.pop("description", "")
    if not isinstance(description, str):
        raise ScenarioError("description", f"must be a string, not {description!r}",
                            labels={"description": label("description")})
    base = document.pop("base", None if name == "default" else "default")
    values, labels = {}, {}
    if base is not None:
        if base not in scenario_names() or base in seen or base == name:
            raise ScenarioError("base", f"must be a named scenario other than this one "
                                        f"({', '.join(scenario_names())}), not {base!r}",
                                labels={"base": label("base")})
        values, labels, _ = _read(SCENARIO_DIR / f"{base}.toml", base, (*seen, base))
        values.pop("name", None)
        labels.pop("name", None)
    document = _normalize(document)
    values.update(document)
    labels.update({key: label(key) for key in document})
    return values, labels, description


def load(spec="default", overrides=None, *, labels=None):
    """The scenario ``spec`` names (a named scenario or a scenario file) with ``overrides``
    on top (``None`` values are ignored; -1 and ``"none"`` mean "none" as in a file).

    ``labels`` names the fields ``overrides`` set in errors (the flags: ``{"planes":
    "--planes"}``). Returns ``(scenario, path of the file)``; raises :class:`ScenarioError`.
    """
    path, name = _locate(spec)
    values, where, _ = _read(path, name)
    values.setdefault("name", name or path.stem)
    where.setdefault("name", f"name (set by scenario '{name}')" if name
                     else f"{path}: name (from the file's name)")
    changes = {key: value for key, value in (overrides or {}).items() if value is not None}
    for key in changes:
        if key not in _FIELD_NAMES:
            raise ScenarioError(key, _unknown(key), labels=labels)
    changes = _normalize(changes)
    values.update(changes)
    where.update({key: (labels or {}).get(key, key) for key in changes})
    try:
        return Scenario(**values), path
    except ScenarioError as e:
        raise e.relabel(where) from None


def describe_scenarios():
    """``[(name, description)]`` of the named scenarios."""
    return [(name, _read(SCENARIO_DIR / f"{name}.toml", name)[2]) for name in scenario_names()]


def scenario(name="default", **overrides):
    """The named scenario (or scenario file) with ``overrides`` applied (``None`` values are
    ignored)."""
    return load(name, overrides)[0]


#: The named scenarios (``--scenario NAME``), read from ``sim/scenarios/``.
SCENARIOS = {name: scenario(name) for name in scenario_names()}
