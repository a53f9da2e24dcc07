"""Figures of a run read off the fabric's records: what crossed which plane when.

Used in the process that owns the :class:`sim.fabric.Fabric` (the cocotb bench or the model
run), so every frame's fate is at hand. The recovery figures of ``report.json`` come from
here; ``docs/sim.md`` defines each one.
"""

from hdl import protocol as P
from hdl.packet.layouts import BTH, IMMDT, MDETH, RETH

from .fabric.frames import parse
from .scenario import line_rate_gbps

__all__ = ["analyse", "data_info", "base_rtt_ns", "loaded_rtt_ns", "wire_shares"]

_IMM = frozenset(int(op) for op in P.IMMEDIATE_OPCODES)
_BTH, _RETH, _IMMDT = BTH.size, RETH.size, IMMDT.size


def _offset(header, name):
    bits = 0
    for f in header.fields:
        if f.name == name:
            return bits // 8
        bits += f.bits
    raise KeyError(name)


_MDETH_FLAGS = _offset(MDETH, "flags")
_MDETH_EV = _offset(MDETH, "ev_index")


def data_info(frame):
    """``(dqpn, psn, retransmission, ev_index)`` of a data packet, or ``None``."""
    info = parse(frame)
    if not info.is_data:
        return None
    b = info.bth_offset
    dqpn = int.from_bytes(frame[b + 5:b + 8], "big")
    psn = int.from_bytes(frame[b + 9:b + 12], "big")
    mdeth = b + _BTH + _RETH + (_IMMDT if info.opcode in _IMM else 0)
    if len(frame) < mdeth + 4:
        return None
    ev_index = int.from_bytes(frame[mdeth + _MDETH_EV:mdeth + _MDETH_EV + 2], "big")
    flags = frame[mdeth + _MDETH_FLAGS]
    return dqpn, psn, bool(flags & P.DataFlags.RETRANSMISSION), ev_index


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
    transmissions of data packets, retransmissions (the MDETH retransmission flag), and every
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


def _window_goodput(stats, lo_ns, hi_ns, directions, line_rate):
    """Mean goodput over [lo, hi) from the per-plane bins, per direction, relative to the
    line rate (bins partly inside count pro rata)."""
    if hi_ns is None or lo_ns is None or hi_ns <= lo_ns:
        return None
    total = 0.0
    for plane in range(stats.planes):
        for index, entry in stats.bins[plane].items():
            start = index * stats.bin_ns
            overlap = min(hi_ns, start + stats.bin_ns) - max(lo_ns, start)
            if overlap > 0:
                total += entry.goodput_bytes * overlap / stats.bin_ns
    gbps = total * 8 / (hi_ns - lo_ns) / directions
    return {"goodput_gbps": round(gbps, 4), "relative_to_line_rate": round(gbps / line_rate, 4),
            "from_us": round(lo_ns / 1000, 3), "to_us": round(hi_ns / 1000, 3)}


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
    for r, (dqpn, psn, _, _) in data:
        if r.outcome == "dropped-failure" and r.sent_ns >= at_ns - rtt:
            key = (r.src, dqpn, psn)
            lost.setdefault(key, r.sent_ns)
    delivered_before = {}   # (src, dqpn, psn) -> earliest send of a copy that arrived
    for r, (dqpn, psn, _, _) in data:
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
    line = line_rate_gbps(config)
    goodput = {
        "before": _window_goodput(stats, 0.0, min(at_ns, end_ns), directions, line),
        "during": _window_goodput(stats, at_ns, min(down_until, end_ns), directions, line),
        "after": _window_goodput(stats, recover_ns, end_ns, directions, line)
        if recover_ns is not None and recover_ns < end_ns else None,
    }
    # During the failure against the healthy fabric before it (the ideal is (P - 1) / P).
    if goodput["before"] and goodput["during"] and goodput["before"]["goodput_gbps"]:
        goodput["during_over_before"] = round(
            goodput["during"]["goodput_gbps"] / goodput["before"]["goodput_gbps"], 4)
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
