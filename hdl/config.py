"""Build parameters of the NIC: one frozen, validated dataclass shared by every consumer.

The gateware, the reference model, the benches and the CLI all take a :class:`NicConfig`, so a
parameter has one name, one default and one allowed range. A bad value raises
:class:`ConfigError` naming the field and its allowed range.
"""

import dataclasses
import json
from dataclasses import dataclass

from . import protocol as P

__all__ = ["NicConfig", "ConfigError", "PSN_CHUNK"]

#: The requester's shared per-PSN state (``psn_pool``) is handed out to QPs in chunks of this
#: many consecutive PSNs, aligned to multiples of it (*project choice*: a QP takes one chunk
#: per 16 packets, and its chunk map holds one entry per 16 PSNs of its window).
PSN_CHUNK = 16


class ConfigError(ValueError):
    """A configuration value outside its allowed range; ``field`` names the parameter."""

    def __init__(self, field, message):
        super().__init__(f"NicConfig.{field} {message}")
        self.field = field


def _choice(*values):
    return {"choices": values}


def _range(lo, hi):
    return {"range": (lo, hi)}


# name: (default, rule, description). The order is the order of the docs table.
_PARAMETERS = {
    "data_width": (64, _choice(64, 128, 256), "datapath width in bits (one beat per cycle)"),
    "ports": (8, _range(1, 16), "network ports, one per plane"),
    "qps": (256, _choice(*(1 << n for n in range(1, 11))), "queue pairs (per-QP state in BRAM)"),
    "mpr_units": (2, _range(1, 8), "max PSN range, out-of-order window, units of 128 PSNs"),
    "ev_profiles": (4, _range(1, 16), "EV profiles held in the path-select unit"),
    "evs_per_profile": (64, _range(1, 256), "EVs per profile"),
    "mtu": (1024, _choice(256, 512, 1024, 2048, 4096), "path MTU: payload bytes per packet"),
    "max_wimm": (16, _range(1, 255), "upper bound of a QP's max WRITE_IMMs in flight"),
    "wr_slots": (16, _range(1, 64), "outstanding work requests per QP (completion ring)"),
    "wr_pool": (1024, _range(2, 16384),
                "outstanding work requests over all QPs (shared WR pool), at least wr_slots"),
    "psn_pool": (4096, _range(32, 262144),
                 "data packets in flight over all QPs (shared per-PSN state), a multiple of 16"),
    "segmenters": (4, _range(1, 16),
                   "WRs cut into packets at once, each of a different QP (segmenter contexts)"),
    "ip_version": (6, _choice(4, 6), "IP version of the underlay the NIC builds"),
    "trim_dscp": (P.DEFAULT_TRIM_DSCP, _range(0, 63), "DSCP code point marking trimmed packets"),
    "clock_hz": (125_000_000, _range(1_000_000, 500_000_000), "engine clock frequency in Hz"),
}


@dataclass(frozen=True, kw_only=True)
class NicConfig:
    """Every build parameter of the NIC. Defaults: the flagship 8-plane, 64-bit configuration.

    Parameters
    ----------
    data_width, ports, qps, mpr_units, ev_profiles, evs_per_profile, mtu,
    max_wimm, wr_slots, wr_pool, psn_pool, segmenters, ip_version, trim_dscp, clock_hz
        See :meth:`describe` (or ``docs/configuration.md``) for meaning and allowed range.
    """
    data_width: int = _PARAMETERS["data_width"][0]
    ports: int = _PARAMETERS["ports"][0]
    qps: int = _PARAMETERS["qps"][0]
    mpr_units: int = _PARAMETERS["mpr_units"][0]
    ev_profiles: int = _PARAMETERS["ev_profiles"][0]
    evs_per_profile: int = _PARAMETERS["evs_per_profile"][0]
    mtu: int = _PARAMETERS["mtu"][0]
    max_wimm: int = _PARAMETERS["max_wimm"][0]
    wr_slots: int = _PARAMETERS["wr_slots"][0]
    wr_pool: int = _PARAMETERS["wr_pool"][0]
    psn_pool: int = _PARAMETERS["psn_pool"][0]
    segmenters: int = _PARAMETERS["segmenters"][0]
    ip_version: int = _PARAMETERS["ip_version"][0]
    trim_dscp: int = _PARAMETERS["trim_dscp"][0]
    clock_hz: int = _PARAMETERS["clock_hz"][0]

    def __post_init__(self):
        for name, (_default, rule, _doc) in _PARAMETERS.items():
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ConfigError(name, f"must be an integer, not {value!r}")
            if "choices" in rule and value not in rule["choices"]:
                allowed = ", ".join(str(c) for c in rule["choices"])
                raise ConfigError(name, f"must be one of {allowed}, not {value!r}")
            if "range" in rule:
                lo, hi = rule["range"]
                if not lo <= value <= hi:
                    raise ConfigError(name, f"must be an integer from {lo} to {hi}, not {value!r}")
        if self.wr_pool < self.wr_slots:
            raise ConfigError("wr_pool", f"must be at least wr_slots ({self.wr_slots}), "
                                         f"not {self.wr_pool!r}")
        if self.psn_pool % PSN_CHUNK:
            raise ConfigError("psn_pool", f"must be a multiple of {PSN_CHUNK} (the PSNs of "
                                          f"a chunk), not {self.psn_pool!r}")

    # -- derived values ------------------------------------------------------------------------

    @property
    def bytes_per_beat(self):
        return self.data_width // 8

    @property
    def window_psns(self):
        """Out-of-order window in PSNs: MPR x 128."""
        return self.mpr_units * P.MPR_UNIT_PSNS

    @property
    def qpn_bits(self):
        """Bits of a local QP index (QPNs 0 .. qps-1)."""
        return max(1, (self.qps - 1).bit_length())

    @property
    def ev_index_bits(self):
        return max(1, (self.evs_per_profile - 1).bit_length())

    @property
    def profile_bits(self):
        return max(1, (self.ev_profiles - 1).bit_length())

    @property
    def window_bits(self):
        """Bits of a PSN offset inside the window (0 .. window_psns-1)."""
        return (self.window_psns - 1).bit_length()

    @property
    def line_rate_bps(self):
        """Engine line rate: one beat per cycle."""
        return self.data_width * self.clock_hz

    # -- conversions ---------------------------------------------------------------------------

    def replace(self, **changes):
        unknown = set(changes) - set(_PARAMETERS)
        if unknown:
            raise ConfigError(sorted(unknown)[0], f"is not a parameter; known: "
                                                  f"{', '.join(_PARAMETERS)}")
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, values):
        if not isinstance(values, dict):
            raise ConfigError("<file>", f"must be a JSON object, not {type(values).__name__}")
        return cls().replace(**values)

    @classmethod
    def from_json(cls, path):
        with open(path) as f:
            return cls.from_dict(json.load(f))

    def to_dict(self):
        return {name: getattr(self, name) for name in _PARAMETERS}

    @staticmethod
    def describe():
        """(name, default, allowed, description) for every parameter, for docs and ``--help``."""
        rows = []
        for name, (default, rule, doc) in _PARAMETERS.items():
            if "choices" in rule:
                allowed = ", ".join(str(c) for c in rule["choices"])
            else:
                allowed = "{} to {}".format(*rule["range"])
            rows.append((name, default, allowed, doc))
        return rows
