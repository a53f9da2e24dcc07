"""NSCC, the congestion control of UET 1.0, for the model requester (the RTL's, in integers:
:mod:`hdl.transport.req_nscc`).

A window in bytes per QP, driven by every ACK's round trip (the SACK's CC_STATE echo of the
data packet's TSETH timestamp), its ECN echo and the NACKs of trimmed packets. The main
job's default (``mrc-nic sim``, ``cc_algorithm = "nscc"``; ``--cc ecn`` for the ECN window of
``docs/requester.md``); a model NIC or requester configured without a scenario keeps the ECN
window, as the RTL requester does after reset.

The rules, as UEC's public htsim model (``initNsccParams`` and the NSCC update) states them:

* Scale: a reference network of :data:`REFERENCE_RATE_GBPS` and :data:`REFERENCE_RTT_NS`;
  ``a`` = BDP / reference BDP, ``b`` = target queueing delay / reference RTT; the target is
  :data:`TARGET_RTTS_TRIMMING` x the base RTT when the fabric trims, else
  :data:`TARGET_RTTS` x; ``alpha`` = 4 MSS a b / target, ``fi`` = 5 MSS a, ``eta`` = 0.15 MSS
  a, ``fi_scale`` = 0.25 a; the window stays in [MTU, 1.5 x BDP].
* Per ACK (delay = RTT - base RTT, the base RTT the least RTT seen; ``acked`` its newly
  acknowledged bytes): no CE and delay below target: ``inc += alpha acked (target -
  delay)``; no CE, delay at or above target: ``inc += fi acked``; CE below target: nothing;
  CE at or above target: ``cwnd *= max(1 - gamma (avg - target) / avg, 0.5)`` (``avg`` the
  delay's EWMA; only while ``avg`` is over the target), at most once per base RTT.
* Every adjust period (one base RTT or :data:`ADJUST_MTUS` MTUs acknowledged, whichever
  first): ``cwnd += inc / cwnd``, and ``eta`` once per base RTT.
* Fast increase (in the no-CE, below-target case): once a whole window was acknowledged with
  delays under :data:`FAST_INCREASE_DELAY_NS`, each such ACK adds ``acked x fi_scale`` in place
  of the proportional increase, until a delay of 1 us or more or a decrease.
* Quick adapt, checked first on every ACK and NACK but acting at most once per base RTT +
  target (at the end of such a period): when a NACK came in the period or this ACK's delay is
  over :data:`QUICK_ADAPT_TARGETS` x target, and the bytes acknowledged in the period are
  under the maximum window >> :data:`QUICK_ADAPT_GATE`, the window becomes those bytes (and
  the ACK changes nothing else).
* A NACK takes its bytes off the window (unless quick adapt just set it).

Acknowledged bytes count whole PSNs at the MTU (a message's shorter last packet counts as a
full one). Times are ns.
"""

import math

from hdl.transport.nscc_defs import (  # noqa: F401 (the model's names, defined once)
    ADJUST_MTUS,
    ALPHA_MSS,
    CC_ALGORITHMS,
    DELAY_EWMA_WEIGHT,
    ETA_MSS,
    FAST_INCREASE_DELAY_NS,
    FI_MSS,
    FI_SCALE,
    GAMMA,
    MAX_WINDOW_BDPS,
    MD_FLOOR,
    QUICK_ADAPT_GATE,
    QUICK_ADAPT_TARGETS,
    REFERENCE_RATE_GBPS,
    REFERENCE_RTT_NS,
    TARGET_RTTS,
    TARGET_RTTS_TRIMMING,
    NsccParameters,
    NsccSetting,
)

__all__ = ["NsccSetting", "NsccParameters", "Nscc", "setting_for", "acks_share_planes",
           "CC_ALGORITHMS", "REFERENCE_RATE_GBPS",
           "REFERENCE_RTT_NS", "TARGET_RTTS", "TARGET_RTTS_TRIMMING", "GAMMA",
           "DELAY_EWMA_WEIGHT", "QUICK_ADAPT_TARGETS", "QUICK_ADAPT_GATE", "ADJUST_MTUS",
           "FAST_INCREASE_DELAY_NS", "MAX_WINDOW_BDPS", "MD_FLOOR"]


