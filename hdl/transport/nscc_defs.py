"""NSCC's protocol constants and parameters, the one definition shared by the RTL engine
(:mod:`hdl.transport.req_nscc`) and the model (:mod:`sim.model.nscc`, whose docstring states
the rules), as UEC's public htsim model (``initNsccParams``) gives them."""

import math
from dataclasses import dataclass

__all__ = ["NsccSetting", "NsccParameters", "CC_ALGORITHMS", "REFERENCE_RATE_GBPS",
           "REFERENCE_RTT_NS", "TARGET_RTTS", "TARGET_RTTS_TRIMMING", "ALPHA_MSS", "FI_MSS",
           "ETA_MSS", "FI_SCALE", "GAMMA", "MD_FLOOR", "DELAY_EWMA_WEIGHT",
           "QUICK_ADAPT_TARGETS", "QUICK_ADAPT_GATE", "ADJUST_MTUS", "FAST_INCREASE_DELAY_NS",
           "MAX_WINDOW_BDPS"]

#: The congestion window's algorithms: the ECN window and NSCC.
CC_ALGORITHMS = ("ecn", "nscc")
#: The reference network the parameters scale from.
REFERENCE_RATE_GBPS = 100.0
REFERENCE_RTT_NS = 12_000.0
#: Target queueing delay in base RTTs, with and without trimming in the fabric.
TARGET_RTTS = 1.0
TARGET_RTTS_TRIMMING = 0.75
#: alpha = ALPHA_MSS x MSS x a x b / target; fi = FI_MSS x MSS x a; eta = ETA_MSS x MSS x a;
#: fi_scale = FI_SCALE x a.
ALPHA_MSS = 4.0
FI_MSS = 5.0
ETA_MSS = 0.15
FI_SCALE = 0.25
#: Multiplicative decrease: gamma, and the least factor a decrease multiplies by.
GAMMA = 0.8
MD_FLOOR = 0.5
#: Weight of a new sample in the delay's EWMA.
DELAY_EWMA_WEIGHT = 0.0125
#: Quick adapt: a delay over this many targets triggers it; it acts only when the bytes of
#: the period are under max window >> QUICK_ADAPT_GATE.
QUICK_ADAPT_TARGETS = 4.0
QUICK_ADAPT_GATE = 3
#: The adjust period ends after a base RTT or this many MTUs acknowledged.
ADJUST_MTUS = 8
#: Fast increase: delays under this for a whole window.
FAST_INCREASE_DELAY_NS = 1000.0
#: The window's ceiling in BDPs (its floor is one MTU).
MAX_WINDOW_BDPS = 1.5


@dataclass(frozen=True, kw_only=True)
class NsccSetting:
    """What NSCC scales from: the sender's line rate (Gbit/s), the network's idle round trip
    (ns), the MTU (the MSS, bytes) and whether the fabric trims."""
    line_rate_gbps: float
    base_rtt_ns: float
    mtu: int
    trimming: bool = False

    def __post_init__(self):
        for name in ("line_rate_gbps", "base_rtt_ns", "mtu"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not value > 0 or math.isinf(value):
                raise ValueError(f"NsccSetting.{name} must be a positive number, not {value!r}")


@dataclass(frozen=True)
class NsccParameters:
    """The parameters derived from a :class:`NsccSetting` (bytes, ns)."""
    setting: NsccSetting

    @property
    def bdp(self):
        return self.setting.line_rate_gbps / 8 * self.setting.base_rtt_ns

    @property
    def a(self):
        return self.bdp / (REFERENCE_RATE_GBPS / 8 * REFERENCE_RTT_NS)

    @property
    def target_ns(self):
        rtts = TARGET_RTTS_TRIMMING if self.setting.trimming else TARGET_RTTS
        return rtts * self.setting.base_rtt_ns

    @property
    def b(self):
        return self.target_ns / REFERENCE_RTT_NS

    @property
    def alpha(self):
        return ALPHA_MSS * self.setting.mtu * self.a * self.b / self.target_ns

    @property
    def fi(self):
        return FI_MSS * self.setting.mtu * self.a

    @property
    def eta(self):
        return ETA_MSS * self.setting.mtu * self.a

    @property
    def fi_scale(self):
        return FI_SCALE * self.a

    @property
    def max_window(self):
        return MAX_WINDOW_BDPS * self.bdp

    @property
    def min_window(self):
        return float(self.setting.mtu)
