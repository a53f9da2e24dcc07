"""Figures of a run read off the fabric's records: what crossed which plane when.

Used in the process that owns the :class:`sim.fabric.Fabric` (the cocotb bench or the model
run), so every frame's fate is at hand. The recovery figures of ``report.json`` come from
here; ``docs/sim.md`` defines each one.
"""

from bisect import bisect_left

from hdl.packet.layouts import BTH

from .fabric.frames import parse, roce_payload_bytes
from .scenario import line_rate_gbps

__all__ = ["analyse", "data_info", "base_rtt_ns", "loaded_rtt_ns", "wire_shares",
           "goodput_samples", "ramp_up_end_ns", "traffic_end_ns", "window_goodput",
           "steady_goodput", "WINDOW_FRAMES", "RAMP_FRACTION"]

_DQPN = BTH.byte_offset("dqpn")
_PSN = BTH.byte_offset("psn")
_RTX_BYTE = BTH.byte_offset("rtx")
_RTX_MASK = 0x80 >> (BTH.bit_offset("rtx") % 8)


def data_info(frame):
    """``(dqpn, psn, retransmission)`` of a data packet (BTH.rtx), or ``None``."""
    info = parse(frame)
    if not info.is_data:
        return None
    b = info.bth_offset
    if len(frame) < b + BTH.size:
        return None
    dqpn = int.from_bytes(frame[b + _DQPN:b + _DQPN + 3], "big")
    psn = int.from_bytes(frame[b + _PSN:b + _PSN + 3], "big")
    return dqpn, psn, bool(frame[b + _RTX_BYTE] & _RTX_MASK)


def base_rtt_ns(fabric_config, mtu_frame_bytes, ack_frame_bytes=110):
    """Round trip of one MTU data packet and its ACK over an idle path: both propagation
    latencies plus both serializations at the plane rate."""
    rate = fabric_config.plane_rate_gbps(0)
    return (2 * fabric_config.path_latency_ns(0)
            + (mtu_frame_bytes + ack_frame_bytes) * 8 / rate)