class Nscc:
    """One QP's NSCC state. ``cwnd`` (bytes) starts at one BDP (within the clamps).

    Call :meth:`on_ack` for every ACK that acknowledges bytes or echoes CE, :meth:`on_nack`
    for every NACK (a trimmed packet); read :attr:`cwnd` or :meth:`window_psns`.
    """

    def __init__(self, setting, now_ns=0.0):
        if not isinstance(setting, NsccSetting):
            raise TypeError(f"setting must be an NsccSetting, not {setting!r}")
        self.p = p = NsccParameters(setting)
        self.cwnd = self._clamp(p.bdp)
        self.base_rtt_ns = math.inf         # the least RTT seen
        self.avg_delay_ns = 0.0
        self.inc = 0.0                      # the adjust period's accumulated increase
        self.adjust_bytes = 0
        self.adjust_start_ns = now_ns
        self.eta_ns = now_ns                # when eta was last added
        self.md_ns = -math.inf              # when the window last decreased
        self.fast_bytes = 0                 # bytes acknowledged in a row under the fast delay
        self.fast = False                   # fast increase on (until a delay of 1 us or more)
        self.qa_end_ns = now_ns + self._rtt() + p.target_ns
        self.qa_bytes = 0                   # bytes acknowledged in this quick-adapt period
        self.qa_triggered = False           # a NACK came: quick adapt at the period's end
        self.quick_adapts = 0

    def _rtt(self):
        return self.p.setting.base_rtt_ns if self.base_rtt_ns == math.inf else self.base_rtt_ns

    def _clamp(self, cwnd):
        return min(max(cwnd, self.p.min_window), self.p.max_window)

    def window_psns(self):
        """The window as whole MTU packets, at least one."""
        return max(1, int(self.cwnd // self.p.setting.mtu))

    def on_ack(self, now_ns, acked_bytes, rtt_ns, ecn):
        """One ACK at ``now_ns``: ``acked_bytes`` newly acknowledged, its RTT sample and
        whether it echoes CE. Returns the rule that acted (``"quick-adapt"``, ``"fast"``,
        ``"proportional"``, ``"fair"``, ``"hold"``, ``"decrease"`` or ``"decrease-held"``)."""
        p = self.p
        self.base_rtt_ns = min(self.base_rtt_ns, rtt_ns)
        delay = max(0.0, rtt_ns - self.base_rtt_ns)
        self.avg_delay_ns += DELAY_EWMA_WEIGHT * (delay - self.avg_delay_ns)
        self.qa_bytes += acked_bytes
        if self._quick_adapt(now_ns, delay > QUICK_ADAPT_TARGETS * p.target_ns):
            return "quick-adapt"
        if delay >= FAST_INCREASE_DELAY_NS:
            self.fast_bytes, self.fast = 0, False
        target = p.target_ns
        if not ecn and delay < target:
            rule = "proportional"
            if delay < FAST_INCREASE_DELAY_NS:
                self.fast_bytes += acked_bytes
                if self.fast or self.fast_bytes >= self.cwnd:
                    # A whole window under the fast delay: grow at once, and on each such
                    # ACK until a delay of FAST_INCREASE_DELAY_NS or more (or a decrease).
                    self.fast = True
                    self.cwnd += acked_bytes * p.fi_scale
                    rule = "fast"
            if rule == "proportional":
                self.inc += p.alpha * acked_bytes * (target - delay)
        elif not ecn:
            self.inc += p.fi * acked_bytes
            rule = "fair"
        elif delay < target:
            rule = "hold"
        else:
            self.fast_bytes, self.fast = 0, False
            avg = self.avg_delay_ns
            if avg > target and now_ns - self.md_ns >= self._rtt():
                self.cwnd *= max(1 - GAMMA * (avg - target) / avg, MD_FLOOR)
                self.md_ns = now_ns
                rule = "decrease"
            else:
                rule = "decrease-held"
        self.cwnd = self._clamp(self.cwnd)
        self._adjust(now_ns, acked_bytes)
        return rule

    def on_nack(self, now_ns, nacked_bytes):
        """A NACK (a trimmed packet) of ``nacked_bytes``: it triggers quick adapt (at the end
        of the period); unless quick adapt acts now, the bytes come off the window. Returns
        whether quick adapt acted."""
        self.qa_triggered = True
        if self._quick_adapt(now_ns, False):
            return True
        self.cwnd = self._clamp(self.cwnd - nacked_bytes)
        return False

    def _adjust(self, now_ns, acked_bytes):
        self.adjust_bytes += acked_bytes
        rtt = self._rtt()
        if self.adjust_bytes < ADJUST_MTUS * self.p.setting.mtu \
                and now_ns - self.adjust_start_ns < rtt:
            return
        cwnd = self.cwnd + self.inc / self.cwnd
        if now_ns - self.eta_ns >= rtt:
            cwnd += self.p.eta
            self.eta_ns = now_ns
        self.cwnd = self._clamp(cwnd)
        self.inc = 0.0
        self.adjust_bytes = 0
        self.adjust_start_ns = now_ns

    def _quick_adapt(self, now_ns, delayed):
        """At the end of a quick-adapt period: act if a NACK came (:attr:`qa_triggered`) or
        this ACK's delay is over the threshold (``delayed``), and the period's bytes are under
        the gate; start the next period. Returns whether it acted."""
        if now_ns < self.qa_end_ns:
            return False
        acted = (self.qa_triggered or delayed) \
            and self.qa_bytes < self.p.max_window / (1 << QUICK_ADAPT_GATE)
        if acted:
            self.cwnd = self._clamp(self.qa_bytes)
            self.quick_adapts += 1
            self.qa_triggered = False
            self.inc = 0.0
            self.adjust_bytes = 0
        self.qa_bytes = 0
        self.qa_end_ns = now_ns + self._rtt() + self.p.target_ns
        return acted


def setting_for(scn, config):
    """The :class:`NsccSetting` of a scenario on a NIC build: the NIC's line rate, the round
    trip of an MTU data packet and its ACK over the scenario's unloaded fabric (both
    latencies, both serializations at the plane rate), trimming when the scenario's fabric
    trims.

    When the peers send to each other (:func:`acks_share_planes`), an ACK also waits behind
    the peer's data frame in service on its plane, half a frame on average: the round trip
    counts that wait (``docs/congestion.md``, "The round trip when ACKs share the planes")."""
    rate = config.data_width * config.clock_hz / 1e9
    plane_rate = rate / config.ports
    frame_bytes = config.mtu + _DATA_HEADER_BYTES
    rtt_ns = 2 * scn.latency_us * 1000 + (frame_bytes + _ACK_FRAME_BYTES) * 8 / plane_rate
    if acks_share_planes(scn):
        rtt_ns += frame_bytes * 8 / plane_rate / 2
    return NsccSetting(line_rate_gbps=rate, base_rtt_ns=rtt_ns, mtu=config.mtu,
                       trimming=scn.trim_threshold > 0)


def acks_share_planes(scn):
    """Whether a scenario's ACKs travel on planes that also carry data the other way: NICs
    that send to each other (pairs both ways, all-to-all); in an incast only ACKs go back."""
    return scn.pattern == "all-to-all" or (scn.pattern == "pairs" and scn.both_ways)


# Frame sizes for the idle round trip (as sim.analysis.base_rtt_ns assumes): the headers of
# an IPv6 data packet with its TSETH, and a SACK.
_DATA_HEADER_BYTES = 110
_ACK_FRAME_BYTES = 110
