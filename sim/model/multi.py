"""N model NICs over a switched fabric: pairs, incast and all-to-all in pure Python.

:func:`run_nics` brings up ``scenario.nics`` model NICs (:class:`~sim.model.nic.ModelNic`)
named ``a``, ``b``, ``c``, ... as :func:`sim.model.pair.bring_up` brings up two, lets them
send by the scenario's ``pattern`` and runs them and the network event by event. NIC ``a``
and ``b`` have the addresses of :mod:`sim.defaults`; NIC i has MAC ``02:00:00:00:00:0a`` + i
and IP ``10.0.0.10`` + i (``fd00::a`` + i).

Patterns (:data:`sim.scenario.PATTERNS`):

* ``pairs``: NIC 2k and NIC 2k + 1 send to each other (only 2k sends without ``both_ways``);
* ``incast``: every NIC but ``a`` sends to ``a``, which only answers;
* ``all-to-all``: every NIC sends to every other.

Each sender sends ``scenario.bytes`` to each of its receivers (a *flow*), on ``scenario.qps``
QPs of its own. QPs come in one block of ``qps`` per peer: the QP block of NIC i towards its
k-th peer (peers in name order) is QPs ``k * qps`` to ``k * qps + qps - 1``, connected to
the block of that peer towards NIC i, so one QP pair carries both directions of a pair of
NICs, as in the two-NIC run. Each flow writes into its own slice of the receiver's memory
region.

The network is anything with the fabric's API (:class:`sim.fabric.Fabric` with one endpoint
per NIC and their MACs). Two NICs talking in pairs are the run of :func:`sim.model.pair.run_model`
with its traffic, addresses and QPs; :func:`run_nics` is the one for more.
"""

import ipaddress
import time

from hdl import protocol as P
from sim.defaults import MR_BASE, MR_LENGTH, default_profile_spec
from sim.probing import ProbeBackoff
from sim.scenario import Scenario, nic_config_for
from sim.workload import make_work as shared_make_work

from .nic import ModelNic
from .pair import PD, PSN_BASE, SRC_BASE, configure_engines

__all__ = ["run_nics", "nic_names", "nic_mac", "flows_of", "fabric_config_multi", "peers_of",
           "make_work", "nic_plan", "expected_completions", "memory_mismatches"]

_PROGRESS_EVERY_NS = 50_000.0
_MAC_BASE = 0x02_00_00_00_00_0A
_IPV4_BASE = int(ipaddress.IPv4Address("10.0.0.10"))
_IPV6_BASE = int(ipaddress.IPv6Address("fd00::a"))


def nic_names(count):
    """``a``, ``b``, ... for ``count`` NICs."""
    return tuple(chr(ord("a") + i) for i in range(count))


def nic_mac(index):
    return _MAC_BASE + index


def _nic_ip(index, ip_version):
    return (_IPV6_BASE if ip_version == 6 else _IPV4_BASE) + index


def flows_of(scn):
    """``[(src index, dst index)]`` of the scenario's pattern, in order."""
    n = scn.nics
    if scn.pattern == "pairs":
        flows = []
        for k in range(0, n, 2):
            flows.append((k, k + 1))
            if scn.both_ways:
                flows.append((k + 1, k))
        return flows
    if scn.pattern == "incast":
        return [(i, 0) for i in range(1, n)]
    return [(i, j) for i in range(n) for j in range(n) if i != j]


def peers_of(scn, flows):
    """Each NIC's peers (NICs it sends to or receives from), in index order."""
    peers = {i: set() for i in range(scn.nics)}
    for src, dst in flows:
        peers[src].add(dst)
        peers[dst].add(src)
    return {i: sorted(p) for i, p in peers.items()}


def fabric_config_multi(scn, nic_config):
    """The fabric of an N-NIC scenario: :func:`sim.workload.fabric_config_for` with one
    endpoint per NIC and their MACs (a switch per plane)."""
    from sim.workload import fabric_config_for
    base = fabric_config_for(scn, nic_config)
    return base.replace(endpoints=nic_names(scn.nics),
                        macs=tuple(nic_mac(i) for i in range(scn.nics)))


_MR_SLOT = 1
_RKEY = 0xBEE0 | _MR_SLOT          # the responder's rule: rkey modulo its MR slots = the slot


def _rkey(index):
    """NIC ``index``'s one memory region's rkey (every NIC has its own MR table)."""
    return _RKEY