def loaded_rtt_ns(records, lo_ns, hi_ns):
    """The round trip traffic actually saw in [lo, hi): the median one-way delay of the data
    frames delivered in that window plus the median one-way delay of the other delivered
    frames (ACKs, NAKs) in it, queueing included. ``None`` when either kind is missing."""
    data, acks = [], []
    for r in records:
        if r.arrival_ns is None or not lo_ns <= r.sent_ns < hi_ns:
            continue
        (data if parse(r.frame).is_data else acks).append(r.arrival_ns - r.sent_ns)
    if not data or not acks:
        return None
    data.sort()
    acks.sort()
    return data[len(data) // 2] + acks[len(acks) // 2]


def wire_shares(records, overhead_bytes=0):
    """How the NICs' transmit wire time was spent, over the sides that sent data: first
    transmissions of data packets, retransmissions (BTH.rtx), and every
    other frame those sides sent (ACKs, NAKs, probes: *control*), each as a share of the wire
    bytes (frame plus ``overhead_bytes``) of those sides. With traffic both ways a side's
    ACKs share its planes with its data; one way they travel on the otherwise idle reverse
    planes and are not counted. ``first_transmission`` bounds the efficiency: it is the
    efficiency the run would have had with the planes busy all the time (``docs/sim.md``).
    ``None`` without records (no capture) or without data."""
    sides = {}
    for r in records:
        if "duplicate" in r.marks:          # the fabric's copy, not something a NIC sent
            continue
        wire = r.sent_len + overhead_bytes
        info = data_info(r.frame) if r.sent_len > 60 else None
        kind = "control" if info is None else "retransmission" if info[2] else "first"
        side = sides.setdefault(r.src, {"first": 0, "retransmission": 0, "control": 0})
        side[kind] += wire
    senders = [v for v in sides.values() if v["first"] or v["retransmission"]]
    total = sum(sum(v.values()) for v in senders)
    if not total:
        return None
    share = {k: round(sum(v[k] for v in senders) / total, 4)
             for k in ("first", "retransmission", "control")}
    return {"first_transmission": share["first"], "retransmission": share["retransmission"],
            "control": share["control"], "data_sides": len(senders)}


# -- steady-state windows ---------------------------------------------------------------------

#: MTU data frames a goodput window holds at the line rate of the directions that carry data:
#: the rolling window of the ramp-up rule and the shortest window a goodput is reported for.
WINDOW_FRAMES = 20
#: The ramp-up ends when one window's goodput reaches this share of the goodput after it.
RAMP_FRACTION = 0.9
_GOODPUT_EXCLUDED = frozenset(("trimmed", "corrupted", "duplicate"))


def goodput_samples(records):
    """``(arrival_ns, payload_bytes)`` of every delivered data frame that counts as goodput
    (as :class:`sim.fabric.stats.Bin` counts it: intact, not the fabric's duplicate), sorted."""
    samples = []
    for r in records:
        if r.outcome != "delivered" or _GOODPUT_EXCLUDED & set(r.marks):
            continue
        payload = roce_payload_bytes(r.frame, parse(r.frame))
        if payload:
            samples.append((r.arrival_ns, payload))
    samples.sort()
    return samples


def _bytes_in(samples, times, lo_ns, hi_ns):
    """Payload bytes and frames of the samples that arrived in [lo, hi)."""
    first, last = bisect_left(times, lo_ns), bisect_left(times, hi_ns)
    return sum(b for _, b in samples[first:last]), last - first


def ramp_up_end_ns(samples, end_ns, window_ns, fraction=RAMP_FRACTION):
    """Where the ramp-up before ``end_ns`` ends: the earliest ``s`` (0 or an arrival time) whose
    window [s, s + W) carries at least ``fraction`` of the goodput rate of [s + W, end_ns),
    that rest being a window long at least; at most ``end_ns / 2`` (also when no window
    qualifies)."""
    cap = end_ns / 2
    times = [t for t, _ in samples]
    for start in [0.0, *times]:
        if start >= cap or start + 2 * window_ns > end_ns:
            break
        head, _ = _bytes_in(samples, times, start, start + window_ns)
        rest, _ = _bytes_in(samples, times, start + window_ns, end_ns)
        if rest and head / window_ns >= fraction * rest / (end_ns - start - window_ns):
            return start
    return cap


def traffic_end_ns(records, end_ns):
    """When the first sending side delivered its last new data packet (first transmission):
    after it fewer senders are left and the goodput drains. ``end_ns`` without data."""
    last = {}
    for r in records:
        if r.outcome != "delivered" or "duplicate" in r.marks or r.sent_len <= 60:
            continue
        info = data_info(r.frame)
        if info is not None and not info[2]:
            last[r.src] = max(last.get(r.src, 0.0), r.arrival_ns)
    return min(min(last.values()), end_ns) if last else end_ns


def window_goodput(samples, lo_ns, hi_ns, *, directions, line_rate_gbps, min_ns):
    """Goodput per direction over [lo, hi): the bounds always, the rates ``None`` when the
    window is shorter than ``min_ns``. ``None`` when the window is missing."""
    if lo_ns is None or hi_ns is None:
        return None
    times = [t for t, _ in samples]
    payload, frames = _bytes_in(samples, times, lo_ns, hi_ns) if hi_ns > lo_ns else (0, 0)
    out = {"from_us": round(lo_ns / 1000, 3), "to_us": round(hi_ns / 1000, 3),
           "frames": frames, "goodput_gbps": None, "relative_to_line_rate": None}
    if hi_ns - lo_ns >= min_ns:
        gbps = payload * 8 / (hi_ns - lo_ns) / directions
        out["goodput_gbps"] = round(gbps, 4)
        out["relative_to_line_rate"] = round(gbps / line_rate_gbps, 4)
    return out


def _ratio(top, bottom):
    if not top or not bottom or top["goodput_gbps"] is None or not bottom["goodput_gbps"]:
        return None
    return round(top["goodput_gbps"] / bottom["goodput_gbps"], 4)


def steady_goodput(samples, *, at_ns, recover_ns, abandoned_ns, returned_ns, settle_ns,
                   traffic_end_ns, directions, line_rate_gbps, window_ns):
    """The goodput of the steady-state windows around a failure (``docs/sim.md``):

    - *before*: from the end of the ramp-up (:func:`ramp_up_end_ns`) to the failure;
    - *during*: from the failure plus its allowance (the time the NICs took to put their last
      data packet on the dead plane, ``abandoned_ns`` after the failure, plus ``settle_ns``)
      to the recovery (or the end of the traffic);
    - *after*: from the recovery plus its allowance (until the first data packet on the
      recovered plane, ``returned_ns`` after the recovery, plus ``settle_ns``) to the end of
      the traffic (``traffic_end_ns``, :func:`traffic_end_ns`).
    """
    ramp = ramp_up_end_ns(samples, min(at_ns, traffic_end_ns), window_ns)
    fail_allowance = abandoned_ns + settle_ns
    during_end = traffic_end_ns if recover_ns is None else min(recover_ns, traffic_end_ns)
    common = {"directions": directions, "line_rate_gbps": line_rate_gbps, "min_ns": window_ns}
    out = {
        "window_us": round(window_ns / 1000, 3),
        "ramp_up_end_us": round(ramp / 1000, 3),
        "failure_allowance_us": round(fail_allowance / 1000, 3),
        "recovery_allowance_us": None,
        "traffic_end_us": round(traffic_end_ns / 1000, 3),
        "before": window_goodput(samples, ramp, min(at_ns, traffic_end_ns), **common),
        "during": window_goodput(samples, at_ns + fail_allowance, during_end, **common),
        "after": None,
    }
    if recover_ns is not None and recover_ns < traffic_end_ns:
        recover_allowance = returned_ns + settle_ns
        out["recovery_allowance_us"] = round(recover_allowance / 1000, 3)
        out["after"] = window_goodput(samples, recover_ns + recover_allowance, traffic_end_ns,
                                      **common)
    out["during_over_before"] = _ratio(out["during"], out["before"])
    out["after_over_before"] = _ratio(out["after"], out["before"])
    return out


def analyse(fabric, scn, config, *, end_ns):
    """The fabric-side figures of a run that ended at ``end_ns`` (fabric time)."""
    records = fabric.records
    stats = fabric.stats
    directions = 2 if scn.both_ways else 1
    out = {
        "trims": sum(1 for r in records if "trimmed" in r.marks),
        "ecn_marked": sum(1 for r in records if "ecn-marked" in r.marks),
        "fabric": {"planes": stats.to_dict()["planes"]},
        "wire_shares": wire_shares(records, fabric.config.wire_overhead_bytes),
        "failure": None,
    }
    failure = scn.failure
    if failure is None:
        return out
    plane = failure["plane"]
    at_ns = failure["at_us"] * 1000.0
    recover_ns = None if failure["recover_at_us"] is None else failure["recover_at_us"] * 1000.0
    down_until = recover_ns if recover_ns is not None else float("inf")
    mtu_frame = max((r.sent_len for r in records if parse(r.frame).is_data), default=1100)
    rtt = base_rtt_ns(fabric.config, mtu_frame)

    # The last data packet either NIC put onto the failed plane while it was down.
    last_on_dead = at_ns
    lost = {}               # (src, dqpn, psn) -> sent time of the lost copy
    resent = {}
    data = []
    for r in records:
        info = data_info(r.frame) if r.sent_len > 60 else None
        if info is None:
            continue
        data.append((r, info))
        if r.plane == plane and at_ns <= r.sent_ns < down_until:
            last_on_dead = max(last_on_dead, r.sent_ns)
    for r, (dqpn, psn, _) in data:
        if r.outcome == "dropped-failure" and r.sent_ns >= at_ns - rtt:
            key = (r.src, dqpn, psn)
            lost.setdefault(key, r.sent_ns)
    delivered_before = {}   # (src, dqpn, psn) -> earliest send of a copy that arrived
    for r, (dqpn, psn, _) in data:
        key = (r.src, dqpn, psn)
        if r.outcome == "delivered":
            delivered_before.setdefault(key, r.sent_ns)
        if key in lost and r.sent_ns > lost[key] and key not in resent:
            resent[key] = r.sent_ns
    # A lost copy of a PSN another copy had already carried needs no resend.
    for key in [k for k in lost if k not in resent and delivered_before.get(k, lost[k]) < lost[k]]:
        del lost[key]
    unresent = len(lost) - len(resent)
    # The loaded round trip just before the failure (the queues the traffic kept full).
    loaded = loaded_rtt_ns(records, max(0.0, at_ns - 4 * rtt), at_ns) or rtt
    timeout_us = 1.024 * (1 << scn.timeout)
    after = (max(resent.values()) - at_ns) / 1000 if resent else 0.0
    # The first data packet either NIC put onto the failed plane once it was back.
    returned = min((r.sent_ns for r, _ in data if r.plane == plane and recover_ns is not None
                    and r.sent_ns >= recover_ns), default=recover_ns)
    samples = goodput_samples(records) or [
        ((index + 0.5) * stats.bin_ns, entry.goodput_bytes)
        for bins in stats.bins for index, entry in bins.items() if entry.goodput_bytes]
    samples.sort()
    rate = sum(fabric.config.plane_rate_gbps(p) for p in range(fabric.config.planes))
    goodput = steady_goodput(
        samples, at_ns=at_ns, recover_ns=recover_ns, abandoned_ns=last_on_dead - at_ns,
        returned_ns=None if recover_ns is None else returned - recover_ns, settle_ns=loaded,
        traffic_end_ns=traffic_end_ns(records, end_ns), directions=directions,
        line_rate_gbps=line_rate_gbps(config),
        window_ns=WINDOW_FRAMES * mtu_frame * 8 / (rate * directions))
    out["failure"] = {
        "plane": plane, "kind": failure["kind"], "at_us": failure["at_us"],
        "recover_at_us": failure["recover_at_us"],
        "base_rtt_us": round(rtt / 1000, 3),
        "dead_plane_abandoned_after_us": round((last_on_dead - at_ns) / 1000, 3),
        "dead_plane_abandoned_after_rtts": round((last_on_dead - at_ns) / rtt, 2),
        "loaded_rtt_us": round(loaded / 1000, 3),
        "dead_plane_abandoned_after_loaded_rtts": round((last_on_dead - at_ns) / loaded, 2),
        "lost_psns": len(lost),
        "lost_psns_never_resent": unresent,
        "all_lost_resent_after_us": round(after, 3) if not unresent else None,
        "timeout_us": round(timeout_us, 3),
        "all_lost_resent_after_timeouts": round(after / timeout_us, 3) if not unresent
        else None,
        "goodput": goodput,
    }
    return out