def _flow_span(scn):
    """Bytes of a receiver's region each flow gets (rounded up to 4 KiB)."""
    return -(-scn.bytes // 4096) * 4096


def make_work(scn, flows, peers):
    """``{nic index: [wr dict with "data" and "dst"]}``: each flow's work requests from
    :func:`sim.workload.make_work` (seeded by the scenario's seed and the sender's name; for
    a sender of several flows, by a seed drawn from the receiver's index too), moved onto its
    QP block, its slice of the receiver's region, its own source bytes, and unique
    ``wr_id``s."""
    names = nic_names(scn.nics)
    work = {i: [] for i in range(scn.nics)}
    span = _flow_span(scn)
    per_sender = {}
    for src, dst in flows:
        per_sender.setdefault(src, []).append(dst)
    for src, dsts in per_sender.items():
        for order, dst in enumerate(dsts):
            side = names[src]
            slot_at_dst = peers[dst].index(src)
            block = peers[src].index(dst) * scn.qps
            for wr in _flow_work(scn, side, dst, len(dsts) > 1, _rkey(dst),
                                 SRC_BASE + order * span, MR_BASE + slot_at_dst * span):
                wr["qpn"] += block
                wr["wr_id"] = (ord(side) << 32) | (order << 24) | (wr["wr_id"] & 0xFFFFFF)
                wr["dst"] = dst
                wr["dst_qpn"] = wr["qpn"] - block + slot_at_dst * scn.qps
                work[src].append(wr)
    return work


def _flow_work(scn, side, dst, several, rkey, src_base, dst_base):
    # make_work seeds a side's bytes with the scenario's seed and the side's name: a sender of
    # several flows draws each flow's bytes with a seed of its own.
    seeded = scn.replace(seed=(scn.seed * 64 + dst) % (1 << 31)) if several else scn
    return shared_make_work(seeded, side, rkey, src_base, dst_base)


def nic_plan(scn, config, work, peers):
    """Every NIC's addresses, memory and QP connections, the same for model and RTL NICs:
    ``{index: {"mac", "ip", "mr": {slot, rkey, pd, base, length}, "source": (base, size),
    "connections": [connect_qp keywords]}}`` (the QP blocks of the module's docstring).
    Raises :class:`ValueError` when the build has too few QPs for the busiest NIC."""
    span = _flow_span(scn)
    needed = len(max(peers.values(), key=len)) * scn.qps
    if needed > config.qps:
        raise ValueError(f"the NIC build has {config.qps} QPs; the busiest NIC needs "
                         f"{needed} (qps x peers)")
    plan = {}
    for index in range(scn.nics):
        sent = sum(wr["length"] for wr in work[index])
        connections = []
        for slot, peer in enumerate(peers[index]):
            remote_slot = peers[peer].index(index)
            for q in range(scn.qps):
                qpn, remote_qpn = slot * scn.qps + q, remote_slot * scn.qps + q
                connections.append(dict(
                    qpn=qpn, ev_profile=0, ev_offset=qpn % scn.evs, remote_qpn=remote_qpn,
                    remote_mac=nic_mac(peer), remote_ip=_nic_ip(peer, config.ip_version),
                    psn=PSN_BASE + qpn, remote_psn=PSN_BASE + remote_qpn,
                    mpr=config.mpr_units, max_wimm=min(4, config.max_wimm), pd=PD,
                    timeout=scn.timeout, retry_linear=scn.retry_linear,
                    retry_exponential=scn.retry_exponential))
        plan[index] = {
            "mac": nic_mac(index), "ip": _nic_ip(index, config.ip_version),
            "mr": dict(slot=_MR_SLOT, rkey=_rkey(index), pd=PD, base=MR_BASE,
                       length=max(MR_LENGTH, span * max(1, len(peers[index])))),
            "source": (SRC_BASE, max(1, span * len(peers[index]), sent)),
            "connections": connections}
    return plan


def bring_up(scn, config, work, peers):
    """``{index: ModelNic}`` configured as :func:`sim.model.pair.bring_up` configures two,
    by :func:`nic_plan`."""
    spec = default_profile_spec()
    names = nic_names(scn.nics)
    plan = nic_plan(scn, config, work, peers)
    nics = {}
    for index in range(scn.nics):
        nic = ModelNic(config, name=names[index])
        nics[index] = nic
        own = plan[index]
        nic.set_local(mac=own["mac"], ip=own["ip"])
        nic.register_mr(**own["mr"])
        nic.memory.add(*own["source"])
        for wr in work[index]:
            nic.memory.write(wr["local_addr"], wr["data"])
        configure_engines(nic, scn, config, spec)
    for index, nic in nics.items():
        for connection in plan[index]["connections"]:
            connection = dict(connection)
            nic.connect_qp(connection.pop("qpn"), **connection)
    return nics


def expected_completions(work, count):
    """``{index: completions}`` a finished run shows: every WR of a NIC, plus one per write
    with immediate it receives."""
    out = {i: len(work[i]) for i in range(count)}
    for i in range(count):
        for wr in work[i]:
            if wr["opcode"] == P.WrOpcode.RDMA_WRITE_WITH_IMM:
                out[wr["dst"]] += 1
    return out


def memory_mismatches(read, work, names):
    """``[{"side", "wr_id", "first_bad_offset"}]``: every WR whose bytes are not in place at
    its receiver; ``read(index, address, length)`` reads NIC ``index``'s memory."""
    out = []
    for src, wrs in work.items():
        for wr in wrs:
            got = read(wr["dst"], wr["remote_addr"], wr["length"])
            if got == wr["data"]:
                continue
            bad = 0 if got is None else next(
                i for i, (x, y) in enumerate(zip(got, wr["data"], strict=True)) if x != y)
            out.append({"side": names[src], "wr_id": wr["wr_id"], "first_bad_offset": bad})
    return out


def run_nics(scenario, *, network, progress=None):
    """Run ``scenario`` on ``scenario.nics`` model NICs over ``network``; return the raw
    result dict of :func:`sim.model.pair.run_model` with every NIC's name as a side, plus
    ``completion_times_us`` ``{side: [time of each completion]}``, ``flows`` ``[(src, dst)]``
    (names) and each work request's ``dst`` (a name) and ``dst_qpn`` (the receiver's QP).

    ``progress`` is called about every 50 us of simulated time with ``{"sim_us",
    "completions", "expected"}`` (per-NIC counts)."""
    if not isinstance(scenario, Scenario):
        raise TypeError(f"scenario must be a Scenario, not {scenario!r}")
    started = time.monotonic()
    scn = scenario
    names = nic_names(scn.nics)
    config = nic_config_for(scn)
    flows = flows_of(scn)
    peers = peers_of(scn, flows)
    work = make_work(scn, flows, peers)
    nics = bring_up(scn, config, work, peers)
    expected = expected_completions(work, scn.nics)
    max_ns = scn.max_us * 1e3
    now = 0.0
    first_send = None
    next_progress = _PROGRESS_EVERY_NS
    for index in range(scn.nics):
        for wr in work[index]:
            nics[index].post({k: v for k, v in wr.items() if k not in ("dst", "dst_qpn")},
                             now)

    def finished():
        return all(len(nics[i].completions) >= expected[i] for i in nics)

    # The control plane stand-in, as in sim.model.pair: a per-EV probe backoff per NIC.
    probe_rtt = 2 * scn.latency_us * 1e3 + 2000.0
    probing = {index: ProbeBackoff() for index in nics}
    answers = []

    def next_probe():
        due = [t for t in (p.next_due_us() for p in probing.values()) if t is not None]
        return min(due) * 1e3 if due else None

    def control_plane(now):
        for item in [a for a in answers if a[0] <= now]:
            answers.remove(item)
            nics[item[1]].probe_answered(0, item[2], item[0])
        for index, nic in nics.items():
            ports = dict(nic.assumed_bad())
            probing[index].track(ports, now / 1e3)
            for ev in probing[index].due(now / 1e3):
                if network.plane_up(ports[ev] - 1, now, now + probe_rtt):
                    answers.append((now + probe_rtt, index, ev))

    index_of = {name: i for i, name in enumerate(names)}
    while not finished():
        times = [t for t in (*(nic.next_event_ns() for nic in nics.values()),
                             network.next_arrival(), next_probe(),
                             *(a[0] for a in answers)) if t is not None]
        if not times:
            break
        now = max(now, min(times))
        if now > max_ns:
            now = max_ns
            break
        control_plane(now)
        for dst, plane, frame in network.deliver(now):
            nics[index_of[dst]].receive(plane, frame, now)
        for index, nic in nics.items():
            for plane, frame in nic.transmit(now):
                if first_send is None:
                    first_send = now
                network.send(names[index], plane, frame, now)
        if progress is not None and now >= next_progress:
            next_progress = now + _PROGRESS_EVERY_NS
            progress({"sim_us": now / 1e3, "expected": {names[i]: expected[i] for i in nics},
                      "completions": {names[i]: len(nics[i].completions) for i in nics}})

    done = finished()
    times = [t for nic in nics.values() for t in nic.completion_times]
    done_ns = max(times) if done and times else now
    sim_ns = done_ns if done else now
    events = sorted(({"time_us": e["time_ns"] / 1e3, "nic": names[i], "profile": e["profile"],
                      "index": e["index"], "port": e["port"], "state": e["state"]}
                     for i, nic in nics.items() for e in nic.ev_events),
                    key=lambda e: (e["time_us"], e["nic"]))
    return {
        "backend": "model",
        "sim_us": sim_ns / 1e3,
        "probes_sent": {names[i]: probing[i].sent for i in nics},
        "cycles": int(sim_ns * config.clock_hz / 1e9),
        "wall_s": time.monotonic() - started,
        "finished": done,
        "completions": {names[i]: list(nic.completions) for i, nic in nics.items()},
        "completion_times_us": {names[i]: [t / 1e3 for t in nic.completion_times]
                                for i, nic in nics.items()},
        "work": {names[i]: [{**{k: v for k, v in wr.items() if k not in ("data", "dst")},
                             "dst": names[wr["dst"]]} for wr in work[i]] for i in nics},
        "flows": [(names[s], names[d]) for s, d in flows],
        "memory_mismatches": memory_mismatches(
            lambda index, address, length: nics[index].memory.read(address, length), work,
            names),
        "counters": {names[i]: nic.counters_snapshot() for i, nic in nics.items()},
        "ev_events": events,
        "first_send_us": (first_send if first_send is not None else 0.0) / 1e3,
        "done_us": done_ns / 1e3,
    }
